"""Helpers for the Triton tests: a served tiny example pair (reference engines + repository)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PYTHON_MODELS = ("preprocessing", "postprocessing", "tensorrt_llm", "tensorrt_llm_draft", "ensemble")


@dataclass
class TinyDeployment:
    root: Path  # holds specbuild.toml, engines/, triton_repo/
    spec_path: Path
    spec: object
    repo: Path


def make_deployment(root: Path, example_tiny) -> TinyDeployment:
    """Spec for the tiny example pair -> converted checkpoints -> reference engines -> reference repository."""
    from specbuild.build.engines import build_engines
    from specbuild.config import load_spec
    from specbuild.convert import convert_pair
    from specbuild.example import specfile
    from specbuild.triton.repository import write_repository

    text = specfile.render_spec(specfile.example_overrides(example_tiny, "tiny"), header="triton tests")
    spec_path = specfile.write_spec(root / "specbuild.toml", text, force=True)
    spec = load_spec(spec_path)
    convert_pair(spec, ["target", "draft"], log=lambda m: None)
    build_engines(spec, ["target", "draft"], "reference")
    repo = root / "triton_repo"
    write_repository(spec, "reference", repo)
    return TinyDeployment(root, spec_path, spec, repo)


def alive(pid: int) -> bool:
    """True while pid exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def limit_threads() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
