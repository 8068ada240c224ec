"""A chaos soak: concurrent greedy and seeded streams through `specbuild serve` while faults rotate (`make soak`).

    python scripts/soak.py -c specbuild.toml --minutes 30 --streams 4 --fault-every 20 --json

`serve` is started on free loopback ports (kept across its restarts). Each stream is one of specbuild's clients
(`SpecbuildClient`, which resumes a stream cut by a restart) sending, in turn, a prompt of PROMPTS greedy or sampled
with a seed; every output is compared with the same request's output before any fault: a greedy one must equal it, a
seeded one may differ (a step a fault ran on the target alone, or another schedule, draws other random numbers; its
distribution is still the target's) and is counted. Every `--fault-every` seconds the next fault of FAULTS: a model's
process killed (the draft, the target, pre- and postprocessing, the BLS), the draft's and the target's frozen
(SIGSTOP), a burst of malformed requests, a client that disconnects mid-stream, and SIGTERM to `serve` then a new
`serve` on the same ports. A request refused while the server is not ready (stopping, starting, restarting: what a
load balancer would send elsewhere) is tried again after 0.5 s and counted as refused, not failed. A seeded stream cut
by a restart whose replay draws other numbers ends with the client's refusal to go on: counted apart
(`seeded_unresumable`), an error the client sees though nothing the request needs was lost.

Reported (`--json`: one document): requests, failed ones with their errors, outputs that differ, the longest pause a
stream saw (between two of its chunks, or before its first), the faults done, and the server's memory (RSS), file
descriptors, threads, shared-memory regions and processes at the start (after a warm-up of a sixth of the run) and at
the end, with their growth; and the processes left once `serve` has stopped. Exit 1 when a request failed (but for
`seeded_unresumable`), a greedy output differed or a process was left. The suite runs a short one
(tests/test_soak.py); the aims and the 30-minute runs' figures are in docs/triton.md ("The chaos soak").
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from specbuild.artifacts import default_repo_dir
from specbuild.config import load_spec
from specbuild.errors import ClientError
from specbuild.triton import procfs
from specbuild.triton.client import SpecbuildClient
from specbuild.triton.server import SHM_ROOT

PROMPTS = ["def add(a, b):", "# Copyright", "import os\nimport sys\n", "class Parser:", '{"name": ']
FAULTS = (
    "kill tensorrt_llm_draft",
    "kill tensorrt_llm",
    "freeze tensorrt_llm_draft",
    "malformed burst",
    "kill preprocessing",
    "freeze tensorrt_llm",
    "client disconnect",
    "kill postprocessing",
    "kill tensorrt_llm_bls",
    "restart serve",
)
DOWN = ("draining", "cannot reach", "failed to connect", "Connection refused", "no response from")
# A seeded stream cut by a restart and sent again may draw other numbers (a step a fault ran on the target alone, or
# another schedule): the client refuses to go on rather than send other text (triton.client.resume_stream).
UNRESUMABLE = ("resumed stream differs", "cannot be resumed")


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class Serve:
    """`specbuild serve --json` as a subprocess on fixed ports: started, stopped (SIGTERM), started again."""

    def __init__(self, spec: Path, repo: Path, ports: list[int]):
        self.spec, self.repo, self.ports = spec, repo, ports
        self.process: subprocess.Popen | None = None
        self.document: dict = {}
        self.log = (
            repo.parent / f".{repo.name}.soak-serve.log"
        )  # serve's stderr, every start appended: an exit says why

    def start(self, timeout: float = 600.0) -> None:
        http, grpc, metrics = self.ports
        argv = [sys.executable, "-m", "specbuild", "serve", "-c", str(self.spec), "--repo", str(self.repo)]
        argv += ["--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics), "--json"]
        argv += ["--max-restarts", "100"]
        with open(self.log, "a") as log:
            self.process = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
            )
        lines, deadline = [], time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                raise SystemExit(f"serve exited ({self.process.wait()}) before it was ready")
            lines.append(line)
            if line.rstrip() == "}":
                self.document = json.loads("".join(lines))
                return
        raise SystemExit(f"serve was not ready within {timeout:.0f} s")

    def stop(self, timeout: float = 120.0) -> tuple[int | None, list[int]]:
        """SIGTERM; (serve's exit code, the processes of it still alive once it returned)."""
        if self.process is None or self.process.poll() is not None:
            return (self.process.returncode if self.process else None), []
        processes = [self.process.pid, *procfs.descendants(self.process.pid)]
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
        left = [pid for pid in processes if procfs.alive(pid)]
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        return code, left

    def log_tail(self, lines: int = 15) -> list[str]:
        try:
            return self.log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return []

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.ports[1]}"

    def server_pid(self) -> int | None:
        if self.process is None:
            return None
        for pid in procfs.descendants(self.process.pid):
            if any(a.startswith("--model-repository=") for a in procfs.cmdline(pid)) and procfs.alive(pid):
                return pid
        return None

    def resources(self) -> dict[str, int]:
        """RSS (KiB), file descriptors and threads of the server and its stubs; its shared-memory regions; processes."""
        pids = [p for p in procfs.descendants(self.process.pid) if procfs.alive(p)] if self.process else []
        figures = {"rss_kib": 0, "fds": 0, "threads": 0, "processes": len(pids)}
        for pid in pids:
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                figures["fds"] += len(os.listdir(f"/proc/{pid}/fd"))
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("VmRSS:"):
                    figures["rss_kib"] += int(line.split()[1])
                elif line.startswith("Threads:"):
                    figures["threads"] += int(line.split()[1])
        server = self.server_pid()
        flag = "--backend-config=python,shm-region-prefix-name="
        prefix = next((a[len(flag) :] for a in procfs.cmdline(server) if a.startswith(flag)), None) if server else None
        figures["shm_regions"] = len(list(SHM_ROOT.glob(prefix + "*"))) if prefix else 0
        return figures


