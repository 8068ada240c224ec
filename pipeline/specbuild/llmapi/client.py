"""The public client (`specbuild.triton.client.SpecbuildClient`) against Triton's llmapi model.

`SpecbuildClient` finds out once per client whether the server runs the llmapi model (no
tensorrt_llm_bls, and a tensorrt_llm model whose inputs are NVIDIA's llmapi ones) and then sends its
requests through `generate` here, so `specbuild generate`, `bench --url` and user code work unchanged:

    client field          llmapi input (contract INPUTS)
    max_tokens            sampling_param_max_tokens
    temperature/top_k/top_p/seed   sampling_param_<same>
    stream                streaming
    exclude_input_in_output   sampling_param_exclude_input_from_output (sent true unless asked: chunks
                          carry new text, as from the BLS; NVIDIA's default would repeat the prompt)
    stop_words            sampling_param_stop
    num_draft_tokens      none: the LLM API drafts its configured max_draft_len at every step; ignored

Every request asks for finish_reason, stop_reason and the perf metrics. The model streams cumulative text;
the chunks carry the difference. The final chunk's stats hold the metrics as numbers (they arrive as
strings), `finish_reason`, and `num_output_tokens`: the llmapi contract sends no token ids, so it is
max_tokens when the finish reason is "length" (the LLM API's meaning of it; a request clamped by
max_seq_len would count fewer), else the generated text re-tokenized with `count_tokens`, when given.
"""

from __future__ import annotations

import json
import queue
import urllib.error
import urllib.request
import uuid
from typing import Any, Iterator

import numpy as np

from specbuild.errors import ClientError
from specbuild.llmapi import contract

FIELDS = {  # client field -> (llmapi input, Triton datatype, numpy dtype)
    "max_tokens": ("sampling_param_max_tokens", "INT32", np.int32),
    "temperature": ("sampling_param_temperature", "FP32", np.float32),
    "top_k": ("sampling_param_top_k", "INT32", np.int32),
    "top_p": ("sampling_param_top_p", "FP32", np.float32),
    "seed": ("sampling_param_seed", "UINT64", np.uint64),
    "stream": ("streaming", "BOOL", np.bool_),
    "exclude_input_in_output": ("sampling_param_exclude_input_from_output", "BOOL", np.bool_),
    "return_perf_metrics": ("sampling_param_return_perf_metrics", "BOOL", np.bool_),
}
IGNORED = ("num_draft_tokens",)
ALWAYS = {"return_finish_reason": True, "return_stop_reason": True, "sampling_param_return_perf_metrics": True}
NUMBERS = {"acceptance_rate": float, "kv_cache_hit_rate": float, "cumulative_logprob": float}


def model_config(client, model: str) -> dict[str, Any] | None:
    """The model's config as JSON, or None when the server has no such model."""
    if client.protocol == "grpc":
        try:
            return client._grpc_client().get_model_config(model, as_json=True).get("config", {})
        except Exception:  # noqa: BLE001 - tritonclient raises InferenceServerException for a missing model
            return None
    try:
        with urllib.request.urlopen(f"http://{client.url}/v2/models/{model}/config", timeout=30) as response:
            return json.loads(response.read().decode())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def is_llmapi_config(config: dict[str, Any] | None) -> bool:
    names = {item.get("name") for item in (config or {}).get("input", [])}
    return "sampling_param_max_tokens" in names and "text_input" in names


def detect(client) -> str | None:
    """The llmapi model to use instead of client.model, or None when the server serves that model itself."""
    if client.model not in ("tensorrt_llm_bls", contract.MODEL_NAME):
        return None
    if client.model == contract.MODEL_NAME:
        return contract.MODEL_NAME if is_llmapi_config(model_config(client, contract.MODEL_NAME)) else None
    if model_config(client, "tensorrt_llm_bls") is not None:
        return None
    return contract.MODEL_NAME if is_llmapi_config(model_config(client, contract.MODEL_NAME)) else None


def request_inputs(fields: dict[str, Any], stop_words: list[str]) -> dict[str, Any]:
    """llmapi input name -> (value, Triton datatype, numpy dtype); the request's fields translated."""
    unknown = [k for k in fields if k not in FIELDS and k not in IGNORED]
    if unknown:
        raise ClientError(f"request field(s) {unknown} have no input in Triton's llmapi model; known are "
                          f"{sorted(FIELDS)}.")
    fields = {"exclude_input_in_output": True, **fields}
    inputs: dict[str, Any] = {}
    for key, value in fields.items():
        if key in FIELDS:
            name, datatype, dtype = FIELDS[key]
            inputs[name] = (value, datatype, dtype)
    for name, value in ALWAYS.items():
        inputs[name] = (value, "BOOL", np.bool_)
    if stop_words:
        inputs["sampling_param_stop"] = (stop_words, "BYTES", object)
    return inputs


def _stats(outputs: dict[str, Any], text: str, count_tokens, max_tokens: int | None) -> dict[str, Any]:
    stats: dict[str, Any] = {}
    for name in ("finish_reason", "stop_reason", *contract.PERF_OUTPUTS, "cumulative_logprob"):
        value = outputs.get(name)
        if value is None:
            continue
        item = np.asarray(value).reshape(-1)
        if not item.size:
            continue
        raw = item[0].decode("utf-8", "replace") if isinstance(item[0], bytes) else str(item[0])
        if name in ("finish_reason", "stop_reason"):
            stats[name] = raw
        elif raw == contract.NOT_FINISHED:
            stats[name] = None
        else:
            stats[name] = NUMBERS.get(name, int)(float(raw) if name in NUMBERS else raw)
    if stats.get("finish_reason") == "length" and max_tokens is not None:
        stats["num_output_tokens"] = int(max_tokens)
    elif count_tokens is not None:
        stats["num_output_tokens"] = int(count_tokens(text))
    return stats


