"""The backends a pair is built and served with: one record each, read by every stage and command.

A backend's name is what the spec (`build.backend`) and every `--backend` option take; its record says what
the name means everywhere else (whether `build` makes engines, whether it needs an NVIDIA GPU, which repository
`repo` writes and which model Triton serves it with), so the stages ask the record rather than compare names.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass

from specbuild.errors import SpecError


@dataclass(frozen=True)
class Backend:
    name: str
    engines: bool  # `build` makes engines from TensorRT-LLM checkpoints
    builder: str | None  # what makes them: "trtllm-build", or specbuild's "reference" builder; None: no engines
    gpu: bool  # served only on an NVIDIA GPU, in NVIDIA's TensorRT-LLM image
    path: str  # the pipeline path that builds and serves it (`specbuild.paths.for_backend`), also the family rules'
    # path (`families.support`): "engine" (TensorRT-LLM checkpoints, engines, the BLS) or "llmapi" (TensorRT-LLM's
    # LLM API: Hugging Face checkpoints, Triton's llmapi model; no BLS, no engines)
    triton_backend: str  # the Triton backend of the served tensorrt_llm model(s)
    summary: str  # one line for help texts


BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend(
            "trtllm",
            engines=True,
            builder="trtllm-build",
            gpu=True,
            path="engine",
            triton_backend="tensorrtllm",
            summary="TensorRT engines served by the tensorrtllm C++ backend (GPU image)",
        ),
        Backend(
            "reference",
            engines=True,
            builder="reference",
            gpu=False,
            path="engine",
            triton_backend="python",
            summary="specbuild's PyTorch reference engines behind the same tensors (any machine)",
        ),
        Backend(
            "llmapi",
            engines=False,
            builder=None,
            gpu=True,
            path="llmapi",
            triton_backend="python",
            summary="TensorRT-LLM's LLM API, Triton's llmapi model (GPU image; a CPU stand-in elsewhere)",
        ),
    )
}
NAMES = tuple(BACKENDS)
ENGINE_BACKENDS = tuple(name for name, backend in BACKENDS.items() if backend.engines)


def get(name: str) -> Backend:
    if name not in BACKENDS:
        raise SpecError(f"backend {name!r} is not supported. Choose one of: {', '.join(NAMES)}.")
    return BACKENDS[name]


def default(configured: str | None, trtllm_build: str | None = None) -> str:
    """The backend a command runs when --backend is not given, the same rule for check, convert, build, repo and up:
    the spec's `build.backend`; else trtllm where this machine builds TensorRT engines (`trtllm-build` on PATH, as
    in NVIDIA's image, or passed with --trtllm-build); else reference, which runs on any machine."""
    if configured:
        return configured
    return "trtllm" if trtllm_build or shutil.which("trtllm-build") else "reference"


DEFAULT_HELP = (
    "Default: the spec's build.backend, else trtllm where trtllm-build is on PATH (NVIDIA's image), else reference."
)


def path_of(name: str | None) -> str:
    """The path of backend `name`; where no backend is named, the engine path (the default rule's backends)."""
    return get(name).path if name is not None else "engine"
