"""specbuild.contract.build_rules one function at a time: what `check`, `convert` and `build` refuse for a GPU, in the
very words a user reads (the refusals, their fixes, the planned limits' notes), at each rule's edge (SM80, SM89, a
value equal to its bound). The same rules are exercised through the commands in tests/test_check_builder_rules.py and
tests/test_build_argv.py; here each branch and message is pinned, so a changed word or bound fails one test by name."""

from __future__ import annotations

import pytest

from specbuild.contract.build_rules import (
    TOKENS_PER_BLOCK,
    GpuRefusal,
    fp8_kv_cache_keeps_paged_context_fmha,
    gpu_refusals,
    norm_algo,
    paged_context_fmha_fix,
    paged_context_fmha_loss,
    planned_max_num_tokens,
    runtime_max_input_len,
    spec_paged_context_fmha_loss,
)
from specbuild.quantization import FORMATS, usable_on

DISABLED = (
    ". Without paged context FMHA the engines have no KV-cache reuse and the target cannot take external draft "
    "tokens: the build would be rejected after it ran."
)
NEEDS = "Draft/target speculative decoding needs paged context FMHA (KV-cache reuse for external draft tokens). Set "


@pytest.mark.parametrize("value", [None, "", "NO_QUANT", "none", "None"])
def test_every_spelling_of_no_quantization_is_none(value):
    assert norm_algo(value) is None


@pytest.mark.parametrize(
    ("value", "algo"),
    [
        ("QuantAlgo.FP8", "FP8"),
        ("tensorrt_llm.quantization.QuantAlgo.FP8", "FP8"),
        ("fp8", "FP8"),
        ("W4A8_AWQ", "W4A8_AWQ"),
        ("NONE", "NONE"),
    ],
)
def test_an_algo_is_its_last_dotted_part_upper_cased(value, algo):
    assert norm_algo(value) == algo  # "NONE" is not one of the spellings of none: it is kept (and matches nothing)


def test_the_fp8_kv_cache_losses_in_words():
    assert paged_context_fmha_loss("FP8", "FP8", 90) is None
    assert paged_context_fmha_loss("QuantAlgo.W4A8_AWQ", "fp8", 89) is None  # the SM89 edge keeps it
    assert paged_context_fmha_loss("FP8", "FP8", 88) == (
        "an FP8 KV cache on SM88 makes trtllm-build turn paged context FMHA off (FP8 context FMHA needs SM89+)"
    )
    assert paged_context_fmha_loss("FP8", "FP8", None) is None  # an unknown GPU: only what holds on every GPU
    assert paged_context_fmha_loss(None, "FP8", 90) == (
        "an FP8 KV cache with quant_algo none makes trtllm-build turn paged context FMHA off (it keeps it with an FP8 "
        "KV cache only for FP8, W4A8_AWQ, NVFP4 weights, which use FP8 context FMHA)"
    )
    assert paged_context_fmha_loss("W4A16_AWQ", None, 90) is None
    assert paged_context_fmha_loss(None, "INT8", None) == (
        "an INT8 KV cache makes trtllm-build turn paged context FMHA off (it does not work with an INT8 KV cache)"
    )


def test_a_spec_name_is_read_as_the_algo_convert_writes():
    # int8_sq writes W8A8_SQ_PER_CHANNEL, which the message names; an unknown name is taken as an algo itself
    assert "quant_algo W8A8_SQ_PER_CHANNEL" in spec_paged_context_fmha_loss("int8_sq", "fp8", 90)
    assert spec_paged_context_fmha_loss("W4A8_AWQ", "fp8", 90) is None
    assert spec_paged_context_fmha_loss("fp8", "none", 90) is None
    assert spec_paged_context_fmha_loss("fp8", "fp8", 86).startswith("an FP8 KV cache on SM86")


@pytest.mark.parametrize(
    ("quantization", "sm", "keeps"),
    [("fp8", 90, True), ("fp8", 89, True), ("fp8", 86, False), ("fp8", None, False), ("int4_awq", 90, False)],
)
def test_an_fp8_kv_cache_is_advised_only_where_it_keeps_paged_context_fmha(quantization, sm, keeps):
    assert fp8_kv_cache_keeps_paged_context_fmha(quantization, sm) is keeps


