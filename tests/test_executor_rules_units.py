"""specbuild.contract.executor one rule at a time: what the `tensorrt_llm` model accepts of a request, refuses (in
TensorRT-LLM's words where it has them) or quietly changes, at each rule's edge: one token, a length equal to its
bound, end id -1 and 0, a draft of exactly max_draft_len, draft logits with and without their batch dimension, the
output shortened to fit max_seq_len. The same rules run through the served models in tests/test_runtime_contract.py
and tests/test_models_fuzz.py; here each branch is pinned, so a changed bound or message fails one test by name."""

from __future__ import annotations

import numpy as np
import pytest

from specbuild.contract.executor import Limits, parse_request
from specbuild.errors import RequestError

VOCAB = 50
LIMITS = Limits(max_batch_size=4, max_seq_len=20, max_draft_len=4)  # max_input_len 19


def request(ids=(3, 4, 5), output_len=5, **extra):
    base = {
        "input_ids": np.array(ids, np.int32),
        "input_lengths": np.array([len(ids)], np.int32),
        "request_output_len": np.array([output_len], np.int32),
    }
    return {**base, **extra}


def refused(req, message: str, limits: Limits = LIMITS) -> None:
    with pytest.raises(RequestError) as error:
        parse_request(req, VOCAB, limits)
    assert str(error.value) == message


def test_the_required_inputs_named_when_missing():
    refused(
        {"input_ids": np.array([1], np.int32)},
        "missing required input(s) input_lengths, request_output_len: send input_ids, input_lengths, "
        "request_output_len.",
    )


def test_one_token_and_the_lengths_at_their_bounds():
    parsed = parse_request(request(ids=[7], output_len=1), VOCAB, LIMITS)
    assert (parsed.input_ids, parsed.output_len, parsed.draft, parsed.draft_logits) == ([7], 1, None, None)
    refused(
        {**request(), "input_lengths": np.array([0], np.int32)},
        "input_lengths = 0 does not fit input_ids of length 3: send 1..3.",
    )
    refused(
        {**request(), "input_lengths": np.array([4], np.int32)},
        "input_lengths = 4 does not fit input_ids of length 3: send 1..3.",
    )
    assert parse_request({**request(), "input_lengths": np.array([2], np.int32)}, VOCAB, LIMITS).input_ids == [3, 4]
    refused(request(output_len=0), "request_output_len = 0: ask for at least 1 token.")
    refused(
        request(ids=list(range(20))),
        "Prompt length (20) exceeds maximum input length (19). Set log level to info and check TRTGptModel logs for "
        "how maximum input length is set",
    )
    assert parse_request(request(ids=list(range(19)), output_len=9), VOCAB, LIMITS).output_len == 1  # cut to fit


def test_token_ids_one_dimensional_a_batch_of_one_unwrapped():
    batched = {**request(), "input_ids": np.array([[3, 4, 5]], np.int32)}
    assert parse_request(batched, VOCAB, LIMITS).input_ids == [3, 4, 5]
    refused(
        request(ids=[[3, 4, 5], [6, 7, 8]]),
        "input 'input_ids' must be a 1-D integer array of token ids, got int32 (2, 3).",
    )
    refused(
        {**request(), "input_ids": np.array([[3], [4], [5]], np.int32)},
        "input 'input_ids' must be a 1-D integer array of token ids, got int32 (3, 1).",
    )
    refused(
        {**request(), "input_ids": np.array([3.0, 4.0, 5.0])},
        "input 'input_ids' must be a 1-D integer array of token ids, got float64 (3,).",
    )
    assert parse_request(request(ids=[0, VOCAB - 1]), VOCAB, LIMITS).input_ids == [0, VOCAB - 1]
    refused(request(ids=[1, VOCAB]), f"input 'input_ids' holds token ids outside [0, {VOCAB}): [1, {VOCAB}].")
    many = [VOCAB + i for i in range(18)]
    refused(
        {**request(ids=many), "input_lengths": np.array([18], np.int32)},
        f"input 'input_ids' holds token ids outside [0, {VOCAB}): {many[:16]}.",
    )


def test_a_scalar_holds_exactly_one_integer():
    refused(request(end_id=np.array([1, 2], np.int32)), "input 'end_id' must hold exactly one value, got shape (2,).")
    assert parse_request(request(end_id=np.array([[2]], np.int32)), VOCAB, LIMITS).end_id == 2
    refused(request(runtime_top_k=np.array([2.5], np.float32)), "input 'runtime_top_k' = 2.5 must be an integer.")
    refused(request(seed=np.array([1.5])), "input 'seed' = 1.5 must be an integer.")
    assert parse_request(request(end_id=None), VOCAB, LIMITS).end_id is None


