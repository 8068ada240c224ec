"""A draft with more embedding rows than the target: trimmed at convert when the extra rows lie beyond the
tokenizer (no token maps to them), refused when they are real tokens. Tiny hand-made checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("torch")
pytest.importorskip("modelopt")

from convert_helpers import make_llama, write_spec  # noqa: E402

from specbuild.cli import main  # noqa: E402


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def test_draft_rows_beyond_the_tokenizer_are_trimmed_to_the_targets(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    from specbuild.check.tokenizer import load_tokenizer_facts
    from specbuild.convert.loader import load_trtllm_checkpoint

    target = make_llama(tmp_path / "target", vocab_size=256)
    draft = make_llama(tmp_path / "draft", vocab_size=300, layers=1, seed=1)
    assert load_tokenizer_facts(draft).max_id < 256  # rows 256..299 of the draft: no token maps to them
    spec = write_spec(tmp_path / "s.toml", target, draft, tmp_path / "out")

    planned = run("convert", "-c", str(spec), "--role", "draft", "--dry-run", "--json")
    assert planned.exit_code == 0, planned.output
    assert json.loads(planned.stdout)["roles"][0]["trim_vocab_to"] == 256

    result = run("convert", "-c", str(spec), "--role", "draft", "--verify", "--json")
    assert result.exit_code == 0, result.output
    assert "trimming the vocabulary 300 -> 256 rows" in result.stderr
    entry = json.loads(result.stdout)["roles"][0]
    manifest = entry["manifest"]
    assert manifest["vocab_size"] == 256 and manifest["settings"]["trim_vocab_to"] == 256
    assert manifest["vocab_trimmed"] == {"from": 300, "to": 256}
    assert entry["verification"]["passed"] and entry["verification"]["trimmed_rows"] == 44
    config = json.loads((Path(entry["checkpoint"]) / "config.json").read_text())
    assert config["vocab_size"] == 256
    # the kept rows are the original's first 256 rows, exactly (float16 export)
    original = load_file(str(draft / "model.safetensors"))
    loaded = load_trtllm_checkpoint(Path(entry["checkpoint"])).state_dict
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        assert loaded[name].shape == (256, 64)
        assert torch.equal(loaded[name].float(), original[name][:256].to(torch.float16).float())


def test_draft_rows_that_are_real_tokens_are_refused(tmp_path: Path) -> None:
    # the target has 160 rows but the shared tokenizer has ids up to 174: cutting the draft would drop tokens
    target = make_llama(tmp_path / "target", vocab_size=160)
    draft = make_llama(tmp_path / "draft", vocab_size=300, layers=1, seed=1)
    spec = write_spec(tmp_path / "s.toml", target, draft, tmp_path / "out")
    result = run("convert", "-c", str(spec), "--role", "draft", "--dry-run")
    assert result.exit_code == 1
    assert "the draft's embedding has 300 rows, more than the target's 160" in result.output
    assert "rows 160..174 are real tokens" in result.output


def test_draft_rows_are_refused_when_no_tokenizer_proves_them_unused(tmp_path: Path) -> None:
    target = make_llama(tmp_path / "target", vocab_size=256)
    draft = make_llama(tmp_path / "draft", vocab_size=300, layers=1, seed=1, tokenizer=False)
    spec = write_spec(tmp_path / "s.toml", target, draft, tmp_path / "out")
    result = run("convert", "-c", str(spec), "--role", "draft", "--dry-run")
    assert result.exit_code == 1 and "the tokenizers cannot be read" in result.output
