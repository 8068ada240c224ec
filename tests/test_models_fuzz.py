"""Every bad input to the repository's other models is refused cleanly (property-based, hypothesis, against the real
server and the tiny pair's repository): preprocessing, postprocessing, tensorrt_llm, tensorrt_llm_draft and the ensemble,
each input they declare (specbuild.contract.tensors) sent with a wrong datatype, a wrong shape, empty, huge, negative,
out of range or not UTF-8, beside a valid request's other inputs. The answer is a whole response or an error naming the
input (Triton's own for a datatype or shape, the model's for a value), never an internal error, never a traceback in
the server log; the server stays ready, and a stream through the BLS running beside the whole run ends with the text
it would have had alone. The number of cases tried per model is printed (pytest -s) and asserted. (The BLS's own
inputs: tests/test_bls_fuzz.py.)
"""

from __future__ import annotations

import numpy as np
import pytest
from fuzz_helpers import OTHER_TYPES, PROMPT, WIRE, stream_beside, tiny_server, tracebacks, value_of
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specbuild.contract import tensors
from specbuild.triton import configs
from specbuild.triton.models import reference_llm

pytestmark = [pytest.mark.server, pytest.mark.slow]
CASES = 160  # hypothesis examples per model
IDS = [5, 6, 7, 8]
VALID = {  # model -> a valid request's required inputs, {name: array} (the batch dimension first)
    "preprocessing": {
        "QUERY": np.array([[PROMPT.encode()]], dtype=object),
        "REQUEST_OUTPUT_LEN": np.array([[4]], np.int32),
    },
    "postprocessing": {
        "TOKENS_BATCH": np.array([[IDS]], np.int32),
        "SEQUENCE_LENGTH": np.array([[len(IDS)]], np.int32),
    },
    "tensorrt_llm": {
        "input_ids": np.array([IDS], np.int32),
        "input_lengths": np.array([[len(IDS)]], np.int32),
        "request_output_len": np.array([[3]], np.int32),
    },
    "ensemble": {
        "text_input": np.array([[PROMPT.encode()]], dtype=object),
        "max_tokens": np.array([[4]], np.int32),
    },
}
VALID["tensorrt_llm_draft"] = VALID["tensorrt_llm"]
DECLARED = {
    "preprocessing": tensors.PRE_INPUTS,
    "postprocessing": tensors.POST_INPUTS,
    "tensorrt_llm": tensors.LLM_INPUTS,
    "tensorrt_llm_draft": tensors.LLM_INPUTS,
    "ensemble": tensors.ENSEMBLE_INPUTS,
}
# The executor's own messages, which the stand-in repeats verbatim (specbuild.contract.executor), name a field in the
# executor's spelling: those count as naming the input.
# So does the C++ backend's refusal of streaming to a model that is not decoupled (reference_llm repeats it).
EXECUTOR_SPELLING = {
    "end_id": "EndId (",
    "input_ids": "Prompt length (",
    "draft_input_ids": "Draft tokens length (",
    "streaming": reference_llm.NOT_DECOUPLED_STREAMING,
    "stream": reference_llm.NOT_DECOUPLED_STREAMING,  # the ensemble's, passed on as tensorrt_llm's streaming
    "runtime_top_k": "topK.value()",  # the executor's sampling assertions (specbuild.contract.sampling)
    "runtime_top_p": "topP.value()",
    "temperature": "temperature.value()",
}
# The ensemble's steps name an input by the composing model's name for it (its input_map: specbuild.triton.configs).
# A value preprocessing passes on reaches tensorrt_llm under a third name: its output's, wired to tensorrt_llm's input.
PREPROCESSED = {  # preprocessing's input -> its output carrying that value on
    "QUERY": "INPUT_ID",
    "REQUEST_OUTPUT_LEN": "REQUEST_OUTPUT_LEN",
    "END_ID": "OUT_END_ID",
    "PAD_ID": "OUT_PAD_ID",
    "BAD_WORDS_DICT": "BAD_WORDS_IDS",
    "STOP_WORDS_DICT": "STOP_WORDS_IDS",
    "EMBEDDING_BIAS_WORDS": "EMBEDDING_BIAS",
    "EMBEDDING_BIAS_WEIGHTS": "EMBEDDING_BIAS",
}
_LLM_INPUT_OF = {wire: name for name, wire in configs._LLM_MAP.items()}
ENSEMBLE_ALIASES: dict[str, set[str]] = {}
for _inner, _outer in {**configs._PRE_MAP, **configs._LLM_MAP}.items():
    ENSEMBLE_ALIASES.setdefault(_outer, set()).add(_inner)
    if _inner in PREPROCESSED:  # and the tensorrt_llm input the preprocessed value arrives at
        ENSEMBLE_ALIASES[_outer].add(_LLM_INPUT_OF[configs._PRE_OUT[PREPROCESSED[_inner]]])
tried = dict.fromkeys(DECLARED, 0)
answers: dict[str, int] = {}  # what the cases got: "served", or the model and the start of the refusal's message


