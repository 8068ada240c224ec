"""`specbuild init`: a commented spec that lists every config key, loads, and is never overwritten by accident."""

from __future__ import annotations

import dataclasses
import json

import tomllib
from click.testing import CliRunner

from specbuild.cli import main
from specbuild.config import Spec, load_spec
from specbuild.example import specfile


def _defaults() -> dict:
    """Spec.to_dict() of an all-defaults spec with placeholder checkpoints, built from the dataclasses."""
    sections = {
        name: cls(**({"checkpoint": "x"} if name in ("target", "draft") else {}))
        for name, cls in specfile.SECTIONS.items()
    }
    return Spec(name="pair", **sections).to_dict()


def test_reasons_cover_exactly_the_config_fields():
    assert set(specfile.REASONS) == set(specfile.all_keys())
    assert all(reason.strip() for reason in specfile.REASONS.values())


def test_init_writes_a_spec_with_every_key_and_its_default(tmp_path):
    out = tmp_path / "specbuild.toml"
    result = CliRunner().invoke(main, ["init", "--out", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    raw = tomllib.loads(text)
    for section, cls in specfile.SECTIONS.items():
        for f in dataclasses.fields(cls):
            if f.default is None:
                assert f"# {f.name} = " in text  # unset keys are shown commented out
            else:
                assert f.name in raw[section], f"{section}.{f.name} missing from the written spec"
    spec = load_spec(out)
    expected = _defaults()
    got = spec.to_dict()
    for role in ("target", "draft"):
        assert got[role].pop("checkpoint") == str(tmp_path / "models" / role)
        expected[role].pop("checkpoint")
    expected["output_dir"] = str(tmp_path / "engines")
    assert got == expected
    assert text.count("\n# ") >= len(specfile.all_keys())  # a reason above every key


def test_init_refuses_to_overwrite_without_force(tmp_path):
    out = tmp_path / "specbuild.toml"
    out.write_text("# mine\n")
    result = CliRunner().invoke(main, ["init", "--out", str(out)])
    assert result.exit_code == 1
    assert result.output == (
        f"Error: {out} already exists; not overwriting it. Pass --force to replace it, or --out to write elsewhere.\n"
    )
    assert out.read_text() == "# mine\n"
    result = CliRunner().invoke(main, ["init", "--out", str(out), "--force"])
    assert result.exit_code == 0, result.output
    assert load_spec(out).name == "pair"


def test_init_dry_run_writes_nothing(tmp_path):
    out = tmp_path / "specbuild.toml"
    result = CliRunner().invoke(main, ["init", "--out", str(out), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert not out.exists()
    assert "[speculative]" in result.stdout and f"would write {out}" in result.stderr


def test_init_bad_variant_is_a_usage_error(tmp_path):
    result = CliRunner().invoke(main, ["init", "--example", "--variant", "huge", "--out", str(tmp_path / "s.toml")])
    assert result.exit_code == 2
    assert "'huge' is not one of 'full', 'tiny'" in result.output


def test_init_example_points_at_the_example_pair(example_tiny, tmp_path):
    out = tmp_path / "specbuild.toml"
    result = CliRunner().invoke(main, ["init", "--example", "--variant", "tiny", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document == {
        "path": str(out.resolve()),
        "written": True,
        "example": str(example_tiny.root),
        "target": str(example_tiny.target),
        "draft": str(example_tiny.draft),
    }
    spec = load_spec(out)
    assert spec.name == "example-tiny"
    assert spec.target.checkpoint == example_tiny.target and spec.draft.checkpoint == example_tiny.draft
    assert spec.gpu.name == "H100-80GB"
    assert 4 <= spec.speculative.max_draft_len <= 8
    assert 1 <= spec.speculative.num_draft_tokens <= spec.speculative.max_draft_len
    positions = json.loads((example_tiny.target / "config.json").read_text())["max_position_embeddings"]
    assert spec.build.max_input_len < spec.build.max_seq_len <= positions


def test_tiny_spec_fixture_loads(tiny_spec_path, example_tiny):
    spec = load_spec(tiny_spec_path)
    assert spec.draft.checkpoint == example_tiny.draft


def test_best_num_draft_tokens_follows_the_closed_form():
    # alpha 0.6, c 0.2: speedups K=1..4 are 1.33, 1.40, 1.36, 1.29 -> K = 2
    assert specfile.best_num_draft_tokens(0.6, 0.2, 6) == 2
    assert specfile.best_num_draft_tokens(0.95, 0.05, 6) == 6  # clamped to max_draft_len
    assert specfile.best_num_draft_tokens(0.1, 0.5, 6) == 1


def test_init_from_check_refuses_a_report_without_a_measurement(tmp_path):
    for content, message in (
        ("{}", "has no measurement: write it with `specbuild check --measure --json"),
        ("{", "is not a JSON check report"),
        (None, "cannot read the check report"),
    ):
        report = tmp_path / "check.json"
        report.unlink(missing_ok=True)
        if content is not None:
            report.write_text(content)
        out = tmp_path / "spec.toml"
        result = CliRunner().invoke(main, ["init", "--from-check", str(report), "--out", str(out)])
        assert result.exit_code == 1 and message in result.output, result.output
        assert not out.exists()


def test_a_check_report_saying_speculation_does_not_pay_gives_k_0(tmp_path):
    report = {
        "pair": "p",
        "models": {"target": {"path": "/m/t"}, "draft": {"path": "/m/d"}},
        "measure": {"recommended_max_draft_len": 0, "alpha": 0.1, "cost_ratio": {"this_machine": 0.9, "gpu": None}},
    }
    (tmp_path / "check.json").write_text(json.dumps(report))
    out = tmp_path / "spec.toml"
    result = CliRunner().invoke(main, ["init", "--from-check", str(tmp_path / "check.json"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    spec = load_spec(out)
    assert spec.speculative.num_draft_tokens == 0 and spec.name == "p"
    assert spec.speculative.max_draft_len == _defaults()["speculative"]["max_draft_len"]
    assert str(spec.target.checkpoint) == "/m/t" and str(spec.draft.checkpoint) == "/m/d"
    assert "speculation is not predicted to pay" in out.read_text()


def test_init_for_your_own_pair_fills_the_spec_from_the_checkpoints_and_check_agrees(tmp_path):
    """--target/--draft: the folders, each checkpoint's dtype, limits within both models' positions (the target's
    less max_draft_len), and the backend a family needs; `check` then finds no position problem or warning."""
    from family_models import make_family

    target = make_family(tmp_path / "Qwen-7B", "qwen2")  # max_position_embeddings 256
    draft = make_family(tmp_path / "Qwen-0.5B", "qwen2", hidden=32, layers=1, seed=1)
    out = tmp_path / "specbuild.toml"
    result = CliRunner().invoke(main, ["init", "--target", str(target), "--draft", str(draft), "--out", str(out)])
    assert result.exit_code == 0, result.output
    spec = load_spec(out)
    assert (spec.name, spec.target.checkpoint.name, spec.draft.checkpoint.name) == ("Qwen-7B", "Qwen-7B", "Qwen-0.5B")
    assert spec.build.max_seq_len == 256 - spec.speculative.max_draft_len and spec.build.backend is None
    checked = CliRunner().invoke(main, ["check", "-c", str(out), "--json", "--no-weight-scan"])
    doc = json.loads(checked.stdout)
    codes = [entry["code"] for entry in doc["problems"] + doc["warnings"]]
    assert not doc["problems"] and not [c for c in codes if "position" in c], codes

    phi = make_family(tmp_path / "phi", "phi3")  # a family only the LLM API path takes
    CliRunner().invoke(main, ["init", "--target", str(phi), "--draft", str(phi), "--out", str(out), "--force"])
    assert load_spec(out).build.backend == "llmapi"
    no_target = CliRunner().invoke(main, ["init", "--draft", str(phi), "--out", str(tmp_path / "x.toml")])
    assert no_target.exit_code == 2 and "--draft needs --target" in no_target.output


def test_init_for_a_target_alone_writes_a_lookup_spec_without_draft_and_check_checks_one_model(tmp_path):
    """--target without --draft: no [draft] table, drafter lookup, the same limits as a pair's; `check` reads one
    model (no pair checks, the target's memory plan alone) and calls it usable on both paths, and it says what is
    missing when the drafter needs a model."""
    from family_models import make_family

    target = make_family(tmp_path / "Qwen-7B", "qwen2")
    out = tmp_path / "specbuild.toml"
    result = CliRunner().invoke(main, ["init", "--target", str(target), "--out", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert "\n[draft]" not in text and "# No [draft]: a target-only deployment" in text and 'drafter = "lookup"' in text
    spec = load_spec(out)
    assert spec.draft is None and spec.roles == ("target",) and spec.speculative.drafter == "lookup"
    assert spec.build.max_seq_len == 256 - spec.speculative.max_draft_len
    for backend in ("reference", "llmapi"):
        checked = CliRunner().invoke(main, ["check", "-c", str(out), "--json", "--backend", backend])
        doc = json.loads(checked.stdout)
        assert checked.exit_code == 0 and not doc["problems"], doc["problems"]
        assert list(doc["models"]) == ["target"] and doc["tokenizer"]["target_only"]
        plan = doc["memory"]
        assert (plan["draft"] is None) if backend == "reference" else (list(plan["kv_bytes_per_token"]) == ["target"])
        assert list(doc["weights"]) == ["target"]
    human = CliRunner().invoke(main, ["check", "-c", str(out), "--no-weight-scan"])
    assert human.exit_code == 0 and "no draft model to compare" in human.output, human.output
    assert "the target alone" in human.output and "OK: the target is (no draft model) usable." in human.output
    out.write_text(text.replace('drafter = "lookup"', 'drafter = "hybrid"'))
    refused = CliRunner().invoke(main, ["check", "-c", str(out)])
    assert refused.exit_code != 0 and "needs a draft model" in refused.output


def test_init_keeps_a_sliding_window_pair_within_its_window_or_says_why_no_path_takes_it(tmp_path):
    """A Mistral pair with a 64-token window: init writes max_seq_len = 64 (check refuses any longer on both paths,
    whose attention would pass the window), and check then calls the spec usable on the backend init chose and on
    the LLM API path; a Gemma 2 pair, which no path of TensorRT-LLM 1.2.1 takes, gets no spec and check's reason."""
    from family_models import make_family

    target = make_family(tmp_path / "mistral", "mistral", sliding_window=64)
    draft = make_family(tmp_path / "mistral-draft", "mistral", hidden=32, layers=1, seed=1, sliding_window=64)
    out = tmp_path / "specbuild.toml"
    result = CliRunner().invoke(main, ["init", "--target", str(target), "--draft", str(draft), "--out", str(out)])
    assert result.exit_code == 0, result.output
    spec = load_spec(out)
    assert spec.build.max_seq_len == 64 and spec.build.max_input_len == 32 and spec.build.backend is None
    for backend in ("reference", "llmapi"):
        checked = CliRunner().invoke(
            main, ["check", "-c", str(out), "--json", "--no-weight-scan", "--backend", backend]
        )
        assert not json.loads(checked.stdout)["problems"], (backend, checked.stdout)

    gemma2 = make_family(tmp_path / "gemma2", "gemma2")
    refused = CliRunner().invoke(
        main, ["init", "--target", str(gemma2), "--draft", str(gemma2), "--out", str(tmp_path / "g.toml")]
    )
    assert refused.exit_code != 0 and not (tmp_path / "g.toml").exists()
    assert "no path takes this pair" in refused.output and "Unknown architecture" in refused.output
