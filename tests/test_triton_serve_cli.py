"""`specbuild repo` / `specbuild serve` CLI, the tritonserver locator and argv (no server started here)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from specbuild.cli import main
from specbuild.errors import ServeError, ToolNotFoundError
from specbuild.triton.server import ServerOptions, TritonInstall, build_argv, find_tritonserver


def write_spec(tmp_path: Path, name: str = "pair-x") -> Path:
    path = tmp_path / "specbuild.toml"
    path.write_text(
        f'name = "{name}"\n[target]\ncheckpoint = "t"\n[draft]\ncheckpoint = "d"\n'
        "[speculative]\nmax_draft_len = 4\nnum_draft_tokens = 2\n"
    )
    return path


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def fake_engine(
    root: Path, role: str, backend: str = "reference", build_config: dict | None = None, **versions
) -> Path:
    folder = root / "engines" / "pair-x" / role / "engine"
    folder.mkdir(parents=True, exist_ok=True)
    manifest = {"backend": backend, "tool_versions": versions, "build_config": build_config or {}}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_repo_writes_once_then_skips_and_force_rewrites(tmp_path):
    spec = write_spec(tmp_path)
    out = tmp_path / "triton_repo"
    first = run("repo", "-c", str(spec), "--backend", "reference", "--out-dir", str(out), "--json")
    assert first.exit_code == 0, first.output
    doc = json.loads(first.stdout)
    assert doc["skipped"] is False and doc["backend"] == "reference"
    assert (out / "tensorrt_llm_bls" / "config.pbtxt").is_file() and (out / "manifest.json").is_file()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["pair"] == "pair-x" and "checkpoint" not in manifest["spec"]["target"]
    again = run("repo", "-c", str(spec), "--backend", "reference", "--out-dir", str(out), "--json")
    assert json.loads(again.stdout)["skipped"] is True
    forced = run("repo", "-c", str(spec), "--backend", "reference", "--out-dir", str(out), "--json", "--force")
    assert json.loads(forced.stdout)["skipped"] is False
    switched = run("repo", "-c", str(spec), "--backend", "trtllm", "--out-dir", str(out), "--json")
    assert json.loads(switched.stdout)["skipped"] is False
    assert (out / "tensorrt_llm" / "1" / ".gitkeep").is_file() and not (
        out / "tensorrt_llm" / "1" / "model.py"
    ).exists()


def test_repo_dry_run_writes_nothing(tmp_path):
    spec = write_spec(tmp_path)
    result = run(
        "repo", "-c", str(spec), "--out-dir", str(tmp_path / "r"), "--dry-run", "--json", "--backend", "trtllm"
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["backend"] == "trtllm" and "tensorrt_llm/config.pbtxt" in doc["files"]
    assert not (tmp_path / "r").exists()


def test_repo_usage_and_input_errors(tmp_path):
    spec = write_spec(tmp_path)
    bad = run("repo", "-c", str(spec), "--backend", "vllm")
    assert bad.exit_code == 2 and "'vllm' is not one of" in bad.output
    missing = run("repo", "-c", str(tmp_path / "nope.toml"))
    assert missing.exit_code == 1 and "spec file" in missing.output and "not found" in missing.output
    fake_engine(tmp_path, "target", backend="trtllm")
    mixed = run("repo", "-c", str(spec), "--backend", "reference", "--out-dir", str(tmp_path / "r"))
    assert mixed.exit_code == 1
    assert "was built with backend 'trtllm'" in mixed.output and "--backend trtllm" in mixed.output


def test_repo_refuses_engines_built_with_other_limits(tmp_path):
    spec = write_spec(tmp_path)
    fake_engine(tmp_path, "target", build_config={"max_draft_len": 8, "max_batch_size": 4})
    result = run("repo", "-c", str(spec), "--backend", "reference", "--out-dir", str(tmp_path / "r"))
    assert result.exit_code == 1
    assert "was built with max_draft_len = 8, the spec says 4" in result.output and not (tmp_path / "r").exists()
    fake_engine(tmp_path, "target", build_config={"max_draft_len": 4, "max_batch_size": 4})
    fake_engine(tmp_path, "draft", build_config={"max_batch_size": 16})
    result = run("repo", "-c", str(spec), "--backend", "reference", "--out-dir", str(tmp_path / "r"))
    assert result.exit_code == 1 and "draft engine" in result.output and "max_batch_size = 16" in result.output
    fake_engine(tmp_path, "draft", build_config={"max_batch_size": 4})
    assert run("repo", "-c", str(spec), "--backend", "reference", "--out-dir", str(tmp_path / "r")).exit_code == 0


def test_repo_detects_the_built_backend(tmp_path):
    spec = write_spec(tmp_path)
    fake_engine(tmp_path, "target", backend="reference")
    result = run("repo", "-c", str(spec), "--out-dir", str(tmp_path / "r"), "--dry-run", "--json")
    assert json.loads(result.stdout)["backend"] == "reference"


def test_serve_refuses_missing_repo_unbuilt_and_mismatched_engines(tmp_path):
    spec = write_spec(tmp_path)
    no_repo = run("serve", "-c", str(spec), "--repo", str(tmp_path / "triton_repo"))
    assert no_repo.exit_code == 1 and "specbuild repo" in no_repo.output
    assert (
        run("repo", "-c", str(spec), "--backend", "reference", "--out-dir", str(tmp_path / "triton_repo")).exit_code
        == 0
    )
    unbuilt = run("serve", "-c", str(spec), "--repo", str(tmp_path / "triton_repo"))
    assert unbuilt.exit_code == 1
    assert (
        "target engine" in unbuilt.output
        and "is not built" in unbuilt.output
        and "--backend reference" in unbuilt.output
    )
    fake_engine(tmp_path, "target", reference_format="0")
    fake_engine(tmp_path, "draft", reference_format="0")
    old = run("serve", "-c", str(spec), "--repo", str(tmp_path / "triton_repo"))
    assert old.exit_code == 1
    assert "refusing the target engine" in old.output and "reference_format: the engine was built with 0" in old.output
    (tmp_path / "other").mkdir()
    other = write_spec(tmp_path / "other", name="other-pair")
    wrong_pair = run("serve", "-c", str(other), "--repo", str(tmp_path / "triton_repo"))
    assert wrong_pair.exit_code == 1 and "written for pair 'pair-x'" in wrong_pair.output


def test_serve_dry_run_prints_the_argv(tmp_path):
    spec = write_spec(tmp_path)
    run("repo", "-c", str(spec), "--backend", "reference", "--out-dir", str(tmp_path / "triton_repo"))
    result = run(
        "serve", "-c", str(spec), "--repo", str(tmp_path / "triton_repo"), "--dry-run", "--json", "--http-port", "9000"
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["gpu"] is False and doc["http_port"] == 9000 and doc["host"] == "127.0.0.1"
    assert f"--model-repository={(tmp_path / 'triton_repo').resolve()}" in doc["argv"]
    assert doc["engines"]["target"] == str((tmp_path / "engines/pair-x/target/engine").resolve())
    usage = run("serve", "-c", str(spec), "--http-port", "70000")
    assert usage.exit_code == 2


def install(tmp_path: Path) -> TritonInstall:
    return TritonInstall(Path("/opt/tritonserver/bin/tritonserver"), "container", env={"PATH": "/venv/bin"})


RESTRICTED = "shared-memory,logging,trace,model-repository,statistics:specbuild-admin-key=K"


def test_argv_cpu_defaults_are_loopback_with_every_non_inference_api_restricted(tmp_path):
    opts = ServerOptions(repo=tmp_path, http_port=1, grpc_port=2, metrics_port=3)
    argv, env = build_argv(install(tmp_path), opts, "K", "specbuild_0123abcd_")
    assert argv[0] == "/opt/tritonserver/bin/tritonserver"
    for flag in (
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        "--metrics-address=127.0.0.1",
        "--http-port=1",
        "--grpc-port=2",
        "--metrics-port=3",
        "--exit-timeout-secs=30",
        "--model-control-mode=explicit",
        "--load-model=*",  # explicit, for the supervisor's reloads
        "--disable-auto-complete-config",
        f"--http-restricted-api={RESTRICTED}",
        f"--grpc-restricted-protocol={RESTRICTED}",
        "--backend-config=python,shm-region-prefix-name=specbuild_0123abcd_",
    ):
        assert flag in argv, flag
    assert "mpirun" not in argv and "TRTLLM_ORCHESTRATOR" not in env


def test_argv_opens_the_apis_asked_for(tmp_path):
    argv, _ = build_argv(install(tmp_path), ServerOptions(repo=tmp_path, allow_model_control=True), "K")
    group = "shared-memory,logging,trace,statistics:specbuild-admin-key=K"
    assert f"--http-restricted-api={group}" in argv and f"--grpc-restricted-protocol={group}" in argv
    every = ServerOptions(
        repo=tmp_path, open_apis=("shared-memory", "logging", "trace", "statistics"), allow_model_control=True
    )
    assert not any("restricted" in a for a in build_argv(install(tmp_path), every, "K")[0])
    argv, _ = build_argv(install(tmp_path), ServerOptions(repo=tmp_path, models=("preprocessing",)), "K")
    assert "--load-model=preprocessing" in argv and "--load-model=*" not in argv
    with pytest.raises(ServeError, match="cannot open API 'inference'"):
        build_argv(install(tmp_path), ServerOptions(repo=tmp_path, open_apis=("inference",)), "K")


def test_serve_allow_api_is_checked_and_shown_in_the_dry_run(tmp_path):
    spec = write_spec(tmp_path)
    run("repo", "-c", str(spec), "--backend", "reference", "--out-dir", str(tmp_path / "triton_repo"))
    base = ["serve", "-c", str(spec), "--repo", str(tmp_path / "triton_repo"), "--dry-run", "--json"]
    doc = json.loads(run(*base).stdout)
    assert doc["restricted_apis"] == ["shared-memory", "logging", "trace", "model-repository", "statistics"]
    opened = json.loads(run(*base, "--allow-api", "statistics", "--allow-model-control", "--exit-timeout", "7").stdout)
    assert opened["restricted_apis"] == ["shared-memory", "logging", "trace"] and opened["exit_timeout_s"] == 7
    assert "--exit-timeout-secs=7" in opened["argv"]
    bad = run(*base, "--allow-api", "inference")
    assert bad.exit_code == 2 and "'inference' is not one of" in bad.output


def test_argv_gpu_is_the_multi_model_orchestrator_launch(tmp_path):
    argv, env = build_argv(
        install(tmp_path), ServerOptions(repo=tmp_path, gpu=True, gpu_count=2), "K", "specbuild_x1234567_"
    )
    assert argv[:5] == ["mpirun", "--allow-run-as-root", "-n", "1", "/opt/tritonserver/bin/tritonserver"]
    assert argv[-1] == ":"
    assert env["TRTLLM_ORCHESTRATOR"] == "1" and env["TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES"] == "1"
    # NVIDIA's launcher names the region prefix per rank (prefix0_); a per-start prefix is unique per rank too.
    for flag in (
        "--backend-config=python,shm-region-prefix-name=specbuild_x1234567_",
        "--pinned-memory-pool-byte-size=0",
        "--enable-peer-access=false",
        "--cuda-memory-pool-byte-size=0:0",
        "--cuda-memory-pool-byte-size=1:0",
        "--disable-auto-complete-config",
    ):
        assert flag in argv, flag


def test_find_tritonserver(tmp_path, monkeypatch):
    with pytest.raises(ToolNotFoundError, match="not an executable"):
        find_tritonserver(tmp_path / "missing")
    fake = tmp_path / "bin" / "tritonserver"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    assert find_tritonserver(fake).kind == "explicit"
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    found = find_tritonserver()
    assert found.kind == "path" and found.binary == fake


def test_pytriton_server_is_set_up_with_its_libraries_and_stub(monkeypatch, tmp_path):
    pytest.importorskip("pytriton")
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on PATH
    monkeypatch.setenv("SPECBUILD_CACHE_DIR", str(tmp_path / "cache"))
    if Path("/opt/tritonserver/bin/tritonserver").exists():
        pytest.skip("a container tritonserver takes precedence here")
    found = find_tritonserver()
    assert found.kind == "pytriton"
    assert "nvidia_pytriton.libs" in found.env["LD_LIBRARY_PATH"]
    names = {p.name for p in (found.backend_dir / "python").iterdir()}
    assert {"libtriton_python.so", "triton_python_backend_utils.py", "triton_python_backend_stub"} <= names
    assert os.access(found.backend_dir / "python" / "triton_python_backend_stub", os.X_OK)
    assert found.env["PATH"].split(os.pathsep)[0] == str(Path(os.sys.executable).parent)


def test_repo_and_serve_find_the_repository_in_one_default_folder(tmp_path, monkeypatch):
    """Run from elsewhere with a spec in its own folder (as after `make demo`: `serve -c .demo/specbuild.toml`),
    `repo` writes triton_repo beside the spec's output_dir, and `serve` looks there (as `up` does: the same
    specbuild.artifacts.default_repo_dir), not in the current folder, which may hold another repository (the
    checkout's committed one)."""
    project = tmp_path / "project"
    project.mkdir()
    spec = write_spec(project)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "triton_repo").mkdir(parents=True)  # someone else's folder: never used by default
    monkeypatch.chdir(elsewhere)
    expected = (project / "triton_repo").resolve()
    planned = run("repo", "-c", str(spec), "--backend", "reference", "--dry-run", "--json")
    assert planned.exit_code == 0, planned.output
    assert json.loads(planned.stdout)["out_dir"] == str(expected)
    assert run("repo", "-c", str(spec), "--backend", "reference").exit_code == 0
    assert (expected / "manifest.json").is_file() and not any((elsewhere / "triton_repo").iterdir())
    served = run("serve", "-c", str(spec), "--dry-run", "--json")
    assert served.exit_code == 0, served.output
    assert f"--model-repository={expected}" in json.loads(served.stdout)["argv"]


