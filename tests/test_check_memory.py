"""The memory plan's arithmetic, against published model configs and real-world figures."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from specbuild.check import advice, memory
from specbuild.check.advice import plan_memory
from specbuild.check.memory import GIB, kv_bytes_per_token, weight_bytes
from specbuild.config import spec_from_dict
from specbuild.contract.build_rules import TOKENS_PER_BLOCK
from specbuild.hfmodel import info_from_config

# Published Hugging Face configs (the fields the plan reads).
LLAMA3_70B = dict(
    architectures=["LlamaForCausalLM"],
    model_type="llama",
    vocab_size=128256,
    hidden_size=8192,
    num_hidden_layers=80,
    num_attention_heads=64,
    num_key_value_heads=8,
    intermediate_size=28672,
    max_position_embeddings=8192,
    tie_word_embeddings=False,
)
LLAMA3_8B = dict(
    architectures=["LlamaForCausalLM"],
    model_type="llama",
    vocab_size=128256,
    hidden_size=4096,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    intermediate_size=14336,
    max_position_embeddings=8192,
    tie_word_embeddings=False,
)
LLAMA32_1B = dict(
    architectures=["LlamaForCausalLM"],
    model_type="llama",
    vocab_size=128256,
    hidden_size=2048,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=64,
    intermediate_size=8192,
    max_position_embeddings=131072,
    tie_word_embeddings=True,
    rope_scaling={"factor": 32.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
)
QWEN25_7B = dict(
    architectures=["Qwen2ForCausalLM"],
    model_type="qwen2",
    vocab_size=152064,
    hidden_size=3584,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    intermediate_size=18944,
    max_position_embeddings=32768,
    tie_word_embeddings=False,
)
QWEN25_05B = dict(
    architectures=["Qwen2ForCausalLM"],
    model_type="qwen2",
    vocab_size=151936,
    hidden_size=896,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    intermediate_size=4864,
    max_position_embeddings=32768,
    tie_word_embeddings=True,
)


def spec(
    target: dict | None = None,
    draft: dict | None = None,
    build: dict | None = None,
    gpu: dict | None = None,
    speculative: dict | None = None,
):
    raw = {
        "speculative": speculative or {},
        "target": {"checkpoint": "t", **(target or {})},
        "draft": {"checkpoint": "d", **(draft or {})},
        "build": {
            "max_batch_size": 4,
            "max_input_len": 1024,
            "max_seq_len": 2048,
            "max_num_tokens": 8192,
            **(build or {}),
        },
        "gpu": gpu or {"name": "H100-80GB"},
    }
    return spec_from_dict(raw, base_dir=Path("/nonexistent"))


@pytest.mark.parametrize(
    "config, published",
    [(LLAMA3_70B, 70.55e9), (LLAMA3_8B, 8.03e9), (LLAMA32_1B, 1.236e9), (QWEN25_7B, 7.62e9), (QWEN25_05B, 0.494e9)],
)
def test_parameter_count_matches_published_sizes(config, published):
    assert info_from_config(config).num_params == pytest.approx(published, rel=0.005)


def test_kv_bytes_per_token_is_2_layers_kvheads_headdim_bytes():
    l70, l1 = info_from_config(LLAMA3_70B), info_from_config(LLAMA32_1B)
    assert kv_bytes_per_token(l70, "none", "bfloat16", 1) == 2 * 80 * 8 * 128 * 2 == 327_680
    assert kv_bytes_per_token(l70, "fp8", "bfloat16", 1) == 163_840
    assert kv_bytes_per_token(l70, "none", "bfloat16", 2) == 163_840  # kv heads split over tp
    assert kv_bytes_per_token(l1, "none", "float16", 1) == 2 * 16 * 8 * 64 * 2
    # 8 kv heads over tp 16: each GPU still holds one (replicated) head
    assert kv_bytes_per_token(l70, "none", "bfloat16", 16) == 2 * 80 * 1 * 128 * 2


def test_pipeline_parallel_splits_layers():
    l70 = info_from_config(LLAMA3_70B)
    assert kv_bytes_per_token(l70, "none", "bfloat16", 1, pp_size=2) == 2 * 40 * 8 * 128 * 2
    total, per_gpu = weight_bytes(l70, "none", "bfloat16", 128256, 1, pp_size=4)
    table = 128256 * 8192 * 2
    assert per_gpu == pytest.approx((total - 2 * table) / 4 + 2 * table, rel=1e-6)


def test_llama3_70b_weights_bf16_141gb_fp8_about_half():
    l70 = info_from_config(LLAMA3_70B)
    bf16, _ = weight_bytes(l70, "none", "bfloat16", 128256, 1)
    fp8, _ = weight_bytes(l70, "fp8", "bfloat16", 128256, 1)
    int4, _ = weight_bytes(l70, "int4_awq", "bfloat16", 128256, 1)
    assert bf16 / 1e9 == pytest.approx(141.1, abs=0.5)
    # fp8 blocks + bf16 embedding and lm_head (2 x 1.05 GB at 2 bytes)
    assert fp8 / 1e9 == pytest.approx(68.45 + 4.2, abs=0.3)
    assert int4 / 1e9 == pytest.approx(68.45 * (0.5 + 2 / 128) + 4.2, abs=0.3)


def test_tensor_parallel_splits_blocks_and_lm_head_but_not_the_embedding():
    l8 = info_from_config(LLAMA3_8B)
    total, per_gpu_1 = weight_bytes(l8, "none", "float16", 128256, 1)
    _, per_gpu_2 = weight_bytes(l8, "none", "float16", 128256, 2)
    embedding = 128256 * 4096 * 2
    assert per_gpu_1 == total
    assert per_gpu_2 == pytest.approx((total - embedding) / 2 + embedding, rel=1e-6)


def test_tied_embeddings_still_count_a_separate_lm_head():
    l1 = info_from_config(LLAMA32_1B)
    total, _ = weight_bytes(l1, "none", "float16", 128256, 1)
    assert total == pytest.approx((l1.num_params + 128256 * 2048) * 2, rel=1e-9)


def test_llama3_70b_bf16_does_not_fit_one_h100_and_fp8_is_the_smallest_change():
    target, draft = info_from_config(LLAMA3_70B), info_from_config(LLAMA32_1B)
    plan = plan_memory(spec({"dtype": "bfloat16"}, {"dtype": "bfloat16"}), target, draft)
    assert not plan.fits and plan.max_batch == 0
    assert [p.code for p in plan.problems] == ["does_not_fit"]
    assert plan.problems[0].message.startswith("does not fit: on H100-80GB (79.6 GiB per GPU, tp_size 1)")
    assert plan.suggestions[0]["change"] == 'target.quantization = "fp8"'
    assert 'Change target.quantization = "fp8"' in plan.problems[0].fix
    changes = [s["change"] for s in plan.suggestions]
    assert "build.tp_size = 2 (gpu.count >= 2)" in changes
    assert not any(c.startswith("build.max_seq_len") for c in changes)  # weights alone overflow: seq cannot help


def test_llama3_70b_fp8_fits_one_h100_with_little_kv():
    target, draft = info_from_config(LLAMA3_70B), info_from_config(LLAMA32_1B)
    plan = plan_memory(spec({"quantization": "fp8", "dtype": "bfloat16"}, {"dtype": "bfloat16"}), target, draft)
    assert plan.fits
    assert 1 <= plan.max_batch <= 8  # "little KV": a handful of 2k-token sequences
    assert plan.kv_available_bytes < 8 * GIB
    assert plan.problems == ()


def test_llama3_70b_on_a100_suggests_int4_awq_not_fp8():
    target, draft = info_from_config(LLAMA3_70B), info_from_config(LLAMA32_1B)
    plan = plan_memory(spec(gpu={"name": "A100-80GB"}), target, draft)
    changes = [s["change"] for s in plan.suggestions]
    assert changes[0] == 'target.quantization = "int4_awq"'
    assert not any("fp8" in c for c in changes)  # A100 is SM80: no FP8


def test_llama3_70b_fits_two_h100_with_tensor_parallel():
    target, draft = info_from_config(LLAMA3_70B), info_from_config(LLAMA32_1B)
    plan = plan_memory(spec(build={"tp_size": 2}, gpu={"name": "H100-80GB", "count": 2}), target, draft)
    assert plan.fits
    assert plan.target.weight_bytes_per_gpu / 1e9 == pytest.approx((141.1 - 4.2) / 2 + 2.1 + 1.05, abs=0.3)
    # blocks halved; the 2.1 GB bf16 embedding whole on each GPU; the 2.1 GB lm_head halved


def test_max_batch_is_the_largest_that_fits():
    target, draft = info_from_config(LLAMA3_8B), info_from_config(LLAMA32_1B)
    plan = plan_memory(spec(), target, draft)
    per_sequence = plan.target.kv_bytes_per_sequence + plan.draft.kv_bytes_per_sequence
    # max_seq_len + max_draft_len (4), in whole KV-cache blocks of 32 tokens (trtllm-build 1.x tokens_per_block)
    assert TOKENS_PER_BLOCK == 32 and plan.target.tokens_per_sequence == 2048 + 32
    assert plan.draft.tokens_per_sequence == 2048
    assert plan.max_batch * per_sequence <= plan.kv_available_bytes < (plan.max_batch + 1) * per_sequence
    # 8B fp16 on 80 GB: ~16 GB weights, ~60 GB KV at ~0.3 GiB per 2k sequence -> a couple of hundred sequences
    assert 150 < plan.max_batch < 260


def test_batch_warning_when_max_batch_size_does_not_fit():
    target, draft = info_from_config(LLAMA3_70B), info_from_config(LLAMA32_1B)
    plan = plan_memory(spec({"quantization": "fp8"}, build={"max_batch_size": 64}), target, draft)
    assert plan.fits and plan.max_batch < 64
    [warning] = [w for w in plan.warnings if w.code == "batch_exceeds_memory"]
    assert f"Set build.max_batch_size = {plan.max_batch}." in warning.fix


def test_shorter_max_seq_len_suggestion_is_the_longest_that_fits():
    target, draft = info_from_config(LLAMA3_8B), info_from_config(LLAMA32_1B)
    long = spec(build={"max_seq_len": 524288, "max_input_len": 1024})
    plan = plan_memory(long, target, draft)
    assert not plan.fits
    [shorter] = [s for s in plan.suggestions if s["change"].startswith("build.max_seq_len")]
    seq = int(shorter["change"].split("=")[1].split()[0])
    assert seq % TOKENS_PER_BLOCK == 0 and shorter["max_batch"] >= 1
    build = advice._with(long, "build", max_seq_len=seq + TOKENS_PER_BLOCK)
    assert plan_memory(build, target, draft, suggest=False).max_batch == 0


def test_kv_split_holds_in_either_load_order():
    """Simulate TensorRT-LLM: each model, when it loads, takes min(cap, fraction x free memory)."""
    target, draft = info_from_config(QWEN25_7B), info_from_config(QWEN25_05B)
    plan = plan_memory(spec(), target, draft)
    assert plan.fits
    usable = plan.memory_per_gpu_bytes
    for order in (("target", "draft"), ("draft", "target")):
        used = 0
        for role in order:
            m = getattr(plan, role)
            used += m.weight_bytes_per_gpu + m.runtime_bytes_per_gpu
            free = usable - used
            cap = m.max_tokens_in_paged_kv_cache * m.kv_bytes_per_token
            kv = min(cap, m.kv_cache_free_gpu_mem_fraction * free)
            assert kv >= cap * 0.999, (order, role)  # every model gets its whole budget
            used += kv
        assert used <= usable - plan.reserved_bytes * 0.99
    # each cap holds at least max_batch full sequences
    for m in (plan.target, plan.draft):
        assert m.max_tokens_in_paged_kv_cache >= plan.max_batch * m.tokens_per_sequence


def test_padded_vocab_is_used_for_both_models():
    target, draft = info_from_config(QWEN25_7B), info_from_config(QWEN25_05B)
    plan = plan_memory(spec(), target, draft)
    padded = info_from_config({**QWEN25_05B, "vocab_size": 152064})
    plan_padded = plan_memory(spec(), target, padded)
    assert plan.draft.weight_bytes == plan_padded.draft.weight_bytes  # the draft is counted at 152064 rows
    assert memory.padded_vocab(151937, 2) == 151938


@pytest.mark.parametrize(
    "gpu, target, code",
    [
        ({"name": "A100-80GB"}, {"quantization": "fp8"}, "quantization_unsupported_on_gpu"),
        ({"name": "A10G"}, {"kv_cache": "fp8"}, "kv_cache_unsupported_on_gpu"),
        ({"name": "B200"}, {"quantization": "int4_awq"}, "quantization_unsupported_on_gpu"),
        ({"name": "B200"}, {"quantization": "int8_sq"}, "quantization_unsupported_on_gpu"),
    ],
)
def test_gpu_feature_gates(gpu, target, code):
    plan = plan_memory(spec(target, gpu=gpu), info_from_config(LLAMA3_8B), info_from_config(LLAMA32_1B))
    assert code in [p.code for p in plan.problems]


def test_gates_pass_where_the_format_is_supported():
    plan = plan_memory(
        spec({"quantization": "fp8", "kv_cache": "fp8"}, gpu={"name": "L40S"}),
        info_from_config(LLAMA3_8B),
        info_from_config(LLAMA32_1B),
    )
    assert plan.problems == ()


def test_custom_gpu_warns_that_sm_is_unknown():
    plan = plan_memory(
        spec(gpu={"name": "MI-lab-card", "memory_gib": 48}), info_from_config(LLAMA3_8B), info_from_config(LLAMA32_1B)
    )
    assert plan.memory_per_gpu_bytes == 48 * GIB
    assert "gpu_sm_unknown" in [w.code for w in plan.warnings]


def test_fraction_is_rounded_up_and_capped():
    assert memory._fraction(0.5, 1.0) == 0.5
    assert memory._fraction(0.301, 1.0) == 0.31
    assert memory._fraction(2.0, 1.0) == memory.MAX_FRACTION
    assert memory._fraction(0, 1.0) == 0.0
    assert math.isclose(memory._fraction(1, 3), 0.34)


def test_draft_on_its_own_gpu_when_there_are_enough():
    target, draft = info_from_config(LLAMA3_70B), info_from_config(LLAMA32_1B)
    shared = plan_memory(spec({"quantization": "fp8"}), target, draft)
    separate = plan_memory(spec({"quantization": "fp8"}, gpu={"name": "H100-80GB", "count": 2}), target, draft)
    assert (shared.placement, separate.placement) == ("shared", "separate")
    assert separate.max_batch > shared.max_batch
    usable = separate.memory_per_gpu_bytes
    batches = []
    for m in (separate.target, separate.draft):  # each model alone on its GPU
        free = usable - m.weight_bytes_per_gpu - m.runtime_bytes_per_gpu
        cap = m.max_tokens_in_paged_kv_cache * m.kv_bytes_per_token
        kv = min(cap, m.kv_cache_free_gpu_mem_fraction * free)
        assert cap * 0.999 <= kv <= free - memory.MIN_SAFETY_BYTES
        batches.append(m.kv_budget_bytes // m.kv_bytes_per_sequence)
    assert separate.max_batch == min(batches)


def test_adding_a_gpu_for_the_draft_is_suggested():
    # Llama-3-8B bf16 + 1B on one L4 (22 GiB): the pair does not fit, the target alone does.
    target, draft = info_from_config(LLAMA3_8B), info_from_config(LLAMA32_1B)
    plan = plan_memory(spec(gpu={"name": "L4"}), target, draft)
    assert not plan.fits
    changes = [s["change"] for s in plan.suggestions]
    assert "gpu.count = 2 (the draft on GPUs of its own)" in changes
    assert changes.index('target.quantization = "fp8"') < changes.index("gpu.count = 2 (the draft on GPUs of its own)")


def test_runtime_buffers_against_a_real_tensorrt_llm_log():
    """NVIDIA/TensorRT-LLM#1188: Qwen2.5-0.5B, defaults (max_batch_size 2048, max_num_tokens 8192) logged
    773.51 MiB execution context + 2.66 GB runtime buffers + 5.76 GB decoder; ~1.2 GB in all at batch 1."""
    qwen = info_from_config(QWEN25_05B)
    big = spec(
        build={"max_batch_size": 2048, "max_num_tokens": 8192, "max_seq_len": 2048},
        speculative={"max_draft_len": 1, "num_draft_tokens": 1},
    )
    logged = 773.51 * 2**20 + 2.66e9 + 5.76e9
    estimate = memory.runtime_bytes(qwen, "float16", big, 151936, is_target=False) - memory.CUDA_CONTEXT_BYTES
    assert logged <= estimate <= 1.5 * logged
    small = spec(build={"max_batch_size": 1, "max_num_tokens": 512, "max_input_len": 256, "max_seq_len": 512})
    assert memory.runtime_bytes(qwen, "float16", small, 151936, is_target=False) < 1.5 * GIB
