"""The speed check command runs K = 0 and each K in one go and reports the ratio (no timing is asserted)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from runtime_models import single_thread  # noqa: F401 (autouse fixture)
from specbuild.runtime.speedcheck import format_report, main


def test_speedcheck_reports_k0_best_k_and_ratio(tiny_spec_path):
    result = CliRunner().invoke(main, ["-c", str(tiny_spec_path), "--ks", "2,50", "--prompts", "2", "--max-tokens", "6",
                                       "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [r["num_draft_tokens"] for r in report["results"]] == [0, 2, 6]  # 50 clamped to max_draft_len
    assert report["greedy_equal"] is True
    assert report["best_num_draft_tokens"] in (2, 6)
    rates = {r["num_draft_tokens"]: r["tokens_per_s"] for r in report["results"]}
    assert report["speedup"] == rates[report["best_num_draft_tokens"]] / rates[0]
    assert report["engine_source"] == "hf-checkpoint"
    assert report["exactness"]["exact"] is True and report["exactness"]["row_block"] == report["row_block"]
    fastest = max(rates[0], report["plain_target_only_tokens_per_s"])
    assert report["speedup_vs_fastest_target_only"] == report["best_tokens_per_s"] / fastest
    text = format_report(report)
    assert "target only:" in text and f"best K = {report['best_num_draft_tokens']}" in text and "ratio" in text
    assert "plain target-only decoding (1-row matmuls)" in text
    assert f"row block {report['row_block']}: {report['exactness']['mode']}, exact on this machine" in text


def test_speedcheck_usage_errors(tiny_spec_path):
    result = CliRunner().invoke(main, ["-c", str(tiny_spec_path), "--ks", "two"])
    assert result.exit_code == 2 and "give a comma-separated list of integers" in result.output


def test_a_row_block_that_fails_the_probe_is_refused(tiny_spec_path, monkeypatch):
    import torch

    import specbuild.runtime.model as model_module

    real = model_module._linear
    monkeypatch.setattr(model_module, "_linear",  # a kernel whose result depends on the row's place in its block
                        lambda x, *args: real(x, *args) + 1e-3 * torch.arange(x.shape[0], dtype=x.dtype)[:, None])
    result = CliRunner().invoke(main, ["-c", str(tiny_spec_path), "--ks", "2", "--prompts", "1", "--max-tokens", "4",
                                       "--row-block", "4"])
    assert result.exit_code == 1
    assert "Error: row block 4 is not exact on this machine: a row's result depends on its place" in result.output
    assert "Leave --row-block out to use a block that passes the probe." in result.output
