"""`specbuild serve`: check the repository and its engines, start tritonserver, canary, wait for a signal."""

from __future__ import annotations

import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from specbuild.artifacts import read_manifest
from specbuild.config import Spec
from specbuild.errors import ArtifactError, ClientError, ServeError
from specbuild.triton.server import ServerHandle, ServerOptions, TritonInstall, build_argv, find_tritonserver

CANARY_PROMPT = "Hello"


@dataclass
class ServePlan:
    repo: Path
    backend: str  # "trtllm" | "reference", from the repository's manifest
    options: ServerOptions
    install: TritonInstall
    engines: dict[str, Path]  # role -> engine folder as resolved on this machine

    def argv(self) -> list[str]:
        return build_argv(self.install, self.options, "<random key per start>")[0]

    def to_dict(self) -> dict[str, Any]:
        o = self.options
        return {"repo": str(self.repo), "backend": self.backend, "tritonserver": str(self.install.binary),
                "tritonserver_kind": self.install.kind, "host": o.host, "http_port": o.http_port,
                "grpc_port": o.grpc_port, "metrics_port": o.metrics_port, "gpu": o.gpu,
                "engines": {k: str(v) for k, v in self.engines.items()}, "argv": self.argv()}


def engine_dirs(repo: Path, manifest: dict[str, Any]) -> dict[str, Path]:
    settings = manifest.get("settings") or {}
    engines = {}
    for role in ("target", "draft"):
        value = (settings.get(role) or {}).get("engine_dir")
        if not value:
            raise ArtifactError(f"{repo}/manifest.json names no {role} engine: regenerate with `specbuild repo`.")
        path = Path(value)
        engines[role] = path if path.is_absolute() else (repo / path).resolve()
    return engines


def check_engines(backend: str, engines: dict[str, Path], python: str | None = None) -> None:
    """Every engine must be built, for this backend, with the versions this runtime has."""
    from specbuild.build.versions import runtime_versions, versions_mismatch

    if backend == "llmapi":  # no engines: the Hugging Face checkpoints written for the LLM API
        from specbuild.llmapi.repository import check_checkpoint_dirs

        return check_checkpoint_dirs(engines)

    runtime = None
    for role, folder in engines.items():
        if not (folder / "manifest.json").is_file():
            hint = " --backend reference" if backend == "reference" else ""
            raise ArtifactError(f"the {role} engine {folder} is not built (no manifest.json). "
                                f"Run `specbuild build{hint}` first, or regenerate the repository with --engines-dir.")
        manifest = read_manifest(folder)
        if manifest.get("backend") not in (None, backend):
            raise ArtifactError(f"the {role} engine {folder} is a {manifest.get('backend')!r} engine but the repository "
                                f"serves {backend!r} models. Regenerate it: specbuild repo --backend {manifest.get('backend')}.")
        runtime = runtime if runtime is not None else runtime_versions(python)
        problems = versions_mismatch(manifest, runtime)
        if problems:
            raise ServeError(f"refusing the {role} engine {folder}: " + " ".join(problems))


def plan_serve(spec: Spec, repo: Path, host: str | None = None, http_port: int | None = None,
               grpc_port: int | None = None, metrics_port: int | None = None, tritonserver: str | None = None,
               allow_model_control: bool = False) -> ServePlan:
    repo = Path(repo).resolve()
    if not repo.is_dir():
        raise ArtifactError(f"model repository {repo} does not exist: write it with `specbuild repo --out-dir {repo}`.")
    manifest = read_manifest(repo)
    backend = manifest.get("backend")
    if backend not in ("trtllm", "reference", "llmapi"):
        raise ArtifactError(f"{repo}/manifest.json has backend {backend!r}: regenerate it with `specbuild repo`.")
    if manifest.get("pair") not in (None, spec.name):
        raise ArtifactError(f"{repo} was written for pair {manifest.get('pair')!r}, the spec is {spec.name!r}. "
                            "Regenerate it with `specbuild repo -c <this spec>`, or pass --repo.")
    s = spec.serve
    options = ServerOptions(
        repo=repo, host=host or s.host,
        http_port=s.http_port if http_port is None else http_port,
        grpc_port=s.grpc_port if grpc_port is None else grpc_port,
        metrics_port=s.metrics_port if metrics_port is None else metrics_port,
        allow_model_control=allow_model_control, gpu=backend == "trtllm", gpu_count=spec.gpu.count,
    )
    if backend == "llmapi":
        from specbuild.llmapi.repository import checkpoint_dirs

        return ServePlan(repo, backend, options, find_tritonserver(tritonserver), checkpoint_dirs(repo, manifest))
    return ServePlan(repo, backend, options, find_tritonserver(tritonserver), engine_dirs(repo, manifest))


def canary(handle: ServerHandle, models: tuple[str, ...] | None = None) -> dict[str, str]:
    """One short request per entry point (BLS over gRPC streaming, ensemble over HTTP); raises on failure."""
    from specbuild.triton.client import SpecbuildClient

    if models is None and _repo_backend(handle.opts.repo) == "llmapi":
        from specbuild.llmapi.client import canary as llmapi_canary

        return llmapi_canary(handle, CANARY_PROMPT)
    loaded = models or ("tensorrt_llm_bls", "ensemble")
    answers = {}
    for model, url, protocol in (("tensorrt_llm_bls", handle.grpc_url, "grpc"), ("ensemble", handle.http_url, "http")):
        if model not in loaded:
            continue
        try:
            with SpecbuildClient(url, protocol=protocol, model=model, timeout=120) as client:
                text, _ = client.complete(CANARY_PROMPT, max_tokens=2, stream=False)
        except ClientError as err:
            raise ServeError(f"the canary request to {model} failed: {err}. Server log: {handle.log_path}") from None
        answers[model] = text
    return answers


def _repo_backend(repo: Path) -> str | None:
    try:
        return read_manifest(Path(repo)).get("backend")
    except ArtifactError:
        return None


def serve_until_signal(handle: ServerHandle, on_ready: Callable[[], None], poll: float = 1.0) -> int:
    """Block until SIGINT/SIGTERM (exit 0) or the server dies (ServeError); always stops the server."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        on_ready()
        while not stop.wait(poll):
            if handle.process is None or handle.process.poll() is not None:
                code = handle.process.returncode if handle.process else None
                raise ServeError(f"tritonserver exited unexpectedly (code {code}). Last log lines:\n{handle.log_tail()}")
        return 0
    finally:
        handle.stop()
        for sig, old in previous.items():
            signal.signal(sig, old)
