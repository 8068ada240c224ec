"""The in-process transport and check --measure's qualification, on the numpy toy pair (no torch)."""

import numpy as np
import pytest
from toy_model import NGramModel, ToyDrafter, ToyVerifier, random_model

from specbuild.bench import measure as qualify
from specbuild.bench import report, runner
from specbuild.bench.local_transport import LocalTransport
from specbuild.bench.workloads import Prompt, Workload
from specbuild.config import spec_from_dict
from specbuild.session.local import LocalSession

VOCAB = 24


def toy_pair(noise: float, max_draft_len: int = 4) -> LocalTransport:
    target = random_model(VOCAB, order=2, scale=3.0, seed=1)
    rng = np.random.default_rng(2)
    draft = NGramModel(target.table + rng.normal(0.0, noise, size=target.table.shape))
    session = LocalSession(
        ToyDrafter(draft),
        ToyVerifier(target, max_draft_len=max_draft_len),
        encode=lambda text: [ord(ch) % VOCAB for ch in text],
    )
    return LocalTransport(session)


WORKLOAD = Workload("toy", tuple(Prompt(text) for text in ("def f(x):", "The quick brown fox", '{"id": 1}')))


def test_local_request_counts_match_the_loop():
    t = toy_pair(noise=1.0)
    settings = runner.Settings(max_tokens=20)
    plain = t.request(WORKLOAD.prompts[0], 0, 20, settings)
    spec = t.request(WORKLOAD.prompts[0], 3, 20, settings)
    assert plain.output_tokens == spec.output_tokens == 20  # no end_id: exactly max_tokens
    assert plain.drafted == 0 and plain.steps == 20 and plain.rejections == 0 and plain.per_position_tried == []
    assert spec.steps < 20 and spec.drafted > 0
    assert spec.accepted + spec.steps == 20  # every step yields its accepted tokens plus one
    assert spec.per_position_tried[0] == spec.per_position_drafted[0]  # position 0 is always tried
    assert spec.per_position_accepted[0] <= spec.per_position_tried[0]
    # a position is tried exactly when the one before it was accepted (and it was drafted)
    for i in range(1, len(spec.per_position_tried)):
        assert spec.per_position_tried[i] <= spec.per_position_accepted[i - 1]
    assert 0 < spec.ttft_seconds <= spec.seconds


def test_local_bench_document_is_consistent():
    t = toy_pair(noise=0.5)
    settings = runner.Settings(num_draft_tokens=(1, 2, 4, 8), max_tokens=24, requests=3)
    measured = runner.run(t, WORKLOAD, settings)
    assert measured["local"].notes == ["K = 8 measured as K = 4: above the deployment's max_draft_len = 4"]
    rows = report.cells(measured["local"].summaries())
    assert [r["num_draft_tokens"] for r in rows] == [0, 1, 2, 4]
    assert len({r["output_tokens"] for r in rows}) == 1  # greedy: the same tokens for every K
    for r in rows[1:]:
        assert 0 <= r["alpha"] <= 1 and r["cost_ratio"] > 0 and r["bound"] > 0
        assert r["efficiency"] == pytest.approx(r["speedup"] / r["bound"], rel=1e-2)
        assert r["mean_accepted_len"] == pytest.approx((r["accepted"] + r["steps"]) / r["steps"], abs=1e-4)


def _spec(tmp_path, max_draft_len=4):
    return spec_from_dict(
        {
            "name": "toy",
            "target": {"checkpoint": "t"},
            "draft": {"checkpoint": "d"},
            "speculative": {"max_draft_len": max_draft_len, "num_draft_tokens": 2},
        },
        tmp_path,
    )


def test_qualify_reports_alpha_c_predictions_and_a_recommendation(tmp_path):
    spec = _spec(tmp_path)
    prompts = [("code", p) for p in WORKLOAD.prompts]
    gpu = {"cost_ratio": 0.05}
    good = qualify.measure_with(toy_pair(noise=0.3), prompts, spec, max_tokens=24, gpu=gpu)
    bad = qualify.measure_with(toy_pair(noise=8.0), prompts, spec, max_tokens=24, gpu=gpu)
    assert good["num_draft_tokens"] == 4  # clamped to the verifier's max_draft_len
    assert len(good["per_position_alpha"]) == 4
    assert good["alpha"] > bad["alpha"]
    assert good["cost_ratio"]["gpu"] == 0.05 and good["cost_ratio"]["this_machine"] > 0
    rows = good["predicted_speedup"]
    assert [r["num_draft_tokens"] for r in rows] == list(range(9))
    best = max(rows[1:], key=lambda r: r["gpu"])
    assert good["recommended_max_draft_len"] == (best["num_draft_tokens"] if best["gpu"] > 1 else 0)
    assert good["alpha_by_workload"].keys() == {"code"}
    assert good["degenerate_workloads"] == []  # the toy target's greedy text varies
    assert bad["predicted_speedup"][1]["gpu"] < good["predicted_speedup"][1]["gpu"]
    lines = qualify.summary_lines(good)
    assert lines[0].startswith(f"alpha {good['alpha']:.2f} at K = 4 on 3 prompts (code)")
    assert lines[-1] == f"recommended max_draft_len = {good['recommended_max_draft_len']}"
    # the overlapped schedule: hit rate from the per-position alphas, its bound, its gain over the sequential best
    alphas = good["per_position_alpha"]
    assert rows[1]["hit_rate"] == pytest.approx(alphas[0] * alphas[1], abs=1e-3)
    assert rows[3]["hit_rate"] == pytest.approx(np.prod(alphas[:4]), abs=1e-3)
    assert rows[6]["hit_rate"] == pytest.approx(np.prod(alphas) * good["alpha"] ** 3, abs=1e-3)  # past K = 4: pooled
    for row in rows[1:]:
        assert row["overlapped_gpu"] >= row["gpu"] - 1e-9  # drafting ahead never costs more in the model
    gain = good["overlap"]["gpu"]
    assert gain["over_sequential"] == pytest.approx(
        max(r["overlapped_gpu"] for r in rows[1:]) / max(r["gpu"] for r in rows[1:]), rel=1e-3
    )
    assert any(line.startswith("overlapped on GPU") for line in lines)


