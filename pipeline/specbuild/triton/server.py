"""Find and run `tritonserver` on a model repository: argv, readiness, canary, clean shutdown.

Where the server comes from (first found): `--tritonserver PATH`; `tritonserver` on PATH; the
TensorRT-LLM container's `/opt/tritonserver/bin/tritonserver`; the binary in the `nvidia-pytriton`
wheel, which runs Python-backend models without a GPU (see docs/triton.md). For the wheel, the CUDA
runtime it bundles goes on LD_LIBRARY_PATH and a backend folder is assembled with the Python
backend library, its utils and the stub built for the running Python; this interpreter's bin folder
goes first on PATH so the models import this environment's specbuild and torch.

On GPU (the trtllm flavour) the argv follows NVIDIA's launch_triton_server.py (NVIDIA/TensorRT-LLM
`triton_backend/scripts/`) in multi-model (orchestrator) mode: `mpirun --allow-run-as-root -n 1 tritonserver ... :` with
TRTLLM_ORCHESTRATOR=1, so the orchestrator spawns one MPI worker group per engine (TP included);
world size 1 is the only one allowed with spawned processes.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from specbuild.errors import ServeError, ToolNotFoundError

CONTAINER_BINARY = Path("/opt/tritonserver/bin/tritonserver")
ADMIN_HEADER = "specbuild-admin-key"


@dataclass(frozen=True)
class TritonInstall:
    binary: Path
    kind: str  # "explicit" | "path" | "container" | "pytriton"
    backend_dir: Path | None = None  # None: the binary's default backends
    env: dict[str, str] = field(default_factory=dict)  # added to the server's environment


def _pytriton_root() -> Path | None:
    for base in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        root = Path(base) / "pytriton" / "tritonserver"
        if (root / "bin" / "tritonserver").is_file():
            return root
    return None


def _pytriton_backends(root: Path) -> Path:
    """A backend folder with python/{libtriton_python.so, triton_python_backend_utils.py, the stub}."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise ToolNotFoundError(f"the nvidia-pytriton wheel has no Python backend stub for Python {version} "
                                f"({stub}). Use Python 3.10-3.12, or run in the CPU image (docker/Dockerfile.cpu).")
    from platformdirs import user_cache_dir

    cache = Path(os.environ.get("SPECBUILD_CACHE_DIR") or user_cache_dir("specbuild"))
    target = cache / "tritonserver-backends" / f"py{version}" / "python"
    target.mkdir(parents=True, exist_ok=True)
    sources = [root / "backends" / "python" / "libtriton_python.so",
               root / "backends" / "python" / "triton_python_backend_utils.py", stub]
    for source in sources:
        dest = target / source.name
        if not dest.is_file() or dest.stat().st_size != source.stat().st_size:
            tmp = dest.with_name(dest.name + f".tmp-{os.getpid()}")
            shutil.copy2(source, tmp)
            os.replace(tmp, dest)
    return target.parent


def _libpython_dir() -> str:
    """The running Python's libpython folder: the stub must load the same libpython as this interpreter's
    extension modules were built for (a system libpython3.x of another patch release breaks `import ssl`)."""
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    name = sysconfig.get_config_var("INSTSONAME") or ""
    return libdir if libdir and name and (Path(libdir) / name).is_file() else ""


def find_tritonserver(explicit: str | Path | None = None) -> TritonInstall:
    venv_bin = str(Path(sys.executable).parent)
    path_env = {"PATH": venv_bin + os.pathsep + os.environ.get("PATH", "")}
    if explicit is not None:
        binary = Path(explicit)
        if not binary.is_file() or not os.access(binary, os.X_OK):
            raise ToolNotFoundError(f"--tritonserver {explicit}: not an executable file. Pass the tritonserver binary.")
        return TritonInstall(binary, "explicit", env=path_env)
    found = shutil.which("tritonserver")
    if found:
        return TritonInstall(Path(found), "path", env=path_env)
    if CONTAINER_BINARY.is_file():
        return TritonInstall(CONTAINER_BINARY, "container", env=path_env)
    root = _pytriton_root()
    if root is not None:
        libs = root.parent.parent / "nvidia_pytriton.libs"
        ld = os.pathsep.join(p for p in (_libpython_dir(), str(libs), os.environ.get("LD_LIBRARY_PATH", "")) if p)
        return TritonInstall(root / "bin" / "tritonserver", "pytriton", _pytriton_backends(root),
                             {**path_env, "LD_LIBRARY_PATH": ld})
    raise ToolNotFoundError(
        "tritonserver not found (not on PATH, not at /opt/tritonserver/bin, no nvidia-pytriton wheel). "
        "Install the serving extra (pip install 'specbuild[serve]') for the CPU server, run in the GPU image "
        "(docker/Dockerfile.gpu), or pass --tritonserver PATH."
    )


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class ServerOptions:
    repo: Path
    host: str = "127.0.0.1"  # loopback unless told otherwise
    http_port: int = 0  # 0 = pick a free port
    grpc_port: int = 0
    metrics_port: int = 0
    allow_model_control: bool = False  # the model-control and repository APIs are off unless asked
    models: tuple[str, ...] | None = None  # load only these (explicit mode); None = every model
    gpu: bool = False  # the TensorRT-LLM (multi-model orchestrator) launch
    gpu_count: int = 1
    log_verbose: int = 0


