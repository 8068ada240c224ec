"""Triton transport: the `tensorrt_llm_bls` model of a running server, through `SpecbuildClient`.

One streamed request per measurement, K = 0 included (the same BLS, so the same deployment).
TTFT is the arrival of the first non-empty text chunk; the final response's `speculation_stats`
(the loop's SpeculationStats as JSON) gives drafted/accepted/steps, per-position counts and the
draft/target seconds measured inside the server. Rejection counts are not sent, so alpha is
inverted from acceptance_rate (`stats.alpha_from_acceptance_rate`). Each thread keeps its own
client, so N concurrent streams are N real connections.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from specbuild.bench.runner import Settings
from specbuild.bench.stats import RequestResult, top_token_share
from specbuild.bench.workloads import Prompt
from specbuild.errors import BenchError, ClientError

MODEL = "tensorrt_llm_bls"


class RemoteTransport:
    name = "triton"
    concurrent = True

    def __init__(self, url: str, protocol: str = "http", max_draft_len: int | None = None):
        self.url = url
        self.protocol = protocol
        self.max_draft_len = max_draft_len
        self._local = threading.local()
        self._clients: list[Any] = []
        self._lock = threading.Lock()

    @classmethod
    def connect(cls, url: str, protocol: str = "http") -> "RemoteTransport":
        """Check the server is ready and read the BLS model's max_draft_len from its config."""
        transport = cls(url, protocol)
        client = transport._client()
        try:
            ready = client.is_ready()
        except ClientError:
            ready = False
        if not ready:
            raise BenchError(f"no ready Triton server at {url} ({protocol}): start one with `specbuild up` or "
                             "`specbuild serve`, pass --url with its address, or measure in-process with --local.")
        transport.max_draft_len = transport._read_max_draft_len()
        return transport

    def _client(self):
        client = getattr(self._local, "client", None)
        if client is None:
            from specbuild.triton.client import SpecbuildClient

            client = SpecbuildClient(self.url, protocol=self.protocol, model=MODEL)
            self._local.client = client
            with self._lock:
                self._clients.append(client)
        return client

    def _read_max_draft_len(self) -> int | None:
        config = self._model_config()
        value = (config.get("parameters", {}).get("max_draft_len") or {}).get("string_value")
        return int(value) if value and value.isdigit() else None

    def _model_config(self) -> dict[str, Any]:
        host = self._client().url
        if self.protocol == "http":
            try:
                with urllib.request.urlopen(f"http://{host}/v2/models/{MODEL}/config", timeout=30) as response:
                    return json.loads(response.read().decode())
            except (urllib.error.URLError, OSError, ValueError):
                return {}
        try:
            import tritonclient.grpc as grpcclient

            with grpcclient.InferenceServerClient(host) as client:
                return client.get_model_config(MODEL, as_json=True).get("config", {})
        except Exception:  # noqa: BLE001 - tritonclient raises several types; the limit is optional
            return {}

    def request(self, prompt: Prompt, k: int, max_tokens: int, settings: Settings,
                concurrent: bool = False) -> RequestResult:
        client = self._client()
        extra: dict[str, Any] = {"temperature": settings.temperature}
        if settings.temperature > 0:
            extra["seed"] = settings.seed
        start = time.perf_counter()
        ttft = None
        stats: dict[str, Any] = {}
        for chunk in client.generate(prompt.text, max_tokens=max_tokens, num_draft_tokens=k, stream=True, **extra):
            if chunk.text and ttft is None:
                ttft = time.perf_counter() - start
            if chunk.stats:
                stats = chunk.stats
        seconds = time.perf_counter() - start
        loop = stats.get("speculation_stats")
        loop = loop if isinstance(loop, dict) else {}
        output = stats.get("num_output_tokens")
        if output is None:
            output = len(stats.get("output_ids") or [])
        return RequestResult(
            prompt_index=0, num_draft_tokens=k, output_tokens=int(output), seconds=seconds,
            ttft_seconds=ttft if ttft is not None else seconds,
            drafted=int(loop.get("drafted", stats.get("total_draft_tokens", 0))),
            accepted=int(loop.get("accepted", stats.get("total_accepted_draft_tokens", 0))),
            steps=int(loop.get("steps", 0)),
            per_position_drafted=[int(x) for x in loop.get("per_position_drafted", [])],
            per_position_accepted=[int(x) for x in loop.get("per_position_accepted", [])],
            draft_seconds=float(loop.get("draft_seconds", 0.0)),
            target_seconds=float(loop.get("target_seconds", 0.0)),
            top_token_share=top_token_share(stats.get("output_ids") or []),
        )

    def close(self) -> None:
        for client in self._clients:
            client.close()
