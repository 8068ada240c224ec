"""`SpecbuildClient`: generate text through a running server with tritonclient (gRPC streaming by default)
or Triton's HTTP generate endpoints.

    with SpecbuildClient("127.0.0.1:8001") as client:
        for chunk in client.generate("def add(a, b):", max_tokens=32, num_draft_tokens=4):
            print(chunk.text, end="", flush=True)
        print(chunk.stats)            # finish_reason, acceptance_rate, ... on the final chunk

The model is `tensorrt_llm_bls` (speculative) unless told otherwise (`ensemble` = target only).
Every failure raises `ClientError` with the server's own message. This is the protocol layer: one
response at a time. A whole generation read from the stream (text, time to first token, tokens/s,
finish reason, figures) is `specbuild.session.served.ServedSession`, which every specbuild command uses.
"""

from __future__ import annotations

import json
import queue
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from specbuild.errors import ClientError

STAT_OUTPUTS = ("finish_reason", "stop_reason", "acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens",
                "mean_accepted_len", "num_output_tokens", "num_input_tokens", "output_ids", "speculation_stats")
TEXT_OUTPUTS = ("finish_reason", "stop_reason")  # strings (BYTES)
_INPUT_TYPES = {  # request field -> (Triton datatype, numpy dtype), NVIDIA's BLS input names
    "max_tokens": ("INT32", np.int32), "num_draft_tokens": ("INT32", np.int32), "top_k": ("INT32", np.int32),
    "end_id": ("INT32", np.int32), "pad_id": ("INT32", np.int32), "min_tokens": ("INT32", np.int32),
    "temperature": ("FP32", np.float32), "top_p": ("FP32", np.float32), "seed": ("UINT64", np.uint64),
    "stream": ("BOOL", np.bool_), "use_draft_logits": ("BOOL", np.bool_), "exclude_input_in_output": ("BOOL", np.bool_),
    "return_perf_metrics": ("BOOL", np.bool_),
}


@dataclass
class Chunk:
    text: str  # new text (streaming) or the whole text (final response of a non-streamed request)
    final: bool
    stats: dict[str, Any] = field(default_factory=dict)  # the finish reason and figures present in this response


def _stats(outputs: dict[str, Any]) -> dict[str, Any]:
    stats: dict[str, Any] = {}
    for name in STAT_OUTPUTS:
        if name not in outputs or outputs[name] is None:
            continue
        value = np.asarray(outputs[name]).reshape(-1)
        if name == "output_ids":
            stats[name] = [int(v) for v in value]
        elif name in TEXT_OUTPUTS:
            stats[name] = _text(value)
        elif name == "speculation_stats":
            raw = value[0] if value.size else b"{}"
            try:
                stats[name] = json.loads(raw.decode() if isinstance(raw, bytes) else str(raw))
            except ValueError:
                stats[name] = str(raw)
        elif value.size:
            stats[name] = value[0].item()
    return stats


def _text(value: Any) -> str:
    if value is None:
        return ""
    array = np.asarray(value).reshape(-1)
    if not array.size:
        return ""
    item = array[0]
    return item.decode("utf-8", "replace") if isinstance(item, bytes) else str(item)


