"""NVIDIA's own clients work unchanged against the served repository (tiny example pair, real CPU tritonserver).

The requests below carry exactly the input sets that NVIDIA's client tools send (NVIDIA/TensorRT-LLM
`triton_backend/tools/inflight_batcher_llm/end_to_end_test.py` `test_functionality_ifb`, and
`triton_backend/inflight_batcher_llm/client/end_to_end_grpc_client.py` / `e2e_grpc_speculative_decoding_client.py`
as `speculative_decoding_test.py` calls them), and read the outputs the way those tools read them
(`OUTPUT[0].decode()`, `output_ids` squeezed on axes 0 and 1, `sequence_length[0, 0]`). The code is
written here from those input lists; none of NVIDIA's code is copied.

The BLS is deployed non-decoupled, as in NVIDIA's draft/target recipe, because the end-to-end test calls it
with a plain (unary) infer. The same server carries two deliberately wrong models, to show the reference
model refusing what the C++ backend refuses.
"""

from __future__ import annotations

import dataclasses
import json
import queue
import shutil
from pathlib import Path

import numpy as np
import pytest

from specbuild.errors import ServeError
from specbuild.triton.server import ServerHandle, ServerOptions
from triton_helpers import make_deployment, serving

pytestmark = [pytest.mark.server, pytest.mark.slow]
PROMPTS = ["def add(a, b):", '{"name": ', "import os\nimport sys\n"]
OUTPUT_LEN = 12
FP32_MODEL = "tensorrt_llm_declared_fp32"  # declares TYPE_FP32 logits over a float16-logits engine


def _with_wrong_logits_type(repo: Path) -> None:
    from specbuild.contract import pbtxt

    config = pbtxt.parse_pbtxt((repo / "tensorrt_llm" / "config.pbtxt").read_text())
    config.name = FP32_MODEL
    for entry in [*config.input, *config.output]:
        if entry.name in ("draft_logits", "context_logits", "generation_logits"):
            entry.data_type = pbtxt.config_proto().DataType.Value("TYPE_FP32")
    (repo / FP32_MODEL / "1").mkdir(parents=True)
    (repo / FP32_MODEL / "config.pbtxt").write_text(pbtxt.to_pbtxt(config))
    shutil.copy(repo / "tensorrt_llm" / "1" / "model.py", repo / FP32_MODEL / "1" / "model.py")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, example_tiny):
    from specbuild.triton.repository import write_repository

    dep = make_deployment(tmp_path_factory.mktemp("nvidia-clients"), example_tiny)
    spec = dataclasses.replace(dep.spec, serve=dataclasses.replace(dep.spec.serve, decoupled=False))
    write_repository(spec, "reference", dep.repo, force=True)
    _with_wrong_logits_type(dep.repo)
    return dep


@pytest.fixture(scope="module")
def server(deployment):
    with serving(deployment.repo, deployment.root / "server.log") as handle:
        yield handle


@pytest.fixture(scope="module")
def grpc(server):
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


def tensors(values: dict[str, np.ndarray]) -> list:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    out = []
    for name, value in values.items():
        tensor = grpcclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
        tensor.set_data_from_numpy(value)
        out.append(tensor)
    return out


def infer(grpc, model: str, values: dict[str, np.ndarray]):
    return grpc.infer(model, tensors(values))


def streamed(grpc, model: str, values: dict[str, np.ndarray]) -> str:
    """One request over the gRPC stream, as end_to_end_grpc_client.run_inference sends it (not streaming)."""
    answers: queue.Queue = queue.Queue()
    grpc.start_stream(callback=lambda result=None, error=None: answers.put((result, error)))
    try:
        grpc.async_stream_infer(model, tensors(values), request_id="1")
        result, error = answers.get(timeout=300)
    finally:
        grpc.stop_stream()
    assert error is None, error
    return result.as_numpy("text_output")[0].decode("utf-8")


def text(prompt: str) -> np.ndarray:
    return np.array([[prompt]], dtype=object)


def scalar(value, dtype) -> np.ndarray:
    return np.array([[value]], dtype=dtype)


# --- end_to_end_test.py, test_functionality_ifb --------------------------------------------------------

