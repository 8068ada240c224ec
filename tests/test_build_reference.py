"""Reference engines from a TensorRT-LLM checkpoint: layout, numerics, skip/force, and the CLI.

The checkpoint here is written by hand from a tiny random LlamaForCausalLM (the TensorRT-LLM LLaMA
tensor names, unquantized float32), so the reference engine's logits can be compared with the
original model's: an independent check of the whole HF -> TRT-LLM -> reference round trip.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from click.testing import CliRunner  # noqa: E402
from fakes.build_fixtures import make_spec  # noqa: E402

from specbuild.cli import main  # noqa: E402
from specbuild.engines.stage import build_engines  # noqa: E402

VOCAB = 96


def tiny_hf_model(folder: Path, seed: int, layers: int = 2):
    from tokenizers import Tokenizer, models, pre_tokenizers

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))
    vocab = {f"t{i}": i for i in range(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    return model


def write_trtllm_checkpoint(model, folder: Path, role: str, pair: str, fp8: bool = False) -> None:
    """TensorRT-LLM LLaMA checkpoint layout (as modelopt exports it), float32 or FP8 linears, one rank."""
    from safetensors.torch import save_file

    c = model.config
    sd = {k: v.detach().float().contiguous() for k, v in model.state_dict().items()}
    out = {
        "transformer.vocab_embedding.weight": sd["model.embed_tokens.weight"],
        "transformer.ln_f.weight": sd["model.norm.weight"],
        "lm_head.weight": sd["lm_head.weight"],
    }
    for i in range(c.num_hidden_layers):
        hf, trt = f"model.layers.{i}", f"transformer.layers.{i}"
        out[f"{trt}.attention.qkv.weight"] = torch.cat(
            [sd[f"{hf}.self_attn.{p}_proj.weight"] for p in "qkv"], dim=0
        ).contiguous()
        for src, dst in (
            ("self_attn.o_proj", "attention.dense"),
            ("mlp.gate_proj", "mlp.fc"),
            ("mlp.up_proj", "mlp.gate"),
            ("mlp.down_proj", "mlp.proj"),
            ("input_layernorm", "input_layernorm"),
            ("post_attention_layernorm", "post_layernorm"),
        ):
            out[f"{trt}.{dst}.weight"] = sd[f"{hf}.{src}.weight"]
    if fp8:  # per-tensor FP8 weights with static FP8 activation scales, like modelopt's FP8 export
        for name in [k for k in out if ".attention." in k or ".mlp." in k]:
            prefix = name[: -len(".weight")]
            w = out[name]
            scale = w.abs().max() / 448.0
            out[name] = (w / scale).to(torch.float8_e4m3fn)
            out[f"{prefix}.weights_scaling_factor"] = scale.reshape(())
            out[f"{prefix}.activation_scaling_factor"] = torch.tensor(0.05)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(out, str(folder / "rank0.safetensors"))
    config = {
        "architecture": "LlamaForCausalLM",
        "dtype": "float32",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "hidden_act": "silu",
        "norm_epsilon": c.rms_norm_eps,
        "max_position_embeddings": c.max_position_embeddings,
        "position_embedding_type": "rope_gpt_neox",
        "rotary_base": c.rope_theta if hasattr(c, "rope_theta") else 10000.0,
        "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1},
        "quantization": {"quant_algo": "FP8" if fp8 else None, "kv_cache_quant_algo": None},
    }
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "manifest.json").write_text(
        json.dumps(
            {
                "stage": "convert",
                "role": role,
                "pair": pair,
                "input_hash": f"hand-written-{role}",
                "quant_algo": "FP8" if fp8 else None,
                "kv_cache_quant_algo": None,
                "mapping": config["mapping"],
                "vocab_size": c.vocab_size,
            }
        )
    )


@pytest.fixture
def pair(tmp_path):
    spec = make_spec(
        tmp_path,
        build={"max_batch_size": 2, "max_input_len": 64, "max_seq_len": 128, "max_num_tokens": 256},
        target={"dtype": "float32"},
        draft={"dtype": "float32"},
    )
    models = {}
    for role, seed, layers in (("target", 1, 2), ("draft", 2, 1)):
        models[role] = tiny_hf_model(tmp_path / f"hf-{role}", seed, layers)
        write_trtllm_checkpoint(models[role], spec.pair_dir / role / "checkpoint", role, spec.name)
    return spec, models


def test_reference_engines_are_self_contained_and_match_the_original_model(pair):
    spec, models = pair
    results = build_engines(spec, ["target", "draft"], "reference")
    assert [(r["role"], r["status"]) for r in results] == [("target", "ran"), ("draft", "ran")]
    for role, model in models.items():
        engine = spec.pair_dir / role / "engine"
        names = {p.name for p in engine.iterdir()}
        assert {
            "config.json",
            "model.safetensors",
            "engine.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "manifest.json",
        } <= names
        assert not {"rank0.engine", "activation_quant.json"} & names
        loaded = transformers.AutoModelForCausalLM.from_pretrained(str(engine), dtype=torch.float32).eval()
        assert loaded.config.eos_token_id == 2
        ids = torch.tensor([[1, 5, 17, 42, 7, 3]])  # [1, 6]
        with torch.no_grad():
            ours, original = loaded(input_ids=ids).logits, model(input_ids=ids).logits  # [1, 6, vocab]
        torch.testing.assert_close(ours, original, atol=1e-5, rtol=1e-5)
        manifest = json.loads((engine / "manifest.json").read_text())
        assert manifest["backend"] == "reference" and manifest["argv"] is None
        assert manifest["smoke_test"]["logits_shape"] == [1, 8, VOCAB] and manifest["smoke_test"]["finite"]
        assert manifest["checkpoint_input_hash"] == f"hand-written-{role}"
        assert manifest["tool_versions"]["reference_format"] == "1" and manifest["tool_versions"]["torch"]


def test_engine_json_has_the_limits_a_trtllm_engine_would_have(pair):
    spec, _ = pair
    build_engines(spec, ["target", "draft"], "reference")
    target = json.loads((spec.pair_dir / "target" / "engine" / "engine.json").read_text())
    draft = json.loads((spec.pair_dir / "draft" / "engine" / "engine.json").read_text())
    assert target["max_seq_len"] == 128 + 4 and draft["max_seq_len"] == 128  # the builder adds K on the target
    assert target["max_draft_len"] == 4 and target["speculative_decoding_mode"] == "draft_tokens_external"
    assert draft["max_draft_len"] == 0 and draft["speculative_decoding_mode"] is None
    for doc in (target, draft):
        assert (doc["max_batch_size"], doc["max_input_len"], doc["max_num_tokens"]) == (2, 64, 256)
        assert doc["vocab_size"] == VOCAB and doc["quant_algo"] is None and doc["dtype"] == "float32"
        assert doc["logits_dtype"] == "float32"  # the checkpoint names none: PretrainedConfig's default


def test_engine_json_takes_the_logits_dtype_of_the_checkpoint(pair):
    """modelopt writes logits_dtype into the checkpoint; trtllm-build keeps it (specbuild passes no --logits_dtype)."""
    from specbuild.engines.plan import plan_role
    from specbuild.engines.reference_engine import engine_json

    spec, _ = pair
    plan = plan_role(spec, "target")
    assert engine_json(plan, VOCAB, {"logits_dtype": "float16"})["logits_dtype"] == "float16"
    assert engine_json(plan, VOCAB, {"logits_dtype": None})["logits_dtype"] == "float32"


def test_second_build_skips_and_force_rebuilds(pair):
    spec, _ = pair
    build_engines(spec, ["target", "draft"], "reference")
    assert [r["status"] for r in build_engines(spec, ["target", "draft"], "reference")] == ["skipped", "skipped"]
    assert [r["status"] for r in build_engines(spec, ["draft"], "reference", force=True)] == ["ran"]
    (spec.target.checkpoint / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 64}))
    assert [r["status"] for r in build_engines(spec, ["target", "draft"], "reference")] == ["ran", "skipped"]


def test_broken_checkpoint_leaves_no_engine(pair):
    spec, _ = pair
    (spec.pair_dir / "draft" / "checkpoint" / "rank0.safetensors").write_bytes(b"not safetensors")
    from specbuild.errors import CheckpointError

    with pytest.raises(CheckpointError, match="corrupt"):
        build_engines(spec, ["draft"], "reference")
    assert not (spec.pair_dir / "draft" / "engine").exists()
    assert not list((spec.pair_dir / "draft").glob(".engine.tmp-*"))


def test_cli_reference_build_json(pair, tmp_path):
    spec, _ = pair
    spec_file = tmp_path / "specbuild.toml"
    spec_file.write_text(
        f'name = "{spec.name}"\noutput_dir = "{spec.output_dir}"\n'
        f'[target]\ncheckpoint = "{spec.target.checkpoint}"\ndtype = "float32"\n'
        f'[draft]\ncheckpoint = "{spec.draft.checkpoint}"\ndtype = "float32"\n'
        "[speculative]\nmax_draft_len = 4\nnum_draft_tokens = 4\n"
        "[build]\nmax_batch_size = 2\nmax_input_len = 64\nmax_seq_len = 128\nmax_num_tokens = 256\n"
    )
    result = CliRunner().invoke(main, ["build", "-c", str(spec_file), "--backend", "reference", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [(e["role"], e["status"], e["backend"]) for e in doc["engines"]] == [
        ("target", "ran", "reference"),
        ("draft", "ran", "reference"),
    ]


def test_dry_run_input_hash_is_the_cache_key_of_the_build(pair):
    from specbuild.engines.stage import dry_run

    spec, _ = pair
    planned = [e["input_hash"] for e in dry_run(spec, ["target", "draft"], "reference")["engines"]]
    built = [r["manifest"]["input_hash"] for r in build_engines(spec, ["target", "draft"], "reference")]
    assert planned == built and None not in planned


def test_fp8_checkpoint_is_dequantized_and_keeps_its_activation_scales(pair, tmp_path):
    from safetensors.torch import load_file

    spec, models = pair
    ckpt = spec.pair_dir / "draft" / "checkpoint"
    write_trtllm_checkpoint(models["draft"], ckpt, "draft", spec.name, fp8=True)
    build_engines(spec, ["draft"], "reference")
    engine = spec.pair_dir / "draft" / "engine"
    raw = load_file(str(ckpt / "rank0.safetensors"))
    weights = load_file(str(engine / "model.safetensors"))
    dense = (
        raw["transformer.layers.0.attention.dense.weight"].float()
        * raw["transformer.layers.0.attention.dense.weights_scaling_factor"]
    )
    assert weights["model.layers.0.self_attn.o_proj.weight"].dtype == torch.float32
    torch.testing.assert_close(weights["model.layers.0.self_attn.o_proj.weight"], dense, atol=0, rtol=0)
    assert not torch.equal(dense, models["draft"].model.layers[0].self_attn.o_proj.weight)  # FP8 error is kept
    info = json.loads((engine / "engine.json").read_text())
    assert info["quant_algo"] == "FP8" and info["activation_quant"] == "activation_quant.json"
    acts = json.loads((engine / "activation_quant.json").read_text())
    assert acts["model.layers.0.self_attn.o_proj"] == {
        "kind": "fp8",
        "scale": pytest.approx(0.05),
        "pre_quant_scale": False,
    }


def test_smoke_test_names_non_finite_weights_of_the_source_checkpoint(pair):
    from specbuild.errors import BuildError

    spec, models = pair
    with torch.no_grad():
        models["draft"].model.layers[0].mlp.down_proj.weight[0, :3] = float("nan")
    models["draft"].save_pretrained(str(spec.draft.checkpoint))  # a corrupt source ...
    write_trtllm_checkpoint(
        models["draft"], spec.pair_dir / "draft" / "checkpoint", "draft", spec.name
    )  # ... converted
    with pytest.raises(BuildError) as err:
        build_engines(spec, ["draft"], "reference")
    assert str(err.value) == (
        "the reference engine's smoke test failed: its logits hold NaN or Inf. The source checkpoint "
        f"{spec.draft.checkpoint} holds non-finite weights (model.safetensors: tensor "
        "'model.layers.0.mlp.down_proj.weight' (F32) has 3 NaN of 2,048 values): conversion copies them, so "
        "`specbuild convert --force` cannot help. Download or save the checkpoint again, and run `specbuild check`, "
        "which scans for them."
    )
    assert not (spec.pair_dir / "draft" / "engine").exists()


def test_smoke_test_blames_the_conversion_when_only_the_converted_weights_are_non_finite(pair):
    from safetensors.torch import load_file, save_file

    from specbuild.errors import BuildError

    spec, _ = pair
    ckpt = spec.pair_dir / "draft" / "checkpoint"
    tensors = load_file(str(ckpt / "rank0.safetensors"))
    tensors["transformer.layers.0.mlp.proj.weight"][0, 0] = float("inf")
    save_file(tensors, str(ckpt / "rank0.safetensors"))
    with pytest.raises(BuildError) as err:
        build_engines(spec, ["draft"], "reference")
    assert str(err.value) == (
        "the reference engine's smoke test failed: its logits hold NaN or Inf. The source weights are finite but "
        f"the converted checkpoint {ckpt} is not (rank0.safetensors: tensor 'transformer.layers.0.mlp.proj.weight' "
        "(F32) has 1 Inf of 2,048 values): the conversion produced them. Run `specbuild convert --force` and check "
        "its log."
    )
