"""The benchmark schedule, report document, table and plots, driven by a simulated transport on a simulated
clock: its costs advance the clock the runner reads instead of being slept, so every figure is the same on any
machine, however busy (slept costs of 2 ms a step came out longer by whatever the scheduler added)."""

import json
import random
import threading
import types
import zlib

import pytest

from specbuild.bench import plots, report, runner
from specbuild.bench.stats import RequestResult
from specbuild.bench.workloads import Prompt, Workload
from specbuild.errors import BenchError

TARGET_STEP = 0.002  # simulated seconds per target forward pass
DRAFT_TOKEN = 0.0002  # simulated seconds per drafted token


class Clock:
    """Simulated seconds: advanced by the transport's costs, read by the runner as time.perf_counter(). Concurrent
    requests advance it in turn, so a batch's wall time is the sum of its requests' (their overlap is not
    simulated; nothing below asserts it)."""

    def __init__(self):
        self.now, self.lock = 1000.0, threading.Lock()

    def advance(self, seconds):
        with self.lock:
            self.now += seconds

    def perf_counter(self):
        with self.lock:
            return self.now


def on_clock(monkeypatch) -> Clock:
    """A new clock, which the runner reads while monkeypatch lasts."""
    clock = Clock()
    monkeypatch.setattr(runner, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    return clock


@pytest.fixture
def clock(monkeypatch):
    return on_clock(monkeypatch)


class SimulatedTransport:
    """Speculative decoding with i.i.d. acceptance `alpha`, costing simulated time on `clock`."""

    name = "sim"
    concurrent = True
    max_draft_len = 4

    def __init__(self, clock, alpha=0.75):
        self.clock, self.alpha = clock, alpha
        self.calls = []

    def request(self, prompt, k, max_tokens, settings, concurrent=False):
        self.calls.append(k)
        rng = random.Random(zlib.crc32(f"{prompt.text}|{k}".encode()))  # not hash(): salted per process
        seconds = 0.0  # this request's own time (another thread's request may advance the clock meanwhile)
        out = steps = drafted = accepted = rejections = 0
        draft_s = target_s = 0.0
        pos_d, pos_a = [0] * k, [0] * k
        ttft = None
        while out < max_tokens:
            n = min(k, max_tokens - out - 1)
            a = 0
            while a < n and rng.random() < self.alpha:
                a += 1
            for i in range(n):
                pos_d[i] += 1
            for i in range(a):
                pos_a[i] += 1
            rejections += a < n
            drafted, accepted, steps = drafted + n, accepted + a, steps + 1
            self.clock.advance(n * DRAFT_TOKEN + TARGET_STEP)
            seconds += n * DRAFT_TOKEN + TARGET_STEP
            draft_s += n * DRAFT_TOKEN
            target_s += TARGET_STEP
            out += a + 1
            ttft = ttft or seconds
        return RequestResult(
            0, k, out, seconds, ttft, drafted, accepted, steps, rejections, pos_d, pos_a, draft_s, target_s
        )


WORKLOAD = Workload("unit", tuple(Prompt(f"prompt {i}") for i in range(3)))


def test_parse_int_list():
    assert runner.parse_int_list("4, 0,2,2", "--num-draft-tokens", 0) == (0, 2, 4)
    with pytest.raises(BenchError, match=r"--concurrency: '0' in '0,2' is not an integer >= 1"):
        runner.parse_int_list("0,2", "--concurrency", 1)
    with pytest.raises(BenchError, match="'x'"):
        runner.parse_int_list("1,x", "--num-draft-tokens", 0)


def test_clamp_and_auto_k():
    assert runner.clamp_ks((2, 8), 4) == (
        (0, 2, 4),
        ["K = 8 measured as K = 4: above the deployment's max_draft_len = 4"],
    )
    assert runner.clamp_ks(None, 6) == ((0, 1, 2, 4, 6), [])
    # the default sweep's 8 is not a K the user asked for: clamped to the deployment's limit without a note
    assert runner.clamp_ks(runner.DEFAULT_KS, 6) == ((0, 1, 2, 4, 6), [])
    assert runner.auto_ks(4) == (0, 1, 2, 4)


def test_sweep_interleaves_k_and_rotates_the_order(clock):
    t = SimulatedTransport(clock)
    settings = runner.Settings(num_draft_tokens=(1, 2), max_tokens=4, requests=3, warmup=False)
    runner.run(t, WORKLOAD, settings)
    assert t.calls == [0, 1, 2, 1, 2, 0, 2, 0, 1]


def test_no_k_left_is_an_error(clock):
    plain_only = SimulatedTransport(clock)
    plain_only.max_draft_len = 0  # a target built without speculative decoding: every K clamps to 0
    with pytest.raises(BenchError, match="leaves no K > 0"):
        runner.run(plain_only, WORKLOAD, runner.Settings(num_draft_tokens=(8,), requests=1))


@pytest.fixture(scope="module")
def document():
    settings = runner.Settings(num_draft_tokens=(1, 2, 4), concurrency=(1, 2), max_tokens=24, requests=4)
    ticks = []
    with pytest.MonkeyPatch.context() as monkeypatch:
        t = SimulatedTransport(on_clock(monkeypatch), alpha=0.75)
        measured = runner.run(t, WORKLOAD, settings, progress=lambda total: lambda: ticks.append(total))
    rows = report.cells(measured["sim"].summaries())
    doc = report.document("sim", "unit-pair", "unit", {"max_tokens": 24}, rows, measured["sim"].notes)
    return doc, ticks


def test_document_fields_are_consistent(document):
    doc, ticks = document
    assert len(ticks) == ticks[0] == 4 * 4 + 2 * 2 * 4  # every measured request ticked once
    json.dumps(doc)  # one JSON-serialisable document
    rows = {(r["concurrency"], r["num_draft_tokens"]): r for r in doc["runs"]}
    assert set(rows) == {(c, k) for c in (1, 2) for k in (0, 1, 2, 4)}
    base = rows[(1, 0)]
    assert base["drafted"] == 0 and base["speedup"] == 1.0 and base["alpha"] is None
    for (c, k), r in rows.items():
        assert r["speedup"] == pytest.approx(r["tokens_per_s"] / rows[(c, 0)]["tokens_per_s"], rel=1e-3)
        if k and c == 1:
            assert 0.0 <= r["alpha"] <= 1.0
            assert r["cost_ratio"] == pytest.approx(DRAFT_TOKEN / TARGET_STEP, rel=1e-3)
            assert r["efficiency"] == pytest.approx(r["speedup"] / r["bound"], rel=1e-2)
            assert len(r["per_position_acceptance"]) == k
            assert r["per_position_acceptance"] == sorted(r["per_position_acceptance"], reverse=True)
            # the simulated draft and verify costs are all the time there is: they explain the speedup
            assert r["verify_step_ratio"] == pytest.approx(1.0, rel=0.05)
            # 1-3 % apart: the last steps draft fewer than K tokens
            assert r["explained_speedup"] == pytest.approx(r["speedup"], rel=0.05)
        if c == 2:
            assert r["cost_ratio"] is None and r["bound"] is None and r["efficiency"] is None
    best = max((r for r in doc["runs"] if r["concurrency"] == 1 and r["num_draft_tokens"]), key=lambda r: r["speedup"])
    assert doc["best_num_draft_tokens"] == best["num_draft_tokens"] and doc["speedup"] == best["speedup"]
    # the simulated costs are the only cost: speculation pays with alpha 0.75 and c 0.1, near its bound
    assert doc["speedup"] > 1.3
    assert 0.6 < doc["efficiency"] < 1.2
    assert [row["concurrency"] for row in doc["concurrency"]] == [1, 2]
    # the K actually drafted per step: at most the K asked (the last steps draft fewer), none at K = 0
    for r in doc["runs"]:
        assert (r["mean_k"] == 0) if r["num_draft_tokens"] == 0 else (0 < r["mean_k"] <= r["num_draft_tokens"])
    assert all(
        row["mean_k"] == rows[(row["concurrency"], row["best_num_draft_tokens"])]["mean_k"]
        for row in doc["concurrency"]
    )


def test_table_lists_every_cell(document):
    doc, _ = document
    text = report.table(doc)
    assert text.splitlines()[0] == "specbuild bench: unit-pair (sim, workload unit)"
    assert len([line for line in text.splitlines() if line[:4].strip() in ("1", "2")]) == 8
    assert f"best K = {doc['best_num_draft_tokens']}" in text


def test_the_best_k_line_gives_the_bound_its_own_row_shows(document):
    """Seen: "best K = 2 ... bound 1.68x" under a K = 2 row that drafted ahead and showed 2.05 (the summary took the
    sequential bound)."""
    doc, _ = document
    top = next(
        r for r in doc["runs"] if r["concurrency"] == 1 and r["num_draft_tokens"] == doc["best_num_draft_tokens"]
    )
    overlapped = {
        **doc,
        "runs": [{**r, "schedule": "overlapped", "overlap_bound": 2.05} if r is top else r for r in doc["runs"]],
        "schedule": "overlapped",
        "overlap_bound": 2.05,
    }
    for shown, expected in ((doc, top["bound"]), (overlapped, 2.05)):
        lines = report.table(shown).splitlines()
        cell = next(line for line in lines[4:] if line.split()[:2] == ["1", str(top["num_draft_tokens"])]).split()[7]
        summary = next(line for line in lines if line.startswith("best K ="))
        assert cell == f"{expected:.2f}" and f"bound {cell}x" in summary


def test_table_columns_carry_units_and_times_are_milliseconds(document):
    doc, _ = document
    lines = report.table(doc).splitlines()
    names, units = lines[1].split(), lines[2]
    assert names[:3] == ["conc", "K", "tok/s"]
    assert units.split() == ["tok/s", "x", "tokens", "ratio", "x", "ms", "ms", "ms", "ms"]
    # each unit sits right-aligned under its column: "ms" under the four latency columns
    assert units.rstrip().endswith("ms") and lines[1].rstrip().endswith("tpot p99")
    first = doc["runs"][0]
    row = next(
        line for line in lines[4:] if line.split()[:2] == [str(first["concurrency"]), str(first["num_draft_tokens"])]
    )
    assert row.split()[-4] == f"{1000 * first['ttft_seconds']['median']:.2f}"
    assert row.split()[-3] == f"{1000 * first['ttft_seconds']['max']:.2f}"


def test_plots_are_valid_pngs(document, tmp_path):
    doc, _ = document
    files = plots.write_plots(doc, tmp_path / "plots")
    assert sorted(p.name for p in files) == [
        "acceptance_by_position.png",
        "speedup_vs_k.png",
        "throughput_vs_concurrency.png",
    ]
    for path in files:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_sequential_transport_skips_concurrency_with_a_note(clock):
    t = SimulatedTransport(clock)
    t.concurrent = False
    settings = runner.Settings(num_draft_tokens=(1,), concurrency=(1, 4), max_tokens=4, requests=1, warmup=False)
    measured = runner.run(t, WORKLOAD, settings)
    assert {key[1] for key in measured["sim"].cells} == {1}
    assert "concurrency 4 skipped" in measured["sim"].notes[0]


def test_results_take_medians_over_runs(document, tmp_path):
    import copy

    from specbuild.bench import results

    doc, _ = document
    docs = []
    for factor in (1.0, 3.0, 2.0):
        d = copy.deepcopy(doc)
        for r in d["runs"]:
            r["tokens_per_s"] *= factor
            if r["num_draft_tokens"] == 2 and r["concurrency"] == 1:
                r["speedup"] = 5.0 * factor  # K = 2 becomes the best, median 10
        docs.append(d)
    s = results.summarize_runs(docs)
    assert s["runs"] == 3 and s["best_num_draft_tokens"] == 2
    assert s["best"]["speedup"] == 10.0
    base = next(r for r in s["per_k"] if r["num_draft_tokens"] == 0)
    assert base["tokens_per_s"] == pytest.approx(2.0 * _cell(doc, 0)["tokens_per_s"], rel=1e-3)
    text = results.markdown({"unit": s}, doc["machine"], "cmd", "sim")
    assert "| unit | 2 |" in text and "Reproduce: `cmd`" in text
    png = plots.write_workload_plot({"unit": s}, tmp_path / "w.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


def _cell(doc, k):
    return next(r for r in doc["runs"] if r["concurrency"] == 1 and r["num_draft_tokens"] == k)


def test_a_timed_run_says_so_and_warns_where_this_machine_set_the_figures(document):
    doc, _ = document
    timed = {
        "timing": "target=20ms,draft=2ms",
        "described": "target 20 ms per step, draft 2 ms per step",
        "in_process": {"target": {"calls": 100, "overruns": 10}, "draft": {"calls": 50, "overruns": 6}},
        "served": "timed only if the server was started with --timed 'target=20ms,draft=2ms' (its log says so)",
    }
    lines = report.table({**doc, "timed_stand_in": timed}).splitlines()
    said = next(line for line in lines if line.startswith("timed stand-ins (target 20 ms per step"))
    assert "overran their time: target 10 of 100, draft 6 of 50" in said
    warnings = [line for line in lines if line.startswith("warning:")]
    assert warnings == [  # 10 % is within the share a run may overrun (its prefills); 12 % is not
        "warning: 12% of the draft's calls overran their timed step: this machine's computation, not the timing, "
        "sets those figures; time longer steps"
    ]
    assert any(line.startswith("the server's models: timed only if") for line in lines)
    assert not any("timed" in line for line in report.table(doc).splitlines())
