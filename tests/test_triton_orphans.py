"""What a killed `specbuild serve` (or `up`, which runs the same supervisor) leaves behind: its tritonserver
dies with it (parent-death signal) and frees the ports, so the next start works on the same ports and
keeps the previous log; a second serve on busy ports is refused with the holder's PID; a stop that runs
out of time exits 1 and says why; /dev/shm regions of a server killed outright are removed by the next
start."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from triton_helpers import make_deployment, read_ready_document

from specbuild.triton import procfs
from specbuild.triton.server import SHM_ROOT, free_ports

pytestmark = [pytest.mark.fault, pytest.mark.server, pytest.mark.slow]
EXIT_TIMEOUT_S = 10
# A deadline, not an aim: a server left without its serve was gone 4.6-8.7 s later on 2 shared cores (it stops
# within its exit timeout); one still running this long after is an orphan. 90 s is over 10 times the slowest.
ORPHAN_GONE_S = 90


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, example_tiny):
    return make_deployment(tmp_path_factory.mktemp("orphans"), example_tiny)


def _serve(deployment, ports: tuple[int, int, int], *extra: str) -> subprocess.Popen:
    argv = [
        sys.executable,
        "-m",
        "specbuild",
        "serve",
        "-c",
        str(deployment.spec_path),
        "--repo",
        str(deployment.repo),
        "--http-port",
        str(ports[0]),
        "--grpc-port",
        str(ports[1]),
        "--metrics-port",
        str(ports[2]),
        "--exit-timeout",
        str(EXIT_TIMEOUT_S),
        "--json",
        *extra,
    ]
    return subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=deployment.root,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def _gone(pids: list[int], limit: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < limit and any(procfs.alive(p) for p in pids):
        time.sleep(0.1)
    assert not [p for p in pids if procfs.alive(p)], f"still running {limit:.0f} s later: {pids}"
    return time.monotonic() - started


def _prefix(server_pid: int) -> str:
    flag = "--backend-config=python,shm-region-prefix-name="
    return next(a[len(flag) :] for a in procfs.cmdline(server_pid) if a.startswith(flag))


def test_the_server_dies_with_serve_and_the_next_start_gets_the_ports(deployment):
    ports = tuple(free_ports("127.0.0.1", 3))  # three distinct ports, chosen together
    first = _serve(deployment, ports)
    try:
        server = read_ready_document(first)["pid"]
        pids = [server, *procfs.descendants(server)]
        first.kill()  # kill -9: no chance to stop anything
        first.wait(10)
        seconds = _gone(pids, ORPHAN_GONE_S)
        print(f"\nserve killed: tritonserver and its stubs gone after {seconds:.1f} s")
        assert not any(procfs.port_holders("127.0.0.1", port)[0] for port in ports)
    finally:
        for pid in procfs.descendants(first.pid):
            os.kill(pid, signal.SIGKILL)
    second = _serve(deployment, ports, "--once")
    out, err = second.communicate(timeout=600)
    assert second.returncode == 0, err[-3000:]
    document = json.loads(out)
    assert document["status"] == "ready" and document["pid"] != server
    log = deployment.root / ".triton_repo.tritonserver.log"
    assert f" {document['pid']} " in log.read_text()
    assert f" {server} " in (deployment.root / ".triton_repo.tritonserver.log.1").read_text()  # kept, not overwritten


def test_a_second_serve_on_the_same_ports_is_refused_with_the_pid(deployment):
    """Then the first one is stopped while a client holds an idle HTTP keep-alive connection: tritonserver
    waits for it through its whole exit timeout and exits 1, which serve reports as a failed stop."""
    import tritonclient.http as httpclient

    ports = tuple(free_ports("127.0.0.1", 3))  # three distinct ports, chosen together
    first = _serve(deployment, ports)
    client = None
    try:
        server = read_ready_document(first)["pid"]
        log = deployment.root / ".triton_repo.tritonserver.log"
        first_log = log.stat().st_ino
        second = _serve(deployment, ports)
        _, err = second.communicate(timeout=180)  # a deadline: refused in under 1 s when measured
        assert second.returncode == 1
        assert f"HTTP port 127.0.0.1:{ports[0]} is already in use by PID {server} (" in err
        # refused before starting anything: a start would have moved the first server's log aside for its own
        assert log.stat().st_ino == first_log and f" {server} " in log.read_text()
        assert "--http-port 0" in err
        client = httpclient.InferenceServerClient(f"127.0.0.1:{ports[0]}")
        assert client.is_server_ready()  # the connection stays open (keep-alive)
        first.send_signal(signal.SIGTERM)
        started = time.monotonic()
        code = first.wait(EXIT_TIMEOUT_S + 5 + 120)  # a deadline: measured 10.7-11.1 s
        seconds = time.monotonic() - started
        print(f"\nSIGTERM with an idle HTTP client connected: serve exited {code} after {seconds:.1f} s")
        assert code == 1
        err = first.stderr.read()
        # tritonserver gave up by itself ("exited with code 1"), not killed by serve after EXIT_TIMEOUT_S + 5 s
        # ("did not stop within ... and was killed"): what the elapsed time once told, told by serve's words
        assert "Error: tritonserver did not stop cleanly: it exited with code 1" in err
        assert "waiting for open HTTP connections (1 HTTP service connections)" in err
    finally:
        if client is not None:
            client.close()
        if first.poll() is None:
            first.kill()


def test_regions_of_a_server_killed_outright_are_removed_by_the_next_start(deployment):
    first = _serve(deployment, (0, 0, 0))
    try:
        server = read_ready_document(first)["pid"]
        prefix = _prefix(server)
        regions = list(SHM_ROOT.glob(prefix + "*"))
        stubs = [c for c in deployment.repo.glob("*/config.pbtxt") if 'backend: "python"' in c.read_text()]
        assert len(regions) == len(stubs) == 6  # one per Python backend stub (the serving gate's included)
        first.send_signal(signal.SIGSTOP)  # serve cannot react ...
        os.killpg(server, signal.SIGKILL)  # ... while its server and stubs are killed outright
        _gone([p for p in procfs.group_members(server)], 10)
        assert all(region.exists() for region in regions)  # nobody cleaned up
    finally:
        first.kill()
        first.wait(10)
    second = _serve(deployment, (0, 0, 0), "--once")
    _, err = second.communicate(timeout=600)
    assert second.returncode == 0, err[-3000:]
    assert not any(region.exists() for region in regions)