@pytest.mark.parametrize(("end_id", "kept"), [(-1, None), (0, 0), (VOCAB - 1, VOCAB - 1)])
def test_end_id_minus_one_means_none_and_zero_is_an_id(end_id, kept):
    assert parse_request(request(end_id=np.array([end_id], np.int32)), VOCAB, LIMITS).end_id == kept


@pytest.mark.parametrize("end_id", [-2, VOCAB])
def test_an_end_id_outside_its_range_is_refused_in_the_executors_words(end_id):
    refused(
        request(end_id=np.array([end_id], np.int32)), f"EndId ({end_id}) is not within acceptable range [-1, {VOCAB})."
    )


def test_a_draft_of_max_draft_len_and_its_logits_with_or_without_the_batch_dimension():
    draft = [1, 2, 3, 4]
    logits = np.arange(4 * VOCAB, dtype=np.float64).reshape(4, VOCAB)
    for sent in (logits, logits[None]):
        parsed = parse_request(request(draft_input_ids=np.array(draft, np.int32), draft_logits=sent), VOCAB, LIMITS)
        assert parsed.draft == draft and parsed.draft_logits.dtype == np.float32
        assert np.array_equal(parsed.draft_logits, logits.astype(np.float32))
    one = parse_request(request(draft_input_ids=np.array([9], np.int32), draft_logits=logits[:1]), VOCAB, LIMITS)
    assert one.draft == [9] and one.draft_logits.shape == (1, VOCAB)
    refused(
        request(draft_input_ids=np.array(draft + [5], np.int32)),
        "Draft tokens length (5) exceeds maximum draft tokens length (4).",
    )
    refused(
        request(draft_input_ids=np.array(draft, np.int32), draft_logits=np.stack([logits, logits])),
        f"draft_logits has shape (2, 4, {VOCAB}), expected [num_draft_tokens, vocab] = [4, {VOCAB}]: send one row "
        "of logits per draft token.",
    )


def test_a_draft_that_overruns_the_input_limit_is_cut_and_the_output_shortened():
    logits = np.zeros((4, VOCAB), np.float32)
    parsed = parse_request(
        request(
            ids=list(range(17)), output_len=9, draft_input_ids=np.array([1, 2, 3, 4], np.int32), draft_logits=logits
        ),
        VOCAB,
        LIMITS,
    )
    assert parsed.draft == [1, 2] and parsed.draft_logits.shape == (2, VOCAB)  # 19 - 17 = 2 kept
    assert parsed.output_len == 1  # 20 - 17 - 2
    short = parse_request(
        request(ids=[1] * 10, output_len=100, draft_input_ids=np.array([1, 2, 3, 4], np.int32)), VOCAB, LIMITS
    )
    assert short.output_len == 6  # max_seq_len - prompt - draft


def test_the_flags_and_word_lists_read():
    plain = parse_request(request(), VOCAB, LIMITS)
    assert plain.return_logits is False and plain.return_perf_metrics is False
    assert plain.stop_words == [] and plain.bad_words == []
    words = np.array([[[7, 8, 9], [2, 3, -1]]], np.int32)  # [7, 8] and [9]
    asked = parse_request(
        request(
            return_generation_logits=np.array([True]),
            return_perf_metrics=np.array([True]),
            bad_words_list=words,
            stop_words_list=np.array([[[5], [1]]], np.int32),
        ),
        VOCAB,
        LIMITS,
    )
    assert asked.return_logits is True and asked.return_perf_metrics is True
    assert asked.bad_words == [[7, 8], [9]] and asked.stop_words == [[5]]


def test_limits_from_an_engine_and_their_defaults():
    assert Limits.from_engine({}, 128) == Limits(8, 128, 0, None, "float32")
    engine = {
        "max_batch_size": 2,
        "max_seq_len": 64,
        "max_draft_len": 3,
        "max_num_tokens": 40,
        "logits_dtype": "float16",
    }
    limits = Limits.from_engine(engine, 128)
    assert limits == Limits(2, 64, 3, 40, "float16") and limits.max_input_len == 40
    assert Limits(max_seq_len=64).max_input_len == 63
    with pytest.raises(ValueError) as error:
        Limits(logits_dtype="int8")
    assert str(error.value).startswith("logits_dtype 'int8' is not one of ['")
