"""`specbuild up`: the stage chain (data-driven), skipping, --json summary, failures, dry-run."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from specbuild.cli import main
from specbuild.errors import BuildError
from specbuild.up.stages import STAGE_NAMES, Stage, UpContext, run_stages, stages_for


def stage(name, status=None, error=None, calls=None):
    def run(ctx):
        if calls is not None:
            calls.append(name)
        if error:
            raise error
        return {"status": status}

    return Stage(name, run)


def test_stage_list_is_the_pipeline_in_order():
    for backend in ("reference", "trtllm", "llmapi"):  # one stage list per path, the same names
        assert (
            [s.name for s in stages_for(backend)] == list(STAGE_NAMES) == ["check", "convert", "build", "repo", "serve"]
        )


def test_run_stages_stops_at_the_first_failure(tmp_path):
    from fakes.build_fixtures import make_spec

    calls = []
    ctx = UpContext(
        spec=make_spec(tmp_path), backend="reference", force=False, dry_run=False, once=False, log=lambda m: None
    )
    stages = [
        stage("a", "ran", calls=calls),
        stage("b", "skipped", calls=calls),
        stage("c", error=BuildError("boom: do X"), calls=calls),
        stage("d", "ran", calls=calls),
    ]
    summary, error = run_stages(ctx, stages)
    assert calls == ["a", "b", "c"]
    assert [(s["stage"], s["status"]) for s in summary] == [("a", "ran"), ("b", "skipped"), ("c", "failed")]
    assert summary[2]["error"] == "boom: do X" and isinstance(error, BuildError)
    assert ctx.results == {"a": {"status": "ran"}, "b": {"status": "skipped"}}


def test_failed_check_exits_1_with_a_json_summary(tmp_path):
    spec = tmp_path / "specbuild.toml"
    spec.write_text('name = "p"\n[target]\ncheckpoint = "missing-target"\n[draft]\ncheckpoint = "missing-draft"\n')
    result = CliRunner().invoke(main, ["up", "-c", str(spec), "--json"])
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert doc["ok"] is False and [s["stage"] for s in doc["stages"]] == ["check"]
    assert doc["stages"][0]["status"] == "failed" and "missing-target" in doc["stages"][0]["error"]
    assert "Error:" in result.stderr and "Traceback" not in result.output


def test_dry_run_plans_every_stage_and_writes_nothing(tiny_spec_path):
    result = CliRunner().invoke(main, ["up", "-c", str(tiny_spec_path), "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [(s["stage"], s["status"]) for s in doc["stages"]] == [
        ("check", "planned"),
        ("convert", "planned"),
        ("build", "planned"),
        ("repo", "planned"),
        ("serve", "planned"),
    ]
    assert [e["role"] for e in doc["stages"][2]["detail"]["engines"]] == ["target", "draft"]
    assert not (tiny_spec_path.parent / "engines").exists()


@pytest.mark.slow
def test_up_runs_through_build_then_skips_everything(tiny_spec_path):
    args = ["up", "-c", str(tiny_spec_path), "--json", "--until", "build"]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    doc = json.loads(first.stdout)  # stdout stays one JSON document although modelopt prints
    assert doc["ok"] and [(s["stage"], s["status"]) for s in doc["stages"]] == [
        ("check", "ran"),
        ("convert", "ran"),
        ("build", "ran"),
    ]
    engines = doc["stages"][2]["engines"]
    for role in ("target", "draft"):
        manifest = json.loads(
            (tiny_spec_path.parent / "engines" / "example-tiny" / role / "engine" / "manifest.json").read_text()
        )
        assert manifest["backend"] == "reference" and manifest["smoke_test"]["finite"]
        assert engines[role].endswith(f"{role}/engine")
    second = json.loads(CliRunner().invoke(main, args).stdout)
    assert [s["status"] for s in second["stages"]] == ["skipped", "skipped", "skipped"]
    forced = json.loads(CliRunner().invoke(main, [*args, "--force"]).stdout)
    assert [s["status"] for s in forced["stages"]] == ["ran", "ran", "ran"]
    # A dry run says which stages are up to date (the repository is not written yet; serve always runs).
    dry = CliRunner().invoke(main, ["up", "-c", str(tiny_spec_path), "--dry-run", "--json"])
    assert [(s["stage"], s["status"]) for s in json.loads(dry.stdout)["stages"]] == [
        ("check", "skipped"),
        ("convert", "skipped"),
        ("build", "skipped"),
        ("repo", "planned"),
        ("serve", "planned"),
    ]
    assert CliRunner().invoke(main, ["up", "-c", str(tiny_spec_path), "--until", "repo"]).exit_code == 0
    text = CliRunner().invoke(main, ["up", "-c", str(tiny_spec_path), "--dry-run"]).stdout.splitlines()
    assert text == [f"{stage:<8} would be skipped (up to date)" for stage in ("check", "convert", "build", "repo")] + [
        f"{'serve':<8} would run"
    ]
    forced_dry = json.loads(
        CliRunner().invoke(main, ["up", "-c", str(tiny_spec_path), "--dry-run", "--json", "--force"]).stdout
    )
    assert {s["status"] for s in forced_dry["stages"]} == {"planned"}


def test_until_stops_after_the_named_stage(tiny_spec_path):
    result = CliRunner().invoke(main, ["up", "-c", str(tiny_spec_path), "--until", "check", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [(s["stage"], s["status"]) for s in doc["stages"]] == [("check", "ran")]
    assert not (tiny_spec_path.parent / "engines" / "example-tiny" / "target").exists()
    bad = CliRunner().invoke(main, ["up", "-c", str(tiny_spec_path), "--until", "deploy"])
    assert bad.exit_code == 2
