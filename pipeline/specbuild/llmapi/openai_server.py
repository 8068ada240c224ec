"""The CPU stand-in for `trtllm-serve`: TensorRT-LLM's OpenAI-compatible server, on the stand-in LLM.

    python -m specbuild.llmapi.openai_server <model> --host H --port P --backend pytorch ...
        --extra_llm_api_options llm_api_options.yaml                (trtllm-serve's own argv: `trtllm_serve.plan`)

`specbuild serve --backend llmapi --server trtllm-serve --trtllm-serve stand-in` runs it where trtllm-serve cannot (a
CPU machine), so
the `openai` Python client, `curl` and specbuild's tests meet the same API as on a GPU. What it serves, as
trtllm-serve does (NVIDIA/TensorRT-LLM `tensorrt_llm/serve/openai_server.py` and `openai_protocol.py`, read on main,
2026; the field names checked, the 1.2.1 tag not): GET /health (200 once loaded), GET /v1/models (the model as named
on the command line), POST /v1/completions and /v1/chat/completions (the chat template of the model's tokenizer),
streamed as server-sent events ending `data: [DONE]`, with `usage` (and, streamed, with
`stream_options.include_usage`); `stop`, `stop_token_ids`, `seed`, `max_tokens`, `temperature` (unset: 1.0, as
`to_sampling_params` sets it), `top_p`, `top_k`, and `response_format` as SamplingParams.guided_decoding
(`_response_format_to_guided_decoding_params`: json -> its `schema`, json_schema -> its `json_schema` (the OpenAI
wrapper's `schema` taken out), json_object, regex, ebnf -> grammar; text -> none). A request the stand-in LLM refuses
(a guided request that samples, a penalty) gets HTTP 400 with the reason, as trtllm-serve answers a bad request.
One request runs at a time (the stand-in LLM's loop, in this process).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from specbuild.contract import llmapi as contract
from specbuild.llmapi.protocol import ModelException

# response_format.type -> (the request's field holding the guide, the GuidedDecodingParams field); text: unguided
RESPONSE_FORMATS = {
    "json": ("schema", "json"),
    "json_schema": ("json_schema", "json"),
    "json_object": (None, "json_object"),
    "regex": ("regex", "regex"),
    "ebnf": ("ebnf", "grammar"),
}


def guided_decoding(response_format: dict[str, Any] | None) -> dict[str, Any] | None:
    """response_format as GuidedDecodingParams' fields (None: unguided); ValueError with trtllm-serve's message."""
    if not response_format or response_format.get("type") == "text":
        return None
    kind = response_format.get("type")
    if kind not in RESPONSE_FORMATS:
        raise ValueError(f"Unsupported response format: {kind}")
    source, field = RESPONSE_FORMATS[kind]
    if source is None:
        return {field: True}
    value = response_format.get(source)
    if value is None:
        raise ValueError(f"response_format.{source} is required for response_format.type == {kind!r}, but got None.")
    if kind == "json_schema" and isinstance(value, dict) and "schema" in value:
        value = value["schema"]  # the OpenAI API wraps the schema: {"name": ..., "schema": {...}}
    return {field: value}


def sampling_params(body: dict[str, Any]) -> dict[str, Any]:
    """A completion request's fields as the SamplingParams the stand-in LLM takes."""
    stop = body.get("stop") or []
    return {
        "max_tokens": body.get("max_tokens") or body.get("max_completion_tokens") or contract.DEFAULT_MAX_TOKENS,
        "temperature": 1.0 if body.get("temperature") is None else body["temperature"],
        "top_p": 1.0 if body.get("top_p") is None else body["top_p"],
        "top_k": body.get("top_k") or 0,
        "seed": body.get("seed"),
        "stop": [stop] if isinstance(stop, str) else list(stop),
        "stop_token_ids": list(body.get("stop_token_ids") or []),
        "frequency_penalty": body.get("frequency_penalty") or 0.0,
        "presence_penalty": body.get("presence_penalty") or 0.0,
        "guided_decoding": guided_decoding(body.get("response_format")),
        "return_perf_metrics": True,
    }


class OpenAIStandIn:
    """The stand-in LLM behind the two OpenAI endpoints."""

    def __init__(self, model_name: str, args: dict[str, Any]):
        from specbuild.llmapi.llm import StandInLLM

        self.model_name = model_name
        self.llm = StandInLLM(args)
        self.lock = threading.Lock()

    def prompt(self, path: str, body: dict[str, Any]) -> str:
        if path.endswith("/chat/completions"):
            from specbuild.session.chat import chat_text

            return chat_text(self.llm.tokenizer, list(body.get("messages") or []))
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise ValueError("prompt: the stand-in takes one prompt string per request")
        return prompt

    def generate(self, path: str, body: dict[str, Any], send_chunk) -> dict[str, Any]:
        """Run one request; `send_chunk(text_delta)` per step when streaming. Returns the final document's parts."""
        from specbuild.llmapi.llm import sampling_from_request

        prompt = self.prompt(path, body)
        sampling = sampling_from_request(sampling_params(body))
        sent = [""]

        def on_output(output) -> None:
            text = output.outputs[0].text
            if len(text) > len(sent[0]):
                send_chunk(text[len(sent[0]) :])
                sent[0] = text

        with self.lock:
            final = self.llm.generate(
                prompt,
                sampling,
                streaming=bool(body.get("stream")),
                on_output=on_output if body.get("stream") else None,
            )
        out = final.outputs[0]
        if body.get("stream") and len(out.text) > len(sent[0]):
            send_chunk(out.text[len(sent[0]) :])
        prompt_tokens = len(self.llm.encode(prompt))
        return {
            "text": out.text,
            "finish_reason": out.finish_reason,
            "stop_reason": out.stop_reason,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": len(out.token_ids),
                "total_tokens": prompt_tokens + len(out.token_ids),
            },
        }


