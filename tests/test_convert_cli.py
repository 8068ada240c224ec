"""`specbuild convert` end to end: the example pair, reruns, dry runs, refusals and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("torch")
pytest.importorskip("modelopt")

from convert_helpers import make_llama, write_spec  # noqa: E402

from specbuild.cli import main  # noqa: E402

FAST = ["--calib-size", "4", "--calib-seq-len", "32"]


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def example_spec(tmp_path: Path, example_tiny, quantization: str = "none", extra: str = "") -> Path:
    return write_spec(
        tmp_path / "specbuild.toml",
        example_tiny.target,
        example_tiny.draft,
        tmp_path / "engines",
        target_q=quantization,
        draft_q=quantization,
        extra=extra,
    )


@pytest.mark.parametrize(
    "quantization,algo",
    [
        ("none", None),
        ("fp8", "FP8"),
        ("int8_sq", "W8A8_SQ_PER_CHANNEL"),
        ("int8_wo", "W8A16"),
        ("int4_wo", "W4A16"),
        ("int4_awq", "W4A16_AWQ"),
        ("w4a8_awq", "W4A8_AWQ"),
    ],
)
def test_example_pair_converts_verifies_and_reruns_as_noop(
    tmp_path: Path, example_tiny, quantization: str, algo: str | None
) -> None:
    spec = example_spec(tmp_path, example_tiny, quantization)
    result = run("convert", "-c", str(spec), "--verify", "--json", *FAST)
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    for entry in document["roles"]:
        assert entry["status"] == "ran"
        assert entry["verification"]["passed"], entry["verification"]
        if quantization == "none":
            assert entry["verification"]["top1_agreement"] == 1.0
        folder = Path(entry["checkpoint"])
        assert folder == tmp_path / "engines" / "pair" / entry["role"] / "checkpoint"
        config = json.loads((folder / "config.json").read_text())
        assert config["quantization"]["quant_algo"] == algo
        assert config["quantization"]["kv_cache_quant_algo"] is None
        assert config["mapping"] == {"world_size": 1, "tp_size": 1, "pp_size": 1}
        assert config["architecture"] == "LlamaForCausalLM" and config["model_type"] == "llama"
        manifest = json.loads((folder / "manifest.json").read_text())
        assert manifest["quant_algo"] == algo and manifest["role"] == entry["role"] and manifest["pair"] == "pair"
        assert set(manifest["source"]["files"]) >= {"config.json", "model.safetensors"}
        assert manifest["tool_versions"]["nvidia-modelopt"]
        assert manifest["calibration"]["used"] is (quantization in ("fp8", "int8_sq", "int4_awq", "w4a8_awq"))
        if "awq" in quantization:  # the example's MLP widths (352, 176) are padded to whole AWQ blocks
            assert config["intermediate_size"] % config["quantization"]["group_size"] == 0
            assert manifest["settings"]["pad_intermediate_to"] == config["intermediate_size"]
    again = run("convert", "-c", str(spec), "--json", *FAST)
    assert again.exit_code == 0
    assert [r["status"] for r in json.loads(again.stdout)["roles"]] == ["skipped", "skipped"]
    assert "up to date" in again.stderr


def test_dry_run_json_prints_plan_and_writes_nothing(tmp_path: Path, example_tiny) -> None:
    spec = example_spec(tmp_path, example_tiny, "fp8")
    result = run("convert", "-c", str(spec), "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert [r["role"] for r in plan["roles"]] == ["target", "draft"]
    assert plan["roles"][0]["quant_algo"] == "FP8" and plan["roles"][0]["calibration"]["source"] == "builtin"
    assert plan["roles"][1]["would_write"][0].endswith("draft/checkpoint/config.json")
    assert not (tmp_path / "engines").exists()


def test_rerun_after_force_and_interrupt_leaves_nothing_half_written(tmp_path: Path, monkeypatch) -> None:
    target = make_llama(tmp_path / "target")
    spec = write_spec(tmp_path / "s.toml", target, target, tmp_path / "out")
    import specbuild.convert.export as export

    def interrupted(model, plan, folder):
        (folder / "rank0.safetensors").write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(export, "export_checkpoint", interrupted)
    result = run("convert", "-c", str(spec), "--role", "target")  # Ctrl-C during the export
    assert result.exit_code == 1 and "Aborted" in result.output
    pair = tmp_path / "out" / "pair" / "target"
    assert not (pair / "checkpoint").exists() and not list(pair.glob(".checkpoint.tmp-*"))
    monkeypatch.undo()
    assert run("convert", "-c", str(spec), "--role", "target").exit_code == 0
    first = json.loads((pair / "checkpoint" / "manifest.json").read_text())
    forced = run("convert", "-c", str(spec), "--role", "target", "--force")
    assert forced.exit_code == 0 and "written" in forced.stdout
    assert json.loads((pair / "checkpoint" / "manifest.json").read_text())["created_unix"] >= first["created_unix"]


def test_draft_vocabulary_is_padded_to_the_targets(tmp_path: Path) -> None:
    target = make_llama(tmp_path / "target", vocab_size=256)
    draft = make_llama(tmp_path / "draft", vocab_size=200, layers=1, seed=1)
    spec = write_spec(tmp_path / "s.toml", target, draft, tmp_path / "out")
    result = run("convert", "-c", str(spec), "--role", "draft", "--verify", "--json")
    assert result.exit_code == 0, result.output
    entry = json.loads(result.stdout)["roles"][0]
    assert entry["manifest"]["vocab_size"] == 256 and entry["manifest"]["settings"]["pad_vocab_to"] == 256
    verification = entry["verification"]
    assert verification["passed"] and verification["padded_rows"] == 56 and verification["padded_rows_max_abs"] == 0


def test_int4_awq_on_a_model_whose_widths_allow_it(tmp_path: Path) -> None:
    # Random weights: a small spread keeps the model from being chaotic, so 4-bit noise does not flip every argmax.
    target = make_llama(tmp_path / "target", std=0.05)
    spec = write_spec(tmp_path / "s.toml", target, target, tmp_path / "out", target_q="int4_awq")
    result = run("convert", "-c", str(spec), "--role", "target", "--verify", "--json", *FAST)
    assert result.exit_code == 0, result.output
    entry = json.loads(result.stdout)["roles"][0]
    config = json.loads((Path(entry["checkpoint"]) / "config.json").read_text())
    assert config["quantization"]["quant_algo"] == "W4A16_AWQ" and config["quantization"]["group_size"] == 64
    assert entry["manifest"]["calibration"]["awq_block_size"] == 64
    assert entry["verification"]["passed"], entry["verification"]


def test_refusals_name_the_problem(tmp_path: Path) -> None:
    target = make_llama(tmp_path / "target", hidden=48, intermediate=96)
    spec = write_spec(tmp_path / "s.toml", target, target, tmp_path / "out")
    result = run("convert", "-c", str(spec), "--kv-cache", "int8", "--dry-run")
    assert result.exit_code == 1
    assert "disables paged context FMHA" in result.output and "KV-cache reuse" in result.output
    result = run("convert", "-c", str(spec), "--quantization", "int4_awq", "--dry-run")
    assert result.exit_code == 1 and "do not divide: [48]" in result.output
    result = run("convert", "-c", str(spec), "--quantization", "int3", "--dry-run")
    assert result.exit_code == 2 and "'int3' is not one of" in result.output
    bad = write_spec(tmp_path / "b.toml", target, target, tmp_path / "out", target_q="int3")
    result = run("convert", "-c", str(bad), "--dry-run")
    assert result.exit_code == 1 and "target.quantization = 'int3' is not supported" in result.output
    a100 = write_spec(
        tmp_path / "a.toml", target, target, tmp_path / "out", target_q="fp8", extra='[gpu]\nname = "A100-80GB"\n'
    )
    result = run("convert", "-c", str(a100), "--dry-run")
    assert result.exit_code == 1 and "needs an SM89+ GPU" in result.output and "SM80" in result.output


def test_unsupported_architecture_and_corrupt_weights(tmp_path: Path) -> None:
    gpt = make_llama(tmp_path / "gpt", tokenizer=False, architecture="GPT2LMHeadModel")
    spec = write_spec(tmp_path / "s.toml", gpt, gpt, tmp_path / "out")
    result = run("convert", "-c", str(spec), "--dry-run")
    assert result.exit_code == 1
    assert "'GPT2LMHeadModel' is not one of the model families" in result.output and "LlamaForCausalLM" in result.output

    broken = make_llama(tmp_path / "broken", tokenizer=False)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # truncated download
    spec = write_spec(tmp_path / "t.toml", broken, broken, tmp_path / "out")
    result = run("convert", "-c", str(spec), "--role", "target")
    assert result.exit_code == 1 and "cannot be loaded" in result.output
    assert "safetensors" in result.output
    assert not (tmp_path / "out" / "pair" / "target" / "checkpoint").exists()
    assert not list((tmp_path / "out" / "pair" / "target").glob(".checkpoint.tmp-*"))


def test_incomplete_hf_checkpoint_is_refused(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    model = make_llama(tmp_path / "m", tokenizer=False)
    weights = load_file(str(model / "model.safetensors"))
    del weights["model.layers.1.mlp.down_proj.weight"]
    save_file(weights, str(model / "model.safetensors"), metadata={"format": "pt"})
    spec = write_spec(tmp_path / "s.toml", model, model, tmp_path / "out")
    result = run("convert", "-c", str(spec), "--role", "target")
    assert result.exit_code == 1
    assert "lacks tensors ['model.layers.1.mlp.down_proj.weight']" in result.output
    assert not (tmp_path / "out" / "pair" / "target" / "checkpoint").exists()

    config = json.loads((model / "config.json").read_text())
    del config["hidden_size"]
    (model / "config.json").write_text(json.dumps(config))
    result = run("convert", "-c", str(spec), "--dry-run")
    assert result.exit_code == 1 and "no positive integer 'hidden_size'" in result.output


def test_tensor_parallel_export_of_the_example_pair(tmp_path: Path, example_tiny) -> None:
    """tp_size 2: two rank files; the draft (1 KV head) has its KV head replicated on both ranks."""
    spec = example_spec(tmp_path, example_tiny, extra="[build]\ntp_size = 2\n[gpu]\ncount = 2\n")
    result = run("convert", "-c", str(spec), "--verify", "--json")
    assert result.exit_code == 0, result.output
    for entry in json.loads(result.stdout)["roles"]:
        folder = Path(entry["checkpoint"])
        assert sorted(p.name for p in folder.iterdir()) == [
            "config.json",
            "manifest.json",
            "rank0.safetensors",
            "rank1.safetensors",
        ]
        assert entry["manifest"]["mapping"] == {"world_size": 2, "tp_size": 2, "pp_size": 1}
        assert entry["verification"]["passed"] and entry["verification"]["max_abs_logit_error"] == 0.0
    again = run("convert", "-c", str(spec), "--role", "draft", "--verify", "--json")
    entry = json.loads(again.stdout)["roles"][0]
    assert entry["status"] == "skipped" and entry["verification"]["passed"]  # --verify checks the existing one


def test_calibration_file_is_used_and_recorded(tmp_path: Path) -> None:
    model = make_llama(tmp_path / "m", std=0.05)
    calib = tmp_path / "calib.jsonl"
    calib.write_text("\n".join(json.dumps({"text": f"sample {i}: the quick brown fox"}) for i in range(3)) + "\n")
    spec = write_spec(tmp_path / "s.toml", model, model, tmp_path / "out", target_q="fp8")
    result = run("convert", "-c", str(spec), "--role", "target", "--calib-file", str(calib), "--json")
    assert result.exit_code == 0, result.output
    calibration = json.loads(result.stdout)["roles"][0]["manifest"]["calibration"]
    assert calibration["source"] == str(calib.resolve()) and calibration["samples"] == 3
    assert len(calibration["file_sha256"]) == 64
    calib.write_text(calib.read_text() + json.dumps({"text": "one more sample"}) + "\n")
    rerun = run("convert", "-c", str(spec), "--role", "target", "--calib-file", str(calib), "--json")
    assert json.loads(rerun.stdout)["roles"][0]["status"] == "ran"  # new calibration data: not up to date


def test_a_qwen_engine_export_works_exactly_where_the_rule_says_it_does(tmp_path: Path, monkeypatch) -> None:
    """Under the installed nvidia-modelopt (the newest here; 0.37 in `make test-convert-pins`): where
    families.export_refusal (which convert and check call) predicts a qwen TensorRT-LLM export fails, modelopt itself fails it (the rule
    bypassed), and where it predicts none, the export is written."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from family_models import make_family

    from specbuild import families
    from specbuild.config import load_spec
    from specbuild.convert import convert_pair
    from specbuild.hfmodel import read_model_info

    target = make_family(tmp_path / "qwen", "qwen2")
    spec_path = tmp_path / "specbuild.toml"
    spec_path.write_text(
        f'name = "q"\noutput_dir = "{tmp_path / "out"}"\n[target]\ncheckpoint = "{target}"\n'
        f'[draft]\ncheckpoint = "{target}"\n[build]\nmax_batch_size = 2\nmax_input_len = 64\n'
        'max_seq_len = 128\nmax_num_tokens = 256\n[gpu]\nname = "H100-80GB"\n'
    )
    spec = load_spec(spec_path)
    predicted = families.export_refusal("target", read_model_info(target, role="target").architecture)
    monkeypatch.setattr(families, "export_refusal", lambda role, architecture, path="engine": None)
    if predicted is None:
        convert_pair(spec, ["target"], log=lambda m: None)
        assert (spec.pair_dir / "target" / "checkpoint" / "config.json").is_file()
    else:
        with pytest.raises(Exception) as failed:
            convert_pair(spec, ["target"], log=lambda m: None)
        chain = [failed.value, failed.value.__cause__, failed.value.__context__]
        assert any(isinstance(err, NotImplementedError) or "NotImplementedError" in str(err) for err in chain), chain


