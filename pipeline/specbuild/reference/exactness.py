"""The row block that makes the reference runtime bit-exact on this machine, found by probing it.

Speculative greedy output equals target-only output token for token only if a position's logits
are bit-identical however the position is computed: prefill, one-token step, (k + 1)-row
verification, beside other sequences. model.py gets there with fixed shapes: every matmul on blocks
of `row_block` rows, attention on blocks of `row_block` query rows over a key count fixed by the
position. A fixed shape is necessary, not sufficient: a row's result must also not depend on its
place in the block or on the other rows, and whether it does is up to the code path the BLAS library
takes for that shape on that CPU (torch's CPU matmuls and its CPU flash attention both call MKL's SGEMM in this
project's torch build; MKL_VERBOSE=1 shows the calls). Blocks that are invariant on one CPU's path break on another's
(docs/runtime.md, "Exactness: the row-block probe", has what was seen), so the block is probed, never assumed:

- `probe(model, block)` runs each function that forward applies to row blocks (qkv, o + MLP,
  lm_head: every weight shape, with the model's own weights and biases) and the attention at each key
  count a sequence can reach, putting random rows at every place of a block, beside other rows
  (random ones and zero rows, as padding), and repeating a call. Any differing bit is a failure.
- `settle(model)` takes the first candidate that passes (4, 8, 2 rows on CPU; 16, 8, 32 on CUDA),
  else 1 row per call, the safe mode: a row alone in its call cannot depend on other rows (exact by
  construction, slower); the probe still checks that a repeated call gives the same bits.
- A block asked for explicitly (`--row-block`) is used only if it passes; otherwise it is refused
  with a SpecError rather than replaced, so a measurement never runs a block other than the one named.
- Wide calls: once a block passes, `probe_wide` checks for each of `WIDE_BLOCKS` whether a layer's row functions
  give every row the same bits in one call of that many rows as in its block (rows at random places, beside
  random and zero rows). Forward runs long runs of rows (a prompt's prefill) in calls of the sizes that pass,
  largest first (faster: docs/runtime.md), and nothing else changes: a row's result is the same bits
  either way. A size that fails is not used. The lm_head stays in blocks (forward needs few rows of logits).
- The choice holds for the torch thread count it was probed with (the BLAS path can depend on it):
  forward probes again when the count has changed since.
"""

from __future__ import annotations

import sys
import time
import warnings
from dataclasses import dataclass, replace
from typing import Any

import torch

from specbuild.errors import SpecError
from specbuild.progress import detail
from specbuild.reference.blocks import KEY_BUCKET, key_bucket_end, run_blocks

CPU_CANDIDATES = (4, 8, 2)  # 4 first: the fastest on the machines measured (docs/runtime.md, speed check)
CUDA_CANDIDATES = (16, 8, 32)
SAFE_BLOCK = 1  # one row per call
WIDE_BLOCKS = (64, 16)  # rows per call for long runs of rows, each used when the probe finds it gives the block's bits
WIDE_ORDERS = 3  # wide calls the wide probe makes: the rows in order, then shuffled (other places, other neighbours)
SPLIT_KEYS = 1024  # every key count up to here is probed, then powers of two and the longest (see attention_ends)


def default_candidates(device_type: str) -> tuple[int, ...]:
    return CPU_CANDIDATES if device_type == "cpu" else CUDA_CANDIDATES


@dataclass(frozen=True)
class Trial:
    row_block: int
    failures: tuple[str, ...]  # what differed ("lm_head 64x211: place"); empty = passed
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "row_block": self.row_block,
            "passed": not self.failures,
            "failures": list(self.failures),
            "seconds": round(self.seconds, 4),
        }

    def why(self) -> str:
        """The first failures, for a log line."""
        more = len(self.failures) - 2
        return ", ".join(self.failures[:2]) + (f" and {more} more" if more > 0 else "")


