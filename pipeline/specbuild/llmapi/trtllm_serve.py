"""`specbuild serve --server trtllm-serve`: TensorRT-LLM's OpenAI-compatible server on the pair (GPU).

argv (contract SERVE; a list, never a shell string):

    trtllm-serve <target hf_checkpoint> --host H --port P --backend pytorch --tp_size T --pp_size P
        --max_batch_size B --max_num_tokens N --max_seq_len S --kv_cache_free_gpu_memory_fraction F
        --extra_llm_api_options <output_dir>/<name>/llmapi/llm_api_options.yaml --log_level info

`trtllm-serve MODEL ...` runs its `serve` subcommand (serve.py's DefaultGroup). The options file, written by
`specbuild build --backend llmapi`, carries the same values plus the speculative config; serve.py applies
it over the CLI values. Readiness: the port answers only once LLM(...) has loaded (serve.py binds, loads,
then serves), and GET /health returns 200 (openai_server.py; 503 while the LLM is unavailable). Shutdown:
SIGTERM to the process group (uvicorn's own handler shuts the server and the LLM down), SIGKILL after a
timeout, as for tritonserver.

End ids: the LLM ends a request at its tokenizer's eos only (specbuild.llmapi.end_ids), and trtllm-serve has no
hook for more, so a checkpoint that lists others (Llama 3.x instruct: three) needs the client to send them as the
request's `stop_token_ids` (a field of TensorRT-LLM's CompletionRequest and ChatCompletionRequest,
tensorrt_llm/serve/openai_protocol.py). `serve` prints them and its --json documents carry them.

Multi-node (--nodes > 1), as NVIDIA documents it: every rank runs `trtllm-llmapi-launch trtllm-serve ...`
under srun (docs/source/commands/trtllm-serve/trtllm-serve.rst "Multi-node Serving with Slurm", @0434755f)
or mpirun; trtllm-llmapi-launch makes rank 0 the server and the others workers (LAUNCH @020c89e6).
`--dry-run` writes that command out; specbuild does not run a cluster job itself.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specbuild.config import Spec
from specbuild.contract import llmapi as contract
from specbuild.contract.images import TRITON_IMAGE
from specbuild.errors import ArtifactError, ServeError, ToolNotFoundError
from specbuild.session.served import reachable_host

LAUNCHERS = ("srun", "mpirun")


STAND_IN = "stand-in"  # --trtllm-serve stand-in: specbuild's CPU stand-in (llmapi.openai_server), same argv


def stand_in_command() -> list[str]:
    import sys

    return [sys.executable, "-m", "specbuild.llmapi.openai_server"]


def find_trtllm_serve(explicit: str | Path | None = None) -> Path | list[str]:
    """trtllm-serve (explicit, else PATH), or the CPU stand-in's command for `STAND_IN`."""
    if explicit == STAND_IN:
        return stand_in_command()
    if explicit is not None:
        path = Path(explicit)
        if not path.is_file() or not os.access(path, os.X_OK):
            raise ToolNotFoundError(f"--trtllm-serve {explicit}: not an executable file.")
        return path
    found = shutil.which("trtllm-serve")
    if found is None:
        raise ToolNotFoundError(
            "trtllm-serve not found on PATH: it comes with TensorRT-LLM, which cannot be installed here. Run this in "
            f"the GPU image (docker/Dockerfile.llmapi, {TRITON_IMAGE}), or pass --trtllm-serve PATH. "
            "On a CPU machine serve the llmapi repository with tritonserver instead (the default --server), or run "
            f"specbuild's stand-in with the same API: --trtllm-serve {STAND_IN}."
        )
    return Path(found)


@dataclass
class ServeCommand:
    argv: list[str]
    host: str
    port: int
    options_file: Path
    launch: list[str] = field(default_factory=list)  # the multi-node command (srun/mpirun ...), when asked
    end_id: int | None = None  # the LLM's own end id: its tokenizer's eos
    stop_token_ids: list[int] = field(default_factory=list)  # the checkpoint's other end ids, for clients to send

    @property
    def health_url(self) -> str:
        return f"http://{reachable_host(self.host)}:{self.port}{contract.SERVE_HEALTH}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "server": "trtllm-serve",
            "argv": self.argv,
            "host": self.host,
            "port": self.port,
            "options_file": str(self.options_file),
            "health": self.health_url,
            "multi_node": self.launch or None,
            "end_id": self.end_id,
            "stop_token_ids": self.stop_token_ids,
        }

    def end_ids_hint(self) -> str | None:
        """What a client sends to stop at every end id the checkpoint lists (None: nothing to send)."""
        if not self.stop_token_ids:
            return None
        return (
            f'end ids: trtllm-serve ends at the tokenizer\'s eos {self.end_id} only; send "stop_token_ids": '
            f"{self.stop_token_ids} with each request to stop at the checkpoint's other end ids"
        )


