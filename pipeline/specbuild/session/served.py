"""Generation through a running server: the one reader of a server's response stream.

    with ServedSession.for_spec(spec, "grpc") as session:
        gen = session.generate("def f(x):", Options(max_tokens=32), on_text=print)
    gen.to_dict()                                       # the `generate --json` document, as in-process

`specbuild generate` (without --local), the `up` demo prompts and `bench --url` all read the stream
here; `specbuild.triton.client.SpecbuildClient` underneath speaks the protocol (gRPC streaming or HTTP)
and the wire format (the BLS's, or Triton's llmapi model's on the LLM API path). The server's own outputs
say how it ended (`finish_reason`, `stop_reason`) and what speculation did (`speculation_stats`, the
acceptance outputs), the BLS the K it used (`speculation_stats.k`: K is resolved there, once).

An llmapi deployment says less, and the session fills in what the spec knows (`for_spec`):
- K: the LLM API drafts its configured max_draft_len at every step and takes no K per request; that K is
  the spec's num_draft_tokens (`build --backend llmapi` writes it), so the K rule is `resolve_fixed_k`;
- output_ids: None. NVIDIA's model sends text only (its outputs: text_output, the reasons, the perf metrics;
  `contract.llmapi.OUTPUTS`), and the text tokenized again is not the model's ids (131 ids for 120 tokens
  when byte tokens decode to U+FFFD), so none are made up; the document says so (`token_ids`);
- num_output_tokens: a generation that ended on "length" made max_tokens tokens (the LLM API's meaning of it;
  a request shortened by max_seq_len would make fewer): exact. Any other is the text tokenized again with the
  target's tokenizer, marked an estimate (`count_estimated`, "~N tokens" where a person reads it);
- prompt_ids (either deployment): the prompt tokenized here as the server does (the BLS's add_special_tokens
  parameter; the LLM API's default, `contract.llmapi.ADD_SPECIAL_TOKENS`), when the session has the target's
  tokenizer (`for_spec`);
- steps: not sent; each verify step makes its accepted tokens plus one, so steps = tokens - accepted.
"""

from __future__ import annotations

import importlib.util
import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbuild.config import Spec
from specbuild.contract import models
from specbuild.contract.bls_params import BlsParameters
from specbuild.contract.llmapi import ADD_SPECIAL_TOKENS as LLMAPI_ADD_SPECIAL_TOKENS
from specbuild.contract.pbtxt import parameter_values
from specbuild.decode.generation import Generation, Options
from specbuild.errors import ClientError
from specbuild.speculative.draft_len import ResolvedK, resolve_fixed_k
from specbuild.speculative.stats import SpeculationStats

__all__ = ["Deployment", "MODEL", "ServedSession", "reachable_host", "read_stream", "server_url"]

MODEL = models.BLS  # the model a client calls by default
WILDCARD_HOSTS = ("0.0.0.0", "::", "[::]")  # a server bound to every address is reached on loopback


def server_url(spec: Spec, protocol: str, url: str | None = None) -> str:
    """The one URL rule: `url` as given (an http:// or grpc:// prefix dropped), else the spec's [serve] address
    for the protocol, with a wildcard host reached as 127.0.0.1."""
    if url:
        return url.removeprefix("http://").removeprefix("grpc://").rstrip("/")
    return f"{reachable_host(spec.serve.host)}:{spec.serve.grpc_port if protocol == 'grpc' else spec.serve.http_port}"


def reachable_host(host: str) -> str:
    """Where a client on this machine reaches a server bound to `host`: a wildcard address as 127.0.0.1."""
    return "127.0.0.1" if host in WILDCARD_HOSTS else host


@dataclass(frozen=True)
class Deployment:
    """What the BLS's model config says (None: not known, e.g. the config cannot be read)."""

    max_draft_len: int | None = None
    num_draft_tokens: int | None = None  # the default K
    adaptive: bool | None = None
    overlap: bool | str | None = None  # the BLS's configured schedule (before it resolves "auto" for its cores)
    llmapi: bool = False  # Triton's llmapi model (the LLM API path): no K per request, no token ids
    add_special_tokens: bool | None = None  # how the server tokenizes a prompt (None: not known)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Deployment:
        """The BLS's settings as the BLS reads them (`contract.bls_params`); nothing known from another config."""
        try:
            bls = BlsParameters.from_parameters(parameter_values(config))
        except ValueError:  # not a BLS's config, or one the BLS itself would refuse
            return cls()
        return cls(
            bls.max_draft_len,
            bls.num_draft_tokens,
            bls.adaptive_draft_len,
            bls.overlap,
            add_special_tokens=bls.add_special_tokens,
        )

    @classmethod
    def of_llmapi(cls) -> Deployment:
        return cls(llmapi=True, add_special_tokens=LLMAPI_ADD_SPECIAL_TOKENS)


