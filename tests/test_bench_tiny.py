"""`specbuild bench --local` on the tiny example pair: one run, every field, consistent numbers."""

import json

import pytest
from click.testing import CliRunner

from specbuild.cli import main
from specbuild.config import load_spec

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def run_bench(*args):
    result = CliRunner().invoke(main, ["bench", *map(str, args)])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def tiny_doc(tmp_path_factory, example_tiny):
    from specbuild.example import specfile

    folder = tmp_path_factory.mktemp("bench")
    text = specfile.render_spec(specfile.example_overrides(example_tiny, "tiny"), header="bench test")
    spec = specfile.write_spec(folder / "specbuild.toml", text)
    args = [
        "-c",
        spec,
        "--local",
        "--json",
        "--num-draft-tokens",
        "0,2",
        "--max-tokens",
        10,
        "--requests",
        2,
        "--vs-hf",
        "--vs-plain",
        "--threads",
        1,
        "--plot",
        folder / "plots",
    ]
    result = CliRunner().invoke(main, ["bench", *map(str, args)])
    assert result.exit_code == 0, result.output
    (folder / "stderr.txt").write_text(result.stderr)
    return json.loads(result.stdout), folder


def test_the_sweep_reports_progress_on_stderr_when_it_is_not_a_terminal(tiny_doc):
    _, folder = tiny_doc
    lines = (folder / "stderr.txt").read_text().splitlines()
    # 2 requests x K in {0, 2} x (ours + Hugging Face), + 2 at K = 0 on the 1-row target = 10 measured requests;
    # the last line says all are done
    assert "bench ..." in lines
    assert any(line.startswith("bench: 10/10 requests (100%), ") and "elapsed" in line for line in lines), lines


def test_local_json_reports_speedup_alpha_c_bound_efficiency(tiny_doc):
    doc, _ = tiny_doc
    assert doc["mode"] == "local" and doc["spec"] == "example-tiny" and doc["workload"] == "code"
    runs = {r["num_draft_tokens"]: r for r in doc["runs"]}
    assert set(runs) == {0, 2}
    base, k2 = runs[0], runs[2]
    assert base["drafted"] == 0 and base["accepted"] == 0 and base["speedup"] == 1.0
    assert base["mean_accepted_len"] == 1.0 and base["alpha"] is None
    assert base["output_tokens"] == k2["output_tokens"]  # greedy: same tokens with and without drafting
    assert k2["speedup"] == pytest.approx(k2["tokens_per_s"] / base["tokens_per_s"], rel=2e-3)
    assert 0.0 <= k2["alpha"] <= 1.0 and 0.0 <= k2["acceptance_rate"] <= 1.0
    assert k2["cost_ratio"] == pytest.approx(k2["draft_seconds_per_token"] / base["target_seconds_per_step"], rel=1e-2)
    from specbuild.speculative.adaptive import predicted_speedup

    assert k2["bound"] == pytest.approx(predicted_speedup(k2["alpha"], 2, k2["cost_ratio"]), rel=1e-3)
    # the spec says overlap = "auto": on this machine K = 2 may have drafted ahead, then its own bound applies
    against = k2["overlap_bound"] if k2["schedule"] == "overlapped" else k2["bound"]
    assert (k2["schedule"] == "overlapped") == (k2["early_drafts"] > 0)
    assert k2["efficiency"] == pytest.approx(k2["speedup"] / against, rel=1e-2)
    assert len(k2["per_position_acceptance"]) == 2
    for key in ("speedup", "alpha", "cost_ratio", "bound", "efficiency"):
        assert doc[key] == k2[key]  # K = 2 is the only K > 0, so it is the best
    for dist in ("ttft_seconds", "tpot_seconds", "request_tokens_per_s"):
        d = k2[dist]
        assert d["median"] <= d["p90"] <= d["p99"] <= d["max"]


def test_vs_hf_adds_the_hugging_face_figures(tiny_doc):
    doc, _ = tiny_doc
    hf = doc["hf"]
    assert hf["num_draft_tokens"] == 2
    assert hf["tokens_per_s"] > 0 and hf["baseline_tokens_per_s"] > 0
    runs = {r["num_draft_tokens"]: r for r in doc["runs"]}
    assert hf["ours_over_hf"] == pytest.approx(runs[2]["tokens_per_s"] / hf["tokens_per_s"], rel=1e-2)


def test_greedy_output_is_the_same_at_every_k_and_on_the_plain_target(tiny_doc):
    doc, _ = tiny_doc
    assert doc["greedy_equal"] is True and [r["same_tokens_as_k0"] for r in doc["runs"]] == [True, True]
    plain = doc["plain"]
    assert plain["tokens_per_s"] > 0 and plain["same_tokens_as_k0"] is True  # 1-row matmuls: exact by construction
    assert plain["speedup_vs_fastest_target_only"] > 0