def _choice(chat: bool, text: str, finish: str | None, stop_reason: Any, stream: bool) -> dict[str, Any]:
    if not chat:
        return {"index": 0, "text": text, "finish_reason": finish, "stop_reason": stop_reason}
    key = "delta" if stream else "message"
    return {
        "index": 0,
        key: {"role": "assistant", "content": text},
        "finish_reason": finish,
        "stop_reason": stop_reason,
    }


def make_handler(server: OpenAIStandIn):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            pass

        def _json(self, status: int, document: dict[str, Any]) -> None:
            data = json.dumps(document).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path == contract.SERVE_HEALTH:
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": server.model_name, "object": "model"}]})
            else:
                self._json(404, {"error": {"message": f"no route {self.path}", "type": "NotFoundError", "code": 404}})

        def do_POST(self) -> None:  # noqa: N802
            if self.path not in ("/v1/completions", "/v1/chat/completions"):
                self._json(404, {"error": {"message": f"no route {self.path}", "type": "NotFoundError", "code": 404}})
                return
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            except ValueError as err:
                self._json(400, {"error": {"message": f"invalid JSON: {err}", "type": "BadRequestError", "code": 400}})
                return
            chat = self.path.endswith("/chat/completions")
            stream = bool(body.get("stream"))
            ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
            kind = "chat.completion" if chat else "text_completion"
            created = int(time.time())
            head = {"id": ident, "created": created, "model": body.get("model") or server.model_name}
            started = [False]

            def send_chunk(delta: str) -> None:
                if not started[0]:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    started[0] = True
                chunk = {
                    **head,
                    "object": f"{kind}.chunk" if chat else kind,
                    "choices": [_choice(chat, delta, None, None, True)],
                }
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()

            try:
                result = server.generate(self.path, body, send_chunk if stream else lambda _: None)
            except (ModelException, ValueError) as err:
                if started[0]:
                    self.wfile.write(f"data: {json.dumps({'error': {'message': str(err)}})}\n\n".encode())
                    self.close_connection = True
                    return
                self._json(400, {"error": {"message": str(err), "type": "BadRequestError", "code": 400}})
                return
            if not stream:
                choice = _choice(chat, result["text"], result["finish_reason"], result["stop_reason"], False)
                self._json(200, {**head, "object": kind, "choices": [choice], "usage": result["usage"]})
                return
            if not started[0]:
                send_chunk("")
            final = {**head, "object": f"{kind}.chunk" if chat else kind}
            final["choices"] = [_choice(chat, "", result["finish_reason"], result["stop_reason"], True)]
            self.wfile.write(f"data: {json.dumps(final)}\n\n".encode())
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = {**head, "object": final["object"], "choices": [], "usage": result["usage"]}
                self.wfile.write(f"data: {json.dumps(usage)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

    return Handler


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """trtllm-serve's options that `trtllm_serve.plan` writes (the rest of its CLI is not taken)."""
    parser = argparse.ArgumentParser(prog="trtllm-serve (specbuild's CPU stand-in)")
    parser.add_argument("model")
    parser.add_argument("--host", default="localhost")
    parser.add_argument("--port", type=int, default=contract.SERVE_DEFAULT_PORT)
    parser.add_argument("--backend", default="pytorch")
    for name in ("tp_size", "pp_size", "max_batch_size", "max_num_tokens", "max_seq_len"):
        parser.add_argument(f"--{name}", type=int, default=None)
    parser.add_argument("--kv_cache_free_gpu_memory_fraction", type=float, default=None)
    parser.add_argument("--extra_llm_api_options", default=None)
    parser.add_argument("--log_level", default="info")
    return parser.parse_args(argv)


def llm_args(options: argparse.Namespace) -> dict[str, Any]:
    """The LLM arguments as trtllm-serve assembles them: the command line, then the options file over it."""
    args: dict[str, Any] = {"model": options.model, "backend": options.backend}
    for name, key in (
        ("tp_size", "tensor_parallel_size"),
        ("pp_size", "pipeline_parallel_size"),
        ("max_batch_size", "max_batch_size"),
        ("max_num_tokens", "max_num_tokens"),
        ("max_seq_len", "max_seq_len"),
    ):
        if getattr(options, name) is not None:
            args[key] = getattr(options, name)
    if options.extra_llm_api_options:
        import yaml  # PyYAML: transformers' own dependency, which the stand-in LLM needs anyway

        args.update(yaml.safe_load(Path(options.extra_llm_api_options).read_text()) or {})
    return args


def main(argv: list[str] | None = None) -> None:
    options = parse_args(argv)
    server = OpenAIStandIn(options.model, llm_args(options))
    httpd = ThreadingHTTPServer((options.host, options.port), make_handler(server))
    httpd.daemon_threads = True
    print(f"specbuild's trtllm-serve stand-in: http://{options.host}:{options.port} ({options.model})", flush=True)
    import signal

    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=httpd.shutdown, daemon=True).start())
    try:
        httpd.serve_forever()
    finally:
        httpd.server_close()


if __name__ == "__main__":
    main()
