"""Progress on stderr: a bar on a terminal, timed lines with an ETA in a log, nothing when off."""

from __future__ import annotations

import io

import pytest

from specbuild.progress import Progress, duration


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_durations_read_like_a_clock():
    assert [duration(s) for s in (0, 12.4, 75, 3599, 3700)] == ["0s", "12s", "1m15s", "59m59s", "1h01m"]


def test_a_log_gets_a_line_per_phase_and_every_few_seconds_with_an_eta():
    out, clock = io.StringIO(), Clock()
    bar = Progress(total=100, desc="pair: tokenizer", mode=None, stream=out, every_s=10, clock=clock)
    clock.now += 30  # the tokenizer phase takes 30 s: not counted in the training ETA
    bar.set_description("pair: training")
    for _ in range(100):
        clock.now += 1
        bar.update(1, loss="3.2")
    bar.close()
    lines = out.getvalue().splitlines()
    assert lines[:2] == ["pair: tokenizer ...", "pair: training ..."]
    assert lines[2] == "pair: training: 10/100 step (10%), 40s elapsed, ETA 1m30s, loss=3.2"
    assert len(lines) == 2 + 10  # one line per 10 s, the last one at 100 %
    assert lines[-1] == "pair: training: 100/100 step (100%), 2m10s elapsed, loss=3.2"


def test_a_terminal_gets_a_bar_and_off_prints_nothing():
    tty = Terminal()
    with Progress(total=3, desc="bench", unit="requests", stream=tty) as bar:
        bar.update(3)
    assert "\rbench:" in tty.getvalue() and "/3 [" in tty.getvalue()  # tqdm redraws in place
    assert "bench ..." not in tty.getvalue()
    quiet = io.StringIO()
    with Progress(total=3, desc="bench", mode="off", stream=quiet) as bar:
        bar.update(3)
    assert quiet.getvalue() == ""


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="bar, lines or off"):
        Progress(total=1, desc="x", mode="loud", stream=io.StringIO())


def test_details_show_with_verbose_only(monkeypatch, capsys):
    from specbuild.progress import VERBOSE_ENV, detail, verbose

    for value, shown in (("", False), ("0", False), ("1", True)):
        monkeypatch.setenv(VERBOSE_ENV, value)
        detail("row block 4")
        assert verbose() is shown and ("row block 4" in capsys.readouterr().err) is shown


def test_librarys_stdout_never_reaches_the_result_and_is_kept_for_a_failure(monkeypatch, capsys):
    """modelopt prints "current rank: 0, tp rank: 0, pp rank: 0" to stdout while exporting: not in a --json result,
    not in normal output; on stderr with --verbose, or when the call fails (nothing a failure needs is lost)."""
    import pytest

    from specbuild.convert.export import _quiet_stdout
    from specbuild.progress import VERBOSE_ENV

    monkeypatch.delenv(VERBOSE_ENV, raising=False)
    with _quiet_stdout():
        print("current rank: 0, tp rank: 0, pp rank: 0")
    assert capsys.readouterr() == ("", "")
    with pytest.raises(RuntimeError), _quiet_stdout():
        print("calibrating layer 3")
        raise RuntimeError("export failed")
    assert capsys.readouterr() == ("", "calibrating layer 3\n")
    monkeypatch.setenv(VERBOSE_ENV, "1")
    with _quiet_stdout():
        print("current rank: 0")
    assert capsys.readouterr() == ("", "current rank: 0\n")


def test_transformers_loading_bars_show_with_verbose_only(monkeypatch):
    """Seen in `make demo`: "Loading weights: 100%|...| 75/75" from transformers between specbuild's own lines."""
    from transformers.utils import logging as hf_logging

    from specbuild.progress import VERBOSE_ENV, quiet_library_bars

    monkeypatch.delenv(VERBOSE_ENV, raising=False)
    with quiet_library_bars():
        assert not hf_logging.is_progress_bar_enabled()
    assert hf_logging.is_progress_bar_enabled()  # restored
    monkeypatch.setenv(VERBOSE_ENV, "1")
    with quiet_library_bars():
        assert hf_logging.is_progress_bar_enabled()
