"""The BLS request parser: every input read and checked, clear INVALID_ARG messages, nothing silently ignored."""

import re

import numpy as np
import pytest

from specbuild.errors import RequestError
from specbuild.speculative.draft_len import resolve_k
from specbuild.speculative.loop import GenerationRequest
from specbuild.triton.models.bls_request import RequestLimits, parse_request

LIMITS = RequestLimits(max_tokens=64)


def getter(**inputs):
    return lambda name: inputs.get(name)


def text(s):
    return np.array([[s.encode()]], dtype=object)


def i32(v):
    return np.array([[v]], dtype=np.int32)


def test_minimal_request_gets_defaults():
    req = parse_request(getter(text_input=text("def f("), max_tokens=i32(16)), LIMITS)
    assert req.text == "def f(" and req.max_tokens == 16
    assert req.num_draft_tokens is None and req.stream is False
    assert req.sampling.greedy and req.sampling.seed is None
    assert req.exclude_input_in_output is None  # the target model's setting decides


def test_sampling_and_stream_inputs():
    req = parse_request(
        getter(
            text_input=text("x"),
            max_tokens=i32(4),
            num_draft_tokens=i32(3),
            stream=np.array([[True]]),
            temperature=np.array([[0.7]], dtype=np.float32),
            top_k=i32(20),
            top_p=np.array([[0.9]], dtype=np.float32),
            seed=np.array([[123]], dtype=np.uint64),
            stop_words=np.array([[b"\n\n", b""]], dtype=object),
        ),
        LIMITS,
    )
    assert req.stream and req.num_draft_tokens == 3
    assert req.sampling.temperature == pytest.approx(0.7) and req.sampling.top_k == 20 and req.sampling.seed == 123
    assert req.stop_words == ["\n\n"]


def test_num_draft_tokens_is_read_as_sent_and_clamped_by_the_one_k_rule():
    req = parse_request(getter(text_input=text("x"), max_tokens=i32(4), num_draft_tokens=i32(1000)), LIMITS)
    assert req.num_draft_tokens == 1000
    assert resolve_k(req.num_draft_tokens, 4, default=2).k == 4  # what the BLS runs with
    assert resolve_k(None, 4, default=2).k == 2


@pytest.mark.parametrize(
    "inputs, message",
    [
        ({"max_tokens": i32(4)}, "'text_input' is required"),
        ({"text_input": text("   "), "max_tokens": i32(4)}, "'text_input' is required"),
        ({"text_input": text("x")}, "'max_tokens' is required"),
        ({"text_input": text("x"), "max_tokens": i32(0)}, "'max_tokens' = 0: must be in 1..64"),
        ({"text_input": text("x"), "max_tokens": i32(10**6)}, "'max_tokens' = 1000000: must be in 1..64"),
        (
            {"text_input": text("x"), "max_tokens": np.array([[4.0]], dtype=np.float32)},
            "'max_tokens' must be an integer",
        ),
        ({"text_input": text("x"), "max_tokens": i32(4), "stream": i32(1)}, "'stream' must be BOOL"),
        ({"text_input": text("x"), "max_tokens": i32(4), "beam_width": i32(2)}, "'beam_width' = [2] is not supported"),
        (
            {"text_input": text("x"), "max_tokens": i32(4), "bad_words": np.array([[b"foo"]], dtype=object)},
            "'bad_words' is not supported by specbuild's speculative BLS (only empty)",
        ),
        (
            {
                "text_input": text("x"),
                "max_tokens": i32(4),
                "embedding_bias_words": np.array([[b"foo"]], dtype=object),
                "embedding_bias_weights": np.array([[1.0]], dtype=np.float32),
            },
            "'embedding_bias_words' is not supported",
        ),
        (
            {"text_input": text("x"), "max_tokens": i32(4), "return_generation_logits": np.array([[True]])},
            "'return_generation_logits' = [True] is not supported",
        ),
        ({"text_input": np.array([[b"\xff\xfe"]], dtype=object), "max_tokens": i32(4)}, "not valid UTF-8"),
        ({"text_input": text("x"), "max_tokens": np.array([[1, 2]], dtype=np.int32)}, "exactly one value"),
    ],
)
def test_bad_inputs_are_named_in_the_error(inputs, message):
    with pytest.raises(RequestError, match=re.escape(message)):
        parse_request(getter(**inputs), LIMITS)


