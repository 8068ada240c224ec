"""`check` against trtllm-build's own rules (specbuild.contract.build_rules): plans the builder would quietly change
are refused, advice never proposes one, max_num_tokens covers the longest input, the KV cap fits an int32."""

from __future__ import annotations

import json

import pytest
from check_fixtures import make_pair
from click.testing import CliRunner
from test_check_memory import LLAMA3_8B, LLAMA3_70B, LLAMA32_1B, spec

from specbuild.check import memory
from specbuild.check.advice import plan_memory
from specbuild.check.pair import check_max_num_tokens
from specbuild.check.report import CheckReport
from specbuild.cli import main
from specbuild.contract import build_rules as rules
from specbuild.hfmodel import info_from_config


@pytest.mark.parametrize(
    "quant_algo, kv, sm, lost",
    [
        (None, "FP8", 90, True),
        ("W8A16", "FP8", 90, True),
        ("W4A16_AWQ", "FP8", 90, True),
        ("W8A8_SQ_PER_CHANNEL", "FP8", 90, True),
        ("FP8", "FP8", 86, True),
        ("FP8", "FP8", 89, False),
        ("W4A8_AWQ", "FP8", 90, False),
        ("NVFP4", "FP8", 100, False),
        ("FP8", "INT8", 90, True),
        (None, None, 80, False),
        ("FP8", None, 90, False),
        ("QuantAlgo.FP8", "QuantAlgo.FP8", 90, False),
        ("FP8", "FP8", None, False),
        (None, "FP8", None, True),
    ],
)
def test_paged_context_fmha_rule_table(quant_algo, kv, sm, lost):
    # builder.py::build: FP8 KV keeps paged context FMHA only with FP8/W4A8_AWQ/NVFP4 weights on SM89+; INT8 KV never
    assert (rules.paged_context_fmha_loss(quant_algo, kv, sm) is not None) is lost


@pytest.mark.parametrize(
    "target",
    [
        {"kv_cache": "fp8"},
        {"quantization": "int4_awq", "kv_cache": "fp8"},
        {"quantization": "int8_sq", "kv_cache": "fp8"},
    ],
)
def test_fp8_kv_cache_the_builder_would_downgrade_is_a_problem(target):
    plan = plan_memory(spec(target), info_from_config(LLAMA3_8B), info_from_config(LLAMA32_1B))
    [problem] = [p for p in plan.problems if p.code == "paged_context_fmha_disabled"]
    assert "makes trtllm-build turn paged context FMHA off" in problem.message
    assert "cannot take external draft tokens" in problem.message
    assert 'target.kv_cache = "none"' in problem.fix and 'target.quantization = "fp8"' in problem.fix


def test_draft_is_checked_too_and_fp8_with_fp8_kv_passes():
    plan = plan_memory(
        spec({"quantization": "fp8", "kv_cache": "fp8"}, {"kv_cache": "fp8"}),
        info_from_config(LLAMA3_8B),
        info_from_config(LLAMA32_1B),
    )
    assert [(p.code, p.message.split(".")[0]) for p in plan.problems] == [("paged_context_fmha_disabled", "draft")]


def test_advice_never_proposes_an_fp8_kv_cache_the_builder_would_drop():
    # Llama-3-70B bf16 + 1B on one H100 does not fit; before, the first suggestion was target.kv_cache = "fp8"
    plan = plan_memory(
        spec({"dtype": "bfloat16"}, {"dtype": "bfloat16"}), info_from_config(LLAMA3_70B), info_from_config(LLAMA32_1B)
    )
    assert not plan.fits and plan.suggestions
    changes = [s["change"] for s in plan.suggestions]
    assert not any("kv_cache" in change for change in changes), changes
    [problem] = [p for p in plan.problems if p.code == "does_not_fit"]
    assert "kv_cache" not in problem.fix


def test_advice_keeps_fp8_kv_only_where_the_builder_keeps_paged_context_fmha():
    target, draft = info_from_config(LLAMA3_70B), info_from_config(LLAMA32_1B)
    fp8 = spec({"quantization": "fp8", "dtype": "bfloat16"}, {"dtype": "bfloat16"}, build={"max_batch_size": 6})
    plan = plan_memory(fp8, target, draft)
    assert plan.suggestions[0]["change"] == 'target.kv_cache = "fp8"'  # FP8 weights on SM90: the builder keeps it
    # with an FP8 KV cache already set, a switch to int4_awq weights would lose paged context FMHA
    fp8_kv = spec(
        {"quantization": "fp8", "kv_cache": "fp8", "dtype": "bfloat16"},
        {"dtype": "bfloat16"},
        build={"max_batch_size": 10},
    )
    plan = plan_memory(fp8_kv, target, draft)
    assert plan.max_batch < 10 and plan.suggestions
    assert not any("int4_awq" in s["change"] for s in plan.suggestions), plan.suggestions


def test_max_num_tokens_below_the_longest_input_is_raised_and_warned():
    report = CheckReport(pair="p")
    check_max_num_tokens(report, spec(build={"max_num_tokens": 256}))
    [warning] = report.warnings
    assert warning.code == "max_num_tokens_raised" and "min(max_seq_len - 1, max_num_tokens)" in warning.message
    assert "build.max_num_tokens = 2047" in warning.fix
    report = CheckReport(pair="p")
    check_max_num_tokens(report, spec(build={"max_num_tokens": 2047}))
    assert report.warnings == []
    # the memory plan counts the raised value: the same runtime buffers as asking for 2047 directly
    info = info_from_config(LLAMA3_8B)
    low = memory.runtime_bytes(info, "float16", spec(build={"max_num_tokens": 256}), 128256, False)
    assert low == memory.runtime_bytes(info, "float16", spec(build={"max_num_tokens": 2047}), 128256, False)


def test_max_tokens_in_paged_kv_cache_fits_the_backends_int32():
    # model_state.cc reads it with std::stoi: a larger value throws, and the backend silently drops the cap
    tiny = dict(
        LLAMA32_1B,
        vocab_size=512,
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=16,
        num_key_value_heads=1,
        head_dim=4,
        intermediate_size=128,
    )
    plan = plan_memory(spec(gpu={"name": "H200"}), info_from_config(tiny), info_from_config(tiny))
    for role in ("target", "draft"):
        kv_tokens = plan.kv_available_bytes // (2 * plan.target.kv_bytes_per_token)
        assert kv_tokens > rules.INT32_MAX  # each model's share is more tokens than an int32 can say
        assert 0 < plan.max_tokens_in_paged_kv_cache[role] <= rules.INT32_MAX
        assert plan.max_tokens_in_paged_kv_cache[role] % rules.TOKENS_PER_BLOCK == 0


def test_check_cli_refuses_an_fp8_kv_cache_without_fp8_weights(tmp_path):
    spec_path = make_pair(tmp_path)
    spec_path.write_text(spec_path.read_text().replace("[draft]", 'kv_cache = "fp8"\n[draft]'))
    result = CliRunner().invoke(main, ["check", "-c", str(spec_path), "--json"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert "paged_context_fmha_disabled" in [p["code"] for p in report["problems"]]
