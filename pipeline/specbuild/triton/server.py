"""Run one `tritonserver` on a model repository: argv, launch, readiness, model control, stop.

On GPU (the trtllm flavour) the argv follows NVIDIA's launch_triton_server.py (NVIDIA/TensorRT-LLM
`triton_backend/scripts/`) in multi-model (orchestrator) mode: `mpirun --allow-run-as-root -n 1
tritonserver ... :` with TRTLLM_ORCHESTRATOR=1, so the orchestrator spawns one MPI worker group per
engine (TP included); world size 1 is the only one allowed with spawned processes.

The control surface (tritonserver 2.51, server src/command_line_parser.cc and src/restricted_features.h):
every API other than health, metadata, model-config and inference is restricted on HTTP
(`--http-restricted-api`) and gRPC (`--grpc-restricted-protocol`) to a header whose value is a random key
made per start and held only by this process (the supervisor uses it to reload models). A client without
it gets HTTP 403 / gRPC UNAVAILABLE "This API is restricted ..."; `open_apis` lifts the restriction.
The gRPC header is the HTTP one prefixed with `triton-grpc-protocol-` (server src/grpc/grpc_server.h).

Housekeeping per start: ports already answering are refused (with the PID holding them); the previous
log is rotated, not truncated; the Python backend's /dev/shm regions get a per-start prefix, so the
regions a killed server leaves behind can be removed without touching anyone else's; the server gets
PR_SET_PDEATHSIG, so it never outlives the process that started it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from specbuild.errors import ServeError
from specbuild.triton import procfs
from specbuild.triton.housekeeping import (  # noqa: F401 (re-exported)
    SHM_PREFIX_START,
    SHM_ROOT,
    refuse_busy_ports,
    remove_regions,
    rotate_log,
)
from specbuild.triton.install import CONTAINER_BINARY, TritonInstall, find_tritonserver  # noqa: F401 (re-exported)

ADMIN_HEADER = "specbuild-admin-key"
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"  # tritonserver prefixes restricted gRPC header names with this
# The APIs restricted unless opened (tritonserver's category names). health, metadata, model-config and
# inference stay open: readiness probes, tritonclient, perf_analyzer and genai-perf need them.
RESTRICTED_APIS = ("shared-memory", "logging", "trace", "model-repository", "statistics")

# The launcher: set PR_SET_PDEATHSIG (prctl option 1, include/uapi/linux/prctl.h) in the child, then exec
# the server. Done in a tiny interpreter rather than a preexec_fn, which is unsafe once threads exist (gRPC
# starts some). The signal goes when the *thread* that forked dies, so start servers from a thread that
# lives as long as they do (the main thread). The ppid check covers a parent that died before the prctl.
# SIGINT/SIGTERM are blocked around the fork (so a stop request cannot land between the fork and the
# bookkeeping) and unblocked in the child before the exec.
_LAUNCHER = (
    "import ctypes, os, signal, sys\n"
    "signal.pthread_sigmask(signal.SIG_SETMASK, [])\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(1)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


class StopRequested(BaseException):
    """SIGINT/SIGTERM arrived while starting or serving: stop, it is not an error."""


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(host, 1)[0]


def free_ports(host: str, count: int) -> list[int]:
    """`count` distinct free ports: every socket stays bound until all are chosen (ports asked one at a time can
    come back the same once the first socket is closed: seen, gRPC and metrics given one port, so tritonserver
    refused to start)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)]
        for s in sockets:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in sockets]


@dataclass
class ServerOptions:
    repo: Path
    host: str = "127.0.0.1"  # loopback unless told otherwise
    http_port: int = 0  # 0 = pick a free port
    grpc_port: int = 0
    metrics_port: int = 0
    allow_model_control: bool = False  # open the model-repository API (same as "model-repository" in open_apis)
    open_apis: tuple[str, ...] = ()  # restricted APIs opened to every client
    models: tuple[str, ...] | None = None  # load only these; None = every model
    gpu: bool = False  # the TensorRT-LLM (multi-model orchestrator) launch
    gpu_count: int = 1
    log_verbose: int = 0
    exit_timeout_s: int = 30  # tritonserver's --exit-timeout-secs: how long a SIGTERM may take

    def restricted_apis(self) -> tuple[str, ...]:
        opened = set(self.open_apis) | ({"model-repository"} if self.allow_model_control else set())
        unknown = opened - set(RESTRICTED_APIS)
        if unknown:
            raise ServeError(f"cannot open API {sorted(unknown)[0]!r}: choose from {', '.join(RESTRICTED_APIS)}.")
        return tuple(api for api in RESTRICTED_APIS if api not in opened)


