"""NVIDIA's own clients work unchanged against the served repository (tiny example pair, real CPU tritonserver).

The requests below carry exactly the input sets that NVIDIA's client tools send (NVIDIA/TensorRT-LLM
`triton_backend/tools/inflight_batcher_llm/end_to_end_test.py` `test_functionality_ifb` here, and
`end_to_end_grpc_client.py` / `e2e_grpc_speculative_decoding_client.py` as `speculative_decoding_test.py` calls them
in `specbuild.triton.nvidia_requests`, which `specbuild selftest` sends on a GPU), and read the outputs the way
those tools read them (`OUTPUT[0].decode()`, `output_ids` squeezed on axes 0 and 1, `sequence_length[0, 0]`).
The code is written here from those input lists; none of NVIDIA's code is copied.

The BLS is deployed non-decoupled, as in NVIDIA's draft/target recipe, because the end-to-end test calls it
with a plain (unary) infer. The same server carries two deliberately wrong models, to show the reference
model refusing what the C++ backend refuses.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from triton_helpers import make_deployment, serving

from specbuild.errors import ServeError
from specbuild.triton.nvidia_requests import (
    OUTPUT_LEN,
    infer,
    run_inference_inputs,
    scalar,
    speculative_decoding_check,
    streamed,
    tensors,
    text,
)
from specbuild.triton.server import ServerHandle, ServerOptions

pytestmark = [pytest.mark.server, pytest.mark.slow]
PROMPTS = ["def add(a, b):", '{"name": ', "import os\nimport sys\n"]
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


# --- end_to_end_test.py, test_functionality_ifb --------------------------------------------------------


def test_end_to_end_models_by_hand_then_ensemble_then_bls_agree(grpc):
    for prompt in PROMPTS:
        pre = infer(
            grpc,
            "preprocessing",
            {
                "QUERY": text(prompt),
                "BAD_WORDS_DICT": text(""),
                "STOP_WORDS_DICT": text(""),
                "REQUEST_OUTPUT_LEN": scalar(OUTPUT_LEN, np.int32),
            },
        )
        llm = infer(
            grpc,
            "tensorrt_llm",
            {
                "input_ids": pre.as_numpy("INPUT_ID"),
                "decoder_input_ids": pre.as_numpy("DECODER_INPUT_ID"),
                "input_lengths": pre.as_numpy("REQUEST_INPUT_LEN"),
                "request_output_len": pre.as_numpy("REQUEST_OUTPUT_LEN"),
                "end_id": pre.as_numpy("OUT_END_ID"),
                "pad_id": pre.as_numpy("OUT_PAD_ID"),
            },
        )
        post = infer(
            grpc,
            "postprocessing",
            {
                "TOKENS_BATCH": llm.as_numpy("output_ids").astype(np.int32),
                "SEQUENCE_LENGTH": llm.as_numpy("sequence_length"),
            },
        )
        by_hand = post.as_numpy("OUTPUT")
        assert by_hand.shape == (1,) and by_hand[0].decode().startswith(prompt[:3])  # one string, prompt included
        request = {
            "text_input": text(prompt),
            "max_tokens": scalar(OUTPUT_LEN, np.int32),
            "bad_words": text(""),
            "stop_words": text(""),
        }
        ensemble = infer(grpc, "ensemble", request).as_numpy("text_output")
        bls = infer(grpc, "tensorrt_llm_bls", request).as_numpy("text_output")
        assert by_hand == ensemble and by_hand == bls, (prompt, by_hand, ensemble, bls)


# --- speculative_decoding_test.py: the control, the BLS, and client-side speculation ------------------------


def test_speculative_decoding_test_inputs_give_the_control_output(grpc):
    for prompt in PROMPTS:
        texts = speculative_decoding_check(grpc, prompt)
        assert texts["ensemble"].startswith(prompt[:3])
        assert texts["bls"] == texts["ensemble"] and texts["client-side"] == texts["ensemble"], (prompt, texts)


def test_sampling_with_draft_logits_sends_them_in_the_declared_type(grpc, deployment):
    """The engines' logits are float16 (the checkpoint's logits_dtype): generation_logits come back as FP16
    and the BLS hands them to the target's TYPE_FP16 draft_logits input (Triton refuses any other type)."""
    engine = json.loads((deployment.spec.pair_dir / "target" / "engine" / "engine.json").read_text())
    assert engine["logits_dtype"] == "float16"
    draft = infer(
        grpc,
        "tensorrt_llm_draft",
        {
            "input_ids": np.array([[5, 6, 7]], np.int32),
            "input_lengths": scalar(3, np.int32),
            "request_output_len": scalar(2, np.int32),
            "return_generation_logits": scalar(True, bool),
        },
    )
    assert draft.as_numpy("generation_logits").dtype == np.float16
    inputs = run_inference_inputs(
        PROMPTS[0],
        num_draft_tokens=scalar(3, np.int32),
        use_draft_logits=scalar(True, bool),
        top_p=scalar(0.9, np.float32),
        seed=scalar(3, np.uint64),
    )
    assert streamed(grpc, "tensorrt_llm_bls", inputs) == streamed(grpc, "tensorrt_llm_bls", inputs)


def test_ensemble_passes_generation_logits_on_in_the_declared_type(grpc):
    """end_to_end_test.py --return-generation-logits: [1, beam, output length, vocab] from the ensemble."""
    import tritonclient.grpc as grpcclient

    request = {
        "text_input": text(PROMPTS[1]),
        "max_tokens": scalar(4, np.int32),
        "return_generation_logits": scalar(True, bool),
    }
    outputs = [grpcclient.InferRequestedOutput(name) for name in ("text_output", "generation_logits")]
    logits = grpc.infer("ensemble", tensors(request), outputs=outputs).as_numpy("generation_logits")
    assert logits.dtype == np.float16 and logits.ndim == 4 and logits.shape[:2] == (1, 1) and logits.shape[3] > 0


def test_a_declared_logits_type_other_than_the_engines_fails_the_response(grpc):
    from tritonclient.utils import InferenceServerException

    request = {
        "input_ids": np.array([[5, 6, 7]], np.int32),
        "input_lengths": scalar(3, np.int32),
        "request_output_len": scalar(2, np.int32),
    }
    assert infer(grpc, FP32_MODEL, request).as_numpy("sequence_length").tolist() == [[5]]  # no logits: served
    with pytest.raises(
        InferenceServerException,
        match=r"Assertion failed: generationLogitsType == "
        r"model_state_->getLogitsDataType\(\)",
    ):
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