def test_a_checkpoint_that_fails_verification_is_not_written(tmp_path: Path, example_tiny, monkeypatch) -> None:
    """An export whose weights came out wrong (here: the lm_head's sign flipped after export) fails `--verify` with
    its figures, exit code 1, and leaves no checkpoint and no half-written folder; without --verify the same export
    is written, so it is the verification that stops it."""
    from safetensors.torch import load_file, save_file

    from specbuild.convert import export

    real = export.export_checkpoint

    def wrong(model, plan, folder):
        real(model, plan, folder)
        for shard in Path(folder).glob("rank*.safetensors"):
            tensors = load_file(shard)
            tensors["lm_head.weight"] = -tensors["lm_head.weight"]
            save_file(tensors, shard)

    monkeypatch.setattr(export, "export_checkpoint", wrong)
    spec = example_spec(tmp_path, example_tiny)
    result = CliRunner().invoke(main, ["convert", "-c", str(spec), "--role", "draft", "--verify", "--json"])
    assert result.exit_code == 1, result.output
    assert "[draft] verification failed" in result.output and "The checkpoint was not written." in result.output
    role_dir = tmp_path / "engines" / "pair" / "draft"
    assert not (role_dir / "checkpoint").exists()
    assert [p.name for p in role_dir.iterdir()] == [".checkpoint.lock"]  # no temporary folder left, only the lock
    unverified = CliRunner().invoke(main, ["convert", "-c", str(spec), "--role", "draft", "--json"])
    assert unverified.exit_code == 0 and (role_dir / "checkpoint" / "config.json").is_file()
