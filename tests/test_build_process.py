"""Process handling with a FAKE trtllm-build (tests/fakes/trtllm-build): success, failure midway,
an engine config.json that disagrees, locking, skipping and --force. Nothing here builds a real engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from fakes.build_fixtures import FAKE_TRTLLM_BUILD, fake_checkpoint, make_spec

from specbuild.engines.stage import build_engines
from specbuild.errors import ArtifactError, BuildError


@pytest.fixture
def spec(tmp_path, monkeypatch):
    monkeypatch.delenv("FAKE_TRTLLM_MODE", raising=False)
    monkeypatch.delenv("FAKE_TRTLLM_SLEEP", raising=False)
    spec = make_spec(tmp_path)
    for role in ("target", "draft"):
        fake_checkpoint(spec, role)
    return spec


def build(spec, roles=("target", "draft"), **kwargs):
    return build_engines(spec, list(roles), "trtllm", trtllm_build=str(FAKE_TRTLLM_BUILD), **kwargs)


def leftovers(spec, role):
    return sorted(p.name for p in (spec.pair_dir / role).iterdir() if p.name.startswith(".engine.tmp"))


def test_success_writes_engine_manifest_and_timing_cache_in_the_engine_dir(spec):
    results = build(spec)
    assert [(r["role"], r["status"]) for r in results] == [("target", "ran"), ("draft", "ran")]
    engine = spec.pair_dir / "target" / "engine"
    assert {"config.json", "rank0.engine", "model.cache", "build.log", "manifest.json"} <= {
        p.name for p in engine.iterdir()
    }
    manifest = json.loads((engine / "manifest.json").read_text())
    assert manifest["backend"] == "trtllm" and manifest["role"] == "target" and manifest["pair"] == "pair"
    assert manifest["checkpoint_input_hash"] == "ckpt-hash-1"
    assert manifest["argv"][0] == str(FAKE_TRTLLM_BUILD)
    assert "--speculative_decoding_mode draft_tokens_external --max_draft_len 4" in manifest["argv_text"]
    assert manifest["engine_build_config"]["max_seq_len"] == 2052  # the builder added K
    for key in ("tensorrt_llm", "tensorrt", "cuda", "gpu_name", "gpu_sm", "specbuild"):
        assert key in manifest["tool_versions"]
    assert manifest["tool_versions"]["tensorrt_llm"] is None  # not in this environment: unknown, not invented
    assert "config.json" in manifest["inputs"]["files"]
    log = (engine / "build.log").read_text()
    assert log.startswith("$ ") and "# exit code 0" in log
    assert not leftovers(spec, "target") and not (spec.pair_dir.parent.parent / "model.cache").exists()


def test_failure_midway_leaves_no_engine_dir(spec, monkeypatch):
    monkeypatch.setenv("FAKE_TRTLLM_MODE", "fail-midway")
    with pytest.raises(BuildError) as err:
        build(spec, ["target"])
    message = str(err.value)
    assert "exited with code 1" in message and "out of memory while building rank 1" in message
    assert not (spec.pair_dir / "target" / "engine").exists()
    assert not leftovers(spec, "target")
    kept = spec.pair_dir / "target" / "engine.failed.log"
    assert "Engine rank0 serialized" in kept.read_text() and str(kept) in message


def test_failed_rebuild_keeps_the_previous_engine(spec, monkeypatch):
    build(spec, ["draft"])
    before = (spec.pair_dir / "draft" / "engine" / "manifest.json").read_text()
    monkeypatch.setenv("FAKE_TRTLLM_MODE", "fail-midway")
    with pytest.raises(BuildError):
        build(spec, ["draft"], force=True)
    assert (spec.pair_dir / "draft" / "engine" / "manifest.json").read_text() == before


def test_disagreeing_engine_config_is_refused(spec, monkeypatch):
    monkeypatch.setenv("FAKE_TRTLLM_MODE", "bad-config")
    with pytest.raises(BuildError, match=r"disagrees with what was asked: max_draft_len = 5 \(asked 4\)"):
        build(spec, ["target"])
    assert not (spec.pair_dir / "target" / "engine").exists()


def test_unchanged_inputs_skip_and_force_rebuilds(spec):
    build(spec)
    first = json.loads((spec.pair_dir / "target" / "engine" / "manifest.json").read_text())
    assert [r["status"] for r in build(spec)] == ["skipped", "skipped"]
    assert [r["status"] for r in build(spec, force=True)] == ["ran", "ran"]
    again = json.loads((spec.pair_dir / "target" / "engine" / "manifest.json").read_text())
    assert again["input_hash"] == first["input_hash"] and again["created_unix"] >= first["created_unix"]


def test_changed_checkpoint_or_settings_rebuild(spec, tmp_path):
    build(spec)
    (spec.pair_dir / "target" / "checkpoint" / "rank0.safetensors").write_bytes(b"new weights")
    assert [r["status"] for r in build(spec)] == ["ran", "skipped"]
    bigger = make_spec(tmp_path, speculative={"max_draft_len": 6, "num_draft_tokens": 4})
    assert [r["status"] for r in build(bigger)] == ["ran", "ran"]


def test_building_one_role_checks_the_other_engine(spec, tmp_path):
    build(spec, ["draft"])
    other = make_spec(tmp_path, build={"max_seq_len": 4096})
    with pytest.raises(BuildError, match="disagrees with the target's 4096"):
        build(other, ["target"])


def test_two_builds_at_once_on_the_same_output(spec, monkeypatch):
    # Ctrl-C at a terminal: the process takes SIGINT as KeyboardInterrupt, also when this suite was started in the
    # background by a shell without job control, which starts it with SIGINT ignored (children inherit that)
    code = (
        "import signal, sys\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        f"sys.path.insert(0, {str(FAKE_TRTLLM_BUILD.parent.parent)!r})\n"
        "from fakes.build_fixtures import make_spec, FAKE_TRTLLM_BUILD\n"
        "from pathlib import Path\n"
        "from specbuild.engines.stage import build_engines\n"
        f"spec = make_spec(Path({str(spec.output_dir.parent)!r}))\n"
        "build_engines(spec, ['draft'], 'trtllm', trtllm_build=str(FAKE_TRTLLM_BUILD))\n"
    )
    env = {**os.environ, "FAKE_TRTLLM_SLEEP": "4"}
    first = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not list((spec.pair_dir / "draft").glob(".engine.tmp-*")) and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(ArtifactError, match="is locked by another specbuild process"):
            build(spec, ["draft"])
    finally:
        _, stderr = first.communicate(timeout=60)
    assert first.returncode == 0, stderr
    assert (spec.pair_dir / "draft" / "engine" / "rank0.engine").is_file()


def test_tensor_parallel_engine_needs_every_rank(spec, tmp_path):
    tp = make_spec(tmp_path, build={"tp_size": 2}, gpu={"count": 2})
    fake_checkpoint(tp, "target", world_size=2)
    result = build(tp, ["target"], force=True)[0]
    assert "--workers 2" in result["manifest"]["argv_text"]
    assert {"rank0.engine", "rank1.engine"} <= {p.name for p in (tp.pair_dir / "target" / "engine").iterdir()}


def test_dry_run_predicts_the_input_hash_a_build_records(spec):
    from specbuild.engines.stage import dry_run

    planned = {
        e["role"]: e["input_hash"]
        for e in dry_run(spec, ["target", "draft"], "trtllm", str(FAKE_TRTLLM_BUILD))["engines"]
    }
    assert all(planned.values())
    recorded = {r["role"]: r["manifest"]["input_hash"] for r in build(spec)}
    assert planned == recorded
    assert dry_run(spec, ["target"], "trtllm", None)["engines"][0]["input_hash"] in (None, planned["target"])


def test_ctrl_c_stops_trtllm_build_and_leaves_nothing(spec, tmp_path):
    import signal

    pidfile = tmp_path / "fake.pid"
    # Ctrl-C at a terminal: the process takes SIGINT as KeyboardInterrupt, also when this suite was started in the
    # background by a shell without job control, which starts it with SIGINT ignored (children inherit that)
    code = (
        "import signal, sys\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        f"sys.path.insert(0, {str(FAKE_TRTLLM_BUILD.parent.parent)!r})\n"
        "from fakes.build_fixtures import make_spec, FAKE_TRTLLM_BUILD\n"
        "from pathlib import Path\n"
        "from specbuild.engines.stage import build_engines\n"
        f"spec = make_spec(Path({str(spec.output_dir.parent)!r}))\n"
        "build_engines(spec, ['target'], 'trtllm', trtllm_build=str(FAKE_TRTLLM_BUILD))\n"
    )
    env = {**os.environ, "FAKE_TRTLLM_SLEEP": "60", "FAKE_TRTLLM_PIDFILE": str(pidfile)}
    parent = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(pidfile.read_text())
    parent.send_signal(signal.SIGINT)
    _, stderr = parent.communicate(timeout=30)
    assert parent.returncode != 0 and "KeyboardInterrupt" in stderr
    with pytest.raises(ProcessLookupError):
        for _ in range(100):  # the child is terminated (and reaped by the parent) before it exits
            os.kill(child, 0)
            time.sleep(0.05)
    assert not (spec.pair_dir / "target" / "engine").exists() and not leftovers(spec, "target")


def engine_config(plan, **changes):
    build_config = {
        **plan.expected_build_config(),
        "speculative_decoding_mode": 2 if plan.role == "target" else 1,
        "kv_cache_type": "PAGED",
        "plugin_config": {"use_paged_context_fmha": True, "remove_input_padding": True},
    }
    plugin = changes.pop("plugin_config", {})
    build_config.update(changes)
    build_config["plugin_config"].update(plugin)
    return {
        "version": "1.2.1",
        "pretrained_config": {"quantization": {"quant_algo": plan.quant_algo}},
        "build_config": build_config,
    }


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"plugin_config": {"use_paged_context_fmha": False}}, "plugin_config.use_paged_context_fmha = False"),
        ({"speculative_decoding_mode": 1}, "speculative_decoding_mode = 'none' (asked 'draft_tokens_external')"),
        ({"max_seq_len": 2048}, "max_seq_len = 2048 (asked 2052)"),
        ({"gather_context_logits": True}, "gather_context_logits = True (asked False)"),
        ({"kv_cache_type": "CONTINUOUS"}, "kv_cache_type = 'CONTINUOUS'"),
    ],
)
def test_verify_engine_refuses_what_the_builder_changed(spec, tmp_path, changes, message):
    from specbuild.engines.plan import plan_role
    from specbuild.engines.trtllm import verify_engine

    plan = plan_role(spec, "target")
    (tmp_path / "rank0.engine").write_bytes(b"x")
    (tmp_path / "config.json").write_text(json.dumps(engine_config(plan)))
    assert verify_engine(plan, tmp_path)["speculative_decoding_mode"] == "draft_tokens_external"
    (tmp_path / "config.json").write_text(json.dumps(engine_config(plan, **changes)))
    with pytest.raises(BuildError) as err:
        verify_engine(plan, tmp_path)
    assert message in str(err.value)


def test_verify_engine_accepts_the_mode_as_a_name_and_needs_config_and_ranks(spec, tmp_path):
    from specbuild.engines.plan import plan_role
    from specbuild.engines.trtllm import verify_engine

    plan = plan_role(spec, "target")
    with pytest.raises(BuildError, match="config.json is missing or has no build_config"):
        verify_engine(plan, tmp_path)
    (tmp_path / "config.json").write_text(
        json.dumps(engine_config(plan, speculative_decoding_mode="DRAFT_TOKENS_EXTERNAL"))
    )
    with pytest.raises(BuildError, match="missing rank0.engine"):
        verify_engine(plan, tmp_path)
    (tmp_path / "rank0.engine").write_bytes(b"x")
    verify_engine(plan, tmp_path)
    quantized = json.loads((tmp_path / "config.json").read_text())
    quantized["pretrained_config"]["quantization"]["quant_algo"] = "FP8"
    (tmp_path / "config.json").write_text(json.dumps(quantized))
    with pytest.raises(BuildError, match=r"quant_algo = 'FP8' \(checkpoint None\)"):
        verify_engine(plan, tmp_path)


def test_fake_builder_drops_paged_context_fmha_like_builder_py(spec, tmp_path):
    """The stand-in applies builder.py's rule on its own: FP8 KV cache without FP8 weights, or INT8 KV."""
    cases = [
        ((None, "FP8", "90"), False),
        (("FP8", "FP8", "90"), True),
        (("FP8", "FP8", "86"), False),
        (("W4A8_AWQ", "FP8", "89"), True),
        (("W4A16_AWQ", "FP8", "90"), False),
        (("FP8", "INT8", "90"), False),
        ((None, None, "80"), True),
    ]
    for (quant_algo, kv_algo, sm), kept in cases:
        ckpt = tmp_path / f"ckpt-{quant_algo}-{kv_algo}-{sm}"
        ckpt.mkdir()
        (ckpt / "config.json").write_text(
            json.dumps(
                {
                    "mapping": {"world_size": 1},
                    "quantization": {"quant_algo": quant_algo, "kv_cache_quant_algo": kv_algo},
                }
            )
        )
        out = ckpt / "engine"
        done = subprocess.run(
            [
                sys.executable,
                str(FAKE_TRTLLM_BUILD),
                "--checkpoint_dir",
                str(ckpt),
                "--output_dir",
                str(out),
                "--use_paged_context_fmha",
                "enable",
                "--output_timing_cache",
                str(ckpt / "model.cache"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "FAKE_TRTLLM_SM": sm},
        )
        assert done.returncode == 0, done.stderr
        plugin = json.loads((out / "config.json").read_text())["build_config"]["plugin_config"]
        assert plugin["use_paged_context_fmha"] is kept, (quant_algo, kv_algo, sm)
        assert ("Paged Context FMHA is disabled" in done.stdout) is not kept


def test_engine_built_on_an_older_gpu_than_the_spec_is_refused_with_the_reason(tmp_path, monkeypatch):
    # the spec says L40S (SM89), so the plan accepts FP8 weights + FP8 KV; the build machine is SM86
    spec = make_spec(tmp_path, gpu={"name": "L40S"})
    fake_checkpoint(spec, "target", quant_algo="FP8", kv_cache_quant_algo="FP8")
    monkeypatch.setenv("FAKE_TRTLLM_SM", "86")
    with pytest.raises(BuildError) as err:
        build(spec, ["target"])
    message = str(err.value)
    assert "plugin_config.use_paged_context_fmha = False" in message
    assert (
        "trtllm-build turned paged context FMHA off (an FP8 KV cache keeps paged context FMHA only on SM89+" in message
    )
    assert "cannot take external draft tokens" in message
    assert not (spec.pair_dir / "target" / "engine").exists()
    monkeypatch.setenv("FAKE_TRTLLM_SM", "89")
    assert build(spec, ["target"])[0]["status"] == "ran"


def test_verify_engine_names_the_gpu_when_it_is_known(spec, tmp_path):
    from specbuild.engines.plan import plan_role
    from specbuild.engines.trtllm import verify_engine

    plan = plan_role(spec, "target")
    (tmp_path / "rank0.engine").write_bytes(b"x")
    config = engine_config(plan, plugin_config={"use_paged_context_fmha": False})
    config["pretrained_config"]["quantization"]["kv_cache_quant_algo"] = "FP8"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(BuildError, match=r"an FP8 KV cache with quant_algo none makes trtllm-build turn paged"):
        verify_engine(plan, tmp_path, gpu_sm=90)
