"""The benchmark schedule: a K sweep and a concurrency sweep over one transport, measured in one run.

The machine is noisy, so ratios are measured from interleaved requests: for each prompt, every K
(K = 0 included) runs back to back, in an order rotated per prompt, rather than all K = 0 first;
with peers (transports compared in the same run) each K runs on every transport, in an order that
alternates too, so that neither always runs first (and pays for the prompt's prefill).
A transport is anything with `request(prompt, k, max_tokens, settings) -> RequestResult`:
the in-process runtime (`bench.local_transport`), a Triton server (`bench.remote`), Hugging Face (`bench.hf_peer`).
K values follow the one K rule (`speculative.draft_len.resolve_ks`: clamped to the deployment's
max_draft_len, each measured once).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Protocol

from specbuild.bench.stats import RequestResult, RunSummary, summarize
from specbuild.bench.workloads import Prompt, Workload
from specbuild.errors import BenchError
from specbuild.speculative.draft_len import resolve_ks

DEFAULT_KS = (0, 1, 2, 4, 8)


@dataclass(frozen=True)
class Settings:
    num_draft_tokens: tuple[int, ...] | None = DEFAULT_KS  # K values of the sweep (0 always added); None = auto
    concurrency: tuple[int, ...] = (1,)
    max_tokens: int = 64
    requests: int = 8  # per (K, concurrency) cell
    temperature: float = 0.0
    seed: int = 0
    warmup: bool = True


class Transport(Protocol):
    name: str
    concurrent: bool  # can serve several requests at once (threads may call `request` together)
    max_draft_len: int | None  # the deployment's limit on K, when known
    only_ks: tuple[int, ...] | None  # a peer that measures only these K values (None: every K)

    def request(
        self, prompt: Prompt, k: int, max_tokens: int, settings: Settings, concurrent: bool = False
    ) -> RequestResult:
        """One request; `concurrent` = other threads are sending requests at the same time."""
        ...


def parse_int_list(text: str, what: str, minimum: int) -> tuple[int, ...]:
    """'0,1,2,4' -> (0, 1, 2, 4), sorted and deduplicated; BenchError names the bad item."""
    values = set()
    for item in text.split(","):
        item = item.strip()
        if not item.isdigit() or int(item) < minimum:
            raise BenchError(
                f"{what}: {item!r} in {text!r} is not an integer >= {minimum}. "
                f"Pass a comma-separated list such as {'0,1,2,4' if minimum == 0 else '1,2,4'}."
            )
        values.add(int(item))
    return tuple(sorted(values))


def auto_ks(max_draft_len: int | None) -> tuple[int, ...]:
    """`--num-draft-tokens auto`: 0, powers of two up to the deployment's max_draft_len, and that limit."""
    limit = max_draft_len if max_draft_len is not None else max(DEFAULT_KS)
    ks = {0, limit}
    k = 1
    while k <= limit:
        ks.add(k)
        k *= 2
    return tuple(sorted(ks))


def clamp_ks(ks: Sequence[int] | None, max_draft_len: int | None) -> tuple[tuple[int, ...], list[str]]:
    """K values the deployment accepts (0 always first, by the one K rule), and notes about those clamped: a K
    the user asked for, never one of the default sweep's (DEFAULT_KS, whose 8 becomes the deployment's limit)."""
    if ks is None:
        return auto_ks(max_draft_len), []
    if max_draft_len is None:
        return tuple(sorted({0, *ks})), []
    resolved, notes = resolve_ks(ks, max_draft_len)
    return resolved, [] if tuple(ks) == DEFAULT_KS else notes


def _measures(transport: Transport, k: int) -> bool:
    only = getattr(transport, "only_ks", None)
    return only is None or k in only


@dataclass
class Measurements:
    cells: dict[tuple[int, int], list[RequestResult]] = field(default_factory=dict)  # (K, concurrency) -> requests
    wall: dict[tuple[int, int], float] = field(default_factory=dict)  # (K, concurrency) -> seconds
    notes: list[str] = field(default_factory=list)

    def add(self, k: int, concurrency: int, results: Sequence[RequestResult], seconds: float) -> None:
        self.cells.setdefault((k, concurrency), []).extend(results)
        self.wall[(k, concurrency)] = self.wall.get((k, concurrency), 0.0) + seconds

    def summaries(self) -> list[RunSummary]:
        return [summarize(self.cells[key], self.wall[key]) for key in sorted(self.cells, key=lambda kc: (kc[1], kc[0]))]


def _prompt(workload: Workload, i: int) -> Prompt:
    return workload.prompts[i % len(workload.prompts)]


def _tokens(prompt: Prompt, settings: Settings) -> int:
    return prompt.max_tokens or settings.max_tokens


def warm_up(transports: Sequence[Transport], ks: Sequence[int], workload: Workload, settings: Settings) -> None:
    """One short request per K per transport, not counted (first-call allocations, lazy loading)."""
    for transport in transports:
        for k in ks:
            if _measures(transport, k):
                transport.request(_prompt(workload, 0), k, min(8, settings.max_tokens), settings)


