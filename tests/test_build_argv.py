"""trtllm-build argv per role, pinned flag by flag, and the planning rules.

The flags are those of NVIDIA/TensorRT-LLM `tensorrt_llm/commands/build.py` (read at 65f1d15 and 008b2b8) and
the recipe in `examples/draft_target_model/README.md`; the builder's own adjustments are in
`specbuild.contract.build_rules` (from `tensorrt_llm/builder.py`)."""

from __future__ import annotations

import pytest
from fakes.build_fixtures import fake_checkpoint, make_spec

from specbuild.engines.flags import FLAG_NAMES, FORBIDDEN, trtllm_argv
from specbuild.engines.plan import check_consistent, plan_role
from specbuild.engines.stage import dry_run, plan_build
from specbuild.errors import ArtifactError, BuildError, SpecError


def flags_of(argv: list[str]) -> dict[str, str | None]:
    """{flag: value or None for switches}; fails on a repeated flag."""
    out: dict[str, str | None] = {}
    i = 1
    while i < len(argv):
        flag = argv[i]
        assert flag.startswith("--") and flag not in out, argv
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[flag], i = argv[i + 1], i + 2
        else:
            out[flag], i = None, i + 1
    return out


def argv_for(spec, role):
    plan = plan_role(spec, role, require_checkpoint=False)
    return trtllm_argv(plan, "trtllm-build", str(plan.engine_dir)), plan


def test_target_argv_flag_by_flag(tmp_path):
    spec = make_spec(tmp_path)
    argv, plan = argv_for(spec, "target")
    assert argv[0] == "trtllm-build"
    engine = str(plan.engine_dir)
    assert flags_of(argv) == {
        "--checkpoint_dir": str(spec.pair_dir / "target" / "checkpoint"),
        "--output_dir": engine,
        "--max_batch_size": "4",
        "--max_input_len": "1024",
        "--max_seq_len": "2048",
        "--max_num_tokens": "8192",
        "--max_beam_width": "1",
        "--kv_cache_type": "paged",
        "--context_fmha": "enable",
        "--use_paged_context_fmha": "enable",
        "--remove_input_padding": "enable",
        "--gpt_attention_plugin": "auto",
        "--gemm_plugin": "auto",
        "--speculative_decoding_mode": "draft_tokens_external",
        "--max_draft_len": "4",
        "--output_timing_cache": engine + "/model.cache",
        "--log_level": "info",
    }


def test_draft_argv_flag_by_flag(tmp_path):
    spec = make_spec(tmp_path)
    argv, plan = argv_for(spec, "draft")
    flags = flags_of(argv)
    assert "--speculative_decoding_mode" not in flags and "--max_draft_len" not in flags
    assert "--gather_generation_logits" not in flags  # greedy deployment: no draft logits
    assert flags["--use_paged_context_fmha"] == "enable" and flags["--kv_cache_type"] == "paged"
    assert flags["--output_timing_cache"] == str(plan.engine_dir) + "/model.cache"
    # the same limits as the target's argv
    target = flags_of(argv_for(spec, "target")[0])
    for key in ("--max_batch_size", "--max_input_len", "--max_seq_len", "--max_num_tokens", "--max_beam_width"):
        assert flags[key] == target[key]


def test_draft_gets_generation_logits_only_when_sampling_with_draft_logits(tmp_path):
    spec = make_spec(tmp_path, speculative={"use_draft_logits": True})
    draft = flags_of(argv_for(spec, "draft")[0])
    target = flags_of(argv_for(spec, "target")[0])
    assert draft["--gather_generation_logits"] is None  # a switch
    assert "--gather_generation_logits" not in target


def test_never_gather_context_logits_and_only_table_flags(tmp_path):
    spec = make_spec(tmp_path, speculative={"use_draft_logits": True, "max_draft_len": 8, "num_draft_tokens": 8})
    for role in ("target", "draft"):
        flags = flags_of(argv_for(spec, role)[0])
        assert not set(flags) & set(FORBIDDEN)
        assert set(flags) <= set(FLAG_NAMES)