@dataclass(frozen=True)
class RowBlockChoice:
    row_block: int
    mode: str  # "probed": the first candidate that passed; "requested": asked for, passed; "safe": none passed
    exact: bool  # the chosen block passed the probe
    tried: tuple[Trial, ...]  # in the order tried, the chosen one last
    threads: int | None  # torch CPU threads during the probe (None off CPU)
    wide_blocks: tuple[int, ...] = ()  # rows per call for long runs: the WIDE_BLOCKS whose probe passed
    wide_tried: tuple[Trial, ...] = ()  # the wide probes, none when not run (an inexact choice or the safe mode)

    @property
    def seconds(self) -> float:
        return sum(t.seconds for t in (*self.tried, *self.wide_tried))

    def as_dict(self) -> dict[str, Any]:
        return {
            "row_block": self.row_block,
            "mode": self.mode,
            "exact": self.exact,
            "threads": self.threads,
            "probe_seconds": round(self.seconds, 4),
            "tried": [t.as_dict() for t in self.tried],
            "wide_blocks": list(self.wide_blocks),
            "wide_tried": [t.as_dict() for t in self.wide_tried],
        }

    def _wide(self) -> str:
        if not self.wide_tried:
            return ""
        failed = "; ".join(f"{t.row_block}-row calls differ: {t.why()}" for t in self.wide_tried if t.failures)
        sizes = " and ".join(map(str, self.wide_blocks))
        return (f"; prefill in calls of {sizes} rows (same bits)" if sizes else "; prefill in blocks") + (
            f" ({failed})" if failed else ""
        )

    def describe(self) -> str:
        rejected = "; ".join(f"{t.row_block} rows failed ({t.why()})" for t in self.tried if t.failures)
        took = f"probe {self.seconds:.2f} s"
        if not self.exact:
            return (
                f"row block {self.row_block}, NOT EXACT: even one row per call gave different bits ({rejected}); "
                "speculative greedy output may differ from target-only output in near-ties"
            )
        if self.mode == "safe":
            return f"row block 1, safe mode (one row per call: exact, slower): {rejected}; {took}"
        how = "asked for" if self.mode == "requested" else "probed"
        rejected = f"{rejected}; " if rejected else ""
        return f"row block {self.row_block} ({how}, exact on this machine; {rejected}{took}){self._wide()}"


def attention_ends(max_len: int) -> list[int]:
    """The key counts the attention probe covers for sequences up to max_len positions.

    Every bucket end up to SPLIT_KEYS: torch's CPU flash attention (aten/src/ATen/native/cpu/
    FlashAttentionKernel.cpp) multiplies keys in blocks of 512 (MKL_VERBOSE shows the SGEMM shapes),
    so these cover each shape of last key block, alone and after a full block; past that, the same
    shapes repeat, and powers of two and the longest bucket are probed too."""
    last = key_bucket_end(max(max_len, 1) - 1)
    ends = list(range(KEY_BUCKET, min(last, SPLIT_KEYS) + 1, KEY_BUCKET))
    power = 2 * SPLIT_KEYS
    while power < last:
        ends.append(power)
        power *= 2
    return ends if ends[-1] == last else [*ends, last]


# Random rows the probe tries, one draw per seed. One draw is not enough: under ATen's scalar kernels
# (ATEN_CPU_CAPABILITY=default) on an Intel Xeon, the 64 x 211 lm_head of a test model depended on its place in a
# 2-row block for the rows of seeds 1-5 and not for seed 0's. A probe costs about 0.05 s per draw for the example
# pair's target.
PROBE_SEEDS = (0, 1, 2, 3)


@torch.inference_mode()
def probe(model, block: int, seeds: tuple[int, ...] = PROBE_SEEDS) -> list[str]:
    """What makes a row's result depend on its place, its neighbours or the call at `block` rows, with the random
    rows of each seed; [] = nothing."""
    for seed in seeds:
        failures = _probe_once(model, block, seed)
        if failures:
            return failures
    return []


def _probe_once(model, block: int, seed: int) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    failures = []
    for name, fn, widths in model.row_parts():
        kind = _rows_kind(model, fn, widths, block, g)
        if kind:
            failures.append(f"{name}: {kind}")
    for end in attention_ends(model.max_len):
        kind = _attention_kind(model, block, end, g)
        if kind:
            failures.append(f"attention over {end} keys: {kind}")
    return failures


