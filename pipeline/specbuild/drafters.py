"""One record per drafter: what proposes the draft tokens the target verifies.

- "model": a draft model (the spec's [draft]), called once per step.
- "lookup": prompt lookup (n-gram drafting), proposals from the request's own text and, with the pool, from recent
  requests' text; no model is called, and a step without a match is a plain target step.
- "hybrid": per step, the lookup's proposal when its match is long enough, else the draft model's.

`LookupSettings` is the spec's [lookup] table; its first four names are those of TensorRT-LLM's NGramDecodingConfig
(`tensorrt_llm/llmapi/llm_args.py`), which the LLM API path passes on (specbuild.contract.llmapi). The rules live in
`specbuild.speculative.lookup`.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LOOKUP", "MODEL", "NAMES", "Drafter", "LookupSettings", "get", "path_refusal", "runnable"]

MODEL, LOOKUP = "model", "lookup"  # the draft model's drafter (the one that drafts ahead), prompt lookup


@dataclass(frozen=True)
class Drafter:
    name: str
    needs_draft_model: bool  # a [draft] checkpoint, its engine and its Triton model
    uses_lookup: bool  # reads [lookup]
    summary: str
    # TensorRT-LLM 1.2.1's LLM API runs it (its speculative_config: DraftTarget for the model, NGram for the lookup);
    # on the engine path the BLS runs every drafter
    on_llm_api: bool = True


_RECORDS = (
    Drafter(MODEL, True, False, "a draft model proposes K tokens per step"),
    Drafter(LOOKUP, False, True, "the continuation of the longest matching n-gram of the text so far (no model)"),
    Drafter(
        "hybrid",
        True,
        True,
        "per step the lookup when its match is long enough, else the draft model",
        on_llm_api=False,  # its NGram and DraftTarget configs are one or the other, per deployment
    ),
)
NAMES = tuple(record.name for record in _RECORDS)
DEFAULT = MODEL


def get(name: str) -> Drafter:
    for record in _RECORDS:
        if record.name == name:
            return record
    raise KeyError(name)


def runnable(has_draft_model: bool) -> tuple[str, ...]:
    """The drafters a deployment can run: every one with a draft model, those that need none without."""
    return tuple(r.name for r in _RECORDS if has_draft_model or not r.needs_draft_model)


def path_refusal(name: str, path: str) -> tuple[str, str] | None:
    """(problem, fix) when the pipeline path ("engine" | "llmapi", specbuild.backends) cannot run drafter `name`;
    check and the path's own stages both ask this."""
    if path == "llmapi" and not get(name).on_llm_api:
        return (
            f"speculative.drafter = {name!r} has no equivalent on the LLM API path: TensorRT-LLM 1.2.1's "
            "speculative_config drafts with a draft model (DraftTarget) or by n-gram lookup (NGram), one per deployment",
            'use drafter = "model" or "lookup" there, or the engine path (--backend trtllm or reference), whose BLS '
            "runs the hybrid",
        )
    return None


@dataclass(frozen=True)
class LookupSettings:
    max_matching_ngram_size: int = 2  # the longest n-gram tried (NVIDIA's name and default)
    is_keep_all: bool = True  # NVIDIA's: False keeps one match per n-gram, the newest (so is_use_oldest is moot)
    is_use_oldest: bool = True  # of several matches, the oldest (NVIDIA's default) or the newest
    is_public_pool: bool = False  # search recent requests' text too (the pool), not only the request's own
    pool_max_tokens: int = 65536  # the pool's cap: tokens held, all sequences together
    hybrid_min_match: int = 2  # the hybrid takes the lookup's proposal from a match of at least this many tokens

    @property
    def oldest(self) -> bool:
        """Which of several matches a step takes: the oldest, or the newest."""
        return self.is_use_oldest and self.is_keep_all