def test_plots_written(tiny_doc):
    doc, folder = tiny_doc
    names = sorted(p.rsplit("/", 1)[1] for p in doc["plots"])
    assert names == ["acceptance_by_position.png", "speedup_vs_k.png", "throughput_vs_concurrency.png"]
    for name in names:
        assert (folder / "plots" / name).read_bytes()[:4] == b"\x89PNG"


def test_local_concurrency_batches_the_streams(tiny_doc):
    _, folder = tiny_doc
    r = CliRunner().invoke(
        main,
        [
            "bench",
            "-c",
            str(folder / "specbuild.toml"),
            "--local",
            "--json",
            "--num-draft-tokens",
            "0,2",
            "--concurrency",
            "1,3",
            "--max-tokens",
            "6",
            "--requests",
            "3",
            "--no-warmup",
            "--threads",
            "1",
        ],
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    cells = {(row["concurrency"], row["num_draft_tokens"]): row for row in doc["runs"]}
    assert set(cells) == {(1, 0), (1, 2), (3, 0), (3, 2)}
    # greedy: the same prompts give the same tokens alone or batched with others, with or without drafting
    assert len({row["output_tokens"] for row in cells.values()}) == 1
    assert cells[(3, 2)]["drafted"] > 0 and cells[(3, 0)]["drafted"] == 0
    assert cells[(3, 2)]["speedup"] == pytest.approx(
        cells[(3, 2)]["tokens_per_s"] / cells[(3, 0)]["tokens_per_s"], rel=2e-3
    )
    assert not any("skipped" in note for note in doc["notes"])


def test_check_measure_section_on_the_tiny_pair(tiny_doc, tmp_path):
    from specbuild.bench import measure as qualify
    from specbuild.config import load_spec

    _, folder = tiny_doc
    spec = load_spec(folder / "specbuild.toml")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "def add(a, b):"}\n{"prompt": "{\\"id\\": 1, \\"name\\":"}\n')
    m = qualify.measure(spec, prompts_file=prompts, max_tokens=8)
    assert m["prompts"] == {"source": "p.jsonl", "count": 2, "max_tokens": 8}
    k = m["num_draft_tokens"]
    assert k == min(8, spec.speculative.max_draft_len)
    assert 0.0 <= m["alpha"] <= 1.0 and len(m["per_position_alpha"]) <= k
    assert m["cost_ratio"]["this_machine"] > 0
    gpu = m["gpu_estimate"]
    assert gpu["gpu"] == spec.gpu.name and gpu["target_parameters"] > gpu["draft_parameters"] > 0
    assert m["cost_ratio"]["gpu"] == pytest.approx(gpu["cost_ratio"], abs=1e-4)
    rows = m["predicted_speedup"]
    assert rows[0] == {
        "num_draft_tokens": 0,
        "expected_tokens_per_step": 1.0,
        "this_machine": 1.0,
        "gpu": 1.0,
        "hit_rate": None,
        "overlapped_this_machine": 1.0,
        "overlapped_gpu": 1.0,
    }
    assert m["overlap"]["gpu"]["over_sequential"] >= 1.0 and m["overlap"]["cores"] >= 1
    best_gpu = max(rows, key=lambda r: (r["gpu"], -r["num_draft_tokens"]))
    assert m["recommended_max_draft_len"] == best_gpu["num_draft_tokens"]


def test_check_measure_cli(tiny_doc):
    _, folder = tiny_doc
    spec = str(folder / "specbuild.toml")
    r = CliRunner().invoke(main, ["check", "-c", spec, "--prompts", "x.jsonl"])
    assert r.exit_code == 2 and "--prompts is used by --measure" in r.output
    r = CliRunner().invoke(main, ["check", "-c", spec, "--measure", "--json"])
    assert r.exit_code == 0, r.output
    m = json.loads(r.stdout)["measure"]
    assert 0 <= m["alpha"] <= 1 and m["recommended_max_draft_len"] is not None

    # init --from-check turns the measured recommendation into the spec's K
    report = folder / "check.json"
    report.write_text(r.stdout)
    tuned = folder / "tuned.toml"
    r = CliRunner().invoke(main, ["init", "--from-check", str(report), "--out", str(tuned)])
    assert r.exit_code == 0, r.output
    got = load_spec(tuned)
    k = m["recommended_max_draft_len"]
    assert got.speculative.num_draft_tokens == k
    assert got.speculative.max_draft_len == (k or load_spec(spec).speculative.max_draft_len)
    assert str(got.target.checkpoint) == json.loads(report.read_text())["models"]["target"]["path"]
    assert f"alpha {m['alpha']}" in tuned.read_text().splitlines()[1]