class SpecbuildClient:
    def __init__(self, url: str, protocol: str = "grpc", model: str = "tensorrt_llm_bls", timeout: float = 300.0):
        if protocol not in ("grpc", "http"):
            raise ClientError(f"protocol {protocol!r} is not supported: use 'grpc' or 'http'.")
        self.url = url.removeprefix("http://").removeprefix("grpc://").rstrip("/")
        self.protocol = protocol
        self.model = model
        self.timeout = timeout
        self._grpc = None

    # ---- connection ------------------------------------------------------------------------------
    def _grpc_client(self):
        if self._grpc is None:
            try:
                import tritonclient.grpc as grpcclient
            except ImportError:
                raise ClientError("tritonclient is not installed: pip install 'specbuild[serve]'.") from None
            self._grpc = grpcclient.InferenceServerClient(self.url)
        return self._grpc

    def is_ready(self) -> bool:
        if self.protocol == "grpc":
            try:
                return bool(self._grpc_client().is_server_ready())
            except Exception:  # noqa: BLE001 - any transport failure means "not ready"
                return False
        try:
            with urllib.request.urlopen(f"http://{self.url}/v2/health/ready", timeout=5) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def model_config(self) -> dict[str, Any]:
        """The model's configuration as JSON ({} when the server does not give it)."""
        if self.protocol == "http":
            try:
                with urllib.request.urlopen(f"http://{self.url}/v2/models/{self.model}/config", timeout=30) as r:
                    return json.loads(r.read().decode())
            except (urllib.error.URLError, OSError, ValueError):
                return {}
        try:
            return self._grpc_client().get_model_config(self.model, as_json=True).get("config", {})
        except Exception:  # noqa: BLE001 - tritonclient raises several types; the caller treats {} as unknown
            return {}

    def close(self) -> None:
        if self._grpc is not None:
            self._grpc.close()
            self._grpc = None

    def __enter__(self) -> "SpecbuildClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- generation ------------------------------------------------------------------------------
    def generate(self, prompt: str, max_tokens: int = 64, num_draft_tokens: int | None = None,
                 temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
                 seed: int | None = None, stream: bool = True, stop_words: list[str] | None = None,
                 **extra: Any) -> Iterator[Chunk]:
        """Yield text chunks as the server sends them; the last one has final=True and the stats.

        Options left at None are not sent (the deployment's defaults apply), with two exceptions that keep
        this client's meaning under TensorRT-LLM's rules: a temperature > 0 without top_k or top_p also sends
        top_p = 1.0 (TensorRT-LLM is greedy when neither is set; this client means sampling), and from the BLS
        the text is the generated text only: exclude_input_in_output defaults to true there (NVIDIA's BLS,
        like the target model, returns the prompt too)."""
        if temperature is not None and temperature > 0 and top_k is None and top_p is None:
            top_p = 1.0
        if self.model == "tensorrt_llm_bls":
            extra.setdefault("exclude_input_in_output", True)
        fields: dict[str, Any] = {"max_tokens": max_tokens, "num_draft_tokens": num_draft_tokens,
                                  "temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed,
                                  "stream": stream, **extra}
        fields = {k: v for k, v in fields.items() if v is not None}
        if self.model != "tensorrt_llm_bls":
            fields.pop("num_draft_tokens", None)  # the target-only ensemble has no such input
        unknown = [k for k in fields if k not in _INPUT_TYPES]
        if unknown:
            raise ClientError(f"unknown request field(s) {unknown}: known are {sorted(_INPUT_TYPES)}.")
        if self.protocol == "grpc":
            yield from self._generate_grpc(prompt, fields, stop_words or [])
        else:
            yield from self._generate_http(prompt, fields, stop_words or [])

    def complete(self, prompt: str, **kwargs: Any) -> tuple[str, dict[str, Any]]:
        """The whole text and the final response's outputs, for a quick call (no timing: see ServedSession)."""
        chunks = list(self.generate(prompt, **kwargs))
        return "".join(chunk.text for chunk in chunks), chunks[-1].stats

    def _generate_grpc(self, prompt: str, fields: dict[str, Any], stop_words: list[str]) -> Iterator[Chunk]:
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException

        inputs = [self._grpc_input(grpcclient, "text_input", np.array([[prompt.encode("utf-8")]], dtype=object), "BYTES")]
        for name, value in fields.items():
            datatype, dtype = _INPUT_TYPES[name]
            inputs.append(self._grpc_input(grpcclient, name, np.array([[value]], dtype=dtype), datatype))
        if stop_words:
            words = np.array([[w.encode("utf-8") for w in stop_words]], dtype=object)
            inputs.append(self._grpc_input(grpcclient, "stop_words", words, "BYTES"))
        results: queue.Queue = queue.Queue()
        client = self._grpc_client()
        latest: dict[str, Any] = {}
        try:
            client.start_stream(callback=lambda result=None, error=None: results.put((result, error)))
            client.async_stream_infer(self.model, inputs, request_id=uuid.uuid4().hex,
                                      enable_empty_final_response=True)
            while True:
                try:
                    result, error = results.get(timeout=self.timeout)
                except queue.Empty:
                    raise ClientError(f"no response from {self.model} at {self.url} within {self.timeout:.0f} s.") from None
                if error is not None:
                    message = error.message() if hasattr(error, "message") else str(error)
                    raise ClientError(f"{self.model}: {message}")
                response = result.get_response()
                final = response.parameters["triton_final_response"].bool_param \
                    if "triton_final_response" in response.parameters else True
                names = [o.name for o in response.outputs]
                outputs = {name: result.as_numpy(name) for name in names}
                latest = _stats(outputs) or latest  # the empty final response carries no outputs
                if names or final:
                    yield Chunk(_text(outputs.get("text_output")), final, latest if final else _stats(outputs))
                if final:
                    return
        except InferenceServerException as err:
            raise ClientError(f"{self.model} at {self.url}: {err.message()}") from None
        finally:
            try:
                client.stop_stream()
            except Exception:  # noqa: BLE001 - the stream may already be closed by the failure above
                pass

    @staticmethod
    def _grpc_input(grpcclient, name: str, value: np.ndarray, datatype: str):
        tensor = grpcclient.InferInput(name, list(value.shape), datatype)
        tensor.set_data_from_numpy(value)
        return tensor

    def _generate_http(self, prompt: str, fields: dict[str, Any], stop_words: list[str]) -> Iterator[Chunk]:
        """Triton's generate extension: one JSON object per request, server-sent events back."""
        body: dict[str, Any] = {"text_input": prompt, **fields}
        if stop_words:
            body["stop_words"] = stop_words
        endpoint = "generate_stream" if fields.get("stream", False) else "generate"
        request = urllib.request.Request(f"http://{self.url}/v2/models/{self.model}/{endpoint}",
                                         data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            response = urllib.request.urlopen(request, timeout=self.timeout)
        except urllib.error.HTTPError as err:
            raise ClientError(f"{self.model}: {_http_error(err)}") from None
        except (urllib.error.URLError, OSError) as err:
            raise ClientError(f"cannot reach {self.url}: {err}") from None
        with response:
            if endpoint == "generate":
                outputs = json.loads(response.read().decode())
                if "error" in outputs:
                    raise ClientError(f"{self.model}: {outputs['error']}")
                yield Chunk(_text(outputs.get("text_output")), True, _stats(outputs))
                return
            last: Chunk | None = None
            for raw in response:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                outputs = json.loads(line[5:])
                if "error" in outputs:
                    raise ClientError(f"{self.model}: {outputs['error']}")
                if last is not None:
                    yield last
                last = Chunk(_text(outputs.get("text_output")), False, _stats(outputs))
            if last is None:
                raise ClientError(f"{self.model}: the stream ended without a response.")
            last.final = True
            yield last


def _http_error(err: urllib.error.HTTPError) -> str:
    """The server's message from a JSON body or a server-sent event (`data: {"error": ...}`)."""
    try:
        body = err.read().decode("utf-8", "replace").strip()
    except OSError:
        return str(err)
    for line in body.splitlines() or [body]:
        line = line.strip().removeprefix("data:").strip()
        try:
            message = json.loads(line).get("error") if line else None
        except (ValueError, AttributeError):
            continue
        if message:
            return str(message)
    return f"{err} {body[:300]}".strip()