def _rand(model, g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g).to(model.device, model.dtype)


def _rows_kind(model, fn, widths: list[int], block: int, g: torch.Generator) -> str | None:
    """Run fn on blocks as forward does: block probe rows, each at every place (rolled), then the first
    half again beside new neighbours (one a zero row), then the first call repeated. Which check failed, if any."""
    probe_rows = [_rand(model, g, block, w) for w in widths]  # per input: [block, width]
    keep = -(-block // 2)
    beside = [torch.cat([rows[:keep], _rand(model, g, block - keep, w)]) for rows, w in zip(probe_rows, widths)]
    if block > keep:
        for rows in beside:
            rows[-1] = 0
    calls = [[r.roll(s, 0) for r in probe_rows] for s in range(block)]  # call s: row i at place (i + s) % block
    calls += [[r.roll(s, 0) for r in beside] for s in range(block)]
    calls.append(calls[0])
    out = run_blocks(fn, [torch.cat([c[j] for c in calls]) for j in range(len(widths))], block)
    out = out.view(len(calls), block, -1)  # [call, place, out]
    for i in range(block):
        if any(not torch.equal(out[s, (i + s) % block], out[0, i]) for s in range(1, block)):
            return "place"
    for i in range(keep):
        if any(not torch.equal(out[block + s, (i + s) % block], out[0, i]) for s in range(block)):
            return "neighbours"
    return None if torch.equal(out[-1], out[0]) else "repeat"


@torch.inference_mode()
def probe_wide(model, block: int, wide: int, seed: int = PROBE_SEEDS[0]) -> list[str]:
    """What makes a layer's row function give a row other bits in a call of `wide` rows than in its `block`-row
    block; [] = nothing. One draw: each call already holds `wide` random rows (a zero one among them, as padding),
    each at a new place beside new neighbours in every shuffled call."""
    g = torch.Generator().manual_seed(seed)
    failures = []
    for name, fn, widths in model.layer_parts():
        rows = [_rand(model, g, wide, w) for w in widths]
        for r in rows:
            r[-1] = 0
        in_blocks = run_blocks(fn, rows, block)
        orders = [torch.arange(wide)] + [torch.randperm(wide, generator=g) for _ in range(WIDE_ORDERS - 1)]
        if any(not torch.equal(fn(*(r[order] for r in rows)), in_blocks[order]) for order in orders):
            failures.append(f"{name}: {wide}-row call")
    return failures


def _attention_kind(model, block: int, end: int, g: torch.Generator) -> str | None:
    """One query at a fixed position, at every place of a query block (beside new random queries, the keys
    it must not see redrawn), over `end` keys laid out as in a SequenceKV; then the first call repeated."""
    a = model.args
    places = range(min(block, KEY_BUCKET))  # a block's rows all sit in one key bucket (model._attention_groups)
    cache = model.new_cache()
    cache.reserve(end)
    keys, values = (_rand(model, g, *cache.k[0].shape) for _ in range(2))  # [capacity, kv_heads, head_dim]
    for position in sorted({end - 1, end - KEY_BUCKET + len(places) - 1}):
        query = _rand(model, g, a.num_heads, a.head_dim)
        calls = []
        for place in places:
            rows = _rand(model, g, block + place, a.num_heads, a.head_dim)  # the block starts at row `place`
            if place % 2 and block > 1:  # a zero neighbour (forward pads query blocks with zero rows)
                rows[place + (0 if place == block - 1 else block - 1)] = 0
            rows[2 * place] = query
            k, v = keys.clone(), values.clone()
            k[position + 1 :], v[position + 1 :] = (_rand(model, g, *k[position + 1 :].shape) for _ in range(2))
            calls.append((place, rows, k, v))
        calls.append(calls[0])
        results = []
        for place, rows, k, v in calls:
            queries = rows.transpose(0, 1).unsqueeze(0)[:, :, place : place + block]  # [1, heads, block, head_dim]
            kv = [t.transpose(0, 1).unsqueeze(0)[:, :, :end] for t in (k, v)]  # [1, kv_heads, end, head_dim]
            out = model.attend(queries, *kv, model.causal_mask(position - place, end, block))
            results.append(out[0, :, place])
        if any(not torch.equal(r, results[0]) for r in results[1:-1]):
            return "place/neighbours"
        if not torch.equal(results[-1], results[0]):
            return "repeat"
    return None


def _trial(model, block: int) -> Trial:
    start = time.perf_counter()
    failures = probe(model, block)
    return Trial(block, tuple(failures), time.perf_counter() - start)


def _threads(model) -> int | None:
    return torch.get_num_threads() if model.device.type == "cpu" else None


def _with_wide(model, choice: RowBlockChoice) -> RowBlockChoice:
    """The choice with its wide calls probed: only beside an exact block of more than one row (the safe mode's
    single rows are exact by construction, a wide call is not)."""
    if not choice.exact or choice.row_block == SAFE_BLOCK:
        return choice
    tried = []
    for wide in WIDE_BLOCKS:
        if wide > choice.row_block and wide % choice.row_block == 0:
            start = time.perf_counter()
            tried.append(Trial(wide, tuple(probe_wide(model, choice.row_block, wide)), time.perf_counter() - start))
    return replace(choice, wide_blocks=tuple(t.row_block for t in tried if not t.failures), wide_tried=tuple(tried))


def _apply(model, choice: RowBlockChoice) -> RowBlockChoice:
    """The model runs what the probe chose: its row block, its wide calls; the choice kept for reports."""
    model.row_block, model.wide_blocks, model.exactness = choice.row_block, choice.wide_blocks, choice
    return choice


def choose(model, candidates: tuple[int, ...]) -> RowBlockChoice:
    """The first candidate that passes the probe, else the safe mode (1 row per call)."""
    tried: list[Trial] = []
    for block in dict.fromkeys((*candidates, SAFE_BLOCK)):
        tried.append(_trial(model, block))
        if not tried[-1].failures:
            mode = "safe" if block == SAFE_BLOCK and SAFE_BLOCK not in candidates else "probed"
            return RowBlockChoice(block, mode, True, tuple(tried), _threads(model))
    return RowBlockChoice(SAFE_BLOCK, "safe", False, tuple(tried), _threads(model))


def settle(model, requested: int | None = None) -> RowBlockChoice:
    """Set model.row_block and model.exactness: the requested block if it passes (else SpecError), or
    the first of the device's candidates that passes, or the safe mode."""
    if requested is not None:
        trial = _trial(model, requested)
        if trial.failures:
            raise SpecError(
                f"row block {requested} is not exact on this machine: a row's result depends on its place or "
                f"neighbours in the block ({trial.why()}), so speculative greedy output could differ "
                "from target-only output. Leave --row-block out to use a block that passes the probe."
            )
        choice = RowBlockChoice(requested, "requested", True, (trial,), _threads(model))
    else:
        choice = choose(model, default_candidates(model.device.type))
    choice = _apply(model, _with_wide(model, choice))
    if not choice.exact:
        warnings.warn(choice.describe(), RuntimeWarning, stacklevel=3)
    return choice


def reprobe_for_threads(model) -> RowBlockChoice:
    """The torch thread count changed since the probe: probe again, keeping the current block if it passes."""
    before = model.exactness
    keep = () if model.row_block == SAFE_BLOCK else (model.row_block,)  # the safe mode is left when a candidate passes
    candidates = tuple(dict.fromkeys((*keep, *default_candidates(model.device.type))))
    choice = _apply(model, _with_wide(model, choose(model, candidates)))
    changed = (
        ""
        if choice.row_block == before.row_block
        else (
            f" (was {before.row_block}: logits computed before this differ in their last bits from those computed after)"
        )
    )
    message = (
        f"specbuild: torch threads changed from {before.threads} to {choice.threads} since the row-block probe; "
        f"probed again: {choice.describe()}{changed}"
    )
    if changed:  # the logits change: said always; the same block again is a detail
        print(message, file=sys.stderr, flush=True)
    else:
        detail(message)
    if not choice.exact:
        warnings.warn(choice.describe(), RuntimeWarning, stacklevel=3)
    return choice
