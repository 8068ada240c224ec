"""`specbuild example`: one JSON document on stdout, dry run, usage errors."""

from __future__ import annotations

import json

from click.testing import CliRunner

from specbuild.cli import main


def test_example_json_reports_the_cached_pair(example_tiny):
    result = CliRunner().invoke(main, ["example", "--variant", "tiny", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["root"] == str(example_tiny.root)
    assert document["target"] == str(example_tiny.target) and document["draft"] == str(example_tiny.draft)
    assert document["agreement"] == example_tiny.info["agreement"]
    assert document["cost_ratio"] == example_tiny.info["cost_ratio"]
    assert document["variant"] == "tiny"


def test_example_text_output(example_tiny):
    result = CliRunner().invoke(main, ["example", "--variant", "tiny"])
    assert result.exit_code == 0, result.output
    assert f"example pair (tiny) at {example_tiny.root}" in result.stdout
    assert "greedy agreement on held-out prompts" in result.stdout


def test_example_dry_run_builds_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBUILD_CACHE_DIR", str(tmp_path))
    result = CliRunner().invoke(main, ["example", "--variant", "tiny", "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["built"] is False and document["root"].startswith(str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_example_bad_variant_is_a_usage_error():
    result = CliRunner().invoke(main, ["example", "--variant", "huge"])
    assert result.exit_code == 2
    assert "'huge' is not one of 'full', 'tiny'" in result.output


def test_example_refuses_foreign_out_folder(example_tiny, tmp_path):
    (tmp_path / "keep.txt").write_text("x")
    result = CliRunner().invoke(main, ["example", "--variant", "tiny", "--out", str(tmp_path)])
    assert result.exit_code == 1
    assert result.output.startswith(f"Error: {tmp_path} exists and is not a specbuild example folder")
