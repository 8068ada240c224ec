"""The TensorRT-LLM checkpoint loader against modelopt's own fake-quantized model, format by format.

modelopt's quantized model computes what the exported checkpoint should compute, so the loaded
checkpoint must land much closer to it than either is to the original model (a wrong int4 nibble
order, scale layout or shard order would make it land far away).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("modelopt")

from convert_helpers import make_llama  # noqa: E402

from specbuild.convert.export import _finish_config, calibrate, export_checkpoint, load_hf_model  # noqa: E402
from specbuild.convert.loader import load_trtllm_checkpoint, to_hf_model, unpack_int4  # noqa: E402
from specbuild.convert.plan import Calibration, ConvertOptions, RolePlan  # noqa: E402
from specbuild.errors import CheckpointError  # noqa: E402

QUANT_ALGO = {
    "none": None,
    "fp8": "FP8",
    "int8_sq": "W8A8_SQ_PER_CHANNEL",
    "int4_awq": "W4A16_AWQ",
    "w4a8_awq": "W4A8_AWQ",
    "int8_wo": "W8A16",
    "int4_wo": "W4A16",
}


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    return make_llama(tmp_path_factory.mktemp("hf") / "tiny")


def _plan(hf_dir: Path, quantization: str, tp: int = 1, pp: int = 1, block: int | None = 64) -> RolePlan:
    calibrated = quantization in ("fp8", "int8_sq", "int4_awq", "w4a8_awq")
    return RolePlan(
        role="target",
        pair="t",
        hf_dir=hf_dir,
        out_dir=hf_dir.parent / "unused",
        architecture="LlamaForCausalLM",
        model_type="llama",
        quantization=quantization,
        quant_algo=QUANT_ALGO[quantization],
        kv_cache="none",
        kv_cache_quant_algo=None,
        dtype="float16",
        tp_size=tp,
        pp_size=pp,
        vocab_rows=256,
        pad_vocab_to=None,
        awq_block_size=block if "awq" in quantization else None,
        pad_intermediate_to=None,
        calibration=Calibration("builtin", 4, 32) if calibrated else None,
        spec_settings={},
    )


def _export(hf_dir: Path, out: Path, quantization: str, tp: int = 1, pp: int = 1):
    """(the original model, the modelopt-quantized model right after export) for one format."""
    plan = _plan(hf_dir, quantization, tp, pp)
    model = load_hf_model(plan, "cpu")
    with torch.no_grad():  # float16-exact weights: the export's float16 rounding then changes nothing
        for p in model.parameters():
            p.copy_(p.half().float())
    original = copy.deepcopy(model)
    calibrate(model, plan, ConvertOptions(calib_size=4, calib_seq_len=32), "cpu", log=lambda m: None, progress=False)
    export_checkpoint(model, plan, out)
    _finish_config(plan, out)  # the quantize.py fix-ups (and rotary_base: the test model uses rope_theta 50000)
    return original, model


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits.float()


WEIGHT_ERROR = {"fp8": 0.08, "int8_sq": 0.05, "int4_awq": 0.25, "w4a8_awq": 0.3}  # a layout bug gives > 1
IDS = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(7))


@pytest.mark.parametrize("quantization", ["fp8", "int8_sq", "int4_awq", "w4a8_awq"])
def test_loader_dequantizes_what_modelopt_quantized(hf_dir: Path, tmp_path: Path, quantization: str) -> None:
    """Every linear layer: loaded weight == modelopt's fake-quantized weight (with its smoothing scale folded in),
    and the activation scale == the input quantizer's amax / maxbound (but for rare rounding flips)."""
    original, quantized = _export(hf_dir, tmp_path, quantization)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["quantization"]["quant_algo"] == QUANT_ALGO[quantization]
    loaded = load_trtllm_checkpoint(tmp_path)
    checked = 0
    with torch.no_grad():
        for name, module in quantized.named_modules():
            if not name.startswith("model.layers.") or not hasattr(module, "weight_quantizer"):
                continue
            want = module.weight_quantizer(module.weight).float()
            pqs = getattr(module.input_quantizer, "_pre_quant_scale", None)
            if pqs is not None:
                want = want * pqs.float().reshape(1, -1)
            got = loaded.state_dict[f"{name}.weight"]
            # The export quantizes the float16 weight, fake quantization the float32 one: a rare element may
            # round to the neighbouring level. A wrong layout, scale or nibble order changes nearly all of them.
            # SmoothQuant/AWQ re-smooth fused q/k/v and gate/up to one shared scale at export and requantize,
            # so there only the distance to the original weight can be checked.
            if quantization == "fp8":
                flipped = ((got - want).abs() > 1e-5 * want.abs().max()).float().mean().item()
                assert flipped < 0.02, (name, flipped)
            w = original.get_submodule(name).weight
            relative = ((got - w).norm() / w.norm()).item()
            assert 0 < relative < WEIGHT_ERROR[quantization], (name, relative)
            act = loaded.activation_quant.get(name)
            if quantization != "int4_awq":
                quantizer = module.input_quantizer
                assert act is not None and act.kind == ("int8" if quantization == "int8_sq" else "fp8")
                assert act.scale == pytest.approx(quantizer.amax.float().item() / quantizer.maxbound, rel=1e-5)
            checked += 1
    assert checked == 2 * 7
    assert torch.isfinite(_logits(to_hf_model(loaded), IDS)).all()  # end to end: the example-pair tests