def plan(
    spec: Spec,
    binary: str | Path | list[str] = "trtllm-serve",
    host: str | None = None,
    port: int | None = None,
    nodes: int = 1,
    launcher: str = "srun",
    require_built: bool = True,
) -> ServeCommand:
    """The trtllm-serve command for the spec, from the build stage's LLM arguments."""
    from specbuild.artifacts import read_manifest
    from specbuild.llmapi.build import OPTIONS_FILE, config_dir

    folder = config_dir(spec)
    if require_built and not (folder / "manifest.json").is_file():
        raise ArtifactError(f"{folder} has no LLM API configuration: run `specbuild build --backend llmapi` first.")
    if (folder / "manifest.json").is_file():
        args = read_manifest(folder).get("llm_args") or {}
    else:
        from specbuild.llmapi.args import llm_args
        from specbuild.llmapi.build import locations

        args = llm_args(spec, locations(spec))
    host = host or spec.serve.host
    port = contract.SERVE_DEFAULT_PORT if port is None else port
    argv = [
        *([str(part) for part in binary] if isinstance(binary, list) else [str(binary)]),
        str(args["model"]),
        "--host",
        host,
        "--port",
        str(port),
        "--backend",
        args["backend"],
        "--tp_size",
        str(args["tensor_parallel_size"]),
        "--pp_size",
        str(args["pipeline_parallel_size"]),
        "--max_batch_size",
        str(args["max_batch_size"]),
        "--max_num_tokens",
        str(args["max_num_tokens"]),
        "--max_seq_len",
        str(args["max_seq_len"]),
        "--kv_cache_free_gpu_memory_fraction",
        str(args["kv_cache_config"]["free_gpu_memory_fraction"]),
        "--extra_llm_api_options",
        str(folder / OPTIONS_FILE),
        "--log_level",
        "info",
    ]
    from specbuild.llmapi.end_ids import stop_token_ids

    eos, others = stop_token_ids(args)  # the LLM ends at its tokenizer's eos only (specbuild.llmapi.end_ids)
    command = ServeCommand(argv, host, port, folder / OPTIONS_FILE, end_id=eos, stop_token_ids=others)
    if nodes > 1:
        command.launch = multi_node(argv, spec.build.tp_size * spec.build.pp_size, nodes, launcher)
    return command


def multi_node(argv: list[str], world_size: int, nodes: int, launcher: str = "srun") -> list[str]:
    """Every rank runs trtllm-llmapi-launch <argv>; rank 0 serves (contract LAUNCH)."""
    if launcher not in LAUNCHERS:
        raise ServeError(f"--launcher {launcher!r}: choose one of {', '.join(LAUNCHERS)}.")
    if world_size % nodes:
        raise ServeError(
            f"tp_size x pp_size = {world_size} GPUs do not split over {nodes} nodes evenly: use a node "
            "count that divides it."
        )
    per_node = world_size // nodes
    if launcher == "srun":
        return [
            "srun",
            "-N",
            str(nodes),
            "--ntasks",
            str(world_size),
            f"--ntasks-per-node={per_node}",
            "--mpi=pmix",
            f"--gres=gpu:{per_node}",
            contract.LAUNCHER,
            *argv,
        ]
    # Open MPI refuses to start as root without --allow-run-as-root, and containers run as root (LWS's
    # docs/examples/tensorrt-llm server.py and this project's engine-path launcher pass it too).
    return [
        "mpirun",
        "--allow-run-as-root",
        "-np",
        str(world_size),
        "--npernode",
        str(per_node),
        "--hostfile",
        "<hostfile>",
        contract.LAUNCHER,
        *argv,
    ]


def nodes_needed(world_size: int, gpus_per_node: int) -> int:
    return max(1, math.ceil(world_size / max(gpus_per_node, 1)))


class TrtllmServeHandle:
    """A running trtllm-serve (or another server whose command has `argv` and `health_url`: `name` says which):
    start (argv list, own process group, log file), wait for its health URL, stop."""

    STOP_TIMEOUT_S = 60.0  # SIGTERM, then SIGKILL after this

    def __init__(self, command: Any, log_path: Path, stop_timeout: float | None = None, name: str = "trtllm-serve"):
        self.command, self.name = command, name
        self.log_path = Path(log_path)
        self.stop_timeout = self.STOP_TIMEOUT_S if stop_timeout is None else stop_timeout
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 1800.0) -> TrtllmServeHandle:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            try:
                self.process = subprocess.Popen(
                    self.command.argv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            except OSError as err:
                raise ServeError(f"could not start {self.command.argv[0]}: {err}") from None
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.command.health_url, timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise ServeError(
                    f"{self.name} exited with code {self.process.returncode} before it was healthy. "
                    f"Last log lines:\n{self.log_tail()}\nFull log: {self.log_path}"
                )
            if self.healthy():
                return
            time.sleep(0.25)
        raise ServeError(
            f"{self.name} was not healthy ({self.command.health_url}) after {timeout:.0f} s. "
            f"Last log lines:\n{self.log_tail()}\nFull log: {self.log_path}"
        )

    def stop(self, timeout: float | None = None) -> int | None:
        timeout = self.stop_timeout if timeout is None else timeout
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            _signal_group(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(process.pid, signal.SIGKILL)
                process.wait(10)
        self.process = None
        return process.returncode


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
