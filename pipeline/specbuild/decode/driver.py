"""The one driver of the draft/verify loop: steps in, text deltas and a `Generation` out.

Every in-process consumer of `speculative.loop.generate` goes through `drive`: `specbuild generate
--local`, the in-process benchmark and `check --measure` (through `LocalSession`) and the Triton BLS
model (with Drafter/Verifier over BLS calls), and the CPU stand-in for Triton's llmapi model
(`llmapi.llm`, both models in-process). It adds what the loop leaves out: incremental text
(`TextStream`), timing (time to first text, tokens/s), cancellation, NVIDIA's finish_reason and
stop_reason, and one record per verify step (also handed to `on_step` as it happens).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from specbuild.decode.generation import Generation, StepRecord, finish_reason
from specbuild.decode.textstream import TextStream
from specbuild.speculative.adaptive import AdaptiveK
from specbuild.speculative.draft_len import ResolvedK
from specbuild.speculative.guide import Guide
from specbuild.speculative.interfaces import Drafter, Verifier
from specbuild.speculative.loop import GenerationRequest, Step, generate
from specbuild.speculative.overlap import AutoSchedule
from specbuild.speculative.stats import SpeculationStats

__all__ = ["drive"]


def _stop_reason(
    output: list[int], request: GenerationRequest, words: dict[tuple[int, ...], str | int]
) -> str | int | list[int] | None:
    """The stop sequence the output ends with: what `words` calls it (its text, or a stop token id), else its ids."""
    for seq in request.stop_sequences:
        seq = [int(t) for t in seq]
        if output[-len(seq) :] == seq:
            return words.get(tuple(seq), seq)
    return None


def drive(
    prompt_ids: Sequence[int],  # [prompt_len]
    drafter: Drafter,
    verifier: Verifier,
    request: GenerationRequest,
    *,
    k: ResolvedK | None = None,  # the K resolution behind request.num_draft_tokens, reported as is
    text: TextStream | None = None,  # None: no text (token ids only)
    on_text: Callable[[str], None] | None = None,  # receives each new piece of text
    cancelled: Callable[[], bool] | None = None,  # polled before each step; True ends it as "cancelled"
    stop_words: dict[tuple[int, ...], str | int] | None = None,  # stop sequence -> its text (or id), for stop_reason
    controller: AdaptiveK | None = None,
    schedule: AutoSchedule | None = None,  # overlap = "auto": the deployment's (None: the request's own)
    ahead_drafter: Drafter | None = None,  # proposes the early drafts (None: drafter)
    on_step: Callable[[Step, list[int]], None] | None = None,  # each step and the output so far ([n])
    drafter_name: str | None = None,  # reported as Generation.drafter
    guide: Guide | None = None,  # the request's grammar state: structured output (speculative.guide)
) -> Generation:
    """Run one request to its end. A bad request raises RequestError before the first step."""
    output: list[int] = []
    records: list[StepRecord] = []
    stats, reason, first = SpeculationStats(), None, None
    started = time.perf_counter()
    steps = generate(prompt_ids, drafter, verifier, request, controller, schedule, ahead_drafter, guide)
    for step in steps:
        if cancelled is not None and cancelled():
            steps.close()
            reason = "cancelled"
            break
        output.extend(step.tokens)
        records.append(StepRecord(step.k, step.drafted, step.accepted))
        delta = text.push(step.tokens) if text is not None and step.tokens else ""
        if first is None and (delta or (text is None and step.tokens)):
            first = time.perf_counter() - started
        if delta and on_text is not None:
            on_text(delta)
        if on_step is not None:
            on_step(step, output)
        if step.finish_reason:
            reason, stats = step.finish_reason, step.stats or stats
    tail = text.finish() if text is not None and reason != "cancelled" else ""
    if tail and on_text is not None:
        on_text(tail)
    seconds = time.perf_counter() - started
    if first is None and output:
        first = seconds
    return Generation(
        text=text.text if text is not None else "",
        output_ids=output,
        finish_reason=finish_reason(reason),
        stop_reason=_stop_reason(output, request, stop_words or {}) if reason == "stop" else None,
        k=k,
        adaptive=request.adaptive,
        stats=stats,
        seconds=seconds,
        ttft_seconds=first,
        prompt_ids=[int(t) for t in prompt_ids],
        steps=records,
        overlap=request.overlap,
        drafter=drafter_name,
    )