def test_the_fix_for_a_lost_paged_context_fmha_in_words():
    fp8 = 'target.quantization = "fp8" (or "w4a8_awq") with target.kv_cache = "fp8"'
    assert paged_context_fmha_fix("target", 90) == NEEDS + f'target.kv_cache = "none" or {fp8}.'
    assert paged_context_fmha_fix("target", 89) == NEEDS + f'target.kv_cache = "none" or {fp8}.'
    assert paged_context_fmha_fix("target", None) == NEEDS + f'target.kv_cache = "none" or {fp8} on an SM89+ GPU.'
    assert paged_context_fmha_fix("draft", 88) == (
        NEEDS + 'draft.kv_cache = "none" or an SM89+ GPU (Ada, Hopper or newer) for an FP8 KV cache.'
    )


def test_a_gpu_older_than_sm80_gets_one_refusal_whatever_the_formats():
    """Before, every format was refused too and its fix offered an empty list: an IndexError instead of a message."""
    for quantization in FORMATS:
        assert gpu_refusals("target", quantization, "fp8", 75, "T4") == [
            GpuRefusal(
                "gpu_too_old",
                "T4 is SM75; draft/target speculative decoding in TensorRT-LLM needs SM80 or newer.",
                "Use an Ampere-or-newer GPU.",
            )
        ]
    assert usable_on(75) == [] and FORMATS["none"].refused_on(75) == "it needs an SM80+ GPU (Ampere or newer)"


def test_each_gpu_refusal_in_words():
    assert gpu_refusals("target", "fp8", "fp8", 86, "A10G") == [
        GpuRefusal(
            "quantization_unsupported_on_gpu",
            "target.quantization = 'fp8' on A10G (SM86): FP8 needs an SM89+ GPU (Ada, Hopper or newer).",
            "Use target.quantization = 'none', 'int8_sq', 'int4_awq', 'int8_wo' or 'int4_wo' on this GPU.",
        ),
        GpuRefusal(
            "kv_cache_unsupported_on_gpu",
            "target.kv_cache = 'fp8' needs an SM89+ GPU (Ada/Hopper or newer), but A10G is SM86.",
            'Set target.kv_cache = "none" on this GPU.',
        ),
    ]  # and no paged-context-FMHA refusal: the KV cache's refusal is that same fact
    assert gpu_refusals("draft", "int8_wo", "none", 100, "B200") == [
        GpuRefusal(
            "quantization_unsupported_on_gpu",
            "draft.quantization = 'int8_wo' on B200 (SM100): trtllm-build refuses INT8/INT4 weight-only and "
            "SmoothQuant on SM100-119.",
            "Use draft.quantization = 'none', 'fp8' or 'w4a8_awq' on this GPU.",
        )
    ]
    loss = spec_paged_context_fmha_loss("int4_awq", "fp8", 90)
    assert gpu_refusals("draft", "int4_awq", "fp8", 90, "H100-80GB") == [
        GpuRefusal(
            "paged_context_fmha_disabled",
            f"draft.quantization = 'int4_awq' with draft.kv_cache = 'fp8': {loss}{DISABLED}",
            paged_context_fmha_fix("draft", 90),
        )
    ]
    assert gpu_refusals("target", "fp8", "fp8", 90, "H100-80GB") == []
    assert gpu_refusals("target", "not-a-format", "none", 90, "H100-80GB") == []  # the spec's own check names it
    assert gpu_refusals("target", "int4_awq", "int8", None, None)[0].code == "paged_context_fmha_disabled"


def test_the_runtimes_longest_input():
    assert runtime_max_input_len(2048, 8192) == 2047
    assert runtime_max_input_len(2048, 1000) == 1000


def test_the_planned_max_num_tokens_and_its_notes_at_each_bound():
    assert planned_max_num_tokens(4, 100, 99) == (99, [])  # exactly max_seq_len - 1: kept
    assert planned_max_num_tokens(4, 100, 50) == (
        99,
        [
            "max_num_tokens 50 -> 99 (max_seq_len - 1: the runtime refuses an input longer than min(max_seq_len - 1, "
            "max_num_tokens), and the BLS re-sends prompt + generated tokens every step)"
        ],
    )
    assert planned_max_num_tokens(2, 100, 200) == (200, [])  # exactly max_batch_size * max_seq_len: kept
    assert planned_max_num_tokens(2, 100, 201) == (
        200,
        ["max_num_tokens 201 -> 200 (max_batch_size * max_seq_len, as trtllm-build clips it)"],
    )
    assert planned_max_num_tokens(1, TOKENS_PER_BLOCK + 1, TOKENS_PER_BLOCK) == (TOKENS_PER_BLOCK, [])  # one block
    value, notes = planned_max_num_tokens(1, 20, 8)
    assert value == TOKENS_PER_BLOCK and notes[-1] == (
        f"max_num_tokens 19 -> {TOKENS_PER_BLOCK} (one KV-cache block, as trtllm-build raises it)"
    )