def build_argv(install: TritonInstall, opts: ServerOptions, admin_key: str) -> tuple[list[str], dict[str, str]]:
    """The exact argv (a list, never a shell string) and the extra environment."""
    server = [
        str(install.binary),
        f"--model-repository={Path(opts.repo).resolve()}",
        f"--http-address={opts.host}", f"--http-port={opts.http_port}",
        f"--grpc-address={opts.host}", f"--grpc-port={opts.grpc_port}",
        f"--metrics-address={opts.host}", f"--metrics-port={opts.metrics_port}",
        "--disable-auto-complete-config",
        "--strict-readiness=true",
        "--exit-on-error=true",
        "--exit-timeout-secs=30",
        f"--log-verbose={opts.log_verbose}",
    ]
    if install.backend_dir is not None:
        server.append(f"--backend-directory={install.backend_dir}")
    if opts.allow_model_control or opts.models is not None:
        server.append("--model-control-mode=explicit")
        server += [f"--load-model={name}" for name in (opts.models or ("*",))]
    else:
        server.append("--model-control-mode=none")
    if not opts.allow_model_control:
        # No API to restrict "off" outright: require a header whose value only this process knew.
        server.append(f"--http-restricted-api=model-repository:{ADMIN_HEADER}={admin_key}")
        server.append(f"--grpc-restricted-protocol=model-repository:{ADMIN_HEADER}={admin_key}")
    env = dict(install.env)
    if not opts.gpu:
        return server, env
    server.append("--backend-config=python,shm-region-prefix-name=prefix0_")
    server += ["--pinned-memory-pool-byte-size=0", "--enable-peer-access=false"]
    server += [f"--cuda-memory-pool-byte-size={gpu}:0" for gpu in range(opts.gpu_count)]
    env.update({"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"})
    return ["mpirun", "--allow-run-as-root", "-n", "1", *server, ":"], env


def _children(pid: int) -> list[int]:
    """Every live descendant of pid (Linux /proc), e.g. the Python backend stubs."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        current = frontier.pop()
        kids = [p for p, parent in parents.items() if parent == current]
        found += kids
        frontier += kids
    return found


class ServerHandle:
    """A running tritonserver. `with ServerHandle(opts) as server:` starts it, waits until ready and
    answers a canary request; leaving the block stops it (SIGTERM, then SIGKILL) with every child."""

    def __init__(self, opts: ServerOptions, install: TritonInstall | None = None, log_path: Path | None = None):
        self.opts = opts
        self.install = install or find_tritonserver()
        self.log_path = Path(log_path) if log_path else Path(opts.repo).resolve().parent / ".tritonserver.log"
        self.process: subprocess.Popen | None = None
        self.pids: list[int] = []
        self.argv: list[str] = []

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

    # ---- lifecycle ---------------------------------------------------------------------------------
    def start(self, timeout: float = 300.0) -> "ServerHandle":
        for key in ("http_port", "grpc_port", "metrics_port"):
            if getattr(self.opts, key) == 0:
                setattr(self.opts, key, free_port(self.opts.host))
        self.argv, extra_env = build_argv(self.install, self.opts, secrets.token_hex(16))
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        try:
            self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env={**os.environ, **extra_env}, start_new_session=True)
        except OSError as err:
            raise ServeError(f"could not start {self.argv[0]}: {err}") from None
        finally:
            log.close()
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

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

    def _failure(self, what: str) -> ServeError:
        errors = self.load_errors()
        reason = ("Models that failed to load:\n  " + "\n  ".join(errors)) if errors else f"Last log lines:\n{self.log_tail()}"
        return ServeError(f"{what}. {reason}\nFull log: {self.log_path}")

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}/v2/health/ready", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise self._failure(f"tritonserver exited with code {self.process.returncode} before it was ready")
            if self.ready():
                self.pids = _children(self.process.pid) if self.process else []
                return
            time.sleep(0.25)
        raise self._failure(f"tritonserver was not ready after {timeout:.0f} s")

    def stop(self, timeout: float = 45.0) -> int | None:
        """SIGTERM to the process group, SIGKILL after `timeout`; returns the exit code."""
        process = self.process
        if process is None:
            return None
        pids = set(self.pids) | set(_children(process.pid))
        if process.poll() is None:
            _signal_group(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(process.pid, signal.SIGKILL)
                process.wait(10)
        for pid in pids:  # stubs that left the process group, if any
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.process = None
        return process.returncode

    def __enter__(self) -> "ServerHandle":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
