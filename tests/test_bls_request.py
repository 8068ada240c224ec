"""The BLS request parser: every input checked, clear INVALID_ARG messages, nothing silently ignored."""

import numpy as np
import pytest

from specbuild.bls.request import InvalidRequest, parse_request


def getter(**inputs):
    return lambda name: inputs.get(name)


def text(s):
    return np.array([[s.encode()]], dtype=object)


def i32(v):
    return np.array([[v]], dtype=np.int32)


def test_minimal_request_gets_defaults():
    req = parse_request(getter(text_input=text("def f("), max_tokens=i32(16)), max_tokens_limit=64, max_draft_len=4)
    assert req.text == "def f(" and req.max_tokens == 16
    assert req.num_draft_tokens is None and req.stream is False
    assert req.sampling.greedy and req.sampling.seed is None
    assert req.exclude_input_in_output is True


def test_sampling_and_stream_inputs():
    req = parse_request(
        getter(text_input=text("x"), max_tokens=i32(4), num_draft_tokens=i32(3), stream=np.array([[True]]),
               temperature=np.array([[0.7]], dtype=np.float32), top_k=i32(20),
               top_p=np.array([[0.9]], dtype=np.float32), seed=np.array([[123]], dtype=np.uint64),
               stop_words=np.array([[b"\n\n", b""]], dtype=object)),
        max_tokens_limit=64, max_draft_len=4,
    )
    assert req.stream and req.num_draft_tokens == 3
    assert req.sampling.temperature == pytest.approx(0.7) and req.sampling.top_k == 20 and req.sampling.seed == 123
    assert req.stop_words == ["\n\n"]


def test_num_draft_tokens_is_clamped_to_the_engine_limit():
    req = parse_request(getter(text_input=text("x"), max_tokens=i32(4), num_draft_tokens=i32(1000)),
                        max_tokens_limit=64, max_draft_len=4)
    assert req.num_draft_tokens == 4


@pytest.mark.parametrize(
    "inputs, message",
    [
        ({"max_tokens": i32(4)}, "'text_input' is required"),
        ({"text_input": text("   "), "max_tokens": i32(4)}, "'text_input' is required"),
        ({"text_input": text("x")}, "'max_tokens' is required"),
        ({"text_input": text("x"), "max_tokens": i32(0)}, "'max_tokens' = 0: must be in 1..64"),
        ({"text_input": text("x"), "max_tokens": i32(10**6)}, "'max_tokens' = 1000000: must be in 1..64"),
        ({"text_input": text("x"), "max_tokens": np.array([[4.0]], dtype=np.float32)}, "'max_tokens' must be an integer"),
        ({"text_input": text("x"), "max_tokens": i32(4), "num_draft_tokens": i32(-1)}, "'num_draft_tokens' = -1"),
        ({"text_input": text("x"), "max_tokens": i32(4), "temperature": np.array([[-1.0]], dtype=np.float32)},
         "'temperature' = -1.0"),
        ({"text_input": text("x"), "max_tokens": i32(4), "top_p": np.array([[0.0]], dtype=np.float32)}, "'top_p' = 0.0"),
        ({"text_input": text("x"), "max_tokens": i32(4), "stream": i32(1)}, "'stream' must be BOOL"),
        ({"text_input": text("x"), "max_tokens": i32(4), "beam_width": i32(2)}, "'beam_width' is not supported"),
        ({"text_input": np.array([[b"\xff\xfe"]], dtype=object), "max_tokens": i32(4)}, "not valid UTF-8"),
        ({"text_input": text("x"), "max_tokens": np.array([[1, 2]], dtype=np.int32)}, "exactly one value"),
    ],
)
def test_bad_inputs_are_named_in_the_error(inputs, message):
    with pytest.raises(InvalidRequest, match=message.replace("(", r"\(").replace(".", r"\.")):
        parse_request(getter(**inputs), max_tokens_limit=64, max_draft_len=4)


def test_neutral_penalties_are_accepted_others_refused():
    ok = parse_request(getter(text_input=text("x"), max_tokens=i32(4),
                              repetition_penalty=np.array([[1.0]], dtype=np.float32), min_tokens=i32(0)),
                       max_tokens_limit=64, max_draft_len=4)
    assert ok.max_tokens == 4
    with pytest.raises(InvalidRequest, match="'repetition_penalty' = \\[1.2"):
        parse_request(getter(text_input=text("x"), max_tokens=i32(4),
                             repetition_penalty=np.array([[1.2]], dtype=np.float32)),
                      max_tokens_limit=64, max_draft_len=4)
