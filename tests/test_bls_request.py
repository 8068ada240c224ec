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


# ---- each input reaches its field, each refusal says its own words (mutation testing found these unpinned) -------
def _flag(value: bool) -> np.ndarray:
    return np.array([[value]])


def test_the_flags_and_the_guide_reach_the_request():
    plain = parse_request(getter(text_input=text("x"), max_tokens=i32(4)), LIMITS)
    assert plain.use_draft_logits is None and plain.guide is None
    assert plain.return_num_input_tokens is False and plain.return_num_output_tokens is False
    req = parse_request(
        getter(
            text_input=text("x"),
            max_tokens=i32(4),
            use_draft_logits=_flag(False),
            return_num_input_tokens=_flag(True),
            return_num_output_tokens=_flag(True),
            guided_decoding_guide_type=text("regex"),
            guided_decoding_guide=text("[ab]+"),
        ),
        LIMITS,
    )
    assert req.use_draft_logits is False
    assert req.return_num_input_tokens is True and req.return_num_output_tokens is True
    assert (req.guide.type, req.guide.text) == ("regex", "[ab]+")
    counts = parse_request(
        getter(text_input=text("x"), max_tokens=i32(4), return_num_output_tokens=_flag(False)), LIMITS
    )
    assert counts.return_num_output_tokens is False


def test_a_guide_is_bounded_in_bytes_before_it_is_read():
    from specbuild.triton.models.bls_request import MAX_GUIDE_BYTES

    def request(size: int):
        guide = "a" * (size - 2)
        return getter(
            text_input=text("x"),
            max_tokens=i32(4),
            guided_decoding_guide_type=text("regex"),
            guided_decoding_guide=text(f"({guide})"),
        )

    assert len(parse_request(request(MAX_GUIDE_BYTES), LIMITS).guide.text) == MAX_GUIDE_BYTES
    with pytest.raises(
        RequestError,
        match=re.escape(
            f"input 'guided_decoding_guide' is {MAX_GUIDE_BYTES + 1} bytes, above the {MAX_GUIDE_BYTES} bytes a "
            "guide may have."
        ),
    ):
        parse_request(request(MAX_GUIDE_BYTES + 1), LIMITS)


def test_max_tokens_is_accepted_from_1_to_the_deployments_limit():
    for value in (1, LIMITS.max_tokens):
        assert parse_request(getter(text_input=text("x"), max_tokens=i32(value)), LIMITS).max_tokens == value
    for value in (0, LIMITS.max_tokens + 1):
        with pytest.raises(RequestError, match=re.escape(f"must be in 1..{LIMITS.max_tokens} for this deployment")):
            parse_request(getter(text_input=text("x"), max_tokens=i32(value)), LIMITS)


@pytest.mark.parametrize(
    "inputs, message",
    [
        ({"max_tokens": i32(4)}, "input 'text_input' is required and must be non-empty text."),
        ({"text_input": text("x")}, "input 'max_tokens' is required (INT32, > 0)."),
        (
            {"text_input": text("x"), "max_tokens": np.array([[4.0]], np.float32)},
            "input 'max_tokens' must be an integer tensor (INT32/UINT64), got float32.",
        ),
        (
            {"text_input": text("x"), "max_tokens": i32(4), "temperature": i32(1)},
            "input 'temperature' must be FP32, got int32.",
        ),
        (
            {"text_input": text("x"), "max_tokens": i32(4), "stream": i32(1)},
            "input 'stream' must be BOOL, got int32.",
        ),
        (
            {"text_input": i32(5), "max_tokens": i32(4)},
            "input 'text_input' must be a STRING (BYTES) tensor, got int32.",
        ),
        (
            {"text_input": text("x"), "max_tokens": i32(4), "lora_task_id": i32(1)},
            "input 'lora_task_id' is not supported by specbuild's speculative BLS; remove it.",
        ),
        (
            {"text_input": text("x"), "max_tokens": i32(4), "embedding_bias_weights": np.array([[1.0]], np.float32)},
            "input 'embedding_bias_weights' is not supported by specbuild's speculative BLS (only empty); remove it.",
        ),
        (
            {"text_input": text("x"), "max_tokens": i32(4), "bad_words": np.array([[b"\xff"]], dtype=object)},
            "input 'bad_words' is not supported by specbuild's speculative BLS (only empty); remove it.",
        ),
    ],
)
def test_each_refusal_names_its_input_in_full(inputs, message):
    with pytest.raises(RequestError, match="^" + re.escape(message) + "$"):
        parse_request(getter(**inputs), LIMITS)


def test_empty_word_inputs_of_every_dtype_are_accepted():
    """NVIDIA's clients send [[""]] (object, or a numpy unicode array from other clients) and zero weights."""
    for empty in (
        np.array([[b""]], dtype=object),
        np.array([[""]]),  # dtype <U1: str items
        np.array([[]], dtype=object),
    ):
        parse_request(getter(text_input=text("x"), max_tokens=i32(4), bad_words=empty), LIMITS)
    for weights in (np.zeros((1, 3), np.float32), np.zeros((1, 0), np.float32)):
        parse_request(getter(text_input=text("x"), max_tokens=i32(4), embedding_bias_weights=weights), LIMITS)


def test_unicode_arrays_are_measured_in_utf8_bytes():
    """A client's numpy str array (dtype <U) is read as text too, and bounded by its UTF-8 size, not its length."""
    req = parse_request(
        getter(text_input=np.array([["x"]]), max_tokens=i32(4), stop_words=np.array([["\n", ""]])), BOUNDED
    )
    assert req.text == "x" and req.stop_words == ["\n"]
    with pytest.raises(RequestError, match=re.escape("input 'text_input' is 42 bytes, above the 40 bytes")):
        parse_request(getter(text_input=np.array([["é" * 21]]), max_tokens=i32(4)), BOUNDED)  # 21 characters
    with pytest.raises(RequestError, match=re.escape("input 'stop_words' is 42 bytes, above this deployment's")):
        parse_request(getter(text_input=text("x"), max_tokens=i32(4), stop_words=np.array([["é" * 21]])), BOUNDED)


def test_a_text_input_of_two_strings_is_refused_for_its_shape_not_its_size():
    two = np.array([[b"x" * 41, b"y"]], dtype=object)
    with pytest.raises(RequestError, match=re.escape("input 'text_input' must hold exactly one value per request")):
        parse_request(getter(text_input=two, max_tokens=i32(4)), BOUNDED)


def test_an_out_of_range_end_id_is_told_what_to_use():
    with pytest.raises(RequestError) as info:
        parse_request(getter(text_input=text("x"), max_tokens=i32(4), end_id=i32(100)), BOUNDED)
    assert str(info.value) == (
        "end_id = 100 is invalid: use -1 (no end id) or a token id in [0, 100), this deployment's vocabulary, "
        "or leave it unset."
    )
    with pytest.raises(RequestError) as info:
        parse_request(getter(text_input=text("x"), max_tokens=i32(4), pad_id=i32(100)), BOUNDED)
    assert str(info.value).startswith("pad_id = 100 is invalid: use a token id in [0, 100)")
