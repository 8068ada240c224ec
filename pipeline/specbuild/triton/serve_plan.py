"""`specbuild serve` and `up`: check the repository and its engines and plan the server; the run itself
(start, canary, supervision, stop) is `specbuild.triton.supervisor.Supervisor`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbuild import backends
from specbuild.artifacts import read_manifest
from specbuild.config import Spec
from specbuild.errors import ArtifactError, ServeError
from specbuild.triton.server import ServerOptions, TritonInstall, build_argv, find_tritonserver


@dataclass
class ServePlan:
    repo: Path
    backend: str  # "trtllm" | "reference" | "llmapi", from the repository's manifest
    options: ServerOptions
    install: TritonInstall
    engines: dict[str, Path]  # role -> engine folder (llmapi: checkpoint folder) as resolved on this machine

    def argv(self) -> list[str]:
        return build_argv(self.install, self.options, "<random key per start>")[0]

    def to_dict(self) -> dict[str, Any]:
        o = self.options
        return {
            "repo": str(self.repo),
            "backend": self.backend,
            "tritonserver": str(self.install.binary),
            "tritonserver_kind": self.install.kind,
            "host": o.host,
            "http_port": o.http_port,
            "grpc_port": o.grpc_port,
            "metrics_port": o.metrics_port,
            "gpu": o.gpu,
            "restricted_apis": list(o.restricted_apis()),
            "exit_timeout_s": o.exit_timeout_s,
            "engines": {k: str(v) for k, v in self.engines.items()},
            "argv": self.argv(),
        }


def engine_dirs(repo: Path, manifest: dict[str, Any]) -> dict[str, Path]:
    settings = manifest.get("settings") or {}
    engines = {}
    for role in ("target", "draft"):
        if role == "draft" and role in settings and settings[role] is None:
            continue  # a target-only deployment: recorded as no draft
        value = (settings.get(role) or {}).get("engine_dir")
        if not value:
            raise ArtifactError(f"{repo}/manifest.json names no {role} engine: regenerate with `specbuild repo`.")
        path = Path(value)
        engines[role] = path if path.is_absolute() else (repo / path).resolve()
    return engines


def check_engines(backend: str, engines: dict[str, Path], python: str | None = None) -> None:
    """Every engine must be built, for this backend, with the versions this runtime has."""
    from specbuild.engines.versions import runtime_versions, versions_mismatch

    if not backends.get(backend).engines:  # the Hugging Face checkpoints written for the LLM API
        from specbuild.llmapi.repository import check_checkpoint_dirs

        return check_checkpoint_dirs(engines)

    runtime = None
    for role, folder in engines.items():
        if not (folder / "manifest.json").is_file():
            hint = " --backend reference" if backend == "reference" else ""
            raise ArtifactError(
                f"the {role} engine {folder} is not built (no manifest.json). "
                f"Run `specbuild build{hint}` first, or regenerate the repository with --engines-dir."
            )
        manifest = read_manifest(folder)
        if manifest.get("backend") not in (None, backend):
            raise ArtifactError(
                f"the {role} engine {folder} is a {manifest.get('backend')!r} engine but the repository "
                f"serves {backend!r} models. Regenerate it: specbuild repo --backend {manifest.get('backend')}."
            )
        runtime = runtime if runtime is not None else runtime_versions(python)
        problems = versions_mismatch(manifest, runtime)
        if problems:
            raise ServeError(f"refusing the {role} engine {folder}: " + " ".join(problems))


def plan_serve(
    spec: Spec,
    repo: Path,
    host: str | None = None,
    http_port: int | None = None,
    grpc_port: int | None = None,
    metrics_port: int | None = None,
    tritonserver: str | None = None,
    allow_model_control: bool = False,
    allow_apis: tuple[str, ...] = (),
    exit_timeout_s: int = ServerOptions.exit_timeout_s,
) -> ServePlan:
    repo = Path(repo).resolve()
    if not repo.is_dir():
        raise ArtifactError(f"model repository {repo} does not exist: write it with `specbuild repo --out-dir {repo}`.")
    manifest = read_manifest(repo)
    backend = manifest.get("backend")
    if backend not in backends.NAMES:
        raise ArtifactError(f"{repo}/manifest.json has backend {backend!r}: regenerate it with `specbuild repo`.")
    if manifest.get("pair") not in (None, spec.name):
        raise ArtifactError(
            f"{repo} was written for pair {manifest.get('pair')!r}, the spec is {spec.name!r}. "
            "Regenerate it with `specbuild repo -c <this spec>`, or pass --repo."
        )
    s = spec.serve
    options = ServerOptions(
        repo=repo,
        host=host or s.host,
        http_port=s.http_port if http_port is None else http_port,
        grpc_port=s.grpc_port if grpc_port is None else grpc_port,
        metrics_port=s.metrics_port if metrics_port is None else metrics_port,
        allow_model_control=allow_model_control,
        open_apis=tuple(allow_apis),
        gpu=backends.get(backend).triton_backend == "tensorrtllm",  # NVIDIA's orchestrator launch of its C++ backend
        gpu_count=spec.gpu.count,
        exit_timeout_s=exit_timeout_s,
    )
    options.restricted_apis()  # an unknown API name fails here, before anything starts
    if not backends.get(backend).engines:
        from specbuild.llmapi.repository import checkpoint_dirs

        return ServePlan(repo, backend, options, find_tritonserver(tritonserver), checkpoint_dirs(repo, manifest))
    return ServePlan(repo, backend, options, find_tritonserver(tritonserver), engine_dirs(repo, manifest))
