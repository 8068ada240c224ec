"""`specbuild check`: exit codes, the --json document, and a clear error for every bad input."""

from __future__ import annotations

import json
import re

import pytest
from check_fixtures import make_pair, words, write_checkpoint, write_spec
from click.testing import CliRunner

from specbuild.cli import main


def check(*args: str):
    return CliRunner().invoke(main, ["check", *args])


def check_json(spec_path, *args: str):
    result = check("-c", str(spec_path), "--json", *args)
    return result, (json.loads(result.stdout) if result.stdout.strip() else None)


def test_identical_pair_is_ok(tmp_path):
    result, doc = check_json(make_pair(tmp_path))
    assert result.exit_code == 0, result.output
    assert doc["ok"] is True and doc["problems"] == []
    assert list(doc) == [
        "ok",
        "pair",
        "backend",
        "models",
        "tokenizer",
        "vocab",
        "memory",
        "weights",
        "problems",
        "warnings",
    ]
    assert doc["tokenizer"]["identical"] is True
    assert doc["vocab"] == {
        "tokenizer_size": 1000,
        "target_rows": 1000,
        "draft_rows": 1000,
        "padded_vocab_size": 1000,
        "pad_rows": {"target": 0, "draft": 0},
        "will_pad": False,
        "trim_rows": {"target": 0, "draft": 0},
        "will_trim": False,
    }
    memory = doc["memory"]
    assert memory["fits"] and memory["max_batch_at_max_seq_len"] >= 2
    assert 0 < memory["target"]["kv_cache_free_gpu_mem_fraction"] <= 0.95
    assert memory["target"]["kv_bytes_per_token"] == 2 * 1 * 2 * 8 * 2  # layers 1, kv heads 2, head_dim 8, fp16


def test_human_output(tmp_path):
    result = check("-c", str(make_pair(tmp_path)))
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0] == "pair       tiny"
    assert lines[3] == "tokenizer  identical (1000 tokens; bos 1, eos 2, unk 0)"
    assert lines[-1] == "OK: the pair is usable."


def test_different_tokenizers_exit_1_naming_the_first_token(tmp_path):
    tokens = words(1000)
    tokens[421] = "zebra"
    result, doc = check_json(make_pair(tmp_path, draft_tokens=tokens))
    assert result.exit_code == 1
    assert doc["ok"] is False
    [problem] = doc["problems"]
    assert problem["code"] == "tokenizer_mismatch"
    assert problem["message"] == (
        "the target and draft tokenizers differ: vocabulary differs at 1 id(s), "
        "the first is id 421: target has 'w421', draft has 'zebra'."
    )
    assert doc["tokenizer"]["first_difference"] == {"id": 421, "target": "w421", "draft": "zebra"}
    human = check("-c", str(tmp_path / "specbuild.toml"))
    assert human.exit_code == 1
    assert "tokenizer  DIFFERENT: first at id 421 ('w421' vs 'zebra')" in human.stdout
    assert human.stdout.splitlines()[-1] == "NOT OK: 1 problem(s)."


def test_padded_vocab_pair_reports_padding(tmp_path):
    result, doc = check_json(make_pair(tmp_path, target_rows=1024, draft_rows=1000))
    assert result.exit_code == 0, result.output
    assert doc["vocab"]["padded_vocab_size"] == 1024
    assert doc["vocab"]["pad_rows"] == {"target": 0, "draft": 24}
    [warning] = [w for w in doc["warnings"] if w["code"] == "vocab_padding"]
    assert "the draft's embedding and lm_head will be padded to 1024 rows at convert time" in warning["message"]
    human = check("-c", str(tmp_path / "specbuild.toml"))
    assert "-> draft padded to 1024 at convert time" in human.stdout


def test_embedding_smaller_than_tokenizer_is_a_problem(tmp_path):
    target = write_checkpoint(tmp_path / "target", 1000)
    draft = write_checkpoint(tmp_path / "draft", 900, tokens=words(1000))
    result, doc = check_json(write_spec(tmp_path / "s.toml", target, draft))
    assert result.exit_code == 1
    assert [p["code"] for p in doc["problems"]] == ["embedding_smaller_than_tokenizer"]
    assert "the draft model has 900 embedding rows but the tokenizer has ids up to 999" in doc["problems"][0]["message"]


