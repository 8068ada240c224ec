"""A deployment's drafters: its draft model (if any), prompt lookup's settings, and the pool its requests share.

    drafting = Drafting.create("hybrid", model_drafter, spec.lookup)
    drafter = drafting.drafter(ready.drafter)           # per request, by the name RequestRules resolved
    ...run the loop...
    drafting.remember(ready.drafter, prompt_ids, output_ids, stats)  # the pool learns the finished text

The local session, the Triton BLS and the CPU stand-in of the llmapi model each hold one, made when they load; the
BLS's instances share one pool (speculative.shared_pool), the others keep one of their own. Every request's draft
model drafter is wrapped in a FallbackDrafter over the deployment's DraftHealth (speculative.fallback): a failed draft
call is a target-only step, not an error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from specbuild import drafters
from specbuild.drafters import LookupSettings
from specbuild.speculative.fallback import DraftHealth, FallbackDrafter
from specbuild.speculative.interfaces import Drafter
from specbuild.speculative.lookup import LookupPool, make_drafter
from specbuild.speculative.stats import SpeculationStats

__all__ = ["Drafting"]


@dataclass
class Drafting:
    default: str  # the drafter of requests that name none
    model: Drafter | None  # the draft model's drafter; None: the deployment has no draft model
    settings: LookupSettings
    pool: LookupPool | None = None  # recent requests' text, when settings.is_public_pool
    log: Callable[[str], None] | None = None  # told when the draft model starts failing and when it answers again
    health: DraftHealth = field(default_factory=DraftHealth)  # the draft model as this deployment's requests see it

    @classmethod
    def create(
        cls,
        default: str,
        model: Drafter | None,
        settings: LookupSettings,
        pool: Any = None,
        log: Callable[[str], None] | None = None,
    ) -> Drafting:
        """pool: the pool to use when settings.is_public_pool (e.g. one shared by processes,
        speculative.shared_pool); None: one of this process's own. log: where the draft model's failures are told."""
        if not settings.is_public_pool:
            pool = None
        elif pool is None:
            pool = LookupPool(settings.pool_max_tokens)
        return cls(default, model, settings, pool, log)

    def close(self) -> None:
        """Let go of the pool (one shared with other processes is removed by the last to close it)."""
        if self.pool is not None:
            self.pool.close()

    @property
    def available(self) -> tuple[str, ...]:
        """The drafters this deployment can run (the draft model's only where it has one)."""
        return drafters.runnable(self.model is not None)

    def drafter(self, name: str, model: Drafter | None = None) -> Drafter:
        """The drafter called `name`; `model`: another drafter over the same draft model (e.g. batched). The draft
        model's calls fall back to target-only steps where they fail (speculative.fallback)."""
        model = model or self.model
        if model is not None:
            model = FallbackDrafter(model, self.health, self.log)
        return make_drafter(name, model, self.settings, self.pool)

    def remember(
        self, drafter: str, prompt_ids: Sequence[int], output_ids: Sequence[int], stats: SpeculationStats
    ) -> None:
        """A finished request's text joins the pool (when there is one) if its drafter reads the pool and was asked
        to propose: requests that chose the draft model, or K = 0, neither use the pool nor fill it."""
        if self.pool is not None and drafters.get(drafter).uses_lookup and stats.by_drafter:
            self.pool.add([*prompt_ids, *output_ids])

    def figures(self) -> dict[str, Any]:
        """The pool's figures (empty without a pool)."""
        return self.pool.figures() if self.pool is not None else {}