def test_unquantized_round_trip_is_exact_and_tp_pp_shards_merge(hf_dir: Path, tmp_path: Path) -> None:
    original, _ = _export(hf_dir, tmp_path / "tp1", "none")
    _export(hf_dir, tmp_path / "tp2pp2", "none", tp=2, pp=2)
    want = _logits(original, IDS)
    single = load_trtllm_checkpoint(tmp_path / "tp1")
    sharded = load_trtllm_checkpoint(tmp_path / "tp2pp2")
    assert sorted((tmp_path / "tp2pp2").glob("rank*.safetensors")) == [
        tmp_path / "tp2pp2" / f"rank{r}.safetensors" for r in range(4)
    ]
    assert sharded.trtllm_config["mapping"] == {"world_size": 4, "tp_size": 2, "pp_size": 2}
    assert single.trtllm_config["rotary_base"] == 50000.0 == single.hf_config["rope_theta"]
    assert single.state_dict.keys() == sharded.state_dict.keys()
    for name, tensor in single.state_dict.items():
        assert torch.equal(tensor, sharded.state_dict[name]), name
    assert set(original.state_dict()) - set(single.state_dict) <= {"model.rotary_emb.inv_freq"}
    got = _logits(to_hf_model(single), IDS)
    assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item()


def test_int8_sq_tp2_matches_tp1(hf_dir: Path, tmp_path: Path) -> None:
    _export(hf_dir, tmp_path / "tp1", "int8_sq")
    _export(hf_dir, tmp_path / "tp2", "int8_sq", tp=2)
    a = _logits(to_hf_model(load_trtllm_checkpoint(tmp_path / "tp1")), IDS)
    b = _logits(to_hf_model(load_trtllm_checkpoint(tmp_path / "tp2")), IDS)
    assert (a - b).abs().max().item() < 1e-3 * a.abs().max().item()


def test_unpack_int4_inverts_modelopt_packing() -> None:
    import inspect

    from modelopt.torch.export.quant_utils import pack_int4_in_uint8

    values = torch.randint(-8, 8, (6, 8)).float()
    # modelopt 0.4x takes the block size; 0.37 (TensorRT-LLM 1.2's pin) derives it from the scales' shape.
    block = (8,) if len(inspect.signature(pack_int4_in_uint8).parameters) == 3 else ()
    packed = pack_int4_in_uint8(values, torch.ones(6, 1), *block).view(torch.int8)
    assert packed.shape == (3, 8)
    assert torch.equal(unpack_int4(packed).float(), values)


def test_weight_only_formats_are_quantized_at_load_like_trtllm_build(hf_dir: Path, tmp_path: Path) -> None:
    _export(hf_dir, tmp_path / "w8", "none")
    config_path = tmp_path / "w8" / "config.json"
    config = json.loads(config_path.read_text())
    config["quantization"]["quant_algo"] = "W4A16"
    config_path.write_text(json.dumps(config))
    simulated = load_trtllm_checkpoint(tmp_path / "w8")
    stored = load_trtllm_checkpoint(tmp_path / "w8", simulate_build_quant=False)
    w = simulated.state_dict["model.layers.0.mlp.down_proj.weight"]
    assert not torch.equal(w, stored.state_dict["model.layers.0.mlp.down_proj.weight"])
    assert all(len(torch.unique(row)) <= 16 for row in w)  # int4: at most 16 levels per output channel
    assert torch.equal(simulated.state_dict["lm_head.weight"], stored.state_dict["lm_head.weight"])  # excluded


def test_missing_tensor_and_config_key_are_named(hf_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    _export(hf_dir, tmp_path, "none")
    weights = load_file(str(tmp_path / "rank0.safetensors"))
    del weights["transformer.layers.1.attention.dense.weight"]
    save_file(weights, str(tmp_path / "rank0.safetensors"))
    with pytest.raises(CheckpointError, match=r"'transformer\.layers\.1\.attention\.dense\.weight' is missing"):
        load_trtllm_checkpoint(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["hidden_act"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"lacks the mandatory keys \['hidden_act'\]"):
        load_trtllm_checkpoint(tmp_path)
    config["hidden_act"] = "silu"
    config["architecture"] = "GPT2LMHeadModel"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="'GPT2LMHeadModel' is not supported .* LlamaForCausalLM"):
        load_trtllm_checkpoint(tmp_path)


def test_corrupt_rank_file_is_a_clean_error(hf_dir: Path, tmp_path: Path) -> None:
    _export(hf_dir, tmp_path, "none")
    (tmp_path / "rank0.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    with pytest.raises(CheckpointError, match="rank0.safetensors is corrupt"):
        load_trtllm_checkpoint(tmp_path)