def build_argv(
    install: TritonInstall, opts: ServerOptions, admin_key: str, shm_prefix: str = "<per-start prefix>"
) -> tuple[list[str], dict[str, str]]:
    """The exact argv (a list, never a shell string) and the extra environment."""
    server = [
        str(install.binary),
        f"--model-repository={Path(opts.repo).resolve()}",
        f"--http-address={opts.host}",
        f"--http-port={opts.http_port}",
        f"--grpc-address={opts.host}",
        f"--grpc-port={opts.grpc_port}",
        f"--metrics-address={opts.host}",
        f"--metrics-port={opts.metrics_port}",
        "--disable-auto-complete-config",
        "--strict-readiness=true",
        "--exit-on-error=true",
        f"--exit-timeout-secs={opts.exit_timeout_s}",
        f"--log-verbose={opts.log_verbose}",
    ]
    if install.backend_dir is not None:
        server.append(f"--backend-directory={install.backend_dir}")
    # Explicit mode always: the supervisor reloads a model whose stub died (the API stays restricted).
    server.append("--model-control-mode=explicit")
    server += [f"--load-model={name}" for name in (opts.models or ("*",))]
    restricted = opts.restricted_apis()
    if restricted:
        group = f"{','.join(restricted)}:{ADMIN_HEADER}={admin_key}"  # syntax <apis>:<header>=<value>
        server += [f"--http-restricted-api={group}", f"--grpc-restricted-protocol={group}"]
    # Per-start region names (default: triton_python_backend_shm_region_<uuid>, python_backend src/python_be.cc).
    server.append(f"--backend-config=python,shm-region-prefix-name={shm_prefix}")
    env = dict(install.env)
    if not opts.gpu:
        return server, env
    server += ["--pinned-memory-pool-byte-size=0", "--enable-peer-access=false"]
    server += [f"--cuda-memory-pool-byte-size={gpu}:0" for gpu in range(opts.gpu_count)]
    env.update({"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"})
    return ["mpirun", "--allow-run-as-root", "-n", "1", *server, ":"], env


@dataclass
class StopResult:
    code: int | None  # the server's exit code (negative: killed by that signal)
    seconds: float
    killed: bool = False  # it did not stop within its exit timeout and got SIGKILL
    removed_regions: list[str] = field(default_factory=list)
    abandoned: str | None = None  # why it was killed before its timeout, with nothing left to wait for

    @property
    def clean(self) -> bool:
        return (self.code == 0 or self.abandoned is not None) and not self.killed

    def describe(self) -> str:
        if self.killed:
            return f"did not stop within {self.seconds:.0f} s and was killed (SIGKILL)"
        if self.abandoned is not None:
            return f"was killed (SIGKILL) after {self.seconds:.1f} s, with nothing left to wait for: {self.abandoned}"
        return f"exited with code {self.code} after {self.seconds:.1f} s"


