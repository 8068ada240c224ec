"""In-process transport: the reference runtime's Drafter and Verifier driven by the draft/verify loop.

Each request runs `speculative.loop.generate` once; K = 0 goes through the same loop (plain target
steps), so "speculation off" and "on" share every line of code but the drafting. Timing covers
tokenization, every draft and verify call and the loop's own work; the loop's per-step Step records
give drafted/accepted counts, draft and target seconds, and whether the step saw a rejection.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specbuild.bench.runner import Settings
from specbuild.bench.stats import RequestResult
from specbuild.bench.workloads import Prompt
from specbuild.speculative.interfaces import Drafter, SamplingParams, Verifier


@dataclass
class LocalTransport:
    drafter: Drafter
    verifier: Verifier
    encode: Callable[[str], Sequence[int]]  # prompt text -> token ids
    end_id: int | None = None
    name: str = "local"
    concurrent: bool = False  # one drafter/verifier pair: requests run one at a time
    source: dict[str, str] | None = None  # where the weights came from, per role (reference-engine / hf-checkpoint)

    @property
    def max_draft_len(self) -> int | None:
        return getattr(self.verifier, "max_draft_len", None)

    def request(self, prompt: Prompt, k: int, max_tokens: int, settings: Settings) -> RequestResult:
        from specbuild.speculative.loop import GenerationRequest, generate

        sampling = SamplingParams(temperature=settings.temperature, seed=settings.seed if settings.temperature > 0 else None)
        gen = GenerationRequest(max_tokens=max_tokens, num_draft_tokens=k, sampling=sampling, end_id=self.end_id)
        start = time.perf_counter()
        ids = list(self.encode(prompt.text))
        ttft = None
        out = rejections = 0
        tried: list[int] = []
        stats = None
        for step in generate(ids, self.drafter, self.verifier, gen):
            if step.tokens and ttft is None:
                ttft = time.perf_counter() - start
            out += len(step.tokens)
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
                               per_position_tried=tried)
        if stats is not None:
            result.drafted, result.accepted, result.steps = stats.drafted, stats.accepted, stats.steps
            result.per_position_drafted = list(stats.per_position_drafted)
            result.per_position_accepted = list(stats.per_position_accepted)
            result.draft_seconds, result.target_seconds = stats.draft_seconds, stats.target_seconds
        return result


def from_spec(spec, log: Callable[[str], None] = lambda m: None) -> LocalTransport:
    """The spec's pair in-process: reference engines when built, else the HF checkpoints (`runtime.loading`)."""
    from transformers import AutoTokenizer

    from specbuild.runtime.loading import load_pair

    pair = load_pair(spec)
    log(f"local runtime: target from {pair.target.kind} ({pair.target.path}), draft from {pair.draft.kind}")
    tokenizer = AutoTokenizer.from_pretrained(str(pair.tokenizer_dir), local_files_only=True)
    transport = LocalTransport(pair.drafter, pair.verifier, encode=lambda text: tokenizer(text)["input_ids"],
                               end_id=pair.end_id)
    transport.source = {"target": pair.target.kind, "draft": pair.draft.kind}
    return transport
