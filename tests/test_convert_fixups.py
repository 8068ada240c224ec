"""Pure pieces of convert: config.json fix-ups, format rules, calibration files, the per-role plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specbuild.config import spec_from_dict
from specbuild.convert import formats
from specbuild.convert.calib import builtin_texts, read_calib_file
from specbuild.convert.fixups import apply_fixups, hf_rope
from specbuild.convert.plan import ConvertOptions, plan_roles
from specbuild.errors import PairError, SpecError

EXPORTED = {
    "architecture": "LlamaForCausalLM",
    "dtype": "float16",
    "vocab_size": 256,
    "hidden_size": 64,
    "quantization": {"quant_algo": None, "kv_cache_quant_algo": None},
    "mapping": {"world_size": 1},
}


def test_weight_only_and_full_precision_quant_algo_like_quantize_py() -> None:
    for name, algo in (("int8_wo", "W8A16"), ("int4_wo", "W4A16"), ("none", None)):
        config, edits = apply_fixups(EXPORTED, {}, formats.get_format(name), "none", "LlamaForCausalLM", "llama")
        assert config["quantization"]["quant_algo"] == algo
        assert config["model_type"] == "llama" and config["architecture"] == "LlamaForCausalLM"
        assert (f"quantization.quant_algo: None -> {algo!r}" in edits) is (algo is not None)
    assert EXPORTED["quantization"]["quant_algo"] is None  # the input is not modified


def test_kv_cache_quant_algo_follows_the_spec() -> None:
    exported = {**EXPORTED, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}
    fp8 = formats.get_format("fp8")
    config, _ = apply_fixups(exported, {}, fp8, "none", "LlamaForCausalLM", "llama")
    assert config["quantization"] == {"quant_algo": "FP8", "kv_cache_quant_algo": None}  # quantize.py's workaround
    config, _ = apply_fixups(exported, {}, fp8, "fp8", "LlamaForCausalLM", "llama")
    assert config["quantization"]["kv_cache_quant_algo"] == "FP8"
    calibrated = {**EXPORTED, "quantization": {"quant_algo": "W4A16_AWQ", "kv_cache_quant_algo": None}}
    config, _ = apply_fixups(calibrated, {}, formats.get_format("int4_awq"), "none", "MistralForCausalLM", "llama")
    assert config["quantization"]["quant_algo"] == "W4A16_AWQ" and config["architecture"] == "MistralForCausalLM"


def test_rope_from_transformers_4_and_5_configs() -> None:
    llama3 = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    v4 = {"rope_theta": 500000.0, "rope_scaling": dict(llama3)}
    v5 = {"rope_parameters": {**llama3, "rope_theta": 500000.0}}
    for hf in (v4, v5):
        theta, scaling = hf_rope(hf)
        assert theta == 500000.0
        assert scaling == {**llama3, "type": "llama3"}
        config, edits = apply_fixups(EXPORTED, hf, formats.get_format("none"), "none", "LlamaForCausalLM", "llama")
        assert config["rotary_base"] == 500000.0 and config["rotary_scaling"]["type"] == "llama3"
    assert hf_rope({"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}) == (10000.0, None)
    assert hf_rope({}) == (None, None)
    kept = {**EXPORTED, "rotary_scaling": {"type": "linear", "factor": 2.0}}
    config, _ = apply_fixups(kept, v5, formats.get_format("none"), "none", "LlamaForCausalLM", "llama")
    assert config["rotary_scaling"] == {"type": "linear", "factor": 2.0}  # present: left alone, as quantize.py does


def test_format_rules() -> None:
    with pytest.raises(SpecError, match="'int3' is not supported"):
        formats.get_format("int3")
    with pytest.raises(SpecError, match="disables paged context FMHA"):
        formats.check_kv_cache("int8", "draft")
    assert formats.check_kv_cache("fp8", "draft") == "FP8" and formats.check_kv_cache("none", "draft") is None
    assert formats.awq_block_size([4096, 4096], None, "target") == 128
    assert formats.awq_block_size([4096, 576], None, "target") == 64
    with pytest.raises(SpecError, match=r"do not divide: \[48\]"):
        formats.awq_block_size([64, 48], None, "target")
    with pytest.raises(SpecError, match="take 64 or 128"):
        formats.awq_block_size([4096], 32, "target")
    formats.check_gpu(formats.get_format("fp8"), "none", 90, "H100-80GB", "target")
    with pytest.raises(SpecError, match="needs an SM89"):
        formats.check_gpu(formats.get_format("none"), "fp8", 80, "A100-80GB", "target")
    with pytest.raises(SpecError, match="refuses INT8/INT4 weight-only and SmoothQuant on SM100"):
        formats.check_gpu(formats.get_format("int8_sq"), "none", 100, "B200", "target")
    # W4A16_AWQ is int4 weight-only to TensorRT-LLM (quantization/mode.py), which builder.py refuses on SM100-119;
    # convert used to accept (and recommend) it there while check refused it
    with pytest.raises(
        SpecError, match="refuses INT8/INT4 weight-only .* Use target.quantization = 'none', 'fp8' or 'w4a8_awq'"
    ):
        formats.check_gpu(formats.get_format("int4_awq"), "none", 100, "B200", "target")


def test_convert_refuses_an_fp8_kv_cache_the_builder_would_drop() -> None:
    # builder.py: an FP8 KV cache keeps paged context FMHA only with FP8 / W4A8_AWQ weights (on SM89+)
    for name in ("none", "int4_awq", "int8_sq", "int8_wo", "int4_wo"):
        for sm, gpu in ((90, "H100-80GB"), (None, None)):
            with pytest.raises(SpecError, match="makes trtllm-build turn paged context FMHA off"):
                formats.check_gpu(formats.get_format(name), "fp8", sm, gpu, "target")
    formats.check_gpu(formats.get_format("fp8"), "fp8", 90, "H100-80GB", "target")
    formats.check_gpu(formats.get_format("w4a8_awq"), "fp8", 89, "L40S", "draft")
    formats.check_gpu(formats.get_format("none"), "none", 90, "H100-80GB", "target")


def test_calibration_files(tmp_path: Path) -> None:
    paragraphs = tmp_path / "c.txt"
    paragraphs.write_text("first paragraph\nstill first\n\nsecond one\n")
    assert read_calib_file(paragraphs) == ["first paragraph\nstill first", "second one"]
    lines = tmp_path / "l.txt"
    lines.write_text("one\ntwo\n\n")
    assert read_calib_file(lines) == ["one", "two"]
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text('{"text": "a"}\n\n{"text": "b"}\n')
    assert read_calib_file(jsonl) == ["a", "b"]
    jsonl.write_text('{"text": "a"}\n{"prompt": "b"}\n')
    with pytest.raises(SpecError, match=r"c\.jsonl:2: no string \"text\" field"):
        read_calib_file(jsonl)
    jsonl.write_text('{"text": "a"\n')
    with pytest.raises(SpecError, match=r"c\.jsonl:1: not valid JSON"):
        read_calib_file(jsonl)
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(SpecError, match="holds no text samples"):
        read_calib_file(tmp_path / "empty.txt")
    samples = builtin_texts(6, 200)
    assert len(samples) == 6 and all(0 < len(s) <= 200 for s in samples)


def _hf(
    folder: Path, vocab: int = 256, intermediate: int = 128, hidden: int = 64, arch: str = "LlamaForCausalLM", **extra
) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(
        json.dumps(
            {
                "architectures": [arch],
                "model_type": "llama",
                "vocab_size": vocab,
                "hidden_size": hidden,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "intermediate_size": intermediate,
                **extra,
            }
        )
    )
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    (folder / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0\0\0\0")
    return folder


def _spec(tmp_path: Path, target_dir: Path, draft_dir: Path, **sections) -> object:
    raw = {
        "name": "p",
        "output_dir": str(tmp_path / "out"),
        "target": {"checkpoint": str(target_dir)},
        "draft": {"checkpoint": str(draft_dir)},
        **sections,
    }
    return spec_from_dict(raw, base_dir=tmp_path)


def test_plan_resolves_padding_blocks_and_refusals(tmp_path: Path) -> None:
    target = _hf(tmp_path / "t", vocab=300, intermediate=352)
    draft = _hf(tmp_path / "d", vocab=256)
    spec = _spec(tmp_path, target, draft, target={"checkpoint": str(target), "quantization": "int4_awq"})
    plans = plan_roles(spec, ["target", "draft"], ConvertOptions(calib_size=100))
    t, d = plans
    assert t.awq_block_size == 64 and t.pad_intermediate_to == 384 and t.calibration.size == 32  # AWQ cap
    assert t.out_dir == tmp_path / "out" / "p" / "target" / "checkpoint"
    assert d.pad_vocab_to == 300 and d.vocab_size == 300 and d.calibration is None
    with pytest.raises(PairError, match="draft's embedding has 300 rows, more than the target's 256"):
        plan_roles(_spec(tmp_path, draft, target), ["draft"], ConvertOptions())
    with pytest.raises(SpecError, match="exported in float16 or bfloat16"):
        plan_roles(
            _spec(tmp_path, target, target, target={"checkpoint": str(target), "dtype": "float32"}),
            ["target"],
            ConvertOptions(),
        )
    with pytest.raises(SpecError, match="tp_size = 3 does not divide"):
        plan_roles(
            _spec(tmp_path, target, target, build={"tp_size": 3}, gpu={"count": 4}), ["target"], ConvertOptions()
        )
    with pytest.raises(SpecError, match="--calib-file .* does not exist"):
        plan_roles(
            _spec(tmp_path, target, target, target={"checkpoint": str(target), "quantization": "fp8"}),
            ["target"],
            ConvertOptions(calib_file=tmp_path / "nope.txt"),
        )
    mistral = _hf(tmp_path / "m", arch="MistralForCausalLM", sliding_window=1024)  # shorter than max_seq_len 2048
    with pytest.raises(SpecError, match="sliding window of 1024 tokens .* set build.max_seq_len <= 1024"):
        plan_roles(_spec(tmp_path, mistral, mistral), ["target"], ConvertOptions())
    wide = _hf(tmp_path / "w", arch="MistralForCausalLM", sliding_window=4096)  # never binds: the engines are exact
    assert plan_roles(_spec(tmp_path, wide, wide), ["target"], ConvertOptions())
