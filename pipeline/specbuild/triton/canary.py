"""Canary requests: one short request through an entry point, to prove the deployment answers.

`canary` runs once after start-up (the BLS over gRPC streaming, the ensemble over HTTP; for an llmapi
repository its `tensorrt_llm` model over gRPC streaming and HTTP) and raises on a failure; `CanaryProbe` is
the supervisor's periodic one through `entry_model`, in a thread so that a request hanging on a dead model
never delays its other checks.
"""

from __future__ import annotations

import threading
from pathlib import Path

from specbuild import backends
from specbuild.artifacts import read_manifest
from specbuild.contract import models as names
from specbuild.errors import ArtifactError, ClientError, ServeError
from specbuild.triton.server import ServerHandle

CANARY_PROMPT = "Hello"


def repo_backend(repo: Path) -> str | None:
    """The repository's backend from its manifest ("trtllm", "reference", "llmapi"), None without one."""
    try:
        return read_manifest(Path(repo)).get("backend")
    except ArtifactError:
        return None


def _serves_engines(repo: Path) -> bool:
    """The repository serves engines behind the BLS and the ensemble (else Triton's llmapi model); one written before
    its manifest named a backend is an engine repository."""
    backend = repo_backend(repo)
    return backend is None or backends.get(backend).engines


def entry_models(repo: Path) -> list[str]:
    """The models clients call: the BLS and the ensemble (those the repository has); an llmapi repository's
    one model. The periodic canary goes through the first; a drain unloads them all."""
    if not _serves_engines(repo):
        from specbuild.contract.llmapi import MODEL_NAME

        return [MODEL_NAME]
    return [model for model in names.ENTRY_MODELS if (Path(repo) / model).is_dir()]


def gate_model(repo: Path) -> str | None:
    """The repository's serving gate, which the drain closes (specbuild.contract.serving_gate); None where it has
    none (a repository written before the gate existed)."""
    from specbuild.contract.serving_gate import MODEL_NAME

    return MODEL_NAME if (Path(repo) / MODEL_NAME / "config.pbtxt").is_file() else None


def entry_model(repo: Path) -> str:
    """The model a periodic canary goes through: the BLS, else the ensemble; an llmapi repository's one model."""
    return (entry_models(repo) or [names.ENSEMBLE])[0]


def canary(handle: ServerHandle, models: tuple[str, ...] | None = None) -> dict[str, str]:
    """One short request per entry point (BLS over gRPC streaming, ensemble over HTTP; an llmapi repository's
    model over both); raises on failure."""
    from specbuild.triton.client import SpecbuildClient

    if models is None and not _serves_engines(handle.opts.repo):
        return llmapi_canary(handle)
    loaded = models or names.ENTRY_MODELS
    answers = {}
    for model, url, protocol in ((names.BLS, handle.grpc_url, "grpc"), (names.ENSEMBLE, handle.http_url, "http")):
        if model not in loaded:
            continue
        try:
            with SpecbuildClient(url, protocol=protocol, model=model, timeout=120) as client:
                text, _ = client.complete(CANARY_PROMPT, max_tokens=2, stream=False)
        except ClientError as err:
            raise ServeError(f"the canary request to {model} failed: {err}. Server log: {handle.log_path}") from None
        answers[model] = text
    return answers


def llmapi_canary(handle: ServerHandle) -> dict[str, str]:
    """The llmapi model over gRPC streaming and over HTTP; each must end with one of its finish reasons."""
    from specbuild.contract.llmapi import FINISH_REASONS, MODEL_NAME
    from specbuild.triton.client import SpecbuildClient

    answers = {}
    for url, protocol, stream in ((handle.grpc_url, "grpc", True), (handle.http_url, "http", False)):
        try:
            with SpecbuildClient(url, protocol=protocol, model=MODEL_NAME, timeout=120) as client:
                text, stats = client.complete(CANARY_PROMPT, max_tokens=2, stream=stream)
        except ClientError as err:
            raise ServeError(
                f"the canary request to {MODEL_NAME} ({protocol}) failed: {err}. Server log: {handle.log_path}"
            ) from None
        if stats.get("finish_reason") not in FINISH_REASONS:
            raise ServeError(
                f"the canary request to {MODEL_NAME} ({protocol}) ended without a finish reason "
                f"({stats}). Server log: {handle.log_path}"
            )
        answers[f"{MODEL_NAME} ({protocol})"] = text
    return answers


class CanaryProbe:
    """One short request through `model` over HTTP, in a daemon thread; `done` is set when it has ended."""

    def __init__(self, http_url: str, model: str, timeout: float):
        self.model = model
        self.error: str | None = None
        self.done = threading.Event()
        threading.Thread(target=self._run, args=(http_url, timeout), name="specbuild-canary", daemon=True).start()

    def _run(self, http_url: str, timeout: float) -> None:
        from specbuild.triton.client import SpecbuildClient

        try:
            with SpecbuildClient(http_url, protocol="http", model=self.model, timeout=timeout) as client:
                client.complete(CANARY_PROMPT, max_tokens=1, stream=False)
        except ClientError as err:
            self.error = str(err)
        except Exception as err:  # noqa: BLE001 - any failure of the probe is a failed canary, reported
            self.error = f"{type(err).__name__}: {err}"
        finally:
            self.done.set()