def generate(client, prompt: str, fields: dict[str, Any], stop_words: list[str]) -> Iterator[Any]:
    from specbuild.triton.client import Chunk

    inputs = request_inputs(fields, stop_words)
    stream = bool(fields.get("stream", False))
    responses = _grpc(client, prompt, inputs) if client.protocol == "grpc" else _http(client, prompt, inputs, stream)
    shown = ""
    count = getattr(client, "count_tokens", None)
    for outputs, final in responses:
        text = _text(outputs.get("text_output"))
        delta = text[len(shown):] if text.startswith(shown) else text
        shown = text
        if delta or final:
            yield Chunk(delta, final, _stats(outputs, text, count, fields.get("max_tokens")) if final else {})
        if final:
            return


def _text(value: Any) -> str:
    if value is None:
        return ""
    item = np.asarray(value).reshape(-1)
    if not item.size:
        return ""
    return item[0].decode("utf-8", "replace") if isinstance(item[0], bytes) else str(item[0])


def _grpc(client, prompt: str, inputs: dict[str, Any]) -> Iterator[tuple[dict[str, Any], bool]]:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    tensors = [client._grpc_input(grpcclient, "text_input", np.array([prompt.encode("utf-8")], dtype=object), "BYTES")]
    for name, (value, datatype, dtype) in inputs.items():
        array = np.array([w.encode("utf-8") for w in value], dtype=object) if datatype == "BYTES" \
            else np.array([value], dtype=dtype)
        tensors.append(client._grpc_input(grpcclient, name, array, datatype))
    results: queue.Queue = queue.Queue()
    grpc = client._grpc_client()
    try:
        grpc.start_stream(callback=lambda result=None, error=None: results.put((result, error)))
        grpc.async_stream_infer(client.model, tensors, request_id=uuid.uuid4().hex, enable_empty_final_response=True)
        while True:
            try:
                result, error = results.get(timeout=client.timeout)
            except queue.Empty:
                raise ClientError(f"no response from {client.model} at {client.url} within {client.timeout:.0f} s.") from None
            if error is not None:
                raise ClientError(f"{client.model}: {error.message() if hasattr(error, 'message') else error}")
            response = result.get_response()
            final = response.parameters["triton_final_response"].bool_param \
                if "triton_final_response" in response.parameters else True
            # Before the end only the text is read (every response repeats the metrics; the last one counts).
            names = [o.name for o in response.outputs if final or o.name == "text_output"]
            yield {name: result.as_numpy(name) for name in names}, final
            if final:
                return
    except InferenceServerException as err:
        raise ClientError(f"{client.model} at {client.url}: {err.message()}") from None
    finally:
        try:
            grpc.stop_stream()
        except Exception:  # noqa: BLE001 - already closed by the failure above
            pass


def _http(client, prompt: str, inputs: dict[str, Any], stream: bool) -> Iterator[tuple[dict[str, Any], bool]]:
    """Triton's generate extension: one JSON object per request; server-sent events for generate_stream."""
    from specbuild.triton.client import _http_error

    body: dict[str, Any] = {"text_input": prompt}
    for name, (value, _, dtype) in inputs.items():
        body[name] = value if dtype is object else np.array(value, dtype=dtype).item()
    endpoint = "generate_stream" if stream else "generate"
    request = urllib.request.Request(f"http://{client.url}/v2/models/{client.model}/{endpoint}",
                                     data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        response = urllib.request.urlopen(request, timeout=client.timeout)
    except urllib.error.HTTPError as err:
        raise ClientError(f"{client.model}: {_http_error(err)}") from None
    except (urllib.error.URLError, OSError) as err:
        raise ClientError(f"cannot reach {client.url}: {err}") from None
    with response:
        if not stream:
            outputs = json.loads(response.read().decode())
            if "error" in outputs:
                raise ClientError(f"{client.model}: {outputs['error']}")
            yield _as_arrays(outputs), True
            return
        last = None
        for raw in response:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            outputs = json.loads(line[5:])
            if "error" in outputs:
                raise ClientError(f"{client.model}: {outputs['error']}")
            if last is not None:
                yield last, False
            last = _as_arrays(outputs)
        if last is None:
            raise ClientError(f"{client.model}: the stream ended without a response.")
        yield last, True


def _as_arrays(outputs: dict[str, Any]) -> dict[str, Any]:
    return {key: np.array([value], dtype=object) for key, value in outputs.items()
            if key not in ("model_name", "model_version")}


def canary(handle, prompt: str) -> dict[str, str]:
    """One short request over gRPC streaming and one over HTTP; raises ServeError on failure."""
    from specbuild.errors import ServeError
    from specbuild.triton.client import SpecbuildClient

    answers = {}
    for url, protocol, stream in ((handle.grpc_url, "grpc", True), (handle.http_url, "http", False)):
        try:
            with SpecbuildClient(url, protocol=protocol, model=contract.MODEL_NAME, timeout=120) as client:
                text, stats = client.complete(prompt, max_tokens=2, stream=stream)
        except ClientError as err:
            raise ServeError(f"the canary request to {contract.MODEL_NAME} ({protocol}) failed: {err}. "
                             f"Server log: {handle.log_path}") from None
        if stats.get("finish_reason") not in contract.FINISH_REASONS:
            raise ServeError(f"the canary request to {contract.MODEL_NAME} ({protocol}) ended without a finish "
                             f"reason ({stats}). Server log: {handle.log_path}")
        answers[f"{contract.MODEL_NAME} ({protocol})"] = text
    return answers