def test_pickle_only_checkpoint_refused_then_allowed(tmp_path):
    target = write_checkpoint(tmp_path / "target", 1000)
    draft = write_checkpoint(tmp_path / "draft", 1000, weights="pickle")
    spec = write_spec(tmp_path / "s.toml", target, draft)
    result = check("-c", str(spec))
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: draft checkpoint '{draft}' has only pickle weights (pytorch_model.bin)")
    assert "--allow-pickle" in result.stderr and "Traceback" not in result.output
    allowed, doc = check_json(spec, "--allow-pickle")
    assert allowed.exit_code == 0
    assert "pickle_weights" in [w["code"] for w in doc["warnings"]]


def test_missing_checkpoint_dir(tmp_path):
    target = write_checkpoint(tmp_path / "target", 1000)
    result = check("-c", str(write_spec(tmp_path / "s.toml", target, tmp_path / "gone")))
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: draft checkpoint '{tmp_path / 'gone'}' does not exist. "
        "Fix draft.checkpoint in the spec, or download the model there.\n"
    )


def test_missing_target_and_draft_are_reported_together(tmp_path):
    result = check("-c", str(write_spec(tmp_path / "s.toml", tmp_path / "no-target", tmp_path / "no-draft")))
    assert result.exit_code == 1
    assert result.stderr == (
        "Error: both checkpoints are unusable:\n"
        f"  target checkpoint '{tmp_path / 'no-target'}' does not exist. "
        "Fix target.checkpoint in the spec, or download the model there.\n"
        f"  draft checkpoint '{tmp_path / 'no-draft'}' does not exist. "
        "Fix draft.checkpoint in the spec, or download the model there.\n"
    )


def test_json_prints_one_failure_document_when_the_input_is_bad(tmp_path):
    target = write_checkpoint(tmp_path / "target", 1000)
    result, doc = check_json(write_spec(tmp_path / "s.toml", target, tmp_path / "gone"))
    assert result.exit_code == 1
    assert doc == {
        "command": "check",
        "ok": False,
        "error_type": "CheckpointError",
        "exit_code": 1,
        "error": f"draft checkpoint '{tmp_path / 'gone'}' does not exist. "
        "Fix draft.checkpoint in the spec, or download the model there.",
    }
    assert result.stderr.startswith("Error: draft checkpoint")


def test_checkpoint_without_tokenizer_is_a_problem_not_a_crash(tmp_path):
    spec = make_pair(tmp_path)
    (tmp_path / "draft" / "tokenizer.json").unlink()
    (tmp_path / "draft" / "tokenizer_config.json").unlink()
    result, doc = check_json(spec)
    assert result.exit_code == 1
    assert doc["problems"][0]["code"] == "tokenizer_unreadable"
    assert doc["tokenizer"]["identical"] is None


def test_unknown_architecture(tmp_path):
    target = write_checkpoint(tmp_path / "target", 1000, architectures=["MambaForCausalLM"])
    draft = write_checkpoint(tmp_path / "draft", 1000)
    result, doc = check_json(write_spec(tmp_path / "s.toml", target, draft))
    assert result.exit_code == 1
    [problem] = doc["problems"]
    assert problem["code"] == "unsupported_architecture"
    assert (
        problem["message"]
        == "target: architecture 'MambaForCausalLM' is not one of the model families specbuild supports."
    )
    assert "LlamaForCausalLM" in problem["fix"]


def test_max_seq_len_above_position_limit(tmp_path):
    target = write_checkpoint(tmp_path / "target", 1000)
    draft = write_checkpoint(tmp_path / "draft", 1000, max_position_embeddings=200)
    result, doc = check_json(write_spec(tmp_path / "s.toml", target, draft))
    assert result.exit_code == 1
    [problem] = doc["problems"]
    assert problem["code"] == "max_seq_len_above_position_limit"
    assert problem["message"].startswith("build.max_seq_len = 256 exceeds the draft model's position limit of 200")
    assert problem["fix"] == "Set build.max_seq_len <= 200."