def test_workers_only_for_multi_gpu(tmp_path):
    single = flags_of(argv_for(make_spec(tmp_path), "target")[0])
    assert "--workers" not in single
    spec = make_spec(tmp_path, build={"tp_size": 2}, gpu={"count": 2})
    assert flags_of(argv_for(spec, "target")[0])["--workers"] == "2"


def test_expected_build_config_accounts_for_the_builder(tmp_path):
    spec = make_spec(
        tmp_path,
        build={"max_batch_size": 64, "max_input_len": 256, "max_seq_len": 384, "max_num_tokens": 256},
        speculative={"max_draft_len": 7, "num_draft_tokens": 5},
    )
    target = plan_role(spec, "target", require_checkpoint=False).expected_build_config()
    draft = plan_role(spec, "draft", require_checkpoint=False).expected_build_config()
    assert target["max_seq_len"] == 384 + 7 and draft["max_seq_len"] == 384
    # both raised to max_seq_len - 1 (the runtime's input limit); the target further to batch * (K + 1)
    assert target["max_num_tokens"] == 64 * (7 + 1) and draft["max_num_tokens"] == 383
    assert target["speculative_decoding_mode"] == "draft_tokens_external" and target["max_draft_len"] == 7
    assert draft["speculative_decoding_mode"] == "none" and draft["max_draft_len"] == 0


def test_max_num_tokens_is_clipped_like_trtllm_build_and_noted(tmp_path):
    spec = make_spec(
        tmp_path, build={"max_batch_size": 1, "max_input_len": 100, "max_seq_len": 512, "max_num_tokens": 8192}
    )
    plan = plan_role(spec, "draft", require_checkpoint=False)
    assert plan.limits.max_num_tokens == 512
    assert plan.notes and "8192 -> 512" in plan.notes[0]


def test_max_input_len_above_max_seq_len_is_refused(tmp_path):
    spec = make_spec(tmp_path)
    bad = spec.__class__(**{**spec.__dict__, "build": spec.build.__class__(max_input_len=4096, max_seq_len=2048)})
    with pytest.raises(SpecError, match="max_input_len = 4096 is above build.max_seq_len = 2048"):
        plan_role(bad, "target", require_checkpoint=False)


@pytest.mark.parametrize("k, message", [(0, "at least 1 draft token"), (1025, "above the generation budget")])
def test_max_draft_len_zero_or_beyond_the_budget_is_refused(tmp_path, k, message):
    spec = make_spec(tmp_path)
    bad = spec.__class__(
        **{**spec.__dict__, "speculative": spec.speculative.__class__(max_draft_len=k, num_draft_tokens=0)}
    )
    with pytest.raises(SpecError, match=message):
        plan_role(bad, "target", require_checkpoint=False)


def test_draft_limits_disagreeing_with_target_are_refused(tmp_path):
    spec = make_spec(tmp_path)
    target = plan_role(spec, "target", require_checkpoint=False)
    with pytest.raises(BuildError, match="draft max_seq_len = 4096 disagrees with the target's 2048"):
        check_consistent(target, {"max_batch_size": 4, "max_input_len": 1024, "max_seq_len": 4096})
    check_consistent(target, plan_role(spec, "draft", require_checkpoint=False))  # same spec: fine


def test_missing_checkpoint_and_foreign_manifest(tmp_path):
    spec = make_spec(tmp_path)
    with pytest.raises(ArtifactError, match="Run `specbuild convert` first"):
        plan_build(spec, ["target"])
    fake_checkpoint(spec, "target", manifest=False)
    with pytest.raises(ArtifactError, match="has no manifest.json"):
        plan_build(spec, ["target"])
    fake_checkpoint(spec, "target", pair="another-pair")
    with pytest.raises(ArtifactError, match="belongs to pair 'another-pair'"):
        plan_build(spec, ["target"])


def test_int8_kv_cache_checkpoint_is_refused(tmp_path):
    spec = make_spec(tmp_path)
    fake_checkpoint(spec, "draft", kv_cache_quant_algo="INT8")
    with pytest.raises(BuildError, match="INT8 KV cache.*paged context FMHA"):
        plan_build(spec, ["draft"])


