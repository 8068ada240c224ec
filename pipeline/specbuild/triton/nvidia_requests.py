"""The requests NVIDIA's own client tools send to a TensorRT-LLM Triton repository, and how they read the answers.

Written here from those tools' input lists (NVIDIA/TensorRT-LLM `triton_backend/inflight_batcher_llm/client/
end_to_end_grpc_client.py` @ 2a9abd9, `e2e_grpc_speculative_decoding_client.py` @ 7ed07f0, and
`triton_backend/tools/inflight_batcher_llm/speculative_decoding_test.py` @ 1cee55d, which calls them); none of
NVIDIA's code is copied. NVIDIA's speculative-decoding test asserts that three ways of generating give the same
text: the ensemble (the control, no speculation), the BLS with `num_draft_tokens`, and client-side speculation (the
client calls `tensorrt_llm_draft` and `tensorrt_llm` itself, step by step). `speculative_decoding_check` makes
that check against a served repository; `specbuild selftest` runs it ("NVIDIA's client requests"), and
tests/test_triton_nvidia_clients.py uses the same requests on CPU.

Every function takes a `tritonclient.grpc.InferenceServerClient`.
"""

from __future__ import annotations

import queue
from typing import Any

import numpy as np

from specbuild.contract import models

OUTPUT_LEN = 12  # tokens per request, as small as NVIDIA's test runs use
SPECULATIVE_K = 5  # the draft length NVIDIA's speculative-decoding test sends


def text(prompt: str) -> np.ndarray:
    return np.array([[prompt]], dtype=object)


def scalar(value: Any, dtype: Any) -> np.ndarray:
    return np.array([[value]], dtype=dtype)


def tensors(values: dict[str, np.ndarray]) -> list:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    out = []
    for name, value in values.items():
        tensor = grpcclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
        tensor.set_data_from_numpy(value)
        out.append(tensor)
    return out


def infer(client, model: str, values: dict[str, np.ndarray]):
    """One unary request (as the tools call preprocessing, the engines and postprocessing)."""
    return client.infer(model, tensors(values))


def streamed(client, model: str, values: dict[str, np.ndarray], timeout: float = 300.0) -> str:
    """One request over the gRPC stream, as end_to_end_grpc_client's run_inference sends it (not streaming): the
    text of its response. Raises RuntimeError with the server's message when the response is an error."""
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result=None, error=None: answers.put((result, error)))
    try:
        client.async_stream_infer(model, tensors(values), request_id="1")
        result, error = answers.get(timeout=timeout)
    finally:
        client.stop_stream()
    if error is not None:
        raise RuntimeError(f"{model}: {error}")
    return result.as_numpy("text_output")[0].decode("utf-8")


def run_inference_inputs(prompt: str, output_len: int = OUTPUT_LEN, **extra: np.ndarray) -> dict[str, np.ndarray]:
    """end_to_end_grpc_client.prepare_inputs as the speculative-decoding test calls it: neutral values included."""
    return {
        "text_input": text(prompt),
        "max_tokens": scalar(output_len, np.int32),
        "stream": scalar(False, bool),
        "beam_width": scalar(1, np.int32),
        "temperature": scalar(1.0, np.float32),
        "embedding_bias_words": np.empty((1, 0), dtype=object),
        "embedding_bias_weights": np.empty((1, 0), dtype=np.float32),
        "exclude_input_in_output": scalar(False, bool),
        **extra,
    }


def client_side_speculation(client, prompt: str, k: int, output_len: int = OUTPUT_LEN) -> str:
    """e2e_grpc_speculative_decoding_client's loop: preprocessing, then draft / target calls, then postprocessing."""
    pre = infer(client, "preprocessing", {"QUERY": text(prompt), "REQUEST_OUTPUT_LEN": scalar(output_len, np.int32)})
    prompt_ids = np.squeeze(pre.as_numpy("INPUT_ID").astype(np.int32), axis=0)
    common = {
        "bad_words_list": pre.as_numpy("BAD_WORDS_IDS").astype(np.int32),
        "stop_words_list": pre.as_numpy("STOP_WORDS_IDS").astype(np.int32),
        "beam_width": scalar(1, np.int32),
        "temperature": scalar(1.0, np.float32),
        "end_id": scalar(pre.as_numpy("OUT_END_ID")[0][0], np.int32),
        "pad_id": scalar(pre.as_numpy("OUT_PAD_ID")[0][0], np.int32),
    }

    def call(model: str, ids: np.ndarray, length: int, draft: np.ndarray | None = None) -> tuple[np.ndarray, int]:
        values = {
            "input_ids": ids[None],
            "input_lengths": scalar(len(ids), np.int32),
            "request_output_len": scalar(length, np.int32),
            **common,
        }
        if draft is not None:
            values["draft_input_ids"] = np.array([draft], dtype=np.int32)
        result = infer(client, model, values)
        lengths = result.as_numpy("sequence_length")  # [1, 1]
        return np.squeeze(result.as_numpy("output_ids").astype(np.int32), axis=(0, 1)), int(lengths[0, 0])

    ids, drafted = prompt_ids, None
    while True:
        n = min(k, len(prompt_ids) + output_len - len(ids) - 1)
        draft = None
        if n > 0:
            drafted, length = call("tensorrt_llm_draft", ids, n)
            draft = drafted[len(ids) : length]
        previous, (ids, _) = ids, call("tensorrt_llm", ids, len(draft) + 1 if n > 0 else 1, draft if n > 0 else None)
        if (
            len(ids) >= len(prompt_ids) + output_len
            or (drafted is not None and np.array_equal(drafted, ids))
            or np.array_equal(previous, ids)
        ):
            break
    post = infer(
        client,
        "postprocessing",
        {"TOKENS_BATCH": ids[None, None].astype(np.int32), "SEQUENCE_LENGTH": scalar(len(ids), np.int32)},
    )
    return post.as_numpy("OUTPUT")[0].decode("utf8")


def speculative_decoding_check(
    client, prompt: str, k: int = SPECULATIVE_K, output_len: int = OUTPUT_LEN
) -> dict[str, str]:
    """NVIDIA's speculative-decoding test for one prompt: the texts of the control (ensemble), the BLS at K and
    client-side speculation at K; they must be equal."""
    return {
        "ensemble": streamed(client, "ensemble", run_inference_inputs(prompt, output_len)),
        "bls": streamed(
            client,
            models.BLS,
            run_inference_inputs(
                prompt, output_len, num_draft_tokens=scalar(k, np.int32), use_draft_logits=scalar(False, bool)
            ),
        ),
        "client-side": client_side_speculation(client, prompt, k, output_len),
    }
