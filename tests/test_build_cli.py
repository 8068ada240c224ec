"""`specbuild build` through click: dry-run JSON, exit codes and error text."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from fakes.build_fixtures import FAKE_TRTLLM_BUILD, fake_checkpoint

from specbuild.cli import main


def write_spec(tmp_path, extra: str = "") -> str:
    path = tmp_path / "specbuild.toml"
    path.write_text(
        'name = "pair"\noutput_dir = "engines"\n'
        '[target]\ncheckpoint = "hf-target"\n[draft]\ncheckpoint = "hf-draft"\n'
        "[speculative]\nmax_draft_len = 5\nnum_draft_tokens = 4\n"
        '[build]\nbackend = "trtllm"\nmax_batch_size = 2\nmax_input_len = 512\nmax_seq_len = 1024\n'
        "max_num_tokens = 2048\n" + extra
    )
    return str(path)


def run(*args):
    return CliRunner().invoke(main, ["build", *args])


def test_dry_run_json_prints_both_argv_lists(tmp_path):
    result = run("-c", write_spec(tmp_path), "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["dry_run"] is True and doc["backend"] == "trtllm"
    target, draft = doc["engines"]
    assert (target["role"], draft["role"]) == ("target", "draft")
    assert target["argv"][target["argv"].index("--max_draft_len") + 1] == "5"
    assert target["argv"][target["argv"].index("--speculative_decoding_mode") + 1] == "draft_tokens_external"
    assert "--max_draft_len" not in draft["argv"]
    for engine in (target, draft):
        argv = engine["argv"]
        assert argv[argv.index("--max_seq_len") + 1] == "1024"
        assert argv[argv.index("--use_paged_context_fmha") + 1] == "enable"
        assert engine["engine_dir"].endswith(f"engines/pair/{engine['role']}/engine")
        assert not (tmp_path / "engines").exists() or not any((tmp_path / "engines").rglob("engine"))


def test_dry_run_text_shows_the_command(tmp_path):
    result = run("-c", write_spec(tmp_path), "--dry-run", "--role", "draft")
    assert result.exit_code == 0
    assert "trtllm-build --checkpoint_dir" in result.stdout and "# would write:" in result.stdout
    assert "target" not in result.stdout.split("\n")[0]


def test_missing_trtllm_build_names_the_gpu_image(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no trtllm-build anywhere
    spec_path = write_spec(tmp_path)
    result = run("-c", spec_path)
    assert result.exit_code == 1 and "Error: no TensorRT-LLM checkpoint for the target" in result.output
    for role in ("target", "draft"):
        fake_checkpoint(make_spec_from_file(spec_path), role)
    result = run("-c", spec_path)
    assert result.exit_code == 1
    assert "Error: trtllm-build not found on PATH" in result.output
    assert "docker/Dockerfile.gpu" in result.output and "--trtllm-build PATH" in result.output
    assert "Traceback" not in result.output


def make_spec_from_file(path):
    from specbuild.config import load_spec

    return load_spec(path)


def test_bad_trtllm_build_path_is_an_error(tmp_path):
    spec_path = write_spec(tmp_path)
    for role in ("target", "draft"):
        fake_checkpoint(make_spec_from_file(spec_path), role)
    result = run("-c", spec_path, "--trtllm-build", str(tmp_path / "nope"))
    assert result.exit_code == 1 and "is not an executable file" in result.output


def test_build_json_with_the_fake_binary_then_skip(tmp_path, monkeypatch):
    monkeypatch.delenv("FAKE_TRTLLM_MODE", raising=False)
    spec_path = write_spec(tmp_path)
    for role in ("target", "draft"):
        fake_checkpoint(make_spec_from_file(spec_path), role)
    args = ("-c", spec_path, "--trtllm-build", str(FAKE_TRTLLM_BUILD), "--json")
    first = run(*args)
    assert first.exit_code == 0, first.output
    doc = json.loads(first.stdout)
    assert [(e["role"], e["status"]) for e in doc["engines"]] == [("target", "ran"), ("draft", "ran")]
    assert all(e["input_hash"] and e["argv_text"].startswith(str(FAKE_TRTLLM_BUILD)) for e in doc["engines"])
    second = json.loads(run(*args).stdout)
    assert [e["status"] for e in second["engines"]] == ["skipped", "skipped"]
    assert "skipped" in run(*args[:-1]).stderr


def test_failed_build_exits_1_with_the_log_tail(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_TRTLLM_MODE", "fail-midway")
    spec_path = write_spec(tmp_path)
    fake_checkpoint(make_spec_from_file(spec_path), "target")
    result = run("-c", spec_path, "--role", "target", "--trtllm-build", str(FAKE_TRTLLM_BUILD), "--json")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)  # one whole document: the failure, never a half result
    assert doc["ok"] is False and doc["error_type"] == "BuildError" and "exited with code 1" in doc["error"]
    assert "Error: trtllm-build for the target exited with code 1" in result.stderr


@pytest.mark.parametrize("args", [["--backend", "tensorrt"], ["--role", "verifier"]])
def test_usage_errors_exit_2(tmp_path, args):
    result = run("-c", write_spec(tmp_path), *args)
    assert result.exit_code == 2


def test_dry_run_imports_no_heavy_module(tmp_path):
    import subprocess
    import sys

    spec_path = write_spec(tmp_path)
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from specbuild.cli import main\n"
        f"r = CliRunner().invoke(main, ['build', '-c', {spec_path!r}, '--dry-run', '--json'])\n"
        "assert r.exit_code == 0, r.output\n"
        f"r = CliRunner().invoke(main, ['build', '-c', {spec_path!r}, '--dry-run', '--backend', 'reference'])\n"
        "assert r.exit_code == 0, r.output\n"
        "print(','.join(m for m in ('torch', 'transformers', 'modelopt', 'tritonclient') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


def test_example_spec_dry_run_has_the_draft_target_recipe_flags(tiny_spec_path):
    """TensorRT-LLM's recipe (NVIDIA/TensorRT-LLM examples/draft_target_model/README.md), with the example spec's values."""
    from specbuild.config import load_spec

    spec = load_spec(tiny_spec_path)
    result = run("-c", str(tiny_spec_path), "--dry-run", "--json", "--backend", "trtllm")
    assert result.exit_code == 0, result.output
    engines = {e["role"]: e["argv"] for e in json.loads(result.stdout)["engines"]}

    def value(argv, flag):
        return argv[argv.index(flag) + 1] if flag in argv else None

    for role, argv in engines.items():
        assert value(argv, "--checkpoint_dir") == str(spec.pair_dir / role / "checkpoint")
        assert value(argv, "--use_paged_context_fmha") == "enable"
        assert value(argv, "--max_batch_size") == str(spec.build.max_batch_size)
        assert value(argv, "--max_input_len") == str(spec.build.max_input_len)
        assert value(argv, "--max_seq_len") == str(spec.build.max_seq_len)
        assert "--gather_context_logits" not in argv
    assert value(engines["target"], "--speculative_decoding_mode") == "draft_tokens_external"
    assert value(engines["target"], "--max_draft_len") == str(spec.speculative.max_draft_len)
    assert value(engines["draft"], "--speculative_decoding_mode") is None