def test_end_to_end_models_by_hand_then_ensemble_then_bls_agree(grpc):
    for prompt in PROMPTS:
        pre = infer(grpc, "preprocessing", {"QUERY": text(prompt), "BAD_WORDS_DICT": text(""),
                                            "STOP_WORDS_DICT": text(""),
                                            "REQUEST_OUTPUT_LEN": scalar(OUTPUT_LEN, np.int32)})
        llm = infer(grpc, "tensorrt_llm", {
            "input_ids": pre.as_numpy("INPUT_ID"), "decoder_input_ids": pre.as_numpy("DECODER_INPUT_ID"),
            "input_lengths": pre.as_numpy("REQUEST_INPUT_LEN"), "request_output_len": pre.as_numpy("REQUEST_OUTPUT_LEN"),
            "end_id": pre.as_numpy("OUT_END_ID"), "pad_id": pre.as_numpy("OUT_PAD_ID")})
        post = infer(grpc, "postprocessing", {"TOKENS_BATCH": llm.as_numpy("output_ids").astype(np.int32),
                                              "SEQUENCE_LENGTH": llm.as_numpy("sequence_length")})
        by_hand = post.as_numpy("OUTPUT")
        assert by_hand.shape == (1,) and by_hand[0].decode().startswith(prompt[:3])  # one string, prompt included
        request = {"text_input": text(prompt), "max_tokens": scalar(OUTPUT_LEN, np.int32),
                   "bad_words": text(""), "stop_words": text("")}
        ensemble = infer(grpc, "ensemble", request).as_numpy("text_output")
        bls = infer(grpc, "tensorrt_llm_bls", request).as_numpy("text_output")
        assert by_hand == ensemble and by_hand == bls, (prompt, by_hand, ensemble, bls)


# --- speculative_decoding_test.py: the control, the BLS, and client-side speculation ------------------------

def run_inference_inputs(prompt: str, **extra) -> dict[str, np.ndarray]:
    """end_to_end_grpc_client.prepare_inputs as the speculative-decoding test calls it: neutral values included."""
    return {"text_input": text(prompt), "max_tokens": scalar(OUTPUT_LEN, np.int32), "stream": scalar(False, bool),
            "beam_width": scalar(1, np.int32), "temperature": scalar(1.0, np.float32),
            "embedding_bias_words": np.empty((1, 0), dtype=object),
            "embedding_bias_weights": np.empty((1, 0), dtype=np.float32),
            "exclude_input_in_output": scalar(False, bool), **extra}


def client_side_speculation(grpc, prompt: str, k: int) -> str:
    """e2e_grpc_speculative_decoding_client's loop: preprocessing, then draft / target calls, then postprocessing."""
    pre = infer(grpc, "preprocessing", {"QUERY": text(prompt), "REQUEST_OUTPUT_LEN": scalar(OUTPUT_LEN, np.int32)})
    prompt_ids = np.squeeze(pre.as_numpy("INPUT_ID").astype(np.int32), axis=0)
    common = {"bad_words_list": pre.as_numpy("BAD_WORDS_IDS").astype(np.int32),
              "stop_words_list": pre.as_numpy("STOP_WORDS_IDS").astype(np.int32),
              "beam_width": scalar(1, np.int32), "temperature": scalar(1.0, np.float32),
              "end_id": scalar(pre.as_numpy("OUT_END_ID")[0][0], np.int32),
              "pad_id": scalar(pre.as_numpy("OUT_PAD_ID")[0][0], np.int32)}

    def call(model: str, ids: np.ndarray, output_len: int, draft: np.ndarray | None = None):
        values = {"input_ids": ids[None], "input_lengths": scalar(len(ids), np.int32),
                  "request_output_len": scalar(output_len, np.int32), **common}
        if draft is not None:
            values["draft_input_ids"] = np.array([draft], dtype=np.int32)
        result = infer(grpc, model, values)
        lengths = result.as_numpy("sequence_length")
        assert lengths.shape == (1, 1)
        return np.squeeze(result.as_numpy("output_ids").astype(np.int32), axis=(0, 1)), int(lengths[0, 0])

    ids, drafted = prompt_ids, None
    while True:
        n = min(k, len(prompt_ids) + OUTPUT_LEN - len(ids) - 1)
        draft = None
        if n > 0:
            drafted, length = call("tensorrt_llm_draft", ids, n)
            draft = drafted[len(ids):length]
        previous, (ids, _) = ids, call("tensorrt_llm", ids, len(draft) + 1 if n > 0 else 1, draft if n > 0 else None)
        if (len(ids) >= len(prompt_ids) + OUTPUT_LEN or (drafted is not None and np.array_equal(drafted, ids))
                or np.array_equal(previous, ids)):
            break
    post = infer(grpc, "postprocessing", {"TOKENS_BATCH": ids[None, None].astype(np.int32),
                                          "SEQUENCE_LENGTH": scalar(len(ids), np.int32)})
    return post.as_numpy("OUTPUT")[0].decode("utf8")


