"""`specbuild bench --url` against Triton's llmapi model: one K, the deployment's.

The LLM API has no per-request K (it drafts its configured max_draft_len at every step), so this
transport measures only that K, which `specbuild build --backend llmapi` wrote from the spec's
num_draft_tokens (and which the server cannot report: it is read from the spec, said in the notes).
There is no K = 0 on the same deployment, so no speedup column; what one run measures is the serving
overhead: Triton's tokens/s against the in-process runtime at the same K, requests interleaved
(`bench.session` adds the local peer).

Per request: one streamed request through `SpecbuildClient`; TTFT is the first non-empty chunk; output
tokens as `llmapi.client` counts them (max_tokens on finish "length", else the text re-tokenized);
drafted / accepted from the perf metrics; verify steps = output tokens - accepted (each step yields its
accepted tokens plus one).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from specbuild.bench.runner import Settings
from specbuild.bench.stats import RequestResult
from specbuild.bench.workloads import Prompt
from specbuild.errors import BenchError


class LlmapiTransport:
    name = "triton"
    concurrent = True

    def __init__(self, url: str, protocol: str, k: int, count_tokens: Any = None):
        self.url, self.protocol = url, protocol
        self.fixed_k = k  # the only K this deployment serves
        self.max_draft_len = k
        self.count_tokens = count_tokens
        self._local = threading.local()
        self._clients: list[Any] = []
        self._lock = threading.Lock()
        self.notes = [f"llmapi deployment: one K = {k} (the LLM API drafts max_draft_len tokens at every step; "
                      "K read from the spec's num_draft_tokens), so no K = 0 baseline and no speedup on the server"]

    def _client(self):
        client = getattr(self._local, "client", None)
        if client is None:
            from specbuild.triton.client import SpecbuildClient

            client = SpecbuildClient(self.url, protocol=self.protocol, model="tensorrt_llm",
                                     count_tokens=self.count_tokens)
            self._local.client = client
            with self._lock:
                self._clients.append(client)
        return client

    def request(self, prompt: Prompt, k: int, max_tokens: int, settings: Settings,
                concurrent: bool = False) -> RequestResult:
        if k != self.fixed_k:
            raise BenchError(f"the llmapi deployment drafts K = {self.fixed_k} tokens per step; K = {k} cannot be "
                             "asked per request.")
        extra: dict[str, Any] = {"temperature": settings.temperature}
        if settings.temperature > 0:
            extra["seed"] = settings.seed
        start = time.perf_counter()
        ttft = None
        stats: dict[str, Any] = {}
        for chunk in self._client().generate(prompt.text, max_tokens=max_tokens, stream=True, **extra):
            if chunk.text and ttft is None:
                ttft = time.perf_counter() - start
            if chunk.stats:
                stats = chunk.stats
        seconds = time.perf_counter() - start
        output = int(stats.get("num_output_tokens") or 0)
        accepted = int(stats.get("total_accepted_draft_tokens") or 0)
        return RequestResult(prompt_index=0, num_draft_tokens=k, output_tokens=output, seconds=seconds,
                             ttft_seconds=ttft if ttft is not None else seconds,
                             drafted=int(stats.get("total_draft_tokens") or 0), accepted=accepted,
                             steps=max(output - accepted, 1 if output else 0))

    def close(self) -> None:
        for client in self._clients:
            client.close()


def connect(url: str, protocol: str, spec) -> LlmapiTransport | None:
    """An LlmapiTransport when the server at url serves Triton's llmapi model, else None."""
    from specbuild.llmapi.checkpoint import checkpoint_dir
    from specbuild.triton.client import SpecbuildClient

    with SpecbuildClient(url, protocol=protocol) as probe:
        if not probe.is_ready() or not probe.is_llmapi():
            return None
    folder = checkpoint_dir(spec, "target")
    tokenizer_dir = folder if (folder / "tokenizer_config.json").is_file() else Path(spec.target.checkpoint)
    from specbuild.llmapi.up import token_counter

    return LlmapiTransport(url, protocol, spec.speculative.num_draft_tokens, token_counter(tokenizer_dir))