def test_overlapped_transport_reports_early_drafts_and_compare_section():
    from specbuild.bench.run import overlap_section

    t = toy_pair(noise=0.3)
    peer = t.with_overlap(True, "local-overlap")
    settings = runner.Settings(num_draft_tokens=(1, 3), max_tokens=24, requests=3)
    measured = runner.run(t, WORKLOAD, settings, peers=[peer])
    seq_rows = report.cells(measured["local"].summaries())
    ovl_rows = report.cells(measured["local-overlap"].summaries())
    assert [r["schedule"] for r in seq_rows] == ["sequential"] * 3 and all(r["early_drafts"] == 0 for r in seq_rows)
    for r in ovl_rows[1:]:
        assert r["schedule"] == "overlapped" and r["early_drafts"] > 0
        assert 0 < r["early_draft_hit_rate"] <= 1 and r["hidden_seconds"] >= 0
        assert r["efficiency"] == pytest.approx(r["speedup"] / r["overlap_bound"], rel=1e-2)
    assert [r["output_tokens"] for r in ovl_rows] == [r["output_tokens"] for r in seq_rows]  # greedy: same text
    section = overlap_section(measured["local"], measured["local-overlap"])
    assert [r["num_draft_tokens"] for r in section["runs"]] == [1, 3]
    for row, o, q in zip(section["runs"], ovl_rows[1:], seq_rows[1:]):
        assert row["overlapped_over_sequential"] == pytest.approx(o["tokens_per_s"] / q["tokens_per_s"], rel=1e-2)
        assert row["predicted_hit_rate"] == pytest.approx(q["alpha"] ** (row["num_draft_tokens"] + 1), abs=1e-3)
        assert row["predicted_overlapped_over_sequential"] == pytest.approx(o["overlap_bound"] / q["bound"], rel=1e-2)
    best = max(section["runs"], key=lambda r: r["overlapped_tokens_per_s"])
    assert section["num_draft_tokens"] == best["num_draft_tokens"]
    doc = report.document("local", "toy", "toy", {}, seq_rows, extra={"overlap": section})
    assert "overlapped (draft-ahead) at K = " in report.table(doc)
    # each ratio's spread: the quartiles of the same ratio prompt by prompt
    ovl, seq = measured["local-overlap"], measured["local"]
    for row in section["runs"]:
        k, spread = row["num_draft_tokens"], row["overlapped_over_sequential_spread"]
        by_prompt = {r.prompt_index: r.tokens_per_s for r in seq.cells[(k, 1)]}
        ratios = sorted(r.tokens_per_s / by_prompt[r.prompt_index] for r in ovl.cells[(k, 1)])
        assert spread["prompts"] == 3 and spread["median"] == pytest.approx(ratios[1], abs=1e-4)
        assert spread["p25"] == pytest.approx((ratios[0] + ratios[1]) / 2, abs=1e-4)  # inclusive quartiles of 3
        assert f"K = {k}: overlapped / sequential {row['overlapped_over_sequential']:.2f}x (per prompt " in (
            report.table(doc)
        )
    with_auto = overlap_section(seq, ovl, auto=seq)  # auto measured as the sequential run: its spread is <= 1
    for row in with_auto["runs"]:
        assert row["auto_over_best_spread"]["p75"] <= 1.0 and "auto_over_best" in row


def test_peers_alternate_which_runs_first():
    order = []

    class Recording(LocalTransport):
        def request(self, prompt, k, max_tokens, settings, concurrent=False):
            order.append((self.name, k))
            return super().request(prompt, k, max_tokens, settings, concurrent)

    base = toy_pair(noise=0.3)
    a = Recording(base.session, name="a")
    b = Recording(base.session, name="b", overlap=True)
    runner.run(a, WORKLOAD, runner.Settings(num_draft_tokens=(2,), max_tokens=8, requests=2, warmup=False), peers=[b])
    firsts = [order[i][0] for i in range(0, len(order), 2)]
    assert order[0::2] != order[1::2] and set(firsts) == {"a", "b"}


def test_auto_overlap_runs_concurrent_requests_sequentially():
    t = toy_pair(noise=0.3)
    t.overlap = "auto"
    settings = runner.Settings(max_tokens=20)
    assert t.request(WORKLOAD.prompts[0], 3, 20, settings).early_drafts > 0
    assert t.request(WORKLOAD.prompts[0], 3, 20, settings, concurrent=True).early_drafts == 0