class Soak:
    def __init__(self, serve: Serve, streams: int, max_tokens: int):
        self.serve, self.streams, self.max_tokens = serve, streams, max_tokens
        self.reference: dict[tuple[str, int | None], str] = {}
        self.lock = threading.Lock()
        self.requests = self.refused = self.resumed = 0
        self.failures: list[str] = []
        self.unresumable: list[str] = []  # seeded streams cut and sent again whose replay drew other numbers
        self.differed: list[str] = []  # greedy outputs unlike the fault-free run's: must not happen
        self.sampled_differed: list[str] = []  # seeded ones: a fault's target-only step draws other numbers
        self.longest_pause = 0.0
        self.faults: list[dict] = []
        self.stop = threading.Event()

    def kinds(self) -> list[tuple[str, int | None]]:
        return [(prompt, seed) for prompt in PROMPTS for seed in (None, 7)]  # greedy, and sampled with a seed

    def one(self, client: SpecbuildClient, prompt: str, seed: int | None) -> tuple[str, float, int]:
        sampling = {"temperature": 0.8, "seed": seed} if seed is not None else {}
        last, pause, text, resumed = time.monotonic(), 0.0, [], 0
        for chunk in client.generate(prompt, max_tokens=self.max_tokens, num_draft_tokens=2, **sampling):
            now = time.monotonic()
            pause, last = max(pause, now - last), now
            text.append(chunk.text)
            resumed = chunk.stats.get("resumed", resumed) if chunk.final else resumed
        return "".join(text), pause, resumed

    def worker(self, index: int) -> None:
        kinds = self.kinds()
        turn = index
        while not self.stop.is_set():
            prompt, seed = kinds[turn % len(kinds)]
            turn += 1
            try:
                with SpecbuildClient(self.serve.grpc, resume_s=300) as client:
                    text, pause, resumed = self.one(client, prompt, seed)
            except ClientError as err:
                down = any(marker in str(err) for marker in DOWN) or not self.ready()
                unresumable = seed is not None and any(marker in str(err) for marker in UNRESUMABLE)
                with self.lock:
                    if down:
                        self.refused += 1
                    elif unresumable:
                        self.requests += 1
                        self.unresumable.append(f"{prompt!r} seed={seed}: {err}")
                    else:
                        self.requests += 1
                        self.failures.append(f"{prompt!r} seed={seed}: {err}")
                time.sleep(0.5)  # as a client would before it tries again
                continue
            with self.lock:
                self.requests += 1
                self.resumed += resumed
                self.longest_pause = max(self.longest_pause, pause)
                if text != self.reference[prompt, seed]:
                    (self.differed if seed is None else self.sampled_differed).append(f"{prompt!r} seed={seed}")

    def ready(self) -> bool:
        """The server says it is ready (a failure while it is not is a refusal while down, not a failure)."""
        with SpecbuildClient(self.serve.grpc) as client:
            return client.is_ready()

    def fault(self, name: str) -> None:
        action, _, model = name.partition(" ")
        server = self.serve.server_pid()
        if action in ("kill", "freeze") and server is not None:
            stubs = [s for s in procfs.python_stubs(server) if s.model == model]
            for stub in stubs[:1]:
                os.kill(stub.pid, signal.SIGKILL if action == "kill" else signal.SIGSTOP)
        elif name == "malformed burst":
            malformed_burst(self.serve.grpc)
        elif name == "client disconnect":
            with SpecbuildClient(self.serve.grpc) as client:
                chunks = client.generate(PROMPTS[0], max_tokens=self.max_tokens)
                for _, _ in zip(range(2), chunks, strict=False):
                    pass
                chunks.close()  # the client goes away mid-stream
        elif name == "restart serve":
            code, left = self.serve.stop()
            if code != 0 or left:
                self.failures.append(f"serve stopped with {code}, processes left {left}")
            self.serve.start()

    def run(self, minutes: float, fault_every: float) -> dict:
        with SpecbuildClient(self.serve.grpc) as client:
            for prompt, seed in self.kinds():
                self.reference[prompt, seed] = self.one(client, prompt, seed)[0]
        workers = [threading.Thread(target=self.worker, args=(i,), daemon=True) for i in range(self.streams)]
        for thread in workers:
            thread.start()
        started = time.monotonic()
        end = started + 60 * minutes
        warm = started + 60 * minutes / 6
        first = None
        next_fault, rotation = started + fault_every, 0
        while time.monotonic() < end:
            if first is None and time.monotonic() >= warm:
                first = self.serve.resources()
            if time.monotonic() >= next_fault:
                name = FAULTS[rotation % len(FAULTS)]
                rotation += 1
                at = time.monotonic() - started
                self.fault(name)
                self.faults.append({"at_s": round(at, 1), "fault": name})
                next_fault += fault_every
            time.sleep(0.2)
        self.stop.set()
        for thread in workers:
            thread.join(600)
        last = self.serve.resources()
        code, left = self.serve.stop()
        first = first or last
        growth = {k: (last[k] - first[k]) / first[k] if first[k] else 0.0 for k in first}
        return {
            "minutes": minutes,
            "streams": self.streams,
            "fault_every_s": fault_every,
            "requests": self.requests,
            "failed": len(self.failures),
            "failures": self.failures[:20],
            "seeded_unresumable": len(self.unresumable),
            "unresumable": self.unresumable[:10],
            "refused_while_down": self.refused,
            "resumed": self.resumed,
            "greedy_differing": len(self.differed),
            "differing": self.differed[:20],
            "sampled_differing": len(self.sampled_differed),
            "longest_pause_s": round(self.longest_pause, 2),
            "faults": self.faults,
            "resources_start": first,
            "resources_end": last,
            "growth": {k: round(v, 3) for k, v in growth.items()},
            "serve_exit": code,
            "serve_log": str(self.serve.log),
            "serve_log_tail": [] if code == 0 else self.serve.log_tail(),  # what serve said before it exited
            "processes_left": left,
        }


