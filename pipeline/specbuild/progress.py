"""Progress of long work on stderr, for people and for logs.

On a terminal: a tqdm bar. Anywhere else (CI, nohup, `| tee`): a plain line when the phase changes
and at most every `every_s` seconds while it runs, with the count, elapsed time and an ETA, so a
log shows that minutes of work are moving.

    with Progress(total=400, desc="example pair (full): training", unit="step") as bar:
        for step in range(400):
            ...
            bar.update(1, loss=f"{loss:.3f}")
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

EVERY_S = 10.0  # seconds between log lines when stderr is not a terminal
VERBOSE_ENV = (
    "SPECBUILD_VERBOSE"  # `specbuild --verbose` sets it, so child processes (the draft's, Triton's) see it too
)


def verbose() -> bool:
    """Whether details for those who tune or debug (which row block the probe chose, libraries' own lines) are shown."""
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def detail(message: str) -> None:
    """A line on stderr with --verbose only: facts a newcomer cannot act on, which a contributor wants."""
    if verbose():
        print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def quiet_library_bars() -> Iterator[None]:
    """transformers' own progress bars ("Loading weights: 100%|...") shown with --verbose only: specbuild says what it
    loads in its own lines. Restores what was set before."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # no transformers: nothing to quiet
        yield
        return
    was = hf_logging.is_progress_bar_enabled()
    if not verbose():
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def duration(seconds: float) -> str:
    """12 -> '12s', 75 -> '1m15s', 3700 -> '1h01m'."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    """mode: "bar" (tqdm), "lines" (a line every `every_s` s) or "off"; None = bar on a terminal, else lines."""

    def __init__(
        self,
        total: int,
        desc: str,
        unit: str = "step",
        mode: str | None = None,
        stream: TextIO | None = None,
        every_s: float = EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        if mode is None:
            isatty = getattr(self.stream, "isatty", None)
            mode = "bar" if isatty is not None and isatty() else "lines"
        if mode not in ("bar", "lines", "off"):
            raise ValueError(f"mode must be bar, lines or off, got {mode!r}")
        self.mode, self.total, self.desc, self.unit, self.every_s = mode, total, desc, unit, every_s
        self.clock = clock
        self.n = 0
        self.started = self.last_line = clock()
        self._phase = (self.started, 0)  # (time, count) when the current phase began: the ETA's base
        self.postfix: dict[str, Any] = {}
        self._bar = None
        if mode == "bar":
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, file=self.stream, dynamic_ncols=True, leave=False)
        elif mode == "lines":
            self._line(f"{desc} ...")

    def set_description(self, desc: str) -> None:
        """A new phase: the bar's label, or one log line."""
        self.desc = desc
        self._phase = (self.clock(), self.n)
        if self._bar is not None:
            self._bar.set_description(desc)
        elif self.mode == "lines":
            self._line(f"{desc} ...")

    def update(self, n: int = 1, **postfix: Any) -> None:
        self.n += n
        self.postfix.update(postfix)
        if self._bar is not None:
            if postfix:
                self._bar.set_postfix(postfix, refresh=False)
            self._bar.update(n)
        elif self.mode == "lines" and (self.clock() - self.last_line >= self.every_s or self.n >= self.total):
            self._line(self.status())

    def status(self) -> str:
        """'desc: 120/400 step (30%), 1m18s elapsed, ETA 3m02s, loss=4.1'."""
        now = self.clock()
        parts = [f"{self.desc}: {self.n}/{self.total} {self.unit}"]
        if self.total:
            parts[0] += f" ({100 * self.n // self.total}%)"
        parts.append(f"{duration(now - self.started)} elapsed")
        since, done = now - self._phase[0], self.n - self._phase[1]
        if done > 0 and self.n < self.total:
            parts.append(f"ETA {duration(since / done * (self.total - self.n))}")
        parts += [f"{key}={value}" for key, value in self.postfix.items()]
        return ", ".join(parts)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _line(self, text: str) -> None:
        self.last_line = self.clock()
        print(text, file=self.stream, flush=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