@pytest.mark.parametrize(
    "inputs, message",
    [
        ({"temperature": np.array([[-1.0]], dtype=np.float32)}, "temperature = -1.0 is invalid"),
        ({"temperature": np.array([[-1.0]], dtype=np.float32), "top_k": i32(1)}, "temperature = -1.0 is invalid"),
        ({"temperature": np.array([[np.nan]], dtype=np.float32)}, "temperature = nan is invalid"),
        ({"top_p": np.array([[1.5]], dtype=np.float32)}, "top_p = 1.5 is invalid: use a number in (0, 1]"),
        ({"top_k": i32(-2)}, "top_k = -2 is invalid"),
    ],
)
def test_bad_sampling_values_are_refused_by_the_loops_own_check(inputs, message):
    """Values are kept as sent, so the loop's validate_sampling refuses them, also where greedy would not use them."""
    req = parse_request(getter(text_input=text("x"), max_tokens=i32(4), **inputs), LIMITS)
    with pytest.raises(RequestError, match=re.escape(message)):
        GenerationRequest(max_tokens=req.max_tokens, sampling=req.sampling).validate()


def test_a_negative_k_is_refused_by_the_one_k_rule():
    req = parse_request(getter(text_input=text("x"), max_tokens=i32(4), num_draft_tokens=i32(-1)), LIMITS)
    with pytest.raises(RequestError, match=re.escape("num_draft_tokens = -1 is invalid")):
        resolve_k(req.num_draft_tokens, 4, default=2)


def test_neutral_penalties_are_accepted_others_refused():
    ok = parse_request(
        getter(
            text_input=text("x"),
            max_tokens=i32(4),
            repetition_penalty=np.array([[1.0]], dtype=np.float32),
            min_tokens=i32(0),
        ),
        LIMITS,
    )
    assert ok.max_tokens == 4
    with pytest.raises(RequestError, match="'repetition_penalty' = \\[1.2"):
        parse_request(
            getter(text_input=text("x"), max_tokens=i32(4), repetition_penalty=np.array([[1.2]], dtype=np.float32)),
            LIMITS,
        )


def test_nvidia_clients_neutral_inputs_are_accepted():
    """The input set of NVIDIA's end_to_end_grpc_client.prepare_inputs (as its speculative-decoding test calls it)."""
    req = parse_request(
        getter(
            text_input=text("def f("),
            max_tokens=i32(8),
            stream=np.array([[False]]),
            beam_width=i32(1),
            temperature=np.array([[1.0]], dtype=np.float32),
            embedding_bias_words=np.empty((1, 0), dtype=object),
            embedding_bias_weights=np.empty((1, 0), dtype=np.float32),
            exclude_input_in_output=np.array([[False]]),
            num_draft_tokens=i32(5),
            use_draft_logits=np.array([[False]]),
            bad_words=np.array([[b""]], dtype=object),
            stop_words=np.array([[b""]], dtype=object),
            return_context_logits=np.array([[False]]),
            return_generation_logits=np.array([[False]]),
            num_return_sequences=i32(1),
        ),
        LIMITS,
    )
    assert req.num_draft_tokens == 5 and req.exclude_input_in_output is False and req.stop_words == []
    assert req.sampling.greedy  # temperature 1.0 alone is greedy to TensorRT-LLM, so the outputs compare exactly


@pytest.mark.parametrize(
    "inputs, greedy, top_k, top_p",
    [
        ({}, True, 0, 1.0),
        ({"temperature": 1.0}, True, 0, 1.0),
        ({"temperature": 0.8, "top_p": 0.0}, True, 0, 1.0),  # top_p <= 0 is "not set"
        ({"temperature": 0.0, "top_k": 0, "top_p": 1.0}, True, 0, 1.0),  # specbuild: temperature 0 is greedy
        ({"temperature": 0.8, "top_k": 1}, True, 0, 1.0),
        ({"temperature": 0.8, "top_p": 1.0}, False, 0, 1.0),
        ({"temperature": 0.8, "top_k": 20}, False, 20, 1.0),  # top_k > 0 with no top_p: top_p 1
        ({"top_p": 0.9}, False, 0, 0.9),  # no temperature: 1.0
    ],
)
def test_sampling_inputs_resolve_by_tensorrt_llms_rules(inputs, greedy, top_k, top_p):
    tensors = {
        "temperature": lambda v: np.array([[v]], dtype=np.float32),
        "top_p": lambda v: np.array([[v]], np.float32),
        "top_k": i32,
    }
    req = parse_request(
        getter(text_input=text("x"), max_tokens=i32(4), **{k: tensors[k](v) for k, v in inputs.items()}), LIMITS
    )
    assert req.sampling.greedy is greedy
    if not greedy:
        assert (req.sampling.top_k, req.sampling.top_p) == (top_k, pytest.approx(top_p))
        assert req.sampling.temperature == pytest.approx(inputs.get("temperature", 1.0))