@pytest.mark.parametrize(
    "quant_algo, gpu", [(None, "H100-80GB"), ("W4A16_AWQ", "H100-80GB"), ("W8A16", "L40S"), ("FP8", "A100-80GB")]
)
def test_fp8_kv_cache_checkpoint_the_builder_would_downgrade_is_refused(tmp_path, quant_algo, gpu):
    # builder.py turns paged context FMHA off for an FP8 KV cache unless the weights are FP8/W4A8_AWQ/NVFP4 on SM89+
    spec = make_spec(tmp_path, gpu={"name": gpu})
    fake_checkpoint(spec, "target", quant_algo=quant_algo, kv_cache_quant_algo="FP8")
    with pytest.raises(BuildError, match="would lose paged context FMHA: an FP8 KV cache") as err:
        plan_build(spec, ["target"])
    assert 'target.kv_cache = "none"' in str(err.value)


@pytest.mark.parametrize("quant_algo", ["FP8", "W4A8_AWQ"])
def test_fp8_kv_cache_with_fp8_activations_on_sm89_is_planned(tmp_path, quant_algo):
    spec = make_spec(tmp_path, gpu={"name": "L40S"})
    fake_checkpoint(spec, "target", quant_algo=quant_algo, kv_cache_quant_algo="FP8")
    assert plan_build(spec, ["target"])[0].kv_cache_quant_algo == "FP8"


def test_dry_run_refuses_a_spec_whose_fp8_kv_cache_the_builder_would_drop(tmp_path):
    spec = make_spec(tmp_path, target={"quantization": "int4_awq", "kv_cache": "fp8"})
    with pytest.raises(BuildError, match="the target's spec would lose paged context FMHA"):
        plan_role(spec, "target", require_checkpoint=False)


def test_max_num_tokens_is_raised_to_the_longest_input_the_loop_sends(tmp_path):
    # trtGptModel.h: maxInputLen = min(maxSequenceLen - 1, maxNumTokens) with context FMHA and packed input; the
    # BLS re-sends prompt + generated tokens every step, so inputs reach max_seq_len - 1 tokens.
    from specbuild.contract.build_rules import runtime_max_input_len

    spec = make_spec(
        tmp_path, build={"max_batch_size": 2, "max_input_len": 100, "max_seq_len": 4096, "max_num_tokens": 1024}
    )
    for role in ("target", "draft"):
        plan = plan_role(spec, role, require_checkpoint=False)
        built = plan.expected_build_config()
        assert runtime_max_input_len(built["max_seq_len"], built["max_num_tokens"]) >= 4096 - 1
        assert plan.limits.max_num_tokens == 4095 and "1024 -> 4095 (max_seq_len - 1" in plan.notes[0]
        assert flags_of(trtllm_argv(plan, "trtllm-build", "/tmp/x"))["--max_num_tokens"] == "4095"


def test_checkpoint_sharding_must_match_the_spec(tmp_path):
    spec = make_spec(tmp_path)
    fake_checkpoint(spec, "target", world_size=2)
    with pytest.raises(BuildError, match="world_size 2"):
        plan_build(spec, ["target"])


def test_dry_run_needs_no_checkpoint_and_reads_one_when_present(tmp_path):
    spec = make_spec(tmp_path)
    doc = dry_run(spec, ["target", "draft"], "trtllm")
    assert [e["role"] for e in doc["engines"]] == ["target", "draft"]
    assert all(not e["checkpoint_ready"] for e in doc["engines"])
    fake_checkpoint(spec, "target", quant_algo="FP8")
    doc = dry_run(spec, ["target"], "reference")
    assert doc["engines"][0]["checkpoint_ready"] and doc["engines"][0]["argv"] is None


@pytest.mark.parametrize(
    "version, warned", [("1.2.1", False), ("1.2.0rc3", False), ("1.1.0", True), ("1.20.0", True), (None, True)]
)
def test_trtllm_version_is_checked(version, warned):
    from specbuild.engines.flags import trtllm_version_note

    note = trtllm_version_note(version)
    assert (note is not None) == warned
    if warned:
        assert "1.2.1" in note
