"""The server's housekeeping without a server: busy ports named with their PID, logs rotated, only our own
/dev/shm regions removed, stubs found in /proc, the supervisor's metrics file."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specbuild.errors import ServeError
from specbuild.triton import procfs
from specbuild.triton.housekeeping import SHM_ROOT, refuse_busy_ports, remove_regions, rotate_log
from specbuild.triton.supervisor import SupervisorMetrics, is_decoupled


def test_a_listening_port_is_refused_with_the_pid_holding_it():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        listening, holders = procfs.port_holders("127.0.0.1", port)
        assert listening and os.getpid() in holders
        assert procfs.port_holders("0.0.0.0", port)[0]  # a wildcard bind clashes with it too
        with pytest.raises(ServeError) as err:
            refuse_busy_ports("127.0.0.1", {"http_port": 0, "grpc_port": port})
        message = str(err.value)
        assert f"gRPC port 127.0.0.1:{port} is already in use by PID {os.getpid()} (" in message
        assert "--grpc-port 0" in message
    refuse_busy_ports("127.0.0.1", {"grpc_port": port})  # closed: free again


def test_logs_are_rotated_never_truncated(tmp_path):
    log = tmp_path / ".repo.tritonserver.log"
    rotate_log(log)  # nothing yet: nothing happens
    for run in range(5):
        rotate_log(log, keep=3)
        log.write_text(f"run {run}\n")
    assert log.read_text() == "run 4\n"
    assert [(tmp_path / f"{log.name}.{i}").read_text() for i in (1, 2, 3)] == ["run 3\n", "run 2\n", "run 1\n"]
    assert not (tmp_path / f"{log.name}.4").exists()


@pytest.fixture
def shm_files():
    created: list[Path] = []

    def make(name: str) -> Path:
        path = SHM_ROOT / name
        path.write_bytes(b"x")
        created.append(path)
        return path

    yield make
    for path in created:
        path.unlink(missing_ok=True)


def test_only_regions_with_our_own_prefix_are_removed(shm_files):
    tag = os.urandom(4).hex()
    ours = [shm_files(f"specbuild_{tag}_{i}-uuid") for i in range(2)]
    longer = shm_files(f"specbuild_{tag}9_x")  # another run whose tag starts like ours
    theirs = shm_files(f"triton_python_backend_shm_region_{tag}")
    assert sorted(remove_regions(f"specbuild_{tag}_")) == sorted(p.name for p in ours)
    assert not any(p.exists() for p in ours) and longer.exists() and theirs.exists()
    for bad in ("triton_python_backend_shm_region_", "specbuild_", "specbuild_../../x_"):
        with pytest.raises(ValueError):
            remove_regions(bad)


def test_python_stubs_are_found_by_their_argv_and_zombies_are_dead(tmp_path):
    """A process with a stub's argv (as python_backend's stub_launcher.cc execs it) under a parent that,
    like tritonserver, does not reap it: argv[0] is the stub's path, the program is Python running model.py."""
    model_path = tmp_path / "repo" / "tensorrt_llm_draft" / "1" / "model.py"
    model_path.parent.mkdir(parents=True)
    model_path.write_text("import time\ntime.sleep(60)\n")
    parent_code = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen(sys.argv[1:], executable=sys.executable)\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    argv = [
        str(tmp_path / procfs.STUB_NAME),
        str(model_path),
        "specbuild_abcd1234_u",
        "1048576",
        "1048576",
        "0",
        "/lib",
        "h",
        "tensorrt_llm_draft_0_0",
        "DEFAULT",
    ]
    parent = subprocess.Popen([sys.executable, "-c", parent_code, *argv], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not procfs.python_stubs(parent.pid):
            time.sleep(0.05)
        found = procfs.python_stubs(parent.pid)
        assert [(s.instance, s.model, s.region) for s in found] == [
            ("tensorrt_llm_draft_0_0", "tensorrt_llm_draft", "specbuild_abcd1234_u")
        ]
        os.kill(child, 9)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and procfs.state(child) != "Z":
            time.sleep(0.05)
        assert procfs.state(child) == "Z" and not procfs.alive(child)
        assert procfs.python_stubs(parent.pid) == []
    finally:
        parent.kill()
        parent.wait(10)


def test_metrics_file_is_prometheus_text(tmp_path):
    """Written by prometheus_client after every change, and parsed back by its own text parser."""
    from prometheus_client.parser import text_string_to_metric_families

    metrics = SupervisorMetrics(tmp_path / "sup.prom")
    metrics.add("specbuild_supervisor_failures_total", model="tensorrt_llm_draft", kind="stub_died")
    metrics.add("specbuild_supervisor_failures_total", model="tensorrt_llm_draft", kind="stub_died")
    metrics.set("specbuild_supervisor_recovery_seconds", 2.5, model="tensorrt_llm_draft")
    metrics.set("specbuild_supervisor_serving", 1)
    text = (tmp_path / "sup.prom").read_text()
    assert 'specbuild_supervisor_failures_total{kind="stub_died",model="tensorrt_llm_draft"} 2.0\n' in text
    assert "# TYPE specbuild_supervisor_failures_total counter" in text
    assert 'specbuild_supervisor_recovery_seconds{model="tensorrt_llm_draft"} 2.5\n' in text
    assert "specbuild_supervisor_serving 1.0\n" in text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert (
        samples[("specbuild_supervisor_failures_total", (("kind", "stub_died"), ("model", "tensorrt_llm_draft")))] == 2
    )
    assert metrics.get("specbuild_supervisor_failures_total", kind="stub_died", model="tensorrt_llm_draft") == 2
    assert list(tmp_path.iterdir()) == [tmp_path / "sup.prom"]  # no temporary file left


def test_decoupled_models_are_read_from_their_config(tmp_path):
    (tmp_path / "bls").mkdir()
    (tmp_path / "bls" / "config.pbtxt").write_text('name: "bls"\nmodel_transaction_policy {\n  decoupled: true\n}\n')
    (tmp_path / "llm").mkdir()
    (tmp_path / "llm" / "config.pbtxt").write_text('name: "llm"\nmodel_transaction_policy {\n  decoupled: false\n}\n')
    assert is_decoupled(tmp_path, "bls") and not is_decoupled(tmp_path, "llm") and not is_decoupled(tmp_path, "x")
    repo = Path(__file__).resolve().parents[1] / "triton_repo"
    assert is_decoupled(repo, "tensorrt_llm_bls") and not is_decoupled(repo, "tensorrt_llm")


def test_a_canary_answered_with_a_full_queue_is_busy_not_a_failure(tmp_path):
    """Under load the BLS's queue may be full: it answers the canary UNAVAILABLE "Exceeds maximum queue size".
    The server answered, so that never counts toward a restart; real failures still do."""
    from types import SimpleNamespace

    from specbuild.triton.server import ServerOptions, TritonInstall
    from specbuild.triton.supervisor import Supervisor, SupervisorSettings

    install = TritonInstall(binary=tmp_path / "tritonserver", kind="explicit")
    supervisor = Supervisor(
        ServerOptions(repo=tmp_path),
        install,
        log_path=tmp_path / "server.log",
        settings=SupervisorSettings(canary_failures=2),
    )
    restarts = []
    supervisor._restart = lambda model, detected: restarts.append(model)
    busy = SimpleNamespace(
        model="tensorrt_llm_bls",
        error="tensorrt_llm_bls: Exceeds maximum queue size: 16 requests wait for the 4 this BLS "
        "runs at once; retry later",
    )
    for _ in range(5):
        supervisor._canary_result(busy)
    assert restarts == [] and supervisor.metrics.get("specbuild_supervisor_canary_total", result="busy") == 5
    broken = SimpleNamespace(model="tensorrt_llm_bls", error="tensorrt_llm_bls: Stub process is not healthy.")
    supervisor._canary_result(broken)
    supervisor._canary_result(broken)
    assert restarts == ["tensorrt_llm_bls"]


def test_a_server_that_exits_is_named_with_its_signal_and_log_and_restarts_are_bounded(tmp_path):
    """What the supervisor says when tritonserver went down on its own (a CI machine's server went down with each
    killed stub), and that `--max-restarts` restarts within the window are made, one more gives up."""
    from specbuild.triton.server import ServerOptions, TritonInstall
    from specbuild.triton.supervisor import Supervisor, SupervisorSettings

    install = TritonInstall(binary=tmp_path / "tritonserver", kind="explicit")
    supervisor = Supervisor(
        ServerOptions(repo=tmp_path),
        install,
        log_path=tmp_path / "server.log",
        settings=SupervisorSettings(max_restarts=2),
    )
    (tmp_path / "server.log").write_text("I1203 loading\nE1203 pb_stub.cc:123] Failed to process the request\n")
    crashed = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"])
    crashed.wait(30)
    message = supervisor._exit_message(crashed)
    assert message == (
        "tritonserver exited with code -11 (SIGSEGV); last lines of its log:\n"
        "I1203 loading\nE1203 pb_stub.cc:123] Failed to process the request"
    )
    assert (
        supervisor._exit_message(None) == "tritonserver exited with code None; last lines of its log:\n"
        "I1203 loading\nE1203 pb_stub.cc:123] Failed to process the request"
    )

    starts = []
    supervisor.handle.stop = lambda graceful=True: None
    supervisor._start = lambda timeout: starts.append(timeout)
    supervisor.handle.process = crashed
    supervisor._restart("tritonserver", time.monotonic())
    supervisor._restart("tritonserver", time.monotonic())
    assert len(starts) == 2
    with pytest.raises(ServeError, match="tritonserver needed 2 restarts within 600 s; giving up"):
        supervisor._restart("tritonserver", time.monotonic())
    assert len(starts) == 2