def test_speculative_decoding_test_inputs_give_the_control_output(grpc):
    for prompt in PROMPTS:
        control = streamed(grpc, "ensemble", run_inference_inputs(prompt))
        assert control.startswith(prompt[:3])
        bls = streamed(grpc, "tensorrt_llm_bls", run_inference_inputs(
            prompt, num_draft_tokens=scalar(5, np.int32), use_draft_logits=scalar(False, bool)))
        assert bls == control, prompt
        assert client_side_speculation(grpc, prompt, 5) == control, prompt


def test_sampling_with_draft_logits_sends_them_in_the_declared_type(grpc, deployment):
    """The engines' logits are float16 (the checkpoint's logits_dtype): generation_logits come back as FP16
    and the BLS hands them to the target's TYPE_FP16 draft_logits input (Triton refuses any other type)."""
    engine = json.loads((deployment.spec.pair_dir / "target" / "engine" / "engine.json").read_text())
    assert engine["logits_dtype"] == "float16"
    draft = infer(grpc, "tensorrt_llm_draft", {"input_ids": np.array([[5, 6, 7]], np.int32),
                                               "input_lengths": scalar(3, np.int32),
                                               "request_output_len": scalar(2, np.int32),
                                               "return_generation_logits": scalar(True, bool)})
    assert draft.as_numpy("generation_logits").dtype == np.float16
    inputs = run_inference_inputs(PROMPTS[0], num_draft_tokens=scalar(3, np.int32), use_draft_logits=scalar(True, bool),
                                  top_p=scalar(0.9, np.float32), seed=scalar(3, np.uint64))
    assert streamed(grpc, "tensorrt_llm_bls", inputs) == streamed(grpc, "tensorrt_llm_bls", inputs)


def test_ensemble_passes_generation_logits_on_in_the_declared_type(grpc):
    """end_to_end_test.py --return-generation-logits: [1, beam, output length, vocab] from the ensemble."""
    import tritonclient.grpc as grpcclient

    request = {"text_input": text(PROMPTS[1]), "max_tokens": scalar(4, np.int32),
               "return_generation_logits": scalar(True, bool)}
    outputs = [grpcclient.InferRequestedOutput(name) for name in ("text_output", "generation_logits")]
    logits = grpc.infer("ensemble", tensors(request), outputs=outputs).as_numpy("generation_logits")
    assert logits.dtype == np.float16 and logits.ndim == 4 and logits.shape[:2] == (1, 1) and logits.shape[3] > 0


def test_a_declared_logits_type_other_than_the_engines_fails_the_response(grpc):
    from tritonclient.utils import InferenceServerException

    request = {"input_ids": np.array([[5, 6, 7]], np.int32), "input_lengths": scalar(3, np.int32),
               "request_output_len": scalar(2, np.int32)}
    assert infer(grpc, FP32_MODEL, request).as_numpy("sequence_length").tolist() == [[5]]  # no logits: served
    with pytest.raises(InferenceServerException, match=r"Assertion failed: generationLogitsType == "
                                                        r"model_state_->getLogitsDataType\(\)"):
        infer(grpc, FP32_MODEL, {**request, "return_generation_logits": scalar(True, bool)})


def test_a_config_without_a_required_parameter_does_not_load(deployment):
    """model_instance_state.cc reads tokenizer_dir with no fallback: the model fails to load with its message."""
    from specbuild.contract import pbtxt

    broken = deployment.root / "broken_repo"
    shutil.copytree(deployment.repo / "tensorrt_llm", broken / "tensorrt_llm")
    config = pbtxt.parse_pbtxt((broken / "tensorrt_llm" / "config.pbtxt").read_text())
    del config.parameters["tokenizer_dir"]
    (broken / "tensorrt_llm" / "config.pbtxt").write_text(pbtxt.to_pbtxt(config))
    handle = ServerHandle(ServerOptions(repo=broken), log_path=deployment.root / "broken.log")
    with pytest.raises(ServeError, match="Cannot find parameter with name: tokenizer_dir"):
        handle.start(timeout=300)