def sweep_k(
    transports: Sequence[Transport],
    ks: Sequence[int],
    workload: Workload,
    settings: Settings,
    tick: Callable[[], None],
    into: dict[str, Measurements],
) -> None:
    """Concurrency 1: every prompt at every K on every transport, interleaved."""
    for i in range(settings.requests):
        prompt = _prompt(workload, i)
        order = list(ks[i % len(ks) :]) + list(ks[: i % len(ks)])
        for j, k in enumerate(order):
            shift = (i + j) % len(transports)
            for transport in (t for t in list(transports[shift:]) + list(transports[:shift]) if _measures(t, k)):
                start = time.perf_counter()
                result = transport.request(prompt, k, _tokens(prompt, settings), settings)
                result.prompt_index = i
                into[transport.name].add(k, 1, [result], time.perf_counter() - start)
                tick()


def sweep_concurrency(
    transports: Sequence[Transport],
    ks: Sequence[int],
    workload: Workload,
    settings: Settings,
    tick: Callable[[], None],
    into: dict[str, Measurements],
) -> None:
    """Concurrency > 1: batches of N simultaneous requests, K = 0 and K > 0 batches interleaved, and each batch on
    every transport in turn (the first one first on even batches, last on odd ones)."""
    for concurrency in settings.concurrency:
        if concurrency == 1:
            continue
        batches = max(1, settings.requests // concurrency)
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            for b in range(batches):
                for k in ks if b % 2 == 0 else list(reversed(ks)):
                    prompts = [_prompt(workload, b * concurrency + j) for j in range(concurrency)]
                    for transport in transports if b % 2 == 0 else list(reversed(transports)):
                        start = time.perf_counter()
                        futures = [
                            pool.submit(transport.request, p, k, _tokens(p, settings), settings, True) for p in prompts
                        ]
                        results = [f.result() for f in futures]
                        elapsed = time.perf_counter() - start
                        for j, result in enumerate(results):
                            result.prompt_index, result.concurrency = b * concurrency + j, concurrency
                        into[transport.name].add(k, concurrency, results, elapsed)
                        for _ in results:
                            tick()


def sweep_ks(transport: Transport, settings: Settings) -> tuple[tuple[int, ...], list[str]]:
    """The Ks `transport` measures and the notes on the sweep; BenchError when no K > 0 is left (checked by
    run_bench as soon as the transport is up, before the slower peers and Triton's floor)."""
    ks, notes = clamp_ks(settings.num_draft_tokens, transport.max_draft_len)
    fixed = getattr(transport, "fixed_k", None)  # a deployment with one K and no per-request K (llmapi)
    if fixed is not None:
        return (fixed,), list(getattr(transport, "notes", []))
    if len(ks) < 2:
        raise BenchError(
            f"the K sweep {list(settings.num_draft_tokens)} leaves no K > 0 for this deployment "
            f"(max_draft_len = {transport.max_draft_len}). Pass --num-draft-tokens with values in "
            f"1..{transport.max_draft_len}."
        )
    return ks, notes


def run(
    transport: Transport,
    workload: Workload,
    settings: Settings,
    peers: Sequence[Transport] = (),
    progress: Callable[[int], Callable[[], None]] | None = None,
) -> dict[str, Measurements]:
    """Measure `transport` (and `peers`, interleaved at concurrency 1) over the sweep; a peer whose
    `sweeps_concurrency` is true is measured at every concurrency too, batch by batch beside the transport.

    `progress(total)` returns a tick function called once per measured request.
    Returns one `Measurements` per transport name.
    """
    ks, notes = sweep_ks(transport, settings)
    concurrent_levels = [c for c in settings.concurrency if c > 1]
    if concurrent_levels and not transport.concurrent:
        notes.append(
            f"concurrency {', '.join(map(str, concurrent_levels))} skipped: the {transport.name} transport "
            "runs one request at a time (measure throughput under concurrency with --url)"
        )
        concurrent_levels = []
    total = settings.requests * sum(1 for t in (transport, *peers) for k in ks if _measures(t, k))
    beside = [t for t in peers if getattr(t, "sweeps_concurrency", False) and t.concurrent]
    total += sum(max(1, settings.requests // c) * c * len(ks) for c in concurrent_levels) * (1 + len(beside))
    tick = progress(total) if progress else (lambda: None)
    out = {t.name: Measurements(notes=list(notes) if t is transport else []) for t in (transport, *peers)}
    if settings.warmup:
        warm_up([transport, *peers], ks, workload, settings)
    sweep_k([transport, *peers], ks, workload, settings, tick, out)
    if concurrent_levels:
        levels = replace(settings, concurrency=tuple(concurrent_levels))
        sweep_concurrency([transport, *beside], ks, workload, levels, tick, out)
    return out
