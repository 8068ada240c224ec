"""`bench --predict` (bench.predict): the speedup per K and schedule from measured acceptance and another machine's
step times, checked against a measured run of timed stand-ins that take those step times."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from specbuild.bench import predict, theory
from specbuild.cli import main
from specbuild.reference.timing import TIMING_ENV, StandInTiming

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _row(k: int, tokens: float, drafted: float, alpha: float, speedup: float, hit: float | None = None):
    return {
        "num_draft_tokens": k,
        "concurrency": 1,
        "mean_accepted_len": tokens,
        "mean_k": drafted,
        "alpha": alpha,
        "early_draft_hit_rate": hit,
        "speedup": speedup,
    }


def test_each_schedules_speedup_is_the_measured_tokens_over_the_steps_time():
    rows = [
        _row(0, 1.0, 0.0, None, 1.0),
        _row(2, 2.2, 2.0, 0.7, 1.5),
        _row(4, 3.0, 3.5, 0.7, 1.9, hit=0.5),
        {**_row(4, 9.0, 4.0, 0.9, 3.0), "concurrency": 4},  # a concurrent cell: not a one-stream figure
    ]
    timing = StandInTiming.parse("target=20ms,draft=2ms")
    out = predict.prediction(rows, {"target": 0.020, "draft": 0.002}, timing)
    assert out["cost_ratio"] == pytest.approx(0.1) and [r["num_draft_tokens"] for r in out["runs"]] == [2, 4]
    k2, k4 = out["runs"]
    assert k2["sequential"] == pytest.approx(2.2 / 1.2, abs=1e-4)  # E / (1 + k c)
    assert k2["hit_rate"] == pytest.approx(theory.hit_rate(0.7, 2), abs=1e-4)  # alpha^(K+1) where not measured
    assert k2["overlapped"] == pytest.approx(2.2 / (1.0 + (1 - 0.7**3) * 0.2), abs=1e-4)
    assert k4["overlapped"] == pytest.approx(3.0 / (1.0 + 0.5 * 0.35), abs=1e-4)  # max(1, 4.5 x 0.1) = 1
    assert k2["bound"] == pytest.approx(theory.bound(0.7, 2, 0.1), abs=1e-4) and k4["measured_speedup"] == 1.9
    assert out["best"] == {"num_draft_tokens": 4, "schedule": "overlapped", "speedup": k4["overlapped"]}
    slow_draft = predict.prediction(rows, {"target": 0.020, "draft": 0.010}, timing)["runs"][1]
    assert slow_draft["overlapped"] == pytest.approx(3.0 / (4.5 * 0.5 + 0.5 * 3.5 * 0.5), abs=1e-4)


def test_a_gpus_step_times_come_from_the_spec_models_sizes_and_format(tiny_spec_path):
    from specbuild import gpus
    from specbuild.config import load_spec

    spec = load_spec(tiny_spec_path)
    target = theory.ModelSize.of_checkpoint(spec.target.checkpoint)
    own = predict.step_times(spec, StandInTiming.parse("gpu=L4"))
    assert own["target"] == pytest.approx(
        gpus.step_seconds(gpus.GPUS["L4"], theory.weight_bytes(target, spec.target), target.layers)
    )
    named = predict.step_times(spec, StandInTiming.parse("gpu=L4,target=8B,bytes_per_weight=1"))
    assert named["target"] == pytest.approx(gpus.step_seconds(gpus.GPUS["L4"], 8e9, target.layers))
    draft = theory.ModelSize.of_checkpoint(spec.draft.checkpoint)  # its own size, at the byte per weight named
    assert named["draft"] == pytest.approx(gpus.step_seconds(gpus.GPUS["L4"], draft.parameters, draft.layers))
    with pytest.raises(Exception, match="no step time for the draft: name both roles"):
        predict.step_times(spec, StandInTiming.parse("target=20ms"))


def test_the_prediction_matches_a_run_of_timed_stand_ins_at_every_k(tiny_spec_path, monkeypatch):
    """The tiny pair's models made to take 40 ms per target step and 4 ms per draft step, and the prediction for those
    times from the same run's acceptance: equal within 10 % at every K (the host's own time per step, which the
    prediction leaves out, is well under a millisecond; the models' computation is far below their timed steps)."""
    monkeypatch.setenv(TIMING_ENV, "")  # --timed sets it in this process: restored after the test
    timing = "target=40ms,draft=4ms"
    args = ["bench", "-c", tiny_spec_path, "--local", "--json", "--num-draft-tokens", "0,2,4", "--max-tokens", "16"]
    args += ["--requests", "2", "--overlap", "off", "--timed", timing, "--predict", timing, "--threads", "1"]
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["timed_stand_in"]["timing"] == timing and doc["timed_stand_in"]["in_process"]["target"]["calls"] > 0
    predicted = doc["prediction"]
    assert predicted["target_step_seconds"] == 0.04 and predicted["cost_ratio"] == pytest.approx(0.1)
    assert [run["num_draft_tokens"] for run in predicted["runs"]] == [2, 4]
    for run in predicted["runs"]:
        assert run["sequential"] == pytest.approx(run["measured_speedup"], rel=0.10), run