def malformed_burst(url: str, count: int = 20) -> None:
    """Requests the BLS must refuse (answers ignored): wrong types, bad UTF-8, huge and negative values."""
    import tritonclient.grpc as grpcclient

    rng = np.random.default_rng(0)
    bad = [
        {"text_input": (np.array([[b"\xff\xfe"]], dtype=object), "BYTES")},
        {"text_input": (np.array([[b"x" * 100_000]], dtype=object), "BYTES")},
        {"max_tokens": (np.array([[-5]], np.int32), "INT32")},
        {"max_tokens": (np.array([[7]], np.int64), "INT64")},
        {"end_id": (np.array([[10**6]], np.int32), "INT32")},
        {"num_draft_tokens": (np.array([[1000]], np.int32), "INT32")},
    ]
    client = grpcclient.InferenceServerClient(url)
    try:
        client.start_stream(callback=lambda result=None, error=None: None)
        for i in range(count):
            inputs = {
                "text_input": (np.array([[PROMPTS[0].encode()]], dtype=object), "BYTES"),
                "max_tokens": (np.array([[4]], np.int32), "INT32"),
                **bad[int(rng.integers(len(bad)))],
            }
            tensors = []
            for name, (value, datatype) in inputs.items():
                tensors.append(grpcclient.InferInput(name, list(value.shape), datatype))
                tensors[-1].set_data_from_numpy(value)
            client.async_stream_infer("tensorrt_llm_bls", tensors, request_id=f"bad-{i}")
        time.sleep(2)
    finally:
        client.stop_stream()
        client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--config", type=Path, required=True, help="the spec file")
    parser.add_argument("--repo", type=Path, help="the Triton repository (default: where `specbuild repo` writes it)")
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--fault-every", type=float, default=20.0, help="seconds between faults")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)
    repo = args.repo or default_repo_dir(load_spec(args.config).output_dir)
    serve = Serve(args.config, repo, free_ports(3))
    serve.start()
    try:
        report = Soak(serve, args.streams, args.max_tokens).run(args.minutes, args.fault_every)
    finally:
        serve.stop()
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        for key in (
            "requests",
            "failed",
            "seeded_unresumable",
            "refused_while_down",
            "resumed",
            "greedy_differing",
            "sampled_differing",
        ):
            print(f"{key:22} {report[key]}")
        print(f"{'longest pause':22} {report['longest_pause_s']} s")
        print(f"{'faults':22} {len(report['faults'])}")
        for key in report["resources_start"]:
            start, end = report["resources_start"][key], report["resources_end"][key]
            print(f"{key:22} {start} -> {end} ({report['growth'][key]:+.1%})")
        print(f"{'processes left':22} {report['processes_left']}")
        for failure in report["failures"]:
            print(f"failed: {failure}")
    bad = report["failed"] or report["greedy_differing"] or report["processes_left"] or report["serve_exit"] != 0
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