def test_the_fix_for_a_target_position_limit_is_the_whole_fix(tmp_path):
    """Applying check's fix leaves no new problem or warning about positions (the builder adds max_draft_len)."""
    import re

    target = write_checkpoint(tmp_path / "target", 1000, max_position_embeddings=200)
    draft = write_checkpoint(tmp_path / "draft", 1000)
    _, doc = check_json(write_spec(tmp_path / "s.toml", target, draft))
    [problem] = [p for p in doc["problems"] if p["code"] == "max_seq_len_above_position_limit"]
    bound = int(re.search(r"<= (\d+)", problem["fix"]).group(1))
    spec_text = (tmp_path / "s.toml").read_text().replace("max_seq_len = 256", f"max_seq_len = {bound}")
    (tmp_path / "s.toml").write_text(spec_text.replace("max_input_len = 128", f"max_input_len = {bound // 2}"))
    _, doc = check_json(tmp_path / "s.toml")
    codes = [entry["code"] for entry in doc["problems"] + doc["warnings"]]
    assert "max_seq_len_above_position_limit" not in codes and "draft_tokens_beyond_position_limit" not in codes


def test_draft_tokens_past_the_target_position_limit_warn(tmp_path):
    target = write_checkpoint(tmp_path / "target", 1000, max_position_embeddings=258)
    draft = write_checkpoint(tmp_path / "draft", 1000)
    result, doc = check_json(write_spec(tmp_path / "s.toml", target, draft))
    assert result.exit_code == 0
    assert "draft_tokens_beyond_position_limit" in [w["code"] for w in doc["warnings"]]


def test_does_not_fit_exits_1_with_the_arithmetic(tmp_path):
    spec = make_pair(tmp_path, gpu='name = "tiny-card"\nmemory_gib = 1.5')
    result, doc = check_json(spec)
    assert result.exit_code == 1
    assert doc["memory"]["fits"] is False
    [problem] = [p for p in doc["problems"] if p["code"] == "does_not_fit"]
    assert problem["message"].startswith("does not fit: on tiny-card (1.5 GiB per GPU, tp_size 1)")
    assert problem["fix"].startswith("Use a larger GPU")  # two engines' runtime alone exceed 1.5 GiB


@pytest.mark.parametrize(
    "section, line, message",
    [
        ("target", 'quantisation = "fp8"', "[target]: unknown key 'quantisation'. Did you mean \"quantization\"?"),
        ("target", 'quantization = "fp9"', "target.quantization = 'fp9' is not supported. Did you mean \"fp8\"?"),
        ("gpu", 'name = "H100"', "gpu.name = 'H100' is not supported."),
        ("build", "max_seq_len = 0", "build.max_seq_len = 0: must be >= 1."),
        ("build", "max_batch_size = -4", "build.max_batch_size = -4: must be >= 1."),
        ("speculative", "max_draft_len = 0", "speculative.max_draft_len = 0: must be >= 1."),
    ],
)
def test_bad_spec_values_exit_1_with_the_fix(tmp_path, section, line, message):
    spec = make_pair(tmp_path)
    key = line.split(" = ")[0]
    text = re.sub(rf"^{key} = .*\n", "", spec.read_text(), flags=re.M)  # the fixture's own value, if any
    header = f"[{section}]\n"
    text = text.replace(header, header + line + "\n") if header in text else text + header + line + "\n"
    spec.write_text(text)
    result = check("-c", str(spec))
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: " + message), result.stderr
    assert "Traceback" not in result.output


def test_missing_spec_file(tmp_path):
    result = check("-c", str(tmp_path / "nope.toml"))
    assert result.exit_code == 1
    assert "not found. Create one with `specbuild init`" in result.stderr


def test_usage_errors_exit_2(tmp_path):
    assert check("--bogus").exit_code == 2
    assert check("-c").exit_code == 2


def test_help_lists_the_flags():
    result = check("--help")
    assert result.exit_code == 0
    for flag in ("--config", "--json", "--allow-pickle"):
        assert flag in result.stdout


def test_example_pair_is_ok(tiny_spec_path):
    result, doc = check_json(tiny_spec_path)
    assert result.exit_code == 0, result.output
    assert doc["ok"] is True
    assert doc["tokenizer"]["identical"] is True
    assert doc["memory"]["fits"] is True


