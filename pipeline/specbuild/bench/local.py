"""In-process transport: the reference runtime's Drafter and Verifier driven by the draft/verify loop.

Each request runs `speculative.loop.generate` once; K = 0 goes through the same loop (plain target
steps), so "speculation off" and "on" share every line of code but the drafting. Timing covers
tokenization, every draft and verify call and the loop's own work; the loop's per-step Step records
give drafted/accepted counts, draft and target seconds, and whether the step saw a rejection.
`overlap` is the loop's schedule (False: sequential; True or "auto": draft-ahead, see
speculative/overlap.py); "auto" runs concurrent requests sequentially, since their batches already
keep the cores busy.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
import threading
from dataclasses import dataclass, field

from specbuild.bench.runner import Settings
from specbuild.bench.stats import RequestResult, top_token_share
from specbuild.bench.workloads import Prompt
from specbuild.speculative.interfaces import Drafter, SamplingParams, Verifier


@dataclass
class LocalTransport:
    drafter: Drafter
    verifier: Verifier
    encode: Callable[[str], Sequence[int]]  # prompt text -> token ids
    end_id: int | None = None
    name: str = "local"
    concurrent: bool = False  # True when `batched` can serve several requests at once
    source: dict[str, str] | None = None  # where the weights came from, per role (reference-engine / hf-checkpoint)
    batched: Callable[[], tuple[Drafter, Verifier]] | None = None  # builds the pair used by concurrent requests
    close_batched: Callable[[], None] | None = None
    overlap: bool | str = False  # the loop's schedule for single requests (GenerationRequest.overlap)
    peers: list[LocalTransport] = field(default_factory=list)  # other schedules on the same models (overlap="compare")
    _batched_pair: tuple[Drafter, Verifier] | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @property
    def max_draft_len(self) -> int | None:
        return getattr(self.verifier, "max_draft_len", None)

    def _pair(self, concurrent: bool) -> tuple[Drafter, Verifier]:
        if not concurrent or self.batched is None:
            return self.drafter, self.verifier
        with self._lock:
            if self._batched_pair is None:
                self._batched_pair = self.batched()
            return self._batched_pair

    def close(self) -> None:
        if self.close_batched is not None:
            self.close_batched()
        self._batched_pair = None

    def request(self, prompt: Prompt, k: int, max_tokens: int, settings: Settings,
                concurrent: bool = False) -> RequestResult:
        """One generation; `concurrent` requests (several threads at once) go through the batching pair."""
        from specbuild.speculative.loop import GenerationRequest, generate

        drafter, verifier = self._pair(concurrent)

        sampling = SamplingParams(temperature=settings.temperature, seed=settings.seed if settings.temperature > 0 else None)
        overlap = False if concurrent and self.overlap == "auto" else self.overlap
        gen = GenerationRequest(max_tokens=max_tokens, num_draft_tokens=k, sampling=sampling, end_id=self.end_id,
                                overlap=overlap)
        start = time.perf_counter()
        with self._lock:  # fast tokenizers are not safe to call from several threads at once
            ids = list(self.encode(prompt.text))
        ttft = None
        out = rejections = 0
        tried: list[int] = []
        tokens: list[int] = []
        stats = None
        for step in generate(ids, drafter, verifier, gen):
            if step.tokens and ttft is None:
                ttft = time.perf_counter() - start
            out += len(step.tokens)
            tokens.extend(step.tokens)
            rejections += step.accepted < step.drafted
            reached = min(step.accepted + 1, step.drafted)  # positions actually put to the test
            tried.extend([0] * (reached - len(tried)))
            for i in range(reached):
                tried[i] += 1
            if step.stats is not None:
                stats = step.stats
        seconds = time.perf_counter() - start
        result = RequestResult(prompt_index=0, num_draft_tokens=k, output_tokens=out, seconds=seconds,
                               ttft_seconds=ttft if ttft is not None else seconds, rejections=rejections,
                               per_position_tried=tried, top_token_share=top_token_share(tokens))
        if stats is not None:
            result.drafted, result.accepted, result.steps = stats.drafted, stats.accepted, stats.steps
            result.per_position_drafted = list(stats.per_position_drafted)
            result.per_position_accepted = list(stats.per_position_accepted)
            result.draft_seconds, result.target_seconds = stats.draft_seconds, stats.target_seconds
            result.early_drafts, result.early_draft_hits = stats.early_drafts, stats.early_draft_hits
            result.hidden_seconds = stats.hidden_seconds
        return result

    def with_overlap(self, overlap: bool | str, name: str, drafter: Drafter | None = None) -> LocalTransport:
        """The same models under another schedule, with `drafter` when given (for measuring both schedules in
        one run; concurrency 1 only)."""
        return LocalTransport(drafter or self.drafter, self.verifier, self.encode, end_id=self.end_id, name=name,
                              source=self.source, overlap=overlap)


def from_spec(spec, log: Callable[[str], None] = lambda m: None, threads: int | None = None,
              row_block: int | None = None, overlap: bool | str | None = None) -> LocalTransport:
    """The spec's pair in-process: reference engines when built, else the HF checkpoints (`runtime.loading`).

    overlap: the schedule (None = the spec's speculative.overlap), "auto" resolved for this machine by
    `runtime.loading.resolve_overlap`.

    Concurrent requests share the models through `runtime.batcher.Batcher` (their sequences share forward
    passes, like Triton's dynamic batching); single requests call the models directly.
    """
    from transformers import AutoTokenizer

    from specbuild.runtime.loading import load_pair

    compare = overlap == "compare"
    setting = True if compare else spec.speculative.overlap if overlap is None else overlap
    pair = load_pair(spec, threads=threads, row_block=row_block, overlap=setting)
    log(f"local runtime: target from {pair.target.kind} ({pair.target.path}), draft from {pair.draft.kind}; "
        f"{'comparing the sequential and overlapped schedules' if compare else pair.overlap_reason}")
    tokenizer = AutoTokenizer.from_pretrained(str(pair.tokenizer_dir), local_files_only=True)
    batchers: list = []

    def batched() -> tuple[Drafter, Verifier]:
        from specbuild.runtime.batcher import Batcher
        from specbuild.speculative.contract_client import ContractDrafter, ContractVerifier

        target, draft = Batcher(pair.target_model), Batcher(pair.draft_model)
        batchers.extend([target, draft])
        return (ContractDrafter(draft, end_id=pair.end_id, use_logits=spec.speculative.use_draft_logits),
                ContractVerifier(target, max_draft_len=pair.max_draft_len, end_id=pair.end_id))

    def close() -> None:
        while batchers:
            batchers.pop().close()
        pair.close()

    schedule = False if compare else pair.overlap
    transport = LocalTransport(pair.drafter_for(schedule), pair.verifier, encode=lambda text: tokenizer(text)["input_ids"],
                               end_id=pair.end_id, concurrent=True,
                               source={"target": pair.target.kind, "draft": pair.draft.kind},
                               batched=batched, close_batched=close, overlap=schedule)
    if compare:
        transport.peers = [transport.with_overlap(pair.overlap, "local-overlap", pair.drafter_for(pair.overlap))]
    return transport