class ServerHandle:
    """A running tritonserver. `with ServerHandle(opts) as server:` starts it and waits until it is ready;
    leaving the block stops it (SIGTERM, then SIGKILL) with every child."""

    def __init__(self, opts: ServerOptions, install: TritonInstall | None = None, log_path: Path | None = None):
        self.opts = opts
        self.install = install or find_tritonserver()
        self.log_path = Path(log_path) if log_path else Path(opts.repo).resolve().parent / ".tritonserver.log"
        self.process: subprocess.Popen | None = None
        self.pids: list[int] = []
        self.argv: list[str] = []
        self.admin_key = ""  # the restricted APIs' header value for this start; never printed
        self.shm_prefix = ""

    # ---- addresses --------------------------------------------------------------------------------
    @property
    def http_url(self) -> str:
        return f"{self.opts.host}:{self.opts.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.opts.host}:{self.opts.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.opts.host}:{self.opts.metrics_port}/metrics"

    def endpoints(self) -> dict[str, str]:
        return {"http": f"http://{self.http_url}", "grpc": self.grpc_url, "metrics": self.metrics_url}

    @property
    def run_record(self) -> Path:
        return self.log_path.with_name(self.log_path.name + ".run.json")

    # ---- lifecycle ---------------------------------------------------------------------------------
    def start(self, timeout: float = 300.0, should_stop: Callable[[], bool] | None = None) -> ServerHandle:
        ports = {
            "http_port": self.opts.http_port,
            "grpc_port": self.opts.grpc_port,
            "metrics_port": self.opts.metrics_port,
        }
        refuse_busy_ports(self.opts.host, ports)
        wanted = [key for key, value in ports.items() if value == 0]
        for key, port in zip(wanted, free_ports(self.opts.host, len(wanted))):
            setattr(self.opts, key, port)
        self.admin_key, self.shm_prefix = secrets.token_hex(16), f"{SHM_PREFIX_START}{secrets.token_hex(4)}_"
        self.argv, extra_env = build_argv(self.install, self.opts, self.admin_key, self.shm_prefix)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._clean_previous_run()
        rotate_log(self.log_path)
        log = open(self.log_path, "wb")
        try:
            launcher = [sys.executable, "-I", "-S", "-c", _LAUNCHER, str(os.getpid())]
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
            try:
                self.process = subprocess.Popen(
                    launcher + self.argv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env={**os.environ, **extra_env},
                    start_new_session=True,
                )
                self.run_record.write_text(json.dumps({"pid": self.process.pid, "shm_prefix": self.shm_prefix}))
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        except OSError as err:
            raise ServeError(f"could not start {self.argv[0]}: {err}") from None
        finally:
            log.close()
        try:
            self.wait_ready(timeout, should_stop)
        except StopRequested:
            raise  # the caller stops it: a server that answers ready may hold clients' requests, to drain first
        except BaseException:
            self.stop(graceful=False)
            raise
        return self

    def _clean_previous_run(self) -> None:
        """Regions of the last server started with this log whose process is gone (killed, not stopped)."""
        try:
            record = json.loads(self.run_record.read_text())
            pid, prefix = int(record["pid"]), str(record["shm_prefix"])
        except (OSError, ValueError, KeyError, TypeError):
            return
        if procfs.alive(pid) and any(prefix in arg for arg in procfs.cmdline(pid)):
            return  # still running (another serve of this repository): not ours to clean
        try:
            remove_regions(prefix)
        except ValueError:
            pass

    def log_tail(self, lines: int = 25) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])

    def load_errors(self, limit: int = 5) -> list[str]:
        """Triton's "failed to load '<model>' ..." lines: the reason a model did not come up."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []
        found = []
        for line in lines:
            if "failed to load '" in line:
                message = line.split('] "', 1)[-1].split("\\n\\nAt:", 1)[0]
                found.append(message[:600])
        return found[:limit]

    def stop_diagnosis(self) -> str:
        """Why a SIGTERM ran out of time, from tritonserver's countdown lines (core src/server.cc and
        server src/http_server.cc log "Timeout N: Found ..." once a second while they wait)."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()[-400:]
        except OSError:
            return ""
        if not any("Exit timeout expired" in line for line in lines[-100:]):
            return ""
        waits = [
            line.split(": Found ", 1)[1].rstrip('"') for line in lines if '"Timeout ' in line and ": Found " in line
        ]
        http = [wait for wait in waits if "HTTP service connections" in wait]
        if http and 2 * len(http) >= len(waits):  # the HTTP front end stops first and spent most of the shared budget
            return (
                f"tritonserver spent {len(http)} s of it waiting for open HTTP connections ({http[-1]}): a client "
                "kept its connection open (HTTP keep-alive, e.g. an open tritonclient.http client); close "
                "clients before stopping the server"
            )
        if waits:  # the models took most of it
            return (
                f"tritonserver waited for models to unload ({waits[-1]}), e.g. a decoupled model with open streams, "
                "or the old instance of a model whose stub died holding a request"
            )
        return ""

    def _failure(self, what: str) -> ServeError:
        errors = self.load_errors()
        reason = (
            ("Models that failed to load:\n  " + "\n  ".join(errors))
            if errors
            else f"Last log lines:\n{self.log_tail()}"
        )
        return ServeError(f"{what}. {reason}\nFull log: {self.log_path}")

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}/v2/health/ready", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def _foreign_holder(self) -> tuple[bool, str]:
        """(every port is held by this server, a message when another process holds one)."""
        ours = {self.process.pid, *procfs.descendants(self.process.pid)} if self.process else set()
        for name, port in (
            ("HTTP", self.opts.http_port),
            ("gRPC", self.opts.grpc_port),
            ("metrics", self.opts.metrics_port),
        ):
            listening, holders = procfs.port_holders(self.opts.host, port)
            if holders & ours:
                continue
            if listening:
                who = ", ".join(f"PID {pid} ({procfs.describe(pid)})" for pid in sorted(holders)) or "another process"
                return False, f"the {name} port {self.opts.host}:{port} answers, but {who} holds it, not this server"
            return False, ""
        return True, ""

    def wait_ready(self, timeout: float, should_stop: Callable[[], bool] | None = None) -> None:
        """Until this server (not another process on its ports) reports ready."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise self._failure(f"tritonserver exited with code {self.process.returncode} before it was ready")
            if should_stop is not None and should_stop():
                raise StopRequested()
            if self.ready():
                own, problem = self._foreign_holder()
                if problem:
                    raise ServeError(f"{problem}. Stop that process, or use other ports.")
                if own:
                    self.pids = procfs.descendants(self.process.pid) if self.process else []
                    return
            time.sleep(0.25)
        raise self._failure(f"tritonserver was not ready after {timeout:.0f} s")

    def admin_headers(self) -> dict[str, str]:
        """The header that opens the model-repository API to this process (none when it is open to all)."""
        return {ADMIN_HEADER: self.admin_key} if "model-repository" in self.opts.restricted_apis() else {}

    def model_control(self, action: str, model: str, timeout: float = 600.0, config: dict | None = None) -> None:
        """Load (reload) or unload one model through the model-repository API. A load blocks until the model
        is loaded (with `config`, Triton's JSON model config, in place of its config.pbtxt); an unload returns
        once it has begun (Triton finishes it when the model's requests end)."""
        body = {"parameters": {"config": json.dumps(config)}} if config is not None else {}
        request = urllib.request.Request(
            f"http://{self.http_url}/v2/repository/models/{model}/{action}",
            data=json.dumps(body).encode(),
            method="POST",
            headers=self.admin_headers(),
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout):
                return
        except urllib.error.HTTPError as err:
            raise ServeError(
                f"{action} of {model} failed: HTTP {err.code} {err.read()[:300].decode(errors='replace')}"
            ) from None
        except OSError as err:
            raise ServeError(f"{action} of {model} failed: {err}") from None

    def stop(
        self, timeout: float | None = None, graceful: bool = True, abandon: Callable[[], str | None] | None = None
    ) -> StopResult | None:
        """SIGTERM to the process group (SIGKILL after exit_timeout_s + 5 s; at once if not graceful),
        then whatever is left of this start (its group, its stubs), then its /dev/shm regions. `abandon`, asked
        every 0.5 s while it stops: a reason when nothing it still waits for can end (then SIGKILL at once)."""
        process = self.process
        if process is None:
            return None
        started = time.monotonic()
        killed = False
        abandoned = None
        if process.poll() is None:
            if graceful:
                _signal_group(process.pid, signal.SIGTERM)
                deadline = started + (self.opts.exit_timeout_s + 5 if timeout is None else timeout)
                while process.poll() is None and abandoned is None:
                    try:
                        process.wait(max(min(0.5, deadline - time.monotonic()), 0.01))
                    except subprocess.TimeoutExpired:
                        if time.monotonic() >= deadline:
                            killed = True
                            break
                        abandoned = abandon() if abandon is not None else None
            if not graceful or killed or abandoned is not None:
                _signal_group(process.pid, signal.SIGKILL)
                process.wait(10)
        seconds = time.monotonic() - started

        def leftovers() -> list[int]:
            # Stubs leave once their server is gone (python_backend src/pb_stub.cc polls the parent every
            # 300 ms), and a stub started by a reload holds copies of the server's listening sockets.
            return procfs.group_members(process.pid) + procfs.stubs_with_region_prefix(self.shm_prefix)

        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and leftovers():
            time.sleep(0.1)
        if procfs.group_members(process.pid):  # a group id is not reused while members of it live
            _signal_group(process.pid, signal.SIGKILL)
        for pid in procfs.stubs_with_region_prefix(self.shm_prefix):  # by their region: ours, no one else's
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + 5.0  # a killed process has closed its sockets once it is a zombie
        while time.monotonic() < deadline and leftovers():
            time.sleep(0.05)
        removed = remove_regions(self.shm_prefix)
        self.process = None
        return StopResult(process.returncode, seconds, killed, removed, abandoned)

    def __enter__(self) -> ServerHandle:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