READY_WAIT_S = 30.0  # how long `check_ready` waits for a live server to become ready (a model reload: 2-13 s)


@dataclass
class Streamed:
    text: str
    ttft_seconds: float | None
    outputs: dict[str, Any]  # the final response's outputs (finish_reason, figures)


def read_stream(
    chunks: Iterable[Any], on_text: Callable[[str], None] | None = None, started: float | None = None
) -> Streamed:
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


class TargetTokenizer:
    """The target's tokenizer, loaded on first use (one for every thread of a bench): what a server does not send
    (prompt ids; an llmapi deployment's output ids and counts) computed here as the server computes it."""

    def __init__(self, tokenizer_dir: str | Path):
        self.tokenizer_dir = tokenizer_dir
        self._loaded: Any = None
        self._lock = threading.Lock()  # fast tokenizers are not safe to call from several threads at once

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if not text:
            return []
        with self._lock:
            if self._loaded is None:
                from transformers import AutoTokenizer

                try:
                    self._loaded = AutoTokenizer.from_pretrained(str(self.tokenizer_dir), local_files_only=True)
                except (OSError, ValueError) as err:
                    raise ClientError(
                        f"the target's tokenizer (for what the server does not send: token ids and "
                        f"counts) does not load from {self.tokenizer_dir}: {err}"
                    ) from None
            return [int(t) for t in self._loaded(text, add_special_tokens=add_special_tokens)["input_ids"]]

    def count(self, text: str) -> int:
        """The tokens of a generated text (no special tokens added)."""
        return len(self.encode(text))


