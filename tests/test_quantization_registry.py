"""One record per quantization format (specbuild.quantization), read by every stage: the stages that once kept
their own copies now agree, for every format on every GPU the spec knows.

The contradictions this replaced, each held here: `convert` accepted int4_awq on SM100-119 (and recommended it)
while `check` refused it; AWQ weights were 0.5156 bytes in the memory plan and 0.5 in the speed bound."""

from __future__ import annotations

import dataclasses

import pytest

from specbuild import quantization
from specbuild.bench import theory
from specbuild.check import advice, memory
from specbuild.config import GPUS, QUANTIZATIONS, GpuSpec, Spec, spec_from_dict
from specbuild.contract import build_rules as rules
from specbuild.contract import llmapi as contract
from specbuild.convert import formats, verify
from specbuild.errors import BuildError, SpecError


def spec_on(gpu: str, quantization_name: str, tmp_path) -> Spec:
    spec = spec_from_dict(
        {"name": "p", "target": {"checkpoint": str(tmp_path / "t")}, "draft": {"checkpoint": str(tmp_path / "d")}},
        base_dir=tmp_path,
    )
    target = dataclasses.replace(spec.target, quantization=quantization_name)
    return dataclasses.replace(spec, target=target, gpu=GpuSpec(name=gpu))


@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_check_refuses_on_a_gpu_exactly_the_formats_convert_refuses_there(gpu, tmp_path):
    """`check` must never call usable what `convert` then refuses, nor refuse what it accepts."""
    sm = GPUS[gpu][1]
    for name in QUANTIZATIONS:
        try:
            formats.check_gpu(formats.get_format(name), "none", sm, gpu, "target")
            convert_refuses = False
        except SpecError:
            convert_refuses = True
        problems, _ = advice.gate_findings(spec_on(gpu, name, tmp_path))
        check_refuses = any(p.code == "quantization_unsupported_on_gpu" for p in problems)
        assert check_refuses == convert_refuses, (gpu, name, problems)
        assert (name in quantization.usable_on(sm)) == (not convert_refuses), (gpu, name)


@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_build_refuses_before_any_argv_every_gpu_format_pair_check_refuses(gpu, tmp_path):
    """`build --dry-run` once printed a trtllm-build argv for fp8 on an A100 that check refused: the three stages
    now ask one gate (build_rules.gpu_refusals), for each weight format and KV cache on each GPU."""
    from specbuild.engines.stage import plan_build

    for name in QUANTIZATIONS:
        for kv_cache in ("none", "fp8"):
            base = spec_on(gpu, name, tmp_path)
            spec = dataclasses.replace(base, draft=dataclasses.replace(base.draft, kv_cache=kv_cache))
            problems, _ = advice.gate_findings(spec)
            try:
                plan_build(spec, ["target", "draft"], require_checkpoint=False)
                build_refuses = False
            except (SpecError, BuildError):
                build_refuses = True
            assert build_refuses == bool(problems), (gpu, name, kv_cache, problems)


def test_int4_awq_is_refused_on_blackwell_as_tensorrt_llm_refuses_it():
    """builder.py @008b2b8 raises for is_int4_weight_only() on SM100-119, and W4A16_AWQ is int4 weight-only."""
    assert quantization.FORMATS["int4_awq"].refused_on(100) is not None
    assert "int4_awq" in rules.BLACKWELL_REJECTED and "int4_awq" not in quantization.usable_on(100)
    assert quantization.FORMATS["int4_awq"].refused_on(90) is None


def test_every_stage_reads_its_figures_from_the_record():
    for name, fmt in quantization.FORMATS.items():
        assert rules.QUANT_ALGO[name] == fmt.quant_algo
        assert memory.WEIGHT_BYTES.get(name) == fmt.weight_bytes
        assert theory.BYTES_PER_WEIGHT[name] == fmt.weight_bytes
        assert verify.QUANT_BOUNDS.get(name) == fmt.verify_bounds
        assert (name in contract.QUANTIZATIONS) == fmt.llmapi
    assert memory.WEIGHT_BYTES["int4_awq"] == theory.BYTES_PER_WEIGHT["int4_awq"] == 0.5 + 2 / 128
    assert QUANTIZATIONS == tuple(quantization.FORMATS)
