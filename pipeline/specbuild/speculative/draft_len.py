"""K per request: the default and the clamp, one rule for every path.

K (num_draft_tokens) is what a request asks for; max_draft_len is what the target engine was built
to verify (trtllm-build --max_draft_len; TensorRT-LLM refuses a longer draft: "Draft tokens length
(n) exceeds maximum draft tokens length (m)"). The rule, applied by the loop, the BLS, `generate`
(local and served), `bench` and `check --measure`:

- no K asked for: the deployment's default (the spec's speculative.num_draft_tokens; the BLS's
  `num_draft_tokens` parameter, written from it);
- a K below 0 or not an integer: RequestError;
- a K above max_draft_len: max_draft_len, and the caller can say so (`ResolvedK.note`).

A deployment that drafts the same K at every step and takes none per request (the LLM API drafts its
configured max_draft_len; `resolve_fixed_k`) uses that K whatever is asked, under the same validity check.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from specbuild.errors import RequestError

__all__ = ["ResolvedK", "check_k", "resolve_fixed_k", "resolve_k", "resolve_ks"]


@dataclass(frozen=True)
class ResolvedK:
    k: int  # K used
    requested: int  # K asked for (the default when none was)
    max_draft_len: int

    @property
    def clamped(self) -> bool:
        return self.k != self.requested

    def to_dict(self) -> dict[str, int]:
        """As the BLS reports it in its final response's speculation_stats ("k"), so a client reads the K the
        server used rather than applying the rule again."""
        return {"k": self.k, "requested": self.requested, "max_draft_len": self.max_draft_len}

    @classmethod
    def from_dict(cls, data: dict) -> ResolvedK:
        return cls(int(data["k"]), int(data["requested"]), int(data["max_draft_len"]))

    def note(self) -> str | None:
        """What a caller tells the user when K was clamped, else None."""
        if not self.clamped:
            return None
        if self.k > self.requested:  # only a fixed-K deployment uses more than was asked
            return (
                f"num_draft_tokens = {self.requested} cannot be asked of this deployment: it drafts "
                f"max_draft_len = {self.k} tokens at every step (the LLM API path); using {self.k}."
            )
        return (
            f"num_draft_tokens = {self.requested} exceeds the target engine's max_draft_len = "
            f"{self.max_draft_len}: using {self.k}. Rebuild with a larger speculative.max_draft_len to draft more."
        )


def _is_int(x: object) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def check_k(k: object) -> int:
    """`k` as a K a request may ask for (an integer >= 0), else RequestError."""
    if not _is_int(k) or k < 0:
        raise RequestError(f"num_draft_tokens = {k!r} is invalid: use 0 (target only) or a positive integer.")
    return int(k)


def resolve_k(requested: int | None, max_draft_len: int, default: int | None = None) -> ResolvedK:
    """The K a request runs with. requested None: `default` (which must then be given)."""
    if requested is None:
        if default is None:
            raise RequestError("num_draft_tokens is not set and this deployment has no default K: send it.")
        requested = default
    requested = check_k(requested)
    return ResolvedK(k=min(requested, int(max_draft_len)), requested=requested, max_draft_len=int(max_draft_len))


def resolve_fixed_k(requested: int | None, k: int) -> ResolvedK:
    """The K of a deployment that drafts k tokens at every step: k, whatever is asked (requested None: k)."""
    resolved = resolve_k(requested, k, default=k)  # the same RequestError for a bad K
    return ResolvedK(k=int(k), requested=resolved.requested, max_draft_len=int(k))


def resolve_ks(ks: Iterable[int], max_draft_len: int) -> tuple[tuple[int, ...], list[str]]:
    """A sweep of K values under the same rule: each clamped, 0 always first, duplicates once; and a note per
    clamped value (bench, check --measure)."""
    resolved = [resolve_k(k, max_draft_len) for k in ks]
    notes = [
        f"K = {r.requested} measured as K = {r.k}: above the deployment's max_draft_len = {max_draft_len}"
        for r in resolved
        if r.clamped
    ]
    return tuple(sorted({0, *(r.k for r in resolved)})), notes
