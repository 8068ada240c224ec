"""Triton transport: the `tensorrt_llm_bls` model of a running server, through `session.served.ServedSession`.

One streamed request per measurement, K = 0 included (the same BLS, so the same deployment). Against
Triton's llmapi model (the LLM API path) only one K is measured, the deployment's (`fixed_k`: the LLM API
drafts its max_draft_len at every step and takes no K per request; the session takes it from the spec), so
there is no K = 0 on the same deployment and no speedup; what such a run measures is the serving overhead
against the in-process runtime at that K. Its token counts and steps are the session's (`session.served`).
TTFT is the arrival of the first non-empty text chunk; the final response's `speculation_stats`
(the loop's SpeculationStats as JSON) gives drafted/accepted/steps, per-position counts and the
draft/target seconds measured inside the server. Rejection counts are not sent, so alpha is
inverted from acceptance_rate (`stats.alpha_from_acceptance_rate`). Each thread keeps its own
session, so N concurrent streams are N real connections. `overlap` (None: the server's schedule) is sent
with every request (a request parameter the BLS reads, `session.served`); the early-draft figures come
back in `speculation_stats`.
"""

from __future__ import annotations

import threading
from typing import Any

from specbuild.bench.runner import Settings
from specbuild.bench.stats import RequestResult, top_token_share
from specbuild.bench.workloads import Prompt
from specbuild.config import Spec
from specbuild.decode.generation import Options
from specbuild.errors import ClientError


class RemoteTransport:
    concurrent = True
    only_ks = None
    fixed_k: int | None = None  # the one K of a deployment that takes no K per request (llmapi)

    def __init__(
        self,
        url: str,
        protocol: str = "http",
        max_draft_len: int | None = None,
        spec_path: str | None = None,
        spec: Spec | None = None,
        overlap: bool | str | None = None,
        name: str = "triton",
        drafter: str | None = None,
    ):
        self.name = name
        self.drafter = drafter  # the drafter each request asks for (None: the server's)
        self.overlap = overlap  # the schedule each request asks for (None: the server's)
        self.url = url
        self.protocol = protocol
        self.max_draft_len = max_draft_len
        self.spec_path = spec_path
        self.spec = spec  # what an llmapi deployment does not say: its K, the target's tokenizer
        self.notes: list[str] = []
        self._tokenizer = None
        if spec is not None:
            from specbuild.session.served import TargetTokenizer

            self._tokenizer = TargetTokenizer(spec.target.checkpoint)  # one tokenizer for every thread
        self._local = threading.local()
        self._sessions: list[Any] = []
        self._lock = threading.Lock()

    @classmethod
    def connect(
        cls, url: str, protocol: str = "http", spec_path: str | None = None, spec: Spec | None = None
    ) -> RemoteTransport:
        """Check the server is ready and read the BLS's max_draft_len from its config (an llmapi deployment:
        its one K, from the spec)."""
        from specbuild.errors import BenchError

        transport = cls(url, protocol, spec_path=spec_path, spec=spec)
        session = transport._session()
        try:
            session.check_ready()
        except ClientError as err:
            raise BenchError(str(err)) from None
        deployment = session.deployment()
        if not deployment.llmapi:
            transport.max_draft_len = deployment.max_draft_len
            return transport
        k = session.resolve_k(None)
        if k is None:
            raise BenchError(
                f"{url} serves Triton's llmapi model, whose K the server does not report: run bench "
                "with the spec it was built from (-c)."
            )
        transport.fixed_k = transport.max_draft_len = k.k
        transport.notes = [
            f"llmapi deployment: one K = {k.k} (the LLM API drafts max_draft_len tokens at every "
            "step; K read from the spec's num_draft_tokens), so no K = 0 baseline and no speedup on "
            "the server"
        ]
        return transport

    def with_overlap(self, overlap: bool | str, name: str) -> RemoteTransport:
        """The same server under another schedule (for measuring both in one run)."""
        other = RemoteTransport(
            self.url, self.protocol, self.max_draft_len, self.spec_path, self.spec, overlap, name, self.drafter
        )
        other.fixed_k, other._tokenizer = self.fixed_k, self._tokenizer
        return other

    def with_drafter(self, drafter: str, name: str) -> RemoteTransport:
        """The same server with another drafter asked for (for comparing drafters in one run)."""
        other = self.with_overlap(self.overlap, name)
        other.drafter = drafter
        return other

    def _session(self):
        session = getattr(self._local, "session", None)
        if session is None:
            from specbuild.session.served import ServedSession

            session = ServedSession(
                self.url,
                self.protocol,
                spec_path=self.spec_path,
                llmapi_k=self.spec.speculative.num_draft_tokens if self.spec else None,
                tokenizer=self._tokenizer,
            )
            self._local.session = session
            with self._lock:
                self._sessions.append(session)
        return session

    def request(
        self, prompt: Prompt, k: int, max_tokens: int, settings: Settings, concurrent: bool = False
    ) -> RequestResult:
        options = Options(
            max_tokens=max_tokens,
            num_draft_tokens=k,
            temperature=settings.temperature,
            seed=settings.seed if settings.temperature > 0 else None,
            overlap=self.overlap,
            drafter=self.drafter,
        )
        gen = self._session().generate(prompt.text, options)
        stats = gen.stats
        return RequestResult(
            prompt_index=0,
            num_draft_tokens=k,
            output_tokens=gen.output_tokens,
            seconds=gen.seconds,
            ttft_seconds=gen.ttft_seconds if gen.ttft_seconds is not None else gen.seconds,
            drafted=stats.drafted,
            accepted=stats.accepted,
            steps=stats.steps,
            per_position_drafted=list(stats.per_position_drafted),
            per_position_accepted=list(stats.per_position_accepted),
            draft_seconds=stats.draft_seconds,
            target_seconds=stats.target_seconds,
            early_drafts=stats.early_drafts,
            early_draft_hits=stats.early_draft_hits,
            hidden_seconds=stats.hidden_seconds,
            by_drafter={name: dict(counts) for name, counts in stats.by_drafter.items()},
            top_token_share=top_token_share(gen.output_ids or ()),
            output_ids=list(gen.output_ids) if gen.output_ids is not None else None,  # [] is an answer too
        )

    def close(self) -> None:
        for session in self._sessions:
            session.close()