def test_stop_sequences_of_every_word_list_shape_preprocessing_emits():
    from specbuild.contract.words import word_sequences

    assert word_sequences(None) == [] and word_sequences(np.empty((1, 2, 0), np.int32)) == []  # not sent
    assert word_sequences(np.array([[[0], [-1]]], np.int32)) == []  # only empty words
    assert word_sequences(np.array([[[5, 6, 7], [2, 3, -1]]], np.int32)) == [[5, 6], [7]]


# A deployment of max_input_len 8 whose tokenizer covers at most 5 bytes per token: prompts up to 40 bytes can fit.
BOUNDED = RequestLimits(max_tokens=64, vocab_size=100, max_input_len=8, longest_token_bytes=5)


class _NotDecoded(bytes):
    """A prompt that fails the test if the parser decodes it (it must be refused by its size alone)."""

    def decode(self, *args, **kwargs):
        raise AssertionError("the prompt was decoded before its size was checked")


def test_a_prompt_that_cannot_fit_is_refused_by_its_size_before_it_is_decoded():
    assert parse_request(getter(text_input=text("x" * 40), max_tokens=i32(4)), BOUNDED).text == "x" * 40
    big = np.empty((1, 1), dtype=object)
    big[0, 0] = _NotDecoded(b"x" * 41)
    with pytest.raises(
        RequestError,
        match=re.escape(
            "input 'text_input' is 41 bytes, above the 40 bytes that can fit this deployment (max_input_len = 8 "
            "tokens x at most 5 bytes per token of this tokenizer); shorten it."
        ),
    ):
        parse_request(getter(text_input=big, max_tokens=i32(4)), BOUNDED)


def test_stop_words_together_may_be_as_long_as_the_longest_prompt():
    ok = parse_request(
        getter(text_input=text("x"), max_tokens=i32(4), stop_words=np.array([[b"a" * 20, b"b" * 20]], dtype=object)),
        BOUNDED,
    )
    assert ok.stop_words == ["a" * 20, "b" * 20]
    with pytest.raises(
        RequestError,
        match=re.escape("input 'stop_words' is 41 bytes in all, above this deployment's limit of 40 bytes"),
    ):
        parse_request(
            getter(
                text_input=text("x"), max_tokens=i32(4), stop_words=np.array([[b"a" * 20, b"b" * 21]], dtype=object)
            ),
            BOUNDED,
        )


def test_stop_words_that_are_not_utf8_are_refused_like_the_prompt():
    with pytest.raises(RequestError, match=re.escape("input 'stop_words' is not valid UTF-8.")):
        parse_request(
            getter(text_input=text("x"), max_tokens=i32(4), stop_words=np.array([[b"ok", b"\xff\xfe"]], dtype=object)),
            LIMITS,
        )


@pytest.mark.parametrize(
    "name, value, accepted",
    [
        ("end_id", -1, True),
        ("end_id", 0, True),
        ("end_id", 99, True),
        ("end_id", 100, False),
        ("end_id", -2, False),
        ("end_id", 2**31 - 1, False),
        ("pad_id", 0, True),
        ("pad_id", 99, True),
        ("pad_id", 100, False),
        ("pad_id", -1, False),
        ("pad_id", -5, False),
    ],
)
def test_end_and_pad_ids_must_be_in_the_vocabulary(name, value, accepted):
    get = getter(text_input=text("x"), max_tokens=i32(4), **{name: i32(value)})
    if accepted:
        assert getattr(parse_request(get, BOUNDED), name) == value
        return
    with pytest.raises(RequestError, match=re.escape(f"{name} = {value} is invalid: use ")) as info:
        parse_request(get, BOUNDED)
    assert "[0, 100)" in str(info.value)