def test_heads_not_divisible_by_tp(tmp_path):
    spec = make_pair(tmp_path, gpu='name = "H100-80GB"\ncount = 4')
    spec.write_text(spec.read_text().replace("max_num_tokens = 512\n", "max_num_tokens = 512\ntp_size = 3\n"))
    result, doc = check_json(spec)
    assert result.exit_code == 1
    messages = [p["message"] for p in doc["problems"] if p["code"] == "heads_not_divisible_by_tp"]
    assert messages == [
        f"the {role} model has 4 attention heads, which tp_size = 3 does not divide." for role in ("target", "draft")
    ]


def test_bf16_checkpoint_served_in_fp16_warns(tmp_path):
    target = write_checkpoint(tmp_path / "target", 1000, torch_dtype="bfloat16")
    draft = write_checkpoint(tmp_path / "draft", 1000)
    result, doc = check_json(write_spec(tmp_path / "s.toml", target, draft))
    assert result.exit_code == 0
    [warning] = [w for w in doc["warnings"] if w["code"] == "dtype_narrower_than_checkpoint"]
    assert warning["fix"] == 'Set target.dtype = "bfloat16" unless the model is known to run in fp16.'


def test_draft_rows_beyond_the_tokenizer_are_trimmed_not_refused(tmp_path):
    # the tokenizer has 1000 tokens: the draft's rows 1000..1023 are padding no token maps to
    result, doc = check_json(make_pair(tmp_path, target_rows=1000, draft_rows=1024))
    assert result.exit_code == 0, result.output
    [warning] = [w for w in doc["warnings"] if w["code"] == "vocab_trim"]
    assert "rows 1000..1023 lie beyond the tokenizer (1000 tokens)" in warning["message"]
    assert doc["vocab"]["will_trim"] is True and doc["vocab"]["trim_rows"] == {"target": 0, "draft": 24}
    assert doc["vocab"]["will_pad"] is False and doc["vocab"]["padded_vocab_size"] == 1000


def test_draft_with_more_rows_that_are_real_tokens_is_a_problem(tmp_path):
    tokens = words(1010)  # the shared tokenizer uses ids up to 1009; the target has only 1000 rows
    target = write_checkpoint(tmp_path / "target", 1000, tokens=tokens)
    draft = write_checkpoint(tmp_path / "draft", 1024, tokens=tokens)
    result, doc = check_json(write_spec(tmp_path / "s.toml", target, draft))
    assert result.exit_code == 1
    [problem] = [p for p in doc["problems"] if p["code"] == "draft_vocab_larger_than_target"]
    assert problem["message"].startswith("the draft's embedding has 1024 rows, more than the target's 1000")
    assert "rows 1000..1009 are real tokens" in problem["message"]
    assert doc["vocab"]["will_trim"] is False


def test_check_imports_neither_torch_nor_transformers(tmp_path):
    """check reads json, safetensors headers and tokenizer.json: it stays fast."""
    import subprocess
    import sys

    spec = make_pair(tmp_path)
    code = (
        "import sys; from specbuild.cli import main\n"
        f"try:\n    main(['check', '-c', {str(spec)!r}, '--json'])\n"
        "except SystemExit as e:\n    rc = e.code\n"
        "print(rc, 'torch' in sys.modules, 'transformers' in sys.modules, file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stderr.strip().splitlines()[-1] == "0 False False"


def test_a_dtype_convert_refuses_is_a_problem_with_convert_s_own_reason(tmp_path):
    """check must not call usable a spec convert refuses: dtype = "float32" is a valid spec value (the reference
    builder reads it), but modelopt exports no float32 TensorRT-LLM or Hugging Face checkpoint."""
    from specbuild.config import load_spec
    from specbuild.convert.plan import ConvertOptions, plan_roles
    from specbuild.errors import SpecError

    spec_path = make_pair(tmp_path)
    spec_path.write_text(spec_path.read_text().replace("[draft]\n", '[draft]\ndtype = "float32"\n'))
    result, doc = check_json(spec_path, "--no-weight-scan")
    assert result.exit_code == 1 and not doc["ok"]
    [problem] = [p for p in doc["problems"] if p["code"] == "dtype_not_exported"]
    with pytest.raises(SpecError) as refused:
        plan_roles(load_spec(spec_path), ["draft"], ConvertOptions())
    assert str(refused.value).startswith(problem["message"]) and 'draft.dtype = "float16"' in problem["fix"]