@pytest.fixture(scope="module")
def server(tmp_path_factory, example_tiny):
    with tiny_server(tmp_path_factory.mktemp("models-fuzz"), example_tiny) as handle:
        yield handle


@pytest.fixture(scope="module")
def beside(server):
    """A greedy stream through the BLS that runs beside the fuzzing, and the text it must end with (alone)."""
    yield stream_beside(server)


def _shaped(values: list, dims: tuple[int, ...], dtype) -> np.ndarray:
    """`values` in the declared shape (each -1 taking what is left), with the batch dimension first."""
    if len(dims) == 1:
        return np.array([values], dtype=dtype)
    if dims[0] == -1:  # [-1, -1] or [-1, 3]: one row of the values, or rows of the fixed width
        width = dims[1] if dims[1] > 0 else len(values)
        rows = [values[i : i + width] for i in range(0, len(values) - width + 1, width)] or [values[:width]]
        return np.array([rows], dtype=dtype) if len(rows[0]) == width else np.array([[values]], dtype=dtype)
    return np.array([[values] * dims[0]], dtype=dtype)  # [2, -1]: the rows a word list has


@st.composite
def bad_requests(draw, model: str):
    """(what was done, inputs {name: (array, wire datatype)}): a valid request of `model` with one declared input
    made bad or given an edge value."""
    inputs = {
        name: (array, WIRE["TYPE_STRING" if array.dtype == object else _declared(model, name)][0])
        for name, array in VALID[model].items()
    }
    declared = draw(st.sampled_from(DECLARED[model]))
    datatype, dtype = WIRE[declared.dtype]
    how = draw(st.sampled_from(["value", "datatype", "shape", "empty", "several", "huge"]))
    if how == "datatype":
        datatype, dtype = draw(st.sampled_from([t for t in OTHER_TYPES if t[0] != datatype]))
        raw = value_of("TYPE_STRING" if dtype is object else "TYPE_INT32", draw)
        if dtype is np.bool_:
            raw = bool(raw)
        elif dtype is not object:
            raw = int(raw) % 100
        array = _shaped([raw], declared.dims, dtype)
    elif how == "huge" and dtype is not object:
        array = _shaped([value_of(declared.dtype, draw)] * 20_000, declared.dims, dtype)
    else:
        count = draw(st.integers(2, 4)) if how == "several" else 1
        array = _shaped([value_of(declared.dtype, draw) for _ in range(count)], declared.dims, dtype)
        if how == "shape":
            array = array.reshape(*array.shape, 1)
        elif how == "empty":
            array = array[..., :0]
    inputs[declared.name] = (array, datatype)
    return f"{declared.name}: {how}", inputs


def _declared(model: str, name: str) -> str:
    return next(t.dtype for t in DECLARED[model] if t.name == name)


def answer(server, model: str, inputs: dict) -> str | None:
    """One inference: None when it was answered with outputs, else the error's message."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        sent = []
        for name, (value, datatype) in inputs.items():
            sent.append(grpcclient.InferInput(name, list(value.shape), datatype))
            sent[-1].set_data_from_numpy(value)
        client.infer(model, sent, client_timeout=120)
        return None
    except InferenceServerException as err:
        return err.message()
    finally:
        client.close()


def check_case(server, model: str, what: str, inputs: dict) -> None:
    before = tracebacks(server)
    message = answer(server, model, inputs)
    tried[model] += 1
    key = f"{model}: {message[:70]}" if message else f"{model}: served"
    answers[key] = answers.get(key, 0) + 1
    if message is not None:
        name = what.split(":")[0]
        aliases = {n: {n, *ENSEMBLE_ALIASES.get(n, ())} for n in inputs}
        spellings = {n: {EXECUTOR_SPELLING.get(a, a) for a in said} | said for n, said in aliases.items()}
        named = [n for n, said in spellings.items() if any(word in message for word in said)]
        assert name in named, (model, what, message)  # the input made bad is the one the answer names
        assert "internal error" not in message.lower() and "Traceback" not in message, (model, what, message)
    assert tracebacks(server) == before, (model, what, message)


@pytest.mark.parametrize("model", list(DECLARED))
def test_every_declared_input_sent_bad_is_refused_by_name_or_served(server, beside, model):
    @settings(max_examples=CASES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(case=bad_requests(model))
    def cases(case):
        check_case(server, model, *case)

    cases()


def test_the_server_stayed_healthy_and_the_stream_beside_it_untouched(server, beside):
    thread, outcome, expected = beside
    thread.join(300)
    print("\ncases tried: " + ", ".join(f"{n} on {model}" for model, n in tried.items()) + "; answers:")
    for text, count in sorted(answers.items(), key=lambda item: -item[1]):
        print(f"  {count:4d}  {text}")
    assert all(n == CASES for n in tried.values()), tried
    assert server.ready()
    assert "error" not in outcome, outcome["error"]
    assert outcome["text"] == expected