class ServedSession:
    def __init__(
        self,
        url: str,
        protocol: str = "grpc",
        model: str = MODEL,
        timeout: float = 300.0,
        spec_path: str | None = None,
        llmapi_k: int | None = None,
        tokenizer: TargetTokenizer | None = None,
    ):
        from specbuild.triton.client import SpecbuildClient

        self.url, self.protocol = url, protocol
        self.spec_path = spec_path  # shown in the "no server" advice
        self.llmapi_k = llmapi_k  # an llmapi deployment's K (the server cannot say it)
        self.tokenizer = tokenizer  # the target's: prompt ids, and an llmapi deployment's token ids (None: not known)
        self.client = SpecbuildClient(url, protocol=protocol, model=model, timeout=timeout)
        self._deployment: Deployment | None = None

    @classmethod
    def for_spec(
        cls,
        spec: Spec,
        protocol: str = "grpc",
        url: str | None = None,
        timeout: float = 300.0,
        spec_path: str | None = None,
    ) -> ServedSession:
        """A session on the spec's server (`server_url`) that also knows what an llmapi deployment of the spec
        does not send: its K and the target's tokenizer."""
        return cls(
            server_url(spec, protocol, url),
            protocol,
            timeout=timeout,
            spec_path=spec_path,
            llmapi_k=spec.speculative.num_draft_tokens,
            tokenizer=TargetTokenizer(spec.target.checkpoint),
        )

    def __enter__(self) -> ServedSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.client.close()

    def deployment(self) -> Deployment:
        if self._deployment is None:
            if self.client.is_llmapi():
                self._deployment = Deployment.of_llmapi()
            else:
                self._deployment = Deployment.from_config(self.client.model_config())
        return self._deployment

    def no_server(self) -> ClientError:
        """The error for an address where no server answers, with what to do."""
        c = f" -c {self.spec_path}" if self.spec_path else ""
        other = "grpc" if self.protocol == "http" else "http"
        return ClientError(
            f"no Triton server answers at {self.url} ({self.protocol}). Start one with `specbuild serve{c}` "
            f"(or `specbuild up{c}`), pass --url with its address (with --protocol {other} if it is Triton's "
            f"{other} port), or run in-process with `specbuild generate{c} --local ...`."
        )

    def unavailable(self) -> ClientError:
        """The error for a server that is not ready: one that answers but is loading or reloading a model says so;
        where nothing answers, `no_server`."""
        if not self.client.is_live():
            return self.no_server()
        return ClientError(
            f"the Triton server at {self.url} answers but is not ready: a model is loading, or being reloaded after a "
            "failure (specbuild serve's supervisor reloads one in seconds; its log says which). Try again shortly."
        )

    def check_ready(self, wait_s: float = READY_WAIT_S) -> None:
        """Return once the server is ready; a live server that is not (a model loading or reloading) is given
        wait_s to become ready."""
        deadline = time.monotonic() + wait_s
        while not self.client.is_ready():
            if time.monotonic() >= deadline or not self.client.is_live():
                raise self.unavailable()
            time.sleep(0.5)

    def resolve_k(self, requested: int | None) -> ResolvedK | None:
        """An llmapi deployment's K (it drafts one fixed K and does not say it): `resolve_fixed_k` with the spec's
        num_draft_tokens; None when the session was not given it. The BLS resolves K itself and says which it used
        (`speculation_stats.k`), so this is never asked of a BLS."""
        return None if self.llmapi_k is None else resolve_fixed_k(requested, self.llmapi_k)

    def generate(
        self, prompt: str, options: Options, on_text: Callable[[str], None] | None = None, stream: bool = True
    ) -> Generation:
        """One request, its text streamed to on_text; ClientError with the server's message on failure."""
        # The BLS applies the K rule itself and says which K it used; the llmapi model drafts a fixed K it does not say
        llmapi = self.deployment().llmapi
        k = self.resolve_k(options.num_draft_tokens) if llmapi else None
        asked = (k.k if k else None) if llmapi else options.num_draft_tokens
        started = time.perf_counter()
        try:
            chunks = self.client.generate(
                prompt,
                max_tokens=options.max_tokens,
                num_draft_tokens=asked,
                temperature=options.temperature,
                top_k=options.top_k,
                top_p=options.top_p,
                seed=options.seed,
                stream=stream,
                overlap=options.overlap,
                drafter=options.drafter,
                stop_words=list(options.stop),
                guide_type=options.guide_type,
                guide=options.guide,
            )
            streamed = read_stream(chunks, on_text, started)
        except ClientError:
            grpc_missing = self.protocol == "grpc" and importlib.util.find_spec("tritonclient") is None
            if grpc_missing or self.client.is_ready():
                raise  # its message says how to install the client, or what the server refused
            raise self.unavailable() from None
        seconds = time.perf_counter() - started
        out = streamed.outputs
        figures = out.get("speculation_stats")
        stats = (
            SpeculationStats.from_dict(figures)
            if isinstance(figures, dict)
            else SpeculationStats(
                drafted=int(out.get("total_draft_tokens") or 0),
                accepted=int(out.get("total_accepted_draft_tokens") or 0),
            )
        )
        if isinstance(figures, dict) and "k" in figures:
            k = ResolvedK.from_dict(figures["k"])  # the K the BLS used
        # the schedule the BLS ran (it sends it with the figures), else what was asked, else the deployment's
        overlap = (
            figures.get("overlap")
            if isinstance(figures, dict) and "overlap" in figures
            else (options.overlap if options.overlap is not None else self.deployment().overlap)
        )
        count = int(out["num_output_tokens"]) if "num_output_tokens" in out else None
        output_ids: list[int] | None = [int(t) for t in out.get("output_ids", [])]
        extra: dict[str, Any] = {}
        estimated = False
        if llmapi:  # text only: no ids, and a count only where the LLM API's own rule gives it
            output_ids = None
            extra["token_ids"] = "not sent: Triton's llmapi model sends text only (no output ids, no token count)"
            count, estimated = self._llmapi_tokens(streamed.text, out.get("finish_reason"), options.max_tokens)
            if count:
                stats.steps = max(count - stats.accepted, 1)
        add_special = self.deployment().add_special_tokens
        prompt_ids = (
            self.tokenizer.encode(prompt, add_special)
            if self.tokenizer is not None and add_special is not None
            else None
        )
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
            num_output_tokens=count,
            count_estimated=estimated,
            prompt_ids=prompt_ids,
            overlap=overlap,
            drafter=figures.get("drafter") if isinstance(figures, dict) else options.drafter,
            extra={
                "engine_source": None,
                "server": {"url": self.url, "protocol": self.protocol},
                "sampling": options.sampling_dict(),
                **extra,
            },
        )

    def _llmapi_tokens(self, text: str, finish_reason: str | None, max_tokens: int) -> tuple[int | None, bool]:
        """An llmapi generation's token count and whether it is an estimate: max_tokens when it ended on "length"
        (exact), else the text tokenized again with the target's tokenizer (an estimate: a byte-level token that
        decodes to U+FFFD, or a word split otherwise, tokenizes to a different count), else None."""
        if finish_reason == "length":
            return int(max_tokens), False
        if self.tokenizer is None:
            return None, False
        return self.tokenizer.count(text), True