def test_serve_timed_is_checked_shown_in_the_dry_run_and_refused_for_tensorrt_engines(tmp_path, monkeypatch):
    from specbuild.reference.timing import TIMING_ENV

    monkeypatch.setenv(TIMING_ENV, "")  # --timed sets it in this process: restored after the test
    spec = write_spec(tmp_path)
    run("repo", "-c", str(spec), "--backend", "reference", "--out-dir", str(tmp_path / "reference_repo"))
    shown = run(
        "serve",
        "-c",
        str(spec),
        "--repo",
        str(tmp_path / "reference_repo"),
        "--dry-run",
        "--json",
        "--timed",
        "target=20ms,draft=2ms",
    )
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["timed_stand_in"] == "target=20ms,draft=2ms"
    assert os.environ[TIMING_ENV] == "target=20ms,draft=2ms"  # what tritonserver's models inherit
    bad = run("serve", "-c", str(spec), "--repo", str(tmp_path / "reference_repo"), "--dry-run", "--timed", "soon")
    assert bad.exit_code == 2 and "timed stand-in 'soon': give the time per step" in bad.output
    run("repo", "-c", str(spec), "--backend", "trtllm", "--out-dir", str(tmp_path / "trtllm_repo"))
    refused = run("serve", "-c", str(spec), "--repo", str(tmp_path / "trtllm_repo"), "--dry-run", "--timed", "20ms")
    assert refused.exit_code == 2 and "serves TensorRT-LLM engines, which take their own time" in refused.output
