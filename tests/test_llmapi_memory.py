"""The LLM API path's memory plan: the engine plan's arithmetic where it applies, and what differs (one process and
CUDA context, one KV pool sized by one fraction for target + draft, max_seq_len + K + 1 tokens per sequence)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from fakes.build_fixtures import make_spec
from test_check_memory import LLAMA3_8B, LLAMA32_1B

from specbuild.check.llmapi_memory import plan_memory
from specbuild.check.memory import CUDA_CONTEXT_BYTES, compute_plan, kv_bytes_per_token
from specbuild.cli import main
from specbuild.hfmodel import info_from_config


@pytest.fixture
def infos():
    return info_from_config(LLAMA3_8B), info_from_config(LLAMA32_1B)


def test_one_pool_for_both_models_at_the_default_fraction(tmp_path, infos):
    target, draft = infos
    spec = make_spec(
        tmp_path,
        speculative={"max_draft_len": 4, "num_draft_tokens": 3},
        build={"max_seq_len": 4096, "max_input_len": 2048},
    )
    plan = plan_memory(spec, target, draft)
    engines = compute_plan(spec, target, draft)
    assert plan.fits and plan.free_gpu_memory_fraction == 0.9 and plan.fraction_source == "TensorRT-LLM default"
    assert plan.weight_bytes_per_gpu == {
        "target": engines.target.weight_bytes_per_gpu,
        "draft": engines.draft.weight_bytes_per_gpu,
    }
    # one CUDA context for both models (one process), where the engine plan counts one per model
    assert plan.runtime_bytes_per_gpu < engines.target.runtime_bytes_per_gpu + engines.draft.runtime_bytes_per_gpu
    assert plan.tokens_per_sequence == 4128  # 4096 + K 3 + 1, in blocks of 32
    per_token = kv_bytes_per_token(target, "none", "float16", 1) + kv_bytes_per_token(draft, "none", "float16", 1)
    assert sum(plan.kv_bytes_per_token.values()) == per_token
    free = plan.memory_per_gpu_bytes - sum(plan.weight_bytes_per_gpu.values()) - plan.runtime_bytes_per_gpu
    assert plan.kv_cache_bytes == int(free * 0.9)
    assert plan.max_tokens == plan.kv_cache_bytes // per_token // 32 * 32
    assert plan.max_batch == plan.max_tokens // plan.tokens_per_sequence
    assert CUDA_CONTEXT_BYTES > 0


def test_the_spec_fraction_is_used(tmp_path, infos):
    spec = make_spec(tmp_path, llmapi={"free_gpu_memory_fraction": 0.5})
    plan = plan_memory(spec, *infos)
    assert plan.free_gpu_memory_fraction == 0.5 and plan.fraction_source == "spec"
    assert plan.max_tokens < plan_memory(make_spec(tmp_path), *infos).max_tokens


def test_does_not_fit_names_a_change_that_does(tmp_path, infos):
    spec = make_spec(tmp_path, gpu={"name": "L4"}, build={"max_seq_len": 131072, "max_input_len": 1024})
    plan = plan_memory(spec, *infos)
    assert not plan.fits and plan.problems[0].code == "does_not_fit"
    assert plan.suggestions and "Change" in plan.problems[0].fix
    assert all(s["max_batch"] >= 1 for s in plan.suggestions)


def test_gates_of_this_path(tmp_path, infos):
    spec = make_spec(
        tmp_path,
        gpu={"name": "A100-80GB"},
        target={"quantization": "fp8"},
        draft={"quantization": "int4_awq"},
        speculative={"max_draft_len": 4, "num_draft_tokens": 0},
    )
    plan = plan_memory(spec, *infos)
    codes = [f.code for f in plan.problems]
    assert "quantization_unsupported_on_gpu" in codes and "quantization_unsupported_on_llmapi" in codes
    assert "llmapi_no_speculation" in [f.code for f in plan.warnings]


def test_check_cli_shows_this_paths_plan(tiny_spec_path):
    result = CliRunner().invoke(
        main, ["check", "-c", str(tiny_spec_path), "--backend", "llmapi", "--json", "--no-weight-scan"]
    )
    assert result.exit_code == 0, result.output
    memory = json.loads(result.stdout)["memory"]
    assert memory["path"] == "llmapi" and memory["free_gpu_memory_fraction"] == 0.9
    text = CliRunner().invoke(main, ["check", "-c", str(tiny_spec_path), "--backend", "llmapi", "--no-weight-scan"])
    assert "one pool" in text.output and "free_gpu_memory_fraction 0.9" in text.output
