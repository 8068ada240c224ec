"""Every bad input is refused cleanly (property-based, hypothesis, against the real server and the tiny pair's BLS):
each input the BLS declares sent with a wrong datatype, a wrong shape, empty, huge, negative, out of range, not
UTF-8, and the request parameters with unknown names and values. Whatever comes, the answer is a whole response or an
error naming the input (Triton's own for a datatype or shape, the BLS's for a value), never an internal error, never a
traceback in the server log; the server stays ready, and a stream running beside the whole run ends with the text it
would have had alone. The number of cases tried is printed (pytest -s) and asserted.
"""

from __future__ import annotations

import queue

import numpy as np
import pytest
from fuzz_helpers import OTHER_TYPES, PROMPT, WIRE, stream_beside, tiny_server, tracebacks, value_of
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_bls_server import _generate as generate

from specbuild.contract import tensors

pytestmark = [pytest.mark.server, pytest.mark.slow]
INPUTS = {t.name: t for t in tensors.BLS_INPUTS}
CASES = 160  # hypothesis examples per test
tried = {"grpc": 0, "http": 0}
answers: dict[str, int] = {}  # what the cases got: "served", or the start of the refusal's message


@pytest.fixture(scope="module")
def server(tmp_path_factory, example_tiny):
    with tiny_server(tmp_path_factory.mktemp("fuzz"), example_tiny) as handle:
        yield handle


@pytest.fixture(scope="module")
def beside(server):
    """A greedy stream through the BLS that runs beside the fuzzing, and the text it must end with (alone)."""
    yield stream_beside(server)


@st.composite
def bad_requests(draw):
    """(what was done, inputs {name: (array, wire datatype)}, request parameters): one input made bad, the others
    (text_input and max_tokens, required) valid."""
    max_tokens = draw(st.integers(1, 8))
    inputs = {
        "text_input": (np.array([[PROMPT.encode()]], dtype=object), "BYTES"),
        "max_tokens": (np.array([[max_tokens]], np.int32), "INT32"),
    }
    name = draw(st.sampled_from(sorted(INPUTS)))
    declared = INPUTS[name]
    datatype, dtype = WIRE[declared.dtype]
    how = draw(st.sampled_from(["value", "datatype", "shape", "empty", "several"]))
    if how == "datatype":
        datatype, dtype = draw(st.sampled_from([t for t in OTHER_TYPES if t[0] != datatype]))
        raw = value_of("TYPE_STRING" if dtype is object else "TYPE_INT32", draw)
        if dtype is np.bool_:
            raw = bool(raw)
        elif dtype is not object:
            raw = int(raw) % 100
        array = np.array([[raw]], dtype=dtype)
    else:
        values = [value_of(declared.dtype, draw) for _ in range(draw(st.integers(2, 4)) if how == "several" else 1)]
        array = np.array([values], dtype=dtype)
        if how == "shape":
            array = array.reshape(1, -1, 1)
        elif how == "empty":
            array = array[:, :0]
    inputs[name] = (array, datatype)
    parameters = draw(
        st.one_of(
            st.just({}),
            st.dictionaries(st.sampled_from(["nonsense", "overlap", "drafter", "k"]), st.text(max_size=8)),
            st.fixed_dictionaries({"overlap": st.integers(-3, 3)}),
        )
    )
    return f"{name}: {how}", inputs, parameters


def stream_answer(server, inputs: dict, parameters: dict) -> str | None:
    """One request on a gRPC stream: None when it ended with its final response, else its error message."""
    import tritonclient.grpc as grpcclient

    answers: queue.Queue = queue.Queue()
    raw = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        raw.start_stream(callback=lambda result=None, error=None: answers.put((result, error)))
        tensors_ = []
        for name, (value, datatype) in inputs.items():
            tensors_.append(grpcclient.InferInput(name, list(value.shape), datatype))
            tensors_[-1].set_data_from_numpy(value)
        raw.async_stream_infer(
            "tensorrt_llm_bls", tensors_, enable_empty_final_response=True, parameters=parameters or None
        )
        while True:
            result, error = answers.get(timeout=120)
            if error is not None:
                return error.message()
            final = result.get_response().parameters.get("triton_final_response")
            if final is None or final.bool_param:
                return None
    finally:
        raw.stop_stream()
        raw.close()


@settings(max_examples=CASES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(case=bad_requests())
def test_every_declared_input_sent_bad_is_refused_by_name_or_served(server, beside, case):
    what, inputs, parameters = case
    before = tracebacks(server)
    message = stream_answer(server, inputs, parameters)
    tried["grpc"] += 1
    answers[message[:60] if message else "served"] = answers.get(message[:60] if message else "served", 0) + 1
    if message is not None:
        name = what.split(":")[0]
        said = [n for n in [*inputs, *parameters] if f"'{n}'" in message or f"{n} " in message or f"{n}=" in message]
        assert said, (what, message)  # the input (or parameter) at fault is named
        assert name in said or "text_input" in said or "max_tokens" in said or set(parameters) & set(said), (
            what,
            message,
        )
        assert "internal error" not in message.lower() and "Traceback" not in message, (what, message)
    assert tracebacks(server) == before, (what, message)


JSON_VALUES = {
    "TYPE_INT32": st.integers(-(2**31), 2**31 - 1),
    "TYPE_UINT64": st.integers(0, 2**64 - 1),
    "TYPE_FP32": st.floats(-1e6, 1e6, width=32) | st.sampled_from([0.0, -0.0, 1e-30, 3.4e38]),
    "TYPE_BOOL": st.booleans(),
    "TYPE_STRING": st.text(max_size=30),
}


@st.composite
def json_requests(draw):
    """A generate body with one to three of the BLS's inputs set to any value of their type (JSON: Triton converts)."""
    body = {"text_input": PROMPT, "max_tokens": draw(st.integers(1, 8))}
    for name in draw(st.lists(st.sampled_from(sorted(set(INPUTS) - {"text_input", "stream"})), max_size=3)):
        declared = INPUTS[name]
        value = draw(JSON_VALUES[declared.dtype])
        body[name] = [value] if declared.dims == (-1,) else value
    return body


@settings(max_examples=CASES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(body=json_requests())
def test_any_value_of_any_input_over_http_is_served_or_invalid_arg_by_name(server, beside, body):
    before = tracebacks(server)
    code, text = generate(server, body)
    tried["http"] += 1
    answers[f"HTTP {code} " + (text[:50] if code != 200 else "")] = (
        answers.get(f"HTTP {code} " + (text[:50] if code != 200 else ""), 0) + 1
    )
    assert code in (200, 400), (body, code, text)  # 400: INVALID_ARG; 500 would be an internal error
    if code == 400:
        assert any(name in text for name in body), (body, text)
    assert tracebacks(server) == before, (body, text)


def test_the_server_stayed_healthy_and_the_stream_beside_it_untouched(server, beside):
    thread, outcome, expected = beside
    thread.join(300)
    print(f"\ncases tried: {tried['grpc']} on gRPC streams, {tried['http']} over HTTP generate; answers:")
    for answer, count in sorted(answers.items(), key=lambda item: -item[1]):
        print(f"  {count:4d}  {answer}")
    assert tried["grpc"] == CASES and tried["http"] == CASES
    assert server.ready()
    assert "error" not in outcome, outcome["error"]
    assert outcome["text"] == expected
