"""What a generation asks for (`Options`) and what it returns (`Generation`), local or served alike.

Finish reasons use NVIDIA's LLM API vocabulary (NVIDIA/TensorRT-LLM `tensorrt_llm/executor/result.py`,
`CompletionOutput.finish_reason`: 'stop', 'length', 'timeout', 'cancelled', with `stop_reason` the
matched stop string or token id). The draft/verify loop's own reasons map onto it:

    loop "length"  -> finish_reason "length"                  (max_tokens reached)
    loop "eos"     -> finish_reason "stop", stop_reason None  (end_id; as the executor's END_ID)
    loop "stop"    -> finish_reason "stop", stop_reason = the stop word that matched (its token ids
                      when it has no text)
    cancelled      -> finish_reason "cancelled"               (the client went away)

The same names travel as the BLS's `finish_reason` / `stop_reason` outputs and as `--json` keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specbuild.speculative.draft_len import ResolvedK
from specbuild.speculative.stats import SpeculationStats

__all__ = ["Generation", "Options", "StepRecord", "finish_reason"]

LOOP_TO_LLM_API = {"length": "length", "eos": "stop", "stop": "stop", "cancelled": "cancelled"}


def finish_reason(loop_reason: str | None) -> str | None:
    """NVIDIA's finish_reason for one of the loop's ("length" | "eos" | "stop"), or "cancelled"."""
    return None if loop_reason is None else LOOP_TO_LLM_API[loop_reason]


@dataclass(frozen=True)
class Options:
    """What a caller asks for. None means: the deployment's default (the spec, or the BLS's parameters)."""

    max_tokens: int = 64
    num_draft_tokens: int | None = None  # K; 0 = target only
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    seed: int | None = None
    adaptive: bool | None = None
    overlap: bool | str | None = None  # draft the next step while the target verifies: True, False, "auto"
    drafter: str | None = None  # what proposes the draft tokens (specbuild.drafters: model, lookup, hybrid)
    stop: tuple[str, ...] = ()  # stop words: the generation ends with the first it produces (kept in the text)
    guide_type: str | None = None  # structured output: json, json_schema, regex or ebnf_grammar (decode.grammar)
    guide: str | None = None  # the schema, regex or grammar text of guide_type

    def sampling_dict(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p, "seed": self.seed}


@dataclass(frozen=True)
class StepRecord:
    k: int  # draft tokens asked for at this step
    drafted: int
    accepted: int


def count_text(tokens: int, estimated: bool) -> str:
    """A token count as a person reads it: "48 tokens", or "~50 tokens (estimated: ...)" when estimated."""
    if estimated:
        return f"~{tokens} tokens (estimated from the text: the server sends no token ids)"
    return f"{tokens} tokens"


@dataclass
class Generation:
    """One finished generation: the text, why it stopped, the figures, and how long it took."""

    text: str  # generated text (prompt excluded)
    output_ids: list[int] | None  # [n] generated token ids (prompt and end_id excluded); None: not sent (llmapi)
    finish_reason: str | None  # "stop" | "length" | "cancelled" (None: the server did not say)
    stop_reason: str | list[int] | None  # the stop word that ended it ("stop" on a stop word only)
    k: ResolvedK | None  # K used and asked for (None: not known, e.g. a server whose config cannot be read)
    adaptive: bool | None  # None: the deployment decides
    stats: SpeculationStats
    seconds: float  # request start to last token (model loading excluded)
    ttft_seconds: float | None  # request start to the first visible text
    prompt_ids: list[int] | None = None  # [prompt_len] when tokenized here
    steps: list[StepRecord] = field(default_factory=list)  # per verify step (in-process only)
    num_output_tokens: int | None = None  # when the server reports a count without the ids
    count_estimated: bool = False  # num_output_tokens is the text tokenized again (a server that sends no ids)
    overlap: bool | str | None = None  # the schedule: drafted ahead (True, "auto") or not (False); None: not known
    drafter: str | None = None  # which drafter proposed (specbuild.drafters); None: not known
    extra: dict[str, Any] = field(default_factory=dict)  # where it ran: weights and exactness, or the server

    @property
    def output_tokens(self) -> int:
        return self.num_output_tokens if self.num_output_tokens is not None else len(self.output_ids or ())

    def count_text(self) -> str:
        return count_text(self.output_tokens, self.count_estimated)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The `generate --json` document."""
        return {
            "text": self.text,
            "output_ids": None if self.output_ids is None else list(self.output_ids),
            "prompt_ids": self.prompt_ids,
            "num_output_tokens": self.output_tokens,
            "num_output_tokens_estimated": self.count_estimated,
            "finish_reason": self.finish_reason,
            "stop_reason": self.stop_reason,
            "num_draft_tokens": self.k.k if self.k else None,
            "requested_num_draft_tokens": self.k.requested if self.k else None,
            "adaptive": self.adaptive,
            "overlap": self.overlap,
            "drafter": self.drafter,
            **self.stats.report_fields(),
            "tokens_per_s": self.tokens_per_s,
            "seconds": self.seconds,
            "time_to_first_token_s": self.ttft_seconds,
            **self.extra,
        }
