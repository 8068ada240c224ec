"""In-process transport: one request = one `LocalSession.generate` (the draft/verify loop on the reference runtime).

K = 0 goes through the same loop (plain target steps), so "speculation off" and "on" share every line
of code but the drafting. Timing covers tokenization, every draft and verify call and the loop's own
work (no detokenization); the session's per-step records give drafted/accepted counts and whether a
step saw a rejection.
`overlap` is the transport's schedule (False: sequential; True or "auto": draft-ahead, see
speculative/overlap.py), passed to the session per request; "auto" runs concurrent requests sequentially,
since their batches already keep the cores busy.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from specbuild.bench.runner import Settings
from specbuild.bench.stats import RequestResult, top_token_share
from specbuild.bench.workloads import Prompt
from specbuild.decode.generation import Generation, Options
from specbuild.speculative.interfaces import Drafter, Verifier


def request_result(gen: Generation, k: int) -> RequestResult:
    """A benchmark record of one finished generation."""
    tried: list[int] = []  # [K] steps that drafted position i with every position before it accepted
    for step in gen.steps:
        reached = min(step.accepted + 1, step.drafted)  # positions actually put to the test
        tried.extend([0] * (reached - len(tried)))
        for i in range(reached):
            tried[i] += 1
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
        rejections=sum(1 for step in gen.steps if step.accepted < step.drafted),
        per_position_drafted=list(stats.per_position_drafted),
        per_position_accepted=list(stats.per_position_accepted),
        draft_seconds=stats.draft_seconds,
        target_seconds=stats.target_seconds,
        early_drafts=stats.early_drafts,
        early_draft_hits=stats.early_draft_hits,
        hidden_seconds=stats.hidden_seconds,
        by_drafter={name: dict(counts) for name, counts in stats.by_drafter.items()},
        per_position_tried=tried,
        top_token_share=top_token_share(gen.output_ids),
        output_ids=list(gen.output_ids),
    )


@dataclass
class LocalTransport:
    session: Any  # session.local.LocalSession
    name: str = "local"
    concurrent: bool = False  # True when `batched` can serve several requests at once
    verifier: Verifier | None = None  # another verifier over the session's drafter (e.g. the plain target)
    only_ks: tuple[int, ...] | None = None  # the K values this transport measures (None: every K of the sweep)
    batched: Callable[[], tuple[Drafter, Verifier]] | None = None  # builds the pair used by concurrent requests
    close_batched: Callable[[], None] | None = None
    overlap: bool | str = False  # the loop's schedule for single requests (GenerationRequest.overlap)
    drafter: str | None = None  # what proposes (specbuild.drafters); None: the session's default
    peers: list[LocalTransport] = field(default_factory=list)  # other schedules on the same models (overlap="compare")
    sweeps_concurrency: bool = False  # as a peer, measured at every concurrency too (Triton against in-process)
    _batched_pair: tuple[Drafter, Verifier] | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @property
    def max_draft_len(self) -> int | None:
        return self.session.max_draft_len

    @property
    def end_id(self) -> int | None:
        return self.session.end_id

    def _pair(self, concurrent: bool) -> tuple[Drafter, Verifier] | None:
        if self.verifier is not None:
            return self.session.drafter, self.verifier
        if not concurrent or self.batched is None:
            return None
        with self._lock:
            if self._batched_pair is None:
                self._batched_pair = self.batched()
            return self._batched_pair

    def close(self) -> None:
        if self.close_batched is not None:
            self.close_batched()
        self._batched_pair = None

    def request(
        self, prompt: Prompt, k: int, max_tokens: int, settings: Settings, concurrent: bool = False
    ) -> RequestResult:
        """One generation; `concurrent` requests (several threads at once) go through the batching pair."""
        overlap = False if concurrent and self.overlap == "auto" else self.overlap
        options = Options(
            max_tokens=max_tokens,
            num_draft_tokens=k,
            temperature=settings.temperature,
            seed=settings.seed if settings.temperature > 0 else None,
            adaptive=False,
            overlap=overlap,
            drafter=self.drafter,
        )
        gen = self.session.generate(prompt.text, options, pair=self._pair(concurrent), text=False)
        return request_result(gen, gen.k.k)

    def with_overlap(self, overlap: bool | str, name: str) -> LocalTransport:
        """The same session under another schedule (for measuring both schedules in one run; concurrency 1 only)."""
        return LocalTransport(self.session, name=name, overlap=overlap, drafter=self.drafter)

    def with_drafter(self, drafter: str, name: str) -> LocalTransport:
        """The same session with another drafter (for comparing drafters in one run; concurrency 1 only)."""
        return LocalTransport(self.session, name=name, overlap=self.overlap, drafter=drafter)


def from_spec(
    spec,
    log: Callable[[str], None] = lambda m: None,
    threads: int | None = None,
    row_block: int | None = None,
    overlap: bool | str | None = None,
) -> LocalTransport:
    """The spec's pair in-process: reference engines when built, else the HF checkpoints (`reference.loading`).

    overlap: the schedule (None = the spec's speculative.overlap), "auto" resolved for this machine by
    `reference.loading.resolve_overlap`.

    Concurrent requests share the models through `reference.batcher.Batcher` (their sequences share forward
    passes, like Triton's dynamic batching); single requests call the models directly.
    """
    from specbuild.session.local import LocalSession

    compare = overlap == "compare"
    setting = True if compare else spec.speculative.overlap if overlap is None else overlap
    session = LocalSession.from_spec(spec, threads=threads, row_block=row_block, overlap=setting)
    pair = session.pair
    log(
        f"local runtime: target from {pair.target.kind} ({pair.target.path}), "
        + (f"draft from {pair.draft.kind}; " if pair.draft is not None else "no draft model; ")
        + f"{'comparing the sequential and overlapped schedules' if compare else session.overlap_reason}"
    )
    batchers: list = []

    def batched() -> tuple[Drafter, Verifier]:
        from specbuild.contract.adapters import ContractDrafter, ContractVerifier
        from specbuild.reference.batcher import Batcher

        target = Batcher(pair.target_model)
        draft = Batcher(pair.draft_model) if pair.draft_model is not None else None
        batchers.extend(b for b in (target, draft) if b is not None)
        return (
            ContractDrafter(draft, end_id=pair.end_id, use_logits=spec.speculative.use_draft_logits) if draft else None,
            ContractVerifier(target, max_draft_len=pair.max_draft_len, end_id=pair.end_id),
        )

    def close() -> None:
        while batchers:
            batchers.pop().close()
        session.close()

    transport = LocalTransport(
        session, concurrent=True, batched=batched, close_batched=close, overlap=False if compare else session.overlap
    )
    if compare:
        transport.peers = [
            transport.with_overlap(session.overlap, f"{transport.name}-overlap"),
            transport.with_overlap("auto", f"{transport.name}-auto"),
        ]
    return transport


def plain_target(transport: LocalTransport, device: str | None = None) -> LocalTransport:
    """Target-only decoding on a second copy of the target with 1-row matmuls (`bench --vs-plain`).

    The engine's fixed row blocks are the price of exact greedy equality and can slow single-token steps;
    this copy is the fastest plain decoding the runtime has, so the honest speedup compares against the
    faster of the two target-only runs."""
    from specbuild.contract.adapters import ContractVerifier
    from specbuild.reference.loading import load_contract_model

    pair = transport.session.pair
    model = load_contract_model(pair.target, device, row_block=1, probe=False)  # one row: exact by construction
    verifier = ContractVerifier(model, max_draft_len=pair.max_draft_len, end_id=pair.end_id)
    return LocalTransport(transport.session, name="plain", verifier=verifier, only_ks=(0,))
