"""The draft/verify loop (Leviathan et al. 2023, arXiv 2211.17192; Chen et al. 2023, arXiv 2302.01318).

Each step: the drafter proposes up to k tokens; the verifier scores context + draft in one target
forward pass and returns the accepted prefix plus one recovered or bonus token (acceptance.py).
With k = 0 the same code path is one plain target decoding step, so "speculation off" and
"speculation on" differ only in k.

Written once, free of torch and Triton: the reference runtime drives it in-process, the Triton BLS
model drives it through Triton calls. Both only implement `Drafter` and `Verifier`.

Two schedules, one loop. Sequential (overlap off): draft, then verify, then draft again. Overlapped
(draft-ahead, overlap.py): while the target verifies step i's draft, the drafter proposes step
i + 1's draft from context + draft + g (g = its own top token after the draft), on another thread;
when step i accepts the whole draft with bonus token g, step i + 1 uses that early draft and skips
its draft call, otherwise it drafts as usual. Which call produced a draft never changes the text:
the early draft is used only when its context, K and seed are exactly those of the call it replaces.

Rules this module owns:
- K per step = min(K, remaining budget - 1); K arrives resolved (draft_len.resolve_k, at most verifier.max_draft_len),
  so a step never overshoots max_tokens; exactly max_tokens tokens come out unless EOS or a stop sequence ends it first.
- EOS: the first end_id, or any of other_end_ids (a checkpoint that lists several), accepted or recovered/bonus,
  ends the request at once and is NOT part of the output, like TensorRT-LLM, whose sequence_length excludes
  end_id. Tokens after it are dropped.
- Stop sequences: matched against the generated tokens only (never the prompt), after every
  token, so a match may span steps. The output ends with the matched stop sequence (TensorRT-LLM
  and Hugging Face keep it too); callers that want it stripped drop the last len(seq) tokens.
- Seeds: drafter and verifier are stateless (like Triton calls), so each call gets its own seed,
  derive_seed(request seed, step index, role) with role 0 = drafter and 1 = verifier. Equal
  requests give equal output as long as implementations are deterministic given (inputs, seed).
  A sampling request without a seed draws one from OS entropy (not reproducible).
- Early drafts (overlap on): the early draft for step i + 1 is asked for with step i + 1's drafter
  seed and the K that step would choose if step i were a hit (the budget, and with adaptive K the
  controller's choice after an all-accepted update; seeded requests fix c, so that choice does not
  depend on timings). It is used only when step i + 1's context is exactly the one it continues and
  its K is the one it was asked for, so the output equals the sequential loop's token for token
  (same seed, same text) whatever the timing; otherwise it is discarded. The guess g itself is a
  greedy call and carries no seed.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specbuild.errors import GenerationError, RequestError
from specbuild.speculative.adaptive import AdaptiveK
from specbuild.speculative.draft_len import check_k
from specbuild.speculative.guide import Guide, GuidedVerifier, check_guided_sampling, cut_draft, keep_allowed
from specbuild.speculative.interfaces import Draft, Drafter, SamplingParams, Verification, Verifier
from specbuild.speculative.overlap import AutoSchedule, DraftAhead
from specbuild.speculative.sampling import validate_sampling
from specbuild.speculative.stats import SpeculationStats

__all__ = ["DRAFTER", "VERIFIER", "GenerationRequest", "GenerationResult", "Step", "derive_seed", "generate", "run"]

DRAFTER, VERIFIER = 0, 1  # the role argument of derive_seed


def derive_seed(seed: int, step: int, role: int) -> int:
    """The seed for one drafter (role 0) or verifier (role 1) call at verify step `step` (0-based).

    SeedSequence([seed, step, role]) hashed to 63 bits, so it fits signed and unsigned 64-bit tensors.
    """
    state = np.random.SeedSequence([int(seed), int(step), int(role)]).generate_state(2, np.uint32)
    return int((int(state[0]) << 32 | int(state[1])) & (2**63 - 1))


SEEDED_COST_RATIO = 0.25  # c assumed by adaptive K for seeded sampling requests without a cost_ratio


@dataclass(frozen=True)
class GenerationRequest:
    max_tokens: int  # tokens to generate at most (EOS and stop sequences may end it earlier)
    num_draft_tokens: int = 4  # K, already resolved (draft_len.resolve_k): 0 <= K <= verifier.max_draft_len
    sampling: SamplingParams = field(default_factory=SamplingParams)
    end_id: int | None = None  # EOS token id; None = never stop on a token
    other_end_ids: Sequence[int] = ()  # more ids that end the request as end_id does (specbuild.hfmodel.end_ids)
    stop_sequences: Sequence[Sequence[int]] = ()  # each a non-empty token id sequence
    adaptive: bool = False  # choose K per step from the running acceptance (adaptive.AdaptiveK)
    cost_ratio: float | None = None  # c for the adaptive controller; None = measure it from step timings
    overlap: bool | str = False  # draft ahead while verifying: False, True, or "auto" (stop while hits are rare)

    def validate(self) -> None:
        """Raise RequestError naming the first invalid field."""
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise RequestError(f"max_tokens = {self.max_tokens!r} is invalid: ask for at least 1 token.")
        check_k(self.num_draft_tokens)
        validate_sampling(self.sampling)
        for end in (self.end_id, *self.other_end_ids):
            if end is not None and (not _is_int(end) or end < 0):
                raise RequestError(f"end_id = {end!r} is invalid: use a token id >= 0, or leave it unset.")
        for seq in self.stop_sequences:
            if isinstance(seq, (str, bytes)) or len(seq) == 0 or not all(_is_int(t) and t >= 0 for t in seq):
                raise RequestError(
                    f"stop sequence {seq!r} is invalid: each must be a non-empty list of token ids >= 0."
                )
        if self.cost_ratio is not None and not (np.isfinite(self.cost_ratio) and self.cost_ratio >= 0):
            raise RequestError(f"cost_ratio = {self.cost_ratio!r} is invalid: use a number >= 0, or leave it unset.")
        if not (self.overlap is True or self.overlap is False or self.overlap == "auto"):
            raise RequestError(f'overlap = {self.overlap!r} is invalid: use true, false or "auto".')


@dataclass
class Step:
    index: int  # 0-based verify step
    tokens: list[int]  # [n] new tokens to stream, already cut at EOS / stop sequence / budget
    k: int  # draft tokens asked for, after clamping (0 = plain step)
    drafted: int  # draft tokens the drafter returned (<= k)
    accepted: int  # draft tokens the verifier kept (before any truncation)
    draft_seconds: float
    target_seconds: float
    finish_reason: str | None = None  # "length" | "eos" | "stop" on the last step, else None
    stats: SpeculationStats | None = None  # the request's totals, on the last step only
    early_hit: bool = False  # the draft was proposed while the previous step was verified


@dataclass
class GenerationResult:
    tokens: list[int]  # [n] generated tokens (prompt and EOS excluded)
    finish_reason: str  # "length" | "eos" | "stop"
    stats: SpeculationStats

    def to_dict(self) -> dict[str, Any]:
        return {"tokens": list(self.tokens), "finish_reason": self.finish_reason, "stats": self.stats.to_dict()}


def generate(
    prompt_ids: Sequence[int],  # [prompt_len]
    drafter: Drafter,
    verifier: Verifier,
    request: GenerationRequest,
    controller: AdaptiveK | None = None,
    schedule: AutoSchedule | None = None,
    ahead_drafter: Drafter | None = None,
    guide: Guide | None = None,
) -> Iterator[Step]:
    """Run the draft/verify loop, yielding one Step per verify call (stream step.tokens).

    With request.adaptive, K follows `controller` when given (e.g. one AdaptiveK shared by all
    requests of a deployment, so short requests benefit from what earlier ones measured), else a
    fresh AdaptiveK for this request. The request's K and max_draft_len still cap it. With request.overlap =
    "auto", `schedule` (one AutoSchedule per deployment, learning across requests) decides when to draft ahead;
    None: a fresh one for this request. `ahead_drafter`: what proposes the early drafts (e.g. the draft model in a
    process of its own); None: the drafter's `early_drafter` where it names one (the hybrid: its draft model), else
    `drafter`; the drafter always proposes the drafts a step makes itself, and is told of each early draft taken
    (`adopt`) where it takes the news. `guide`: this
    request's grammar state (speculative.guide): the output is the target's constrained greedy text, and the
    verifier must be a GuidedVerifier.
    """
    request.validate()
    if guide is not None:
        check_guided_sampling(request.sampling)
        if not isinstance(verifier, GuidedVerifier):
            raise GenerationError("a guided request needs a verifier that can step with banned tokens (step_banning).")
    if len(prompt_ids) == 0 or not all(_is_int(t) and t >= 0 for t in prompt_ids):
        raise RequestError(f"prompt_ids = {list(prompt_ids)[:8]!r} is invalid: give at least one token id >= 0.")
    max_draft_len = getattr(verifier, "max_draft_len", None)
    if not _is_int(max_draft_len) or max_draft_len < 0:
        raise GenerationError(f"verifier.max_draft_len = {max_draft_len!r} is invalid: it must be an integer >= 0.")
    if request.num_draft_tokens > max_draft_len:
        raise GenerationError(
            f"num_draft_tokens = {request.num_draft_tokens} exceeds the verifier's max_draft_len = {max_draft_len}: "
            "resolve K first (decode.request.RequestRules, or speculative.draft_len.resolve_k)."
        )
    k_max = request.num_draft_tokens
    if not request.adaptive:
        controller = None
    elif controller is None:
        cost_ratio = request.cost_ratio
        if cost_ratio is None and not request.sampling.greedy and request.sampling.seed is not None:
            # K decides which random draws each token uses: with a seed, K must not depend on wall-clock
            # timings, or the same seed would give different text. Greedy text never depends on K.
            cost_ratio = SEEDED_COST_RATIO
        controller = AdaptiveK(k_max, cost_ratio=cost_ratio)
    base_seed = None
    if not request.sampling.greedy:
        seed = request.sampling.seed
        base_seed = int(seed) if seed is not None else int(np.random.SeedSequence().entropy)
    # Validated before the first step, so a bad request fails at the call, not at the first next().
    if request.overlap == "auto" and schedule is None:
        schedule = AutoSchedule()
    return _steps(
        [int(t) for t in prompt_ids],
        drafter,
        verifier,
        request,
        k_max,
        controller,
        base_seed,
        schedule if request.overlap == "auto" else None,
        ahead_drafter or getattr(drafter, "early_drafter", drafter),
        guide,
    )


def _steps(
    prompt: list[int],  # [prompt_len]
    drafter: Drafter,
    verifier: Verifier,
    request: GenerationRequest,
    k_max: int,
    controller: AdaptiveK | None,
    base_seed: int | None,
    schedule: AutoSchedule | None,
    ahead_drafter: Drafter,
    guide: Guide | None = None,
) -> Iterator[Step]:
    sampling = request.sampling
    stops = [[int(t) for t in s] for s in request.stop_sequences]
    ahead = None
    if request.overlap and k_max > 0:
        ahead = DraftAhead(
            ahead_drafter,
            schedule,
            lambda output, draft, seconds: _k_after_a_hit(output, draft, seconds, request, stops, k_max, controller),
            lambda step: _seeded(sampling, base_seed, step, DRAFTER),
        )
    output: list[int] = []
    stats = SpeculationStats()
    index = 0
    try:
        while True:
            remaining = request.max_tokens - len(output)
            k = min(controller.choose() if controller is not None else k_max, k_max, remaining - 1)
            context = prompt + output

            early = ahead.take(context, k, stats) if ahead is not None else None
            if early is not None and (adopt := getattr(drafter, "adopt", None)) is not None:
                adopt(list(context), early)  # a drafter that chooses per step (the hybrid) learns from the hit too
            draft, draft_seconds = (early, early.seconds) if early is not None else (Draft(tokens=[]), 0.0)
            if k > 0 and early is None:
                t0 = time.perf_counter()
                draft = drafter.propose(list(context), k, _seeded(sampling, base_seed, index, DRAFTER))
                draft_seconds = draft.seconds or time.perf_counter() - t0
            if k > 0:
                _check_draft(draft, k)
                if guide is not None:
                    draft = cut_draft(draft, guide)
            if ahead is not None:
                ahead.start(context, output, draft, draft_seconds, index + 1, stats)

            t0 = time.perf_counter()
            verification = verifier.verify(list(context), draft, _seeded(sampling, base_seed, index, VERIFIER))
            target_seconds = verification.seconds or time.perf_counter() - t0
            _check_verification(verification, draft)
            if guide is not None:
                verification, constrained = keep_allowed(
                    verification, guide, verifier, list(context), _seeded(sampling, base_seed, index, VERIFIER)
                )
                stats.constrained_steps += constrained

            drafted, accepted = len(draft.tokens), verification.accepted
            stats.record_step(
                drafted,
                accepted,
                draft_seconds,
                target_seconds,
                getattr(draft, "source", "model") if k > 0 else None,
                fallback=k > 0 and getattr(draft, "failure", None) is not None,
            )
            if controller is not None:
                controller.update(drafted, accepted, draft_seconds, target_seconds)

            new, finish = _emit(verification.tokens, output, request, stops)
            yield Step(
                index=index,
                tokens=new,
                k=k,
                drafted=drafted,
                accepted=accepted,
                draft_seconds=draft_seconds,
                target_seconds=target_seconds,
                finish_reason=finish,
                stats=stats if finish else None,
                early_hit=early is not None,
            )
            if finish:
                return
            index += 1
    finally:
        if ahead is not None:
            ahead.close()


def _emit(
    tokens: Sequence[int], output: list[int], request: GenerationRequest, stops: list[list[int]]
) -> tuple[list[int], str | None]:
    """Append verified tokens to output until a stop rule fires: (the tokens appended, finish reason or None)."""
    new: list[int] = []
    for token in map(int, tokens):
        if (request.end_id is not None and token == request.end_id) or token in request.other_end_ids:
            return new, "eos"  # EOS ends the request at once and is not emitted
        output.append(token)
        new.append(token)
        if any(len(output) >= len(s) and output[-len(s) :] == s for s in stops):
            return new, "stop"  # the stop sequence stays in the output
        if len(output) >= request.max_tokens:
            return new, "length"
    return new, None


def _k_after_a_hit(
    output: list[int],
    draft: Draft,
    draft_seconds: float,
    request: GenerationRequest,
    stops: list[list[int]],
    k_max: int,
    controller: AdaptiveK | None,
) -> int:
    """The K of the next step if this one accepts its whole draft and a bonus token; 0 when that step would not
    draft or would not run (the draft ends the request)."""
    hypothetical = list(output)
    _, finish = _emit(draft.tokens, hypothetical, request, stops)
    if finish:
        return 0
    choice = k_max
    if controller is not None:
        predicted = copy.copy(controller)
        predicted.update(
            len(draft.tokens), len(draft.tokens), draft_seconds
        )  # this step's target time is not known yet
        choice = predicted.choose()
    return max(min(choice, k_max, request.max_tokens - len(hypothetical) - 2), 0)  # the budget after the bonus, - 1


def run(
    prompt_ids: Sequence[int],  # [prompt_len]
    drafter: Drafter,
    verifier: Verifier,
    request: GenerationRequest,
    controller: AdaptiveK | None = None,
    guide: Guide | None = None,
) -> GenerationResult:
    """generate() to completion: the generated tokens, why it stopped, and the statistics."""
    tokens: list[int] = []
    for step in generate(prompt_ids, drafter, verifier, request, controller, guide=guide):
        tokens.extend(step.tokens)
        if step.finish_reason:
            return GenerationResult(tokens, step.finish_reason, step.stats or SpeculationStats())
    raise GenerationError("the draft/verify loop ended without a finish reason")  # unreachable by construction


def _seeded(sampling: SamplingParams, base_seed: int | None, step: int, role: int) -> SamplingParams:
    if base_seed is None:
        return sampling
    return dataclasses.replace(sampling, seed=derive_seed(base_seed, step, role))


def _is_int(x: object) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _check_draft(draft: Draft, k: int) -> None:
    if len(draft.tokens) > k or not all(_is_int(t) and t >= 0 for t in draft.tokens):
        raise GenerationError(
            f"the drafter returned {list(draft.tokens)!r} for k = {k}: it must propose at most k token ids >= 0."
        )
    if draft.probs is not None and np.shape(draft.probs)[0] != len(draft.tokens):
        raise GenerationError(
            f"the drafter returned probs of shape {np.shape(draft.probs)} for {len(draft.tokens)} tokens: "
            "it must return one distribution per drafted token ([k, vocab]) or None."
        )


def _check_verification(v: Verification, draft: Draft) -> None:
    k = len(draft.tokens)
    ok = (
        _is_int(v.accepted)
        and 0 <= v.accepted <= k
        and len(v.tokens) == v.accepted + 1
        and all(_is_int(t) and t >= 0 for t in v.tokens)
        and [int(t) for t in v.tokens[: v.accepted]] == [int(t) for t in draft.tokens[: v.accepted]]
    )
    if not ok:
        raise GenerationError(
            f"the verifier returned accepted = {v.accepted!r}, tokens = {list(v.tokens)!r} for draft "
            f"{list(draft.tokens)!r}: it must return the accepted draft prefix plus exactly one token "
            "(include end_id as that token when the target ends)."
        )
