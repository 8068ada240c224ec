"""The chart's own pods, run here: the commands, arguments, ports and probe paths of the rendered build Job and
Deployment (CPU values: the reference backend, no GPU), each container path mapped to a folder of this test, against
a real tritonserver. What a cluster would run, minus the cluster: the Job builds, the init containers wait and write
the repository, `serve` becomes ready on the probe's path and port, the Service names its ports, and SIGTERM lets a
stream in flight finish within the pod's grace period.

One change to what the pod runs: `--host 0.0.0.0` (every interface, as a pod needs) becomes 127.0.0.1, since a test
server binds loopback only."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from deploy_support import by_kind, deploy, render
from test_triton_drain import Serving

from specbuild.triton.server import free_ports

pytestmark = [pytest.mark.server, pytest.mark.slow]
HANG_S = 300.0  # no step may take longer: a deadline against hanging, not an aim


class Pod:
    """The container paths of the rendered pods, each mapped to a folder of the test (as the volumes would be)."""

    def __init__(self, root: Path, mounts: list[dict], claim_key: str, configmap: dict, models: dict[str, Path]):
        self.local: dict[str, Path] = {}
        for mount in mounts:
            name, path, sub = mount["name"], mount["mountPath"], mount.get("subPath", "")
            if name == "spec":
                folder = root / "etc"
            elif name == "models":
                folder = root / "models"
                folder.mkdir(parents=True, exist_ok=True)
                for role, source in models.items():
                    if not (folder / role).exists():
                        (folder / role).symlink_to(source, target_is_directory=True)
            elif name == "engines":
                assert sub.startswith(claim_key), sub  # engines live under the build key on the claim
                folder = root / "claim" / sub
            else:  # emptyDirs (run, shm)
                folder = root / name
            folder.mkdir(parents=True, exist_ok=True)
            self.local[path] = folder
        # the longest container path first, matched only where a path starts
        starts = "|".join(re.escape(p) for p in sorted(self.local, key=len, reverse=True))
        self._pattern = re.compile(r"(?<![\w/.-])(" + starts + r")(?=/|$|'|\"|\s)")
        for key, text in configmap["data"].items():  # the spec names container paths: here, the test's folders
            (self.local["/etc/specbuild"] / key).write_text(self.path(text))

    def path(self, text: str) -> str:
        return self._pattern.sub(lambda m: str(self.local[m.group(1)]), text)

    def argv(self, command: list[str], args: list[str] = ()) -> list[str]:
        argv = [self.path(part).replace("0.0.0.0", "127.0.0.1") for part in [*command, *args]]
        return [sys.executable, "-m", "specbuild", *argv[1:]] if argv[0] == "specbuild" else argv


def _run(argv: list[str], what: str) -> None:
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=HANG_S, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert done.returncode == 0, f"{what} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except Exception:  # noqa: BLE001 - not answering yet
        return 0


def rendered_pods(tmp_path, example_tiny, tiny_spec_path, values: dict | None = None):
    """The chart for the tiny pair (free ports, the reference backend), rendered with CPU values; its build Job and
    init containers run here, as a cluster would run them first. Returns (the serve container, the pod spec, the
    Service, the ports by name, the Pod mapping, the build key)."""
    http, grpc, metrics = free_ports("127.0.0.1", 3)
    text = tiny_spec_path.read_text()
    for key, port in (("http_port", http), ("grpc_port", grpc), ("metrics_port", metrics)):
        text = re.sub(rf"(?m)^{key} = \d+", f"{key} = {port}", text)
    tiny_spec_path.write_text(text)
    chart = tmp_path / "chart"
    result = deploy("-c", str(tiny_spec_path), "--backend", "reference", "--out-dir", str(chart))
    assert result.exit_code == 0, result.output
    kinds = by_kind(render(chart, {"gpu": {"enabled": False}, **(values or {})}))
    job, deployment = kinds["Job"][0], kinds["Deployment"][0]
    service, configmap = kinds["Service"][0], kinds["ConfigMap"][0]
    pod = deployment["spec"]["template"]["spec"]
    serve = pod["containers"][0]
    key = deployment["spec"]["template"]["metadata"]["annotations"]["specbuild.dev/build-key"]
    mapped = Pod(
        tmp_path / "pod",
        serve["volumeMounts"],
        key,
        configmap,
        {"target": example_tiny.target, "draft": example_tiny.draft},
    )

    # the build Job, then the init containers in order: wait for the build's manifests, write the repository
    builder = job["spec"]["template"]["spec"]["containers"][0]
    assert {m["mountPath"] for m in builder["volumeMounts"]} <= set(mapped.local)
    _run(mapped.argv(builder["command"], builder.get("args", [])), "the build Job")
    for init in pod["initContainers"]:
        _run(mapped.argv(init["command"], init.get("args", [])), f"init container {init['name']}")
    ports = {p["name"]: p["containerPort"] for p in serve["ports"]}
    assert ports == {"http": http, "grpc": grpc, "metrics": metrics}
    return serve, pod, service, ports, mapped, key


def _wait_ready(serving: Serving, url: str) -> None:
    deadline = time.monotonic() + HANG_S
    while _status(url) != 200:
        assert serving.process.poll() is None, f"serve exited {serving.process.returncode}:\n{serving.log()}"
        assert time.monotonic() < deadline, f"not ready within {HANG_S:.0f} s:\n{serving.log()}"
        time.sleep(0.5)


def test_the_rendered_pods_build_serve_and_drain_here(tmp_path, example_tiny, tiny_spec_path):
    from specbuild.triton.client import SpecbuildClient

    serve, pod, service, ports, mapped, key = rendered_pods(tmp_path, example_tiny, tiny_spec_path)
    root = tmp_path / "pod"
    grpc = ports["grpc"]
    # the Service's ports are the container's, by name
    assert {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        name: (port, name) for name, port in ports.items()
    }

    serving = Serving(mapped.argv(serve["command"], serve.get("args", [])), root)
    try:
        ready = pod["containers"][0]["readinessProbe"]["httpGet"]
        live = pod["containers"][0]["livenessProbe"]["httpGet"]
        ready_url = f"http://127.0.0.1:{ports[ready['port']]}{ready['path']}"
        _wait_ready(serving, ready_url)
        assert _status(f"http://127.0.0.1:{ports[live['port']]}{live['path']}") == 200
        # from the probe's first success on, as the kubelet would: Triton answers ready before serve's start-up
        # canary has run, and a SIGTERM then drains too

        # SIGTERM, as the kubelet sends it, with a stream in flight: the stream finishes, serve exits 0 in time
        with SpecbuildClient(f"127.0.0.1:{grpc}") as client:
            chunks = client.generate("def add(a, b):", max_tokens=200, num_draft_tokens=3)
            first = next(chunks)
            serving.process.send_signal(signal.SIGTERM)
            rest = list(chunks)
        final = (rest or [first])[-1]
        assert final.final and final.stats.get("finish_reason") in ("length", "stop"), final
        grace = pod["terminationGracePeriodSeconds"]
        assert serving.process.wait(timeout=grace) == 0, serving.log()  # within the grace period, or the kubelet kills
        assert "drained in" in serving.log(), serving.log()
        assert _status(ready_url) == 0  # nothing answers once it has stopped
    finally:
        serving.close()
    assert len(list((root / "claim" / key / "engines").rglob("manifest.json"))) >= 2  # under the build key


def test_a_supervisor_that_gives_up_ends_the_container(tmp_path, example_tiny, tiny_spec_path):
    """The supervisor's verdict reaches Kubernetes as the container's exit: with the chart's serve.maxRestarts = 0,
    tritonserver killed under the rendered serve command makes the supervisor give up at once, and serve exits
    non-zero (the kubelet then restarts the container; no probe needed)."""
    from specbuild.triton import procfs

    serve, pod, _, ports, mapped, _ = rendered_pods(
        tmp_path, example_tiny, tiny_spec_path, {"serve": {"maxRestarts": 0}}
    )
    assert "--max-restarts=0" in serve["args"]
    serving = Serving(mapped.argv(serve["command"], serve.get("args", [])), tmp_path / "pod")
    try:
        ready = pod["containers"][0]["readinessProbe"]["httpGet"]
        _wait_ready(serving, f"http://127.0.0.1:{ports[ready['port']]}{ready['path']}")
        serving.wait_line("serving; press")  # past the start-up canary: the supervisor watches
        server = next(
            pid
            for pid in procfs.descendants(serving.process.pid)
            if open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[0].endswith(b"tritonserver")
        )
        os.kill(server, signal.SIGKILL)
        code = serving.process.wait(timeout=HANG_S)
        assert code != 0, serving.log()
        assert "giving up" in serving.log(), serving.log()
    finally:
        serving.close()
