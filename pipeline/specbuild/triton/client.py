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

`overlap` (True, False or "auto") asks the BLS for a schedule and `drafter` ("model", "lookup", "hybrid") for a
drafter, overriding its deployment's: each travels as a Triton request parameter, not a tensor (gRPC `parameters`,
the HTTP generate body's "parameters" object), so the BLS's inputs stay NVIDIA's. The llmapi model has neither.

Two wire formats, one gRPC loop and one HTTP loop: the BLS's and the ensemble's (NVIDIA's inflight-batcher
names, tensors [1, ...]), and Triton's llmapi model's (the LLM API path), found once per client
(`is_llmapi`: asked for the BLS on a server that has none, or for `tensorrt_llm`, and that model's inputs
are NVIDIA's llmapi ones; then `model` becomes "tensorrt_llm"). For the llmapi model (no batch
dimension, max_batch_size 0) a client field travels as the llmapi input `LLMAPI_FIELDS` names (types from
`contract.llmapi.INPUTS`); `exclude_input_in_output` is sent true unless asked (chunks carry new text, as from the
BLS; NVIDIA's default would repeat the prompt); stop words go as `sampling_param_stop`; `num_draft_tokens` is not
sent (the LLM API drafts its configured max_draft_len at every step);
and every request asks for finish_reason, stop_reason and the perf metrics. The model streams cumulative
text, so the chunks carry the difference; only the final response's other outputs are read (each response
repeats them), and its metrics arrive as strings ("None" before the end) and are returned as numbers. The
llmapi model sends no token ids: a whole generation's token count is the session's (`session.served`).
"""

from __future__ import annotations

import http.client
import json
import queue
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specbuild.contract import llmapi, models, tensors
from specbuild.errors import ClientError

# What urllib raises when nothing answers at an address, or something that does not speak HTTP/1.1 (such as
# Triton's gRPC port, whose HTTP/2 frames fail as http.client.BadStatusLine).
UNREACHABLE = (urllib.error.URLError, OSError, http.client.HTTPException)

STAT_OUTPUTS = tensors.BLS_FINAL_OUTPUTS  # what the BLS sends on its final response (the contract's one table)
TEXT_OUTPUTS = tuple(
    name
    for name in STAT_OUTPUTS  # strings (BYTES) that are not JSON documents
    if tensors.BLS_OUTPUT[name].dtype == "TYPE_STRING" and name not in tensors.JSON_OUTPUTS
)
ID_OUTPUTS = tuple(name for name in STAT_OUTPUTS if tensors.BLS_OUTPUT[name].dims == (-1,))  # token ids

# How a stream reads when the server went away under it (its BLS process died and took the server down, or the server
# was killed or restarted): gRPC's transport errors (status UNAVAILABLE) and http.client's. One answer of Triton's
# reads as a cut too: a model whose Python stub died or hung (contract.models.UNHEALTHY_STUB), which the supervisor
# brings back (a reload, or a server restart for the BLS) with nothing of the request lost (`_answer`). Any other
# answer (a full queue, a drain's refusal, a bad request) reads otherwise and is never resumed.
CUT_MARKERS = ("Socket closed", "Connection reset", "Stream removed", "Broken pipe", "RST_STREAM", "recvmsg")
STREAM_ERROR_WAIT_S = 2.0  # how long a refused send waits for tritonclient's reader to say why the stream broke
RESUME_S = 120.0  # how long a cut stream waits for the server to serve again: a restart loads every model (8-32 s)


class StreamCut(ClientError):
    """The server went away during a stream (not an answer it gave): a deterministic request may be resumed."""


def resume_stream(
    attempt: Callable[[], Iterator[Chunk]],
    exact: bool,
    wait_for_server: Callable[[float], bool],
    resume_s: float = RESUME_S,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[Chunk]:
    """The chunks of `attempt()` (one request), the request sent again where its stream is cut (StreamCut: the server
    was there and went away; a server that never answered is not waited for).

    A greedy or seeded request gives the same text when it runs again, so the text already yielded is skipped in the
    new stream (checked character for character) and the caller's stream goes on where it was cut: nothing is sent
    twice and nothing skipped. `exact` False (sampling without a seed): a cut after some text is reported, with what
    arrived, as it cannot be resumed (a cut before any text is sent again: no sample was shown).
    `wait_for_server(deadline)`: True once the server answers again, before the deadline (on `clock`). The wait is
    `resume_s` from the first cut since the stream last moved on (new text), however often the request is cut again
    meanwhile (a server that says it is ready while a model's stub is still dead answers at once). The final chunk's
    stats say how often the stream was resumed (`resumed`)."""
    sent, resumes, deadline = "", 0, None
    while True:
        seen = ""
        try:
            for chunk in attempt():
                seen += chunk.text
                if len(seen) <= len(sent) and not chunk.final:
                    if not sent.startswith(seen):
                        raise _diverged(sent, seen)
                    continue
                if not seen.startswith(sent):
                    raise _diverged(sent, seen)
                if len(seen) > len(sent):
                    deadline = None  # the stream moved on: a later cut waits afresh
                new, sent = seen[len(sent) :], seen
                if chunk.final and resumes:
                    chunk.stats["resumed"] = resumes
                yield Chunk(new, chunk.final, chunk.stats)
            return
        except StreamCut as err:
            if not exact and sent:
                raise StreamCut(
                    f"{err} The stream was cut after {len(sent)} characters; a request that samples without a seed "
                    "cannot be resumed as it was (it would be another sample): send it again, or send a seed."
                ) from None
            deadline = deadline if deadline is not None else clock() + resume_s
            if resume_s <= 0 or not wait_for_server(deadline):
                raise StreamCut(
                    f"{err} The stream was cut after {len(sent)} characters and the server did not serve again within "
                    f"{resume_s:.0f} s: send the request again."
                ) from None
            resumes += 1


def _diverged(sent: str, seen: str) -> ClientError:
    at = next((i for i, (a, b) in enumerate(zip(sent, seen, strict=False)) if a != b), min(len(sent), len(seen)))
    return ClientError(
        f"the resumed stream differs from the text already received at character {at} "
        f"({sent[at : at + 20]!r} received, {seen[at : at + 20]!r} now): the server's output is not reproducible "
        "(another model, or another schedule), so the stream cannot go on."
    )


def _wire(data_type: str) -> tuple[str, type]:
    """A config.pbtxt data type as a request carries it: (Triton's wire datatype, numpy dtype), TYPE_INT32 ->
    ("INT32", numpy.int32), TYPE_STRING -> ("BYTES", object)."""
    return data_type.removeprefix("TYPE_").replace("STRING", "BYTES"), np.dtype(tensors.NUMPY_DTYPES[data_type]).type


_LLMAPI_INPUT = {t.name: t.data_type for t in llmapi.INPUTS}
LLMAPI_FIELDS = {  # request field -> (llmapi input, Triton datatype, numpy dtype); the types are the contract's
    field: (name, *_wire(_LLMAPI_INPUT[name]))
    for field, name in (
        ("max_tokens", "sampling_param_max_tokens"),
        ("temperature", "sampling_param_temperature"),
        ("top_k", "sampling_param_top_k"),
        ("top_p", "sampling_param_top_p"),
        ("seed", "sampling_param_seed"),
        ("stream", "streaming"),
        ("exclude_input_in_output", "sampling_param_exclude_input_from_output"),
        ("return_perf_metrics", "sampling_param_return_perf_metrics"),
    )
}
LLMAPI_ALWAYS = ("return_finish_reason", "return_stop_reason", "sampling_param_return_perf_metrics")
LLMAPI_FLOATS = ("acceptance_rate", "kv_cache_hit_rate", "cumulative_logprob")
_BLS_INPUT = {t.name: t.dtype for t in tensors.BLS_INPUTS}
_INPUT_TYPES = {  # request field -> (Triton datatype, numpy dtype): NVIDIA's BLS input names, the contract's types
    name: _wire(_BLS_INPUT[name])
    for name in (
        "max_tokens",
        "num_draft_tokens",
        "top_k",
        "end_id",
        "pad_id",
        "min_tokens",
        "temperature",
        "top_p",
        "seed",
        "stream",
        "use_draft_logits",
        "exclude_input_in_output",
        "return_perf_metrics",
        "guided_decoding_guide_type",
        "guided_decoding_guide",
    )
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
        if name in ID_OUTPUTS:
            stats[name] = [int(v) for v in value]
        elif name in TEXT_OUTPUTS:
            stats[name] = _text(value)
        elif name in tensors.JSON_OUTPUTS:
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


def _llmapi_stats(outputs: dict[str, Any]) -> dict[str, Any]:
    """The llmapi model's final outputs: finish/stop reason as text, the perf metrics (strings on the wire)
    as numbers, None where the model sends str(None) (no stop string, a time not reached)."""
    stats: dict[str, Any] = {}
    for name in ("finish_reason", "stop_reason", *llmapi.PERF_OUTPUTS, "cumulative_logprob"):
        value = outputs.get(name)
        if value is None or not np.asarray(value).size:
            continue
        raw = _text(value)
        if raw == llmapi.NOT_FINISHED:
            stats[name] = None
        elif name in ("finish_reason", "stop_reason"):
            stats[name] = raw
        else:
            stats[name] = float(raw) if name in LLMAPI_FLOATS else int(raw)
    return stats


@dataclass
class _Request:
    """One request on the wire: input name -> (value, Triton datatype, numpy dtype); a BYTES value is a list."""

    inputs: dict[str, tuple[Any, str, Any]]
    batched: bool  # tensors carry a batch dimension [1, ...] (the BLS, the ensemble), else not (llmapi)


class _BlsResponses:
    """The BLS's and the ensemble's responses: each holds its text piece and the figures it carries; the
    empty final response (enable_empty_final_response) carries none, so the last figures seen are kept."""

    def __init__(self) -> None:
        self.latest: dict[str, Any] = {}

    @staticmethod
    def reads(name: str, final: bool) -> bool:
        return True

    def chunk(self, outputs: dict[str, Any], final: bool) -> Chunk | None:
        stats = _stats(outputs)
        self.latest = stats or self.latest
        if not (outputs or final):
            return None
        return Chunk(_text(outputs.get("text_output")), final, self.latest if final else stats)


class _LlmapiResponses:
    """The llmapi model's responses: cumulative text (chunks carry the difference), figures read from the
    final response only."""

    def __init__(self) -> None:
        self.shown = ""

    @staticmethod
    def reads(name: str, final: bool) -> bool:
        return final or name == "text_output"

    def chunk(self, outputs: dict[str, Any], final: bool) -> Chunk | None:
        text = _text(outputs.get("text_output"))
        delta = text[len(self.shown) :] if text.startswith(self.shown) else text
        self.shown = text
        if not (delta or final):
            return None
        return Chunk(delta, final, _llmapi_stats(outputs) if final else {})


class SpecbuildClient:
    def __init__(
        self,
        url: str,
        protocol: str = "grpc",
        model: str = models.BLS,
        timeout: float = 300.0,
        resume_s: float = RESUME_S,
    ):
        """resume_s: how long a streamed request cut by the server going away waits for it to serve again before it
        is sent again and resumed where it was cut (`resume_stream`); 0 = a cut is an error at once."""
        if protocol not in ("grpc", "http"):
            raise ClientError(f"protocol {protocol!r} is not supported: use 'grpc' or 'http'.")
        self.url = url.removeprefix("http://").removeprefix("grpc://").rstrip("/")
        self.protocol = protocol
        self.model = model
        self.timeout = timeout
        self.resume_s = resume_s
        self._grpc = None
        self._llmapi: bool | None = None  # the model is Triton's llmapi model (found on first use)

    # ---- connection ------------------------------------------------------------------------------
    def _grpc_client(self):
        if self._grpc is None:
            try:
                import tritonclient.grpc as grpcclient
            except ImportError:
                raise ClientError("tritonclient is not installed: pip install 'specbuild[serve]'.") from None
            self._grpc = grpcclient.InferenceServerClient(self.url)
        return self._grpc

    def is_live(self) -> bool:
        """The server answers at all (it may not be ready: a model loading or being reloaded)."""
        return self._says_yes(lambda client: client.is_server_live(), "v2/health/live")

    def is_ready(self) -> bool:
        return self._says_yes(lambda client: client.is_server_ready(), "v2/health/ready")

    def _model_ready(self) -> bool:
        return self._says_yes(lambda client: client.is_model_ready(self.model), f"v2/models/{self.model}/ready")

    def _says_yes(self, ask_grpc: Callable[[Any], Any], http_path: str) -> bool:
        """A health question, over gRPC (`ask_grpc(client)`) or HTTP (200 at `http_path`); any failure is a no."""
        if self.protocol == "grpc":
            try:
                return bool(ask_grpc(self._grpc_client()))
            except Exception:  # noqa: BLE001 - tritonclient raises several types; all mean "no"
                return False
        try:
            with urllib.request.urlopen(f"http://{self.url}/{http_path}", timeout=5) as r:
                return r.status == 200
        except UNREACHABLE:
            return False

    def model_config(self) -> dict[str, Any]:
        """The model's configuration as JSON ({} when the server does not give it)."""
        return self._config(self.model) or {}

    def _config(self, model: str) -> dict[str, Any] | None:
        """A model's configuration as JSON, None when the server does not give it (e.g. no such model)."""
        if self.protocol == "http":
            try:
                with urllib.request.urlopen(f"http://{self.url}/v2/models/{model}/config", timeout=30) as r:
                    return json.loads(r.read().decode())
            except (*UNREACHABLE, ValueError):
                return None
        try:
            return self._grpc_client().get_model_config(model, as_json=True).get("config", {})
        except Exception:  # noqa: BLE001 - tritonclient raises several types; the caller treats None as unknown
            return None

    def is_llmapi(self) -> bool:
        """True when the server answers with Triton's llmapi model (then self.model is "tensorrt_llm"): asked
        for it, or for the BLS on a server that has no BLS but the llmapi model. Found once per client."""
        if self._llmapi is None:
            found = False
            if self.model == llmapi.MODEL_NAME:
                found = llmapi.is_llmapi_config(self._config(self.model))
            elif self.model == models.BLS and self._config(self.model) is None:
                found = llmapi.is_llmapi_config(self._config(llmapi.MODEL_NAME))
            self._llmapi = found
            self.model = llmapi.MODEL_NAME if found else self.model
        return self._llmapi

    def close(self) -> None:
        if self._grpc is not None:
            self._grpc.close()
            self._grpc = None

    def __enter__(self) -> SpecbuildClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- generation ------------------------------------------------------------------------------
    def generate(
        self,
        prompt: str,
        max_tokens: int = 64,
        num_draft_tokens: int | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stream: bool = True,
        stop_words: list[str] | None = None,
        overlap: bool | str | None = None,
        drafter: str | None = None,
        guide_type: str | None = None,
        guide: str | None = None,
        **extra: Any,
    ) -> Iterator[Chunk]:
        """Yield text chunks as the server sends them; the last one has final=True and the stats.

        `guide_type` (json, json_schema, regex, ebnf_grammar) and `guide` (its schema, regex or grammar): structured
        output, sent as NVIDIA's guided_decoding_guide_type / guided_decoding_guide inputs (the BLS only).

        Options left at None are not sent (the deployment's defaults apply), with two exceptions that keep
        this client's meaning under TensorRT-LLM's rules: a temperature > 0 without top_k or top_p also sends
        top_p = 1.0 (TensorRT-LLM is greedy when neither is set; this client means sampling), and from the BLS
        (and the llmapi model) the text is the generated text only: exclude_input_in_output defaults to true
        there (NVIDIA's BLS, like the target model and the llmapi model, returns the prompt too). Every field is sent
        as a value of its input's type (INT32, UINT64, FP32, BOOL): a number outside it raises ClientError rather than
        reach the server as another number (`_typed`)."""
        llmapi = self.is_llmapi()  # first: it may change self.model to the llmapi model
        if self.model == models.BLS or llmapi:
            extra.setdefault("exclude_input_in_output", True)
        fields: dict[str, Any] = {
            "max_tokens": max_tokens,
            "num_draft_tokens": num_draft_tokens,
            "temperature": temperature,
            "top_k": top_k,
            "top_p": top_p,
            "seed": seed,
            "stream": stream,
            "guided_decoding_guide_type": guide_type,
            "guided_decoding_guide": guide,
            **extra,
        }
        fields = {k: v for k, v in fields.items() if v is not None}
        if self.model != models.BLS:
            fields.pop("num_draft_tokens", None)  # the target-only ensemble and the llmapi model have no such input
        known = LLMAPI_FIELDS if llmapi else _INPUT_TYPES
        unknown = [k for k in fields if k not in known]
        if unknown and llmapi:
            raise ClientError(
                f"request field(s) {unknown} have no input in Triton's llmapi model; known are {sorted(LLMAPI_FIELDS)}."
            )
        if unknown:
            raise ClientError(f"unknown request field(s) {unknown}: known are {sorted(_INPUT_TYPES)}.")
        fields = {name: _typed(name, value, *known[name][-2:]) for name, value in fields.items()}
        if fields.get("temperature", 0) > 0 and "top_k" not in fields and "top_p" not in fields:
            fields["top_p"] = 1.0
        parameters = {}
        if overlap is not None:
            if llmapi or self.model != models.BLS:
                raise ClientError(
                    f"overlap is a setting of the speculative BLS; {self.model} has no such setting: leave it unset."
                )
            parameters["overlap"] = overlap
        if drafter is not None:
            if llmapi or self.model != models.BLS:
                raise ClientError(
                    f"drafter is a setting of the speculative BLS; {self.model} has no such setting: leave it unset "
                    "(the llmapi model drafts as its model.yaml's speculative_config says)."
                )
            parameters["drafter"] = drafter
        send = self._generate_grpc if self.protocol == "grpc" else self._generate_http

        def attempt() -> Iterator[Chunk]:
            return send(prompt, fields, stop_words or [], parameters)

        if not stream or self.resume_s <= 0:
            yield from attempt()
            return
        exact = fields.get("temperature", 0) <= 0 or "seed" in fields  # greedy, or seeded sampling: reproducible
        yield from resume_stream(attempt, exact, self._wait_until_serving, self.resume_s)

    def _wait_until_serving(self, deadline: float) -> bool:
        """After a cut stream: True once the server and this client's model answer ready again (a new connection
        each try), False at the monotonic deadline."""
        while time.monotonic() < deadline:
            self.close()
            if self.is_ready() and self._model_ready():
                return True
            time.sleep(0.5)
        return False

    def complete(self, prompt: str, **kwargs: Any) -> tuple[str, dict[str, Any]]:
        """The whole text and the final response's outputs, for a quick call (no timing: see ServedSession)."""
        chunks = list(self.generate(prompt, **kwargs))
        return "".join(chunk.text for chunk in chunks), chunks[-1].stats

    def _request(self, fields: dict[str, Any], stop_words: list[str]) -> _Request:
        """The wire inputs for this model: NVIDIA's BLS/ensemble names, or the llmapi model's."""
        if not self.is_llmapi():
            inputs = {name: (value, *_INPUT_TYPES[name]) for name, value in fields.items()}
            if stop_words:
                inputs["stop_words"] = (list(stop_words), "BYTES", object)
            return _Request(inputs, batched=True)
        inputs = {LLMAPI_FIELDS[name][0]: (value, *LLMAPI_FIELDS[name][1:]) for name, value in fields.items()}
        for name in LLMAPI_ALWAYS:
            inputs[name] = (True, "BOOL", np.bool_)
        if stop_words:
            inputs["sampling_param_stop"] = (list(stop_words), "BYTES", object)
        return _Request(inputs, batched=False)

    def _responses(self) -> _BlsResponses | _LlmapiResponses:
        return _LlmapiResponses() if self.is_llmapi() else _BlsResponses()

    def _generate_grpc(
        self, prompt: str, fields: dict[str, Any], stop_words: list[str], parameters: dict[str, Any]
    ) -> Iterator[Chunk]:
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException

        request, responses = self._request(fields, stop_words), self._responses()
        shape = (lambda array: array[None]) if request.batched else (lambda array: array)
        inputs = [
            self._grpc_input(grpcclient, "text_input", shape(np.array([prompt.encode("utf-8")], dtype=object)), "BYTES")
        ]
        for name, (value, datatype, dtype) in request.inputs.items():
            array = (
                np.array([w.encode("utf-8") for w in (value if isinstance(value, list) else [value])], dtype=object)
                if datatype == "BYTES"
                else np.array([value], dtype=dtype)
            )
            inputs.append(self._grpc_input(grpcclient, name, shape(array), datatype))
        results: queue.Queue = queue.Queue()
        client = self._grpc_client()
        try:
            client.start_stream(callback=lambda result=None, error=None: results.put((result, error)))
            client.async_stream_infer(
                self.model,
                inputs,
                request_id=uuid.uuid4().hex,
                enable_empty_final_response=True,
                parameters=parameters or None,
            )
            while True:
                try:
                    result, error = results.get(timeout=self.timeout)
                except queue.Empty:
                    raise ClientError(
                        f"no response from {self.model} at {self.url} within {self.timeout:.0f} s."
                    ) from None
                if error is not None:
                    raise self._stream_error(error)
                response = result.get_response()
                final = (
                    response.parameters["triton_final_response"].bool_param
                    if "triton_final_response" in response.parameters
                    else True
                )
                outputs = {o.name: result.as_numpy(o.name) for o in response.outputs if responses.reads(o.name, final)}
                chunk = responses.chunk(outputs, final)
                if chunk is not None:
                    yield chunk
                if final:
                    return
        except InferenceServerException as err:
            # tritonclient refuses to send on a stream its reader found broken ("The stream is no longer in valid
            # state ...", tritonclient/grpc/_infer_stream.py: it marks the stream inactive, then calls the callback
            # with the reason): that reason is what happened (the server went away before this request was sent: a
            # cut). Any other refusal puts nothing there, and costs this wait once.
            try:
                _, error = results.get(timeout=STREAM_ERROR_WAIT_S)
            except queue.Empty:
                error = None
            if error is not None:
                raise self._stream_error(error) from None
            raise ClientError(f"{self.model} at {self.url}: {err.message()}") from None
        finally:
            try:
                client.stop_stream()
            except Exception:  # noqa: BLE001 - the stream may already be closed by the failure above
                pass

    def _stream_error(self, error) -> ClientError:
        """A stream's error as the client raises it: StreamCut where the server went away under it (UNAVAILABLE with
        a transport's words), otherwise the server's answer."""
        message = error.message() if hasattr(error, "message") else str(error)
        status = str(error.status()) if hasattr(error, "status") else ""
        transport = "UNAVAILABLE" in status + str(error) and any(m in str(error) for m in CUT_MARKERS)
        return _answer(f"{self.model}: {message}", cut=transport)

    @staticmethod
    def _grpc_input(grpcclient, name: str, value: np.ndarray, datatype: str):
        tensor = grpcclient.InferInput(name, list(value.shape), datatype)
        tensor.set_data_from_numpy(value)
        return tensor

    def _generate_http(
        self, prompt: str, fields: dict[str, Any], stop_words: list[str], parameters: dict[str, Any]
    ) -> Iterator[Chunk]:
        """Triton's generate extension: one JSON object per request, server-sent events back."""
        request, responses = self._request(fields, stop_words), self._responses()
        body: dict[str, Any] = {"text_input": prompt, **{name: value for name, (value, _, _) in request.inputs.items()}}
        if parameters:
            body["parameters"] = parameters  # request parameters (server docs/protocol/extension_generate.md)
        endpoint = "generate_stream" if fields.get("stream", False) else "generate"
        http_request = urllib.request.Request(
            f"http://{self.url}/v2/models/{self.model}/{endpoint}",
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            response = urllib.request.urlopen(http_request, timeout=self.timeout)
        except urllib.error.HTTPError as err:
            raise _answer(f"{self.model}: {_http_error(err)}") from None
        except http.client.HTTPException:
            raise ClientError(
                f"what answers at {self.url} does not speak HTTP: is it Triton's gRPC port? Use "
                "--protocol grpc, or the HTTP port."
            ) from None
        except UNREACHABLE as err:
            raise ClientError(f"cannot reach {self.url}: {err}") from None
        with response:
            if endpoint == "generate":
                outputs = json.loads(response.read().decode())
                if "error" in outputs:
                    raise _answer(f"{self.model}: {outputs['error']}")
                yield responses.chunk(outputs, True)
                return
            last: dict[str, Any] | None = None
            lines = iter(response)
            while True:
                try:
                    raw = next(lines, None)
                except (http.client.HTTPException, OSError) as err:  # the server went away mid-stream
                    raise StreamCut(f"{self.model}: the stream was cut ({type(err).__name__}: {err}).") from None
                if raw is None:
                    break
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                outputs = json.loads(line[5:])
                if "error" in outputs:
                    raise _answer(f"{self.model}: {outputs['error']}")
                if last is not None and (chunk := responses.chunk(last, False)) is not None:
                    yield chunk
                last = outputs
            if last is None:
                raise StreamCut(f"{self.model}: the stream ended without a response (the server went away).")
            yield responses.chunk(last, True)


def _answer(message: str, cut: bool = False) -> ClientError:
    """An error the server sent as the client raises it: StreamCut where the server went away under the request
    (`cut`: a transport's error) or its model's stub is dead or hung (Triton's words, contract.models.UNHEALTHY_STUB),
    else the server's answer."""
    return (StreamCut if cut or models.UNHEALTHY_STUB.search(message) else ClientError)(message)


def _typed(name: str, value: Any, datatype: str, dtype: Any) -> Any:
    """A request field as a value of its input's type, or a ClientError: a number outside the type is never sent.
    Triton would not see it: a JSON integer is cast to the input's type, so 2^32 + 5 arrives as 5 in an INT32
    input (server src/http_server.cc, ReadDataFromJsonHelper), and numpy 1.x wraps the same way for gRPC."""
    kind = np.dtype(dtype).kind
    if kind in "iu":
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise ClientError(f"request field '{name}' = {value!r}: expected an integer ({datatype}).")
        info = np.iinfo(dtype)
        if not info.min <= int(value) <= info.max:
            raise ClientError(
                f"request field '{name}' = {value}: outside the range of its input type {datatype} "
                f"({info.min}..{info.max}); the server would receive a different number."
            )
        return int(value)
    if kind == "f":
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
            raise ClientError(f"request field '{name}' = {value!r}: expected a number ({datatype}).")
        return float(value)
    if kind == "b":
        return bool(value)
    return value


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
