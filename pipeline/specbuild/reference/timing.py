"""Timed stand-ins: reference models whose calls take the time a GPU's would, while the host stays free.

On a CPU the toy pair's calls take 1-2.5 ms, so the host's own work per step (the loop, Triton, the client) is a
large share of each step; on a GPU a 7B-70B target's step takes 5-40 ms and that share is small. A timed stand-in
computes the real model's outputs, then waits (`time.sleep`: not computing, as the host waits on a GPU) for what is
left of the call's time. Outputs are unchanged; only their timing is shaped.

The timing is one text, given as `$SPECBUILD_STANDIN_TIMING` (every reference model reads it when it loads: in
process, in the draft's child process, in tritonserver's Python models, in the LLM API stand-in), or by
`bench --timed` / `serve --timed`, which set it:

- `20ms`: every step of either model takes at least 20 ms;
- `target=20ms,draft=2ms`: per role (a role not named is not timed);
- `gpu=H100-80GB[,target=8B][,draft=1B][,bytes_per_weight=1]`: each step takes what `specbuild.gpus`' cost model
  gives on that GPU: the weights read once (the model's own parameter count, or the one named, e.g. as if the target
  had 8 billion) at `bytes_per_weight` (float16's 2 unless given), plus the KV cache each row reads (its context; the
  model's own layers and KV heads), plus the launch floor.

A step is one token position: a verify call (K draft tokens checked at once) is one step, as is a prefill; a call that
decodes n tokens (the draft model proposing K) is n steps. The rows of one batch share its steps, as a GPU's batch
does, and a call of more rows than the engine's max_batch_size runs one batch after another.

A call whose computation alone took longer than its timed step is an overrun: the figure then reflects this host, and
`CallClock.overruns` counts them so a report can say so.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from specbuild import gpus

TIMING_ENV = "SPECBUILD_STANDIN_TIMING"
ROLES = ("target", "draft")
KV_BYTES_PER_ELEMENT = 2.0  # a float16 KV cache
_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
_COUNTS = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9}
USAGE = (
    "give the time per step (e.g. 20ms, or target=20ms,draft=2ms) or a GPU's cost model "
    "(gpu=H100-80GB[,target=8B][,draft=1B][,bytes_per_weight=1])"
)


def _seconds(text: str) -> float | None:
    match = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*(s|ms|us)", text.strip().lower())
    return float(match[1]) * _UNITS[match[2]] if match else None


def _count(text: str) -> float | None:
    match = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmb]?)", text.strip().lower())
    return float(match[1]) * _COUNTS[match[2]] if match else None


@dataclass(frozen=True)
class StandInTiming:
    """What each role's calls take: fixed seconds, or a GPU's cost model (with a parameter count to read as)."""

    text: str
    fixed: dict[str, float] = field(default_factory=dict)  # role -> seconds per step
    gpu: gpus.Gpu | None = None
    parameters: dict[str, float] = field(default_factory=dict)  # role -> parameter count to cost (gpu mode)
    bytes_per_weight: float | None = None  # gpu mode: as given (1 for FP8, 0.5 for 4-bit); None: float16's 2

    @classmethod
    def parse(cls, text: str) -> StandInTiming:
        """The timing a text describes; ValueError says what is wrong and what to give."""
        raw = text.strip()
        bad = ValueError(f"timed stand-in {text!r}: {USAGE}.")
        if not raw:
            raise bad
        every = _seconds(raw)
        if every is not None:
            return cls(raw, fixed=dict.fromkeys(ROLES, every))
        pairs: dict[str, str] = {}
        for item in raw.split(","):
            key, sep, value = item.partition("=")
            key = key.strip().lower()
            if not sep or key in pairs or key not in (*ROLES, "gpu", "bytes_per_weight"):
                raise bad
            pairs[key] = value.strip()
        if "gpu" not in pairs:
            fixed = {role: _seconds(pairs[role]) for role in ROLES if role in pairs}
            if not fixed or "bytes_per_weight" in pairs or any(v is None for v in fixed.values()):
                raise bad
            return cls(raw, fixed=fixed)  # type: ignore[arg-type]
        try:
            gpu = gpus.lookup(pairs["gpu"])
        except KeyError as err:
            raise ValueError(f"timed stand-in {text!r}: {err.args[0]}.") from None
        parameters = {role: _count(pairs[role]) for role in ROLES if role in pairs}
        per_weight = _count(pairs["bytes_per_weight"]) if "bytes_per_weight" in pairs else None
        if any(v is None or v <= 0 for v in parameters.values()) or (per_weight is not None and per_weight <= 0):
            raise bad
        return cls(raw, gpu=gpu, parameters=parameters, bytes_per_weight=per_weight)  # type: ignore[arg-type]

    def describe(self) -> str:
        if self.gpu is None:
            return ", ".join(f"{role} {seconds * 1e3:g} ms per step" for role, seconds in self.fixed.items())
        sizes = "".join(f", {role} as {count / 1e9:g}B parameters" for role, count in self.parameters.items())
        return f"{self.gpu.name}'s cost model ({gpus.ASSUMPTIONS}){sizes}"

    def clock_for(self, role: str, model) -> CallClock | None:
        """The clock of `role`'s calls (None: untimed). `model` is the reference LlamaModel: its parameter count,
        layers and KV heads feed the GPU's cost model."""
        if self.gpu is None:
            seconds = self.fixed.get(role)
            return None if seconds is None else CallClock(lambda contexts, steps: steps * seconds)
        gpu, args = self.gpu, model.args
        weights = self.parameters.get(role, model.parameter_count) * (self.bytes_per_weight or 2.0)
        kv_per_token = 2 * args.num_layers * args.num_kv_heads * args.head_dim * KV_BYTES_PER_ELEMENT

        def seconds_for(contexts: Sequence[int], steps: int) -> float:
            return steps * gpus.step_seconds(gpu, weights, args.num_layers, kv_per_token * sum(contexts))

        return CallClock(seconds_for)


def from_environ(environ: Mapping[str, str] = os.environ) -> StandInTiming | None:
    """The timing `$SPECBUILD_STANDIN_TIMING` asks for, None when unset; ValueError names a bad value."""
    raw = environ.get(TIMING_ENV, "").strip()
    if not raw:
        return None
    try:
        return StandInTiming.parse(raw)
    except ValueError as err:
        raise ValueError(f"{TIMING_ENV}: {err}") from None


class CallClock:
    """Makes each call last its timed steps: the call's computation, then a wait for the rest."""

    def __init__(
        self,
        seconds_for: Callable[[Sequence[int], int], float],
        now: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.seconds_for, self.now, self.sleep = seconds_for, now, sleep
        self.calls = 0
        self.timed_seconds = 0.0  # the time the calls were to take, in all
        self.overruns = 0  # calls whose computation alone outlasted their timed step

    def finish(self, started: float, groups: Sequence[tuple[Sequence[int], int]]) -> None:
        """Wait out the call that began at `started` (this clock's `now`): one batch after another, each `(contexts,
        steps)`: `steps` steps whose rows read `contexts` tokens each (an engine runs at most max_batch_size rows
        together, so a call of more rows is several batches)."""
        seconds = sum(self.seconds_for(contexts, steps) for contexts, steps in groups)
        left = seconds - (self.now() - started)
        self.calls += 1
        self.timed_seconds += seconds
        if left > 0 and math.isfinite(left):
            self.sleep(left)  # waiting, not computing: the host stays free, as during a GPU call
        else:
            self.overruns += 1
