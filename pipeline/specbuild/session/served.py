"""Generation through a running server: the one reader of the BLS's response stream.

    with ServedSession(server_url(spec, "grpc")) as session:
        gen = session.generate("def f(x):", Options(max_tokens=32), on_text=print)
    gen.to_dict()                                       # the `generate --json` document, as in-process

`specbuild generate` (without --local), the `up` demo prompts and `bench --url` all read the stream
here; `specbuild.triton.client.SpecbuildClient` underneath speaks the protocol (gRPC streaming or HTTP).
The server's own outputs say how it ended (`finish_reason`, `stop_reason`) and what speculation did
(`speculation_stats`, the acceptance outputs); the K rule (`resolve_k`) is applied with the
deployment's max_draft_len and default K, read from the BLS's model config.
"""

from __future__ import annotations

import importlib.util
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from specbuild.config import Spec
from specbuild.errors import ClientError
from specbuild.session.generation import Generation, Options
from specbuild.speculative.draft_len import ResolvedK, resolve_k
from specbuild.speculative.stats import SpeculationStats

__all__ = ["Deployment", "MODEL", "ServedSession", "read_stream", "server_url"]

MODEL = "tensorrt_llm_bls"
WILDCARD_HOSTS = ("0.0.0.0", "::", "[::]")  # a server bound to every address is reached on loopback


def server_url(spec: Spec, protocol: str, url: str | None = None) -> str:
    """The one URL rule: `url` as given (an http:// or grpc:// prefix dropped), else the spec's [serve] address
    for the protocol, with a wildcard host reached as 127.0.0.1."""
    if url:
        return url.removeprefix("http://").removeprefix("grpc://").rstrip("/")
    host = "127.0.0.1" if spec.serve.host in WILDCARD_HOSTS else spec.serve.host
    return f"{host}:{spec.serve.grpc_port if protocol == 'grpc' else spec.serve.http_port}"


@dataclass(frozen=True)
class Deployment:
    """What the BLS's model config says (None: not known, e.g. the config cannot be read)."""

    max_draft_len: int | None = None
    num_draft_tokens: int | None = None  # the default K
    adaptive: bool | None = None

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "Deployment":
        params = {key: (value or {}).get("string_value", "") for key, value in config.get("parameters", {}).items()}

        def number(key: str) -> int | None:
            return int(params[key]) if params.get(key, "").isdigit() else None

        adaptive = params.get("adaptive_draft_len", "").lower()
        return cls(number("max_draft_len"), number("num_draft_tokens"),
                   {"true": True, "false": False}.get(adaptive))


@dataclass
class Streamed:
    text: str
    ttft_seconds: float | None
    outputs: dict[str, Any]  # the final response's outputs (finish_reason, figures)


def read_stream(chunks: Iterable[Any], on_text: Callable[[str], None] | None = None,
                started: float | None = None) -> Streamed:
    """Join a response stream (`Chunk`s): the text, when its first piece arrived, the final outputs."""
    started = time.perf_counter() if started is None else started
    parts: list[str] = []
    first, outputs = None, {}
    for chunk in chunks:
        if chunk.text:
            first = time.perf_counter() - started if first is None else first
            parts.append(chunk.text)
            if on_text is not None:
                on_text(chunk.text)
        if chunk.stats:
            outputs = chunk.stats
    return Streamed("".join(parts), first, outputs)


class ServedSession:
    def __init__(self, url: str, protocol: str = "grpc", model: str = MODEL, timeout: float = 300.0,
                 spec_path: str | None = None):
        from specbuild.triton.client import SpecbuildClient

        self.url, self.protocol = url, protocol
        self.spec_path = spec_path  # shown in the "no server" advice
        self.client = SpecbuildClient(url, protocol=protocol, model=model, timeout=timeout)
        self._deployment: Deployment | None = None

    def __enter__(self) -> "ServedSession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.client.close()

    def deployment(self) -> Deployment:
        if self._deployment is None:
            self._deployment = Deployment.from_config(self.client.model_config())
        return self._deployment

    def no_server(self) -> ClientError:
        """The error for an address where no server answers, with what to do."""
        c = f" -c {self.spec_path}" if self.spec_path else ""
        return ClientError(
            f"no Triton server answers at {self.url} ({self.protocol}). Start one with `specbuild serve{c}` "
            f"(or `specbuild up{c}`), pass --url with its address, or run in-process with "
            f"`specbuild generate{c} --local ...`."
        )

    def check_ready(self) -> None:
        if not self.client.is_ready():
            raise self.no_server()

    def resolve_k(self, requested: int | None) -> ResolvedK | None:
        """The K rule with the deployment's limit and default; None when neither a K nor a default is known."""
        deployment = self.deployment()
        if requested is None and deployment.num_draft_tokens is None:
            return None
        if deployment.max_draft_len is None:
            requested = deployment.num_draft_tokens if requested is None else requested
            return resolve_k(requested, requested)  # the server applies its own limit
        return resolve_k(requested, deployment.max_draft_len, default=deployment.num_draft_tokens)

    def generate(self, prompt: str, options: Options, on_text: Callable[[str], None] | None = None,
                 stream: bool = True) -> Generation:
        """One request, its text streamed to on_text; ClientError with the server's message on failure."""
        k = self.resolve_k(options.num_draft_tokens)
        started = time.perf_counter()
        try:
            chunks = self.client.generate(prompt, max_tokens=options.max_tokens, num_draft_tokens=k.k if k else None,
                                          temperature=options.temperature, top_k=options.top_k, top_p=options.top_p,
                                          seed=options.seed, stream=stream)
            streamed = read_stream(chunks, on_text, started)
        except ClientError:
            grpc_missing = self.protocol == "grpc" and importlib.util.find_spec("tritonclient") is None
            if grpc_missing or self.client.is_ready():
                raise  # its message says how to install the client, or what the server refused
            raise self.no_server() from None
        seconds = time.perf_counter() - started
        out = streamed.outputs
        stats = (SpeculationStats.from_dict(out["speculation_stats"]) if isinstance(out.get("speculation_stats"), dict)
                 else SpeculationStats(drafted=int(out.get("total_draft_tokens", 0)),
                                       accepted=int(out.get("total_accepted_draft_tokens", 0))))
        output_ids = [int(t) for t in out.get("output_ids", [])]
        stop_reason = out.get("stop_reason")
        if isinstance(stop_reason, str) and stop_reason.startswith("["):
            stop_reason = json.loads(stop_reason)  # a stop sequence given as token ids
        return Generation(
            text=streamed.text,
            output_ids=output_ids,
            finish_reason=out.get("finish_reason") or None,
            stop_reason=stop_reason,
            k=k,
            adaptive=self.deployment().adaptive,
            stats=stats,
            seconds=seconds,
            ttft_seconds=streamed.ttft_seconds,
            num_output_tokens=int(out["num_output_tokens"]) if "num_output_tokens" in out else None,
            extra={"engine_source": None, "server": {"url": self.url, "protocol": self.protocol},
                   "sampling": options.sampling_dict()},
        )
