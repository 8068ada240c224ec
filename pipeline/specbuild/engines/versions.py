"""Tool versions recorded in an engine's manifest, and the check `serve` makes against them.

A TensorRT engine only runs on the TensorRT-LLM / TensorRT release that built it, on the same GPU
model (SM). The trtllm backend reads the versions *inside the build environment* (the Python
interpreter that runs `trtllm-build`), so the manifest describes the engine, not this process.
Unknown values are recorded as None and never reported as a mismatch.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

# Keys of a manifest's `tool_versions` that decide whether a runtime can load the engine.
TRTLLM_KEYS = ("tensorrt_llm", "tensorrt", "cuda", "gpu_name", "gpu_sm")
REFERENCE_KEYS = ("reference_format",)
REFERENCE_FORMAT = "1"  # the reference engine layout (see specbuild.engines.reference_engine)

# Run with the build environment's interpreter: fast (package metadata, nvidia-smi), no heavy imports.
_PROBE = r"""
import json, os, shutil, subprocess
from importlib import metadata
def version(*names):
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return None
out = {
    "tensorrt_llm": version("tensorrt_llm", "tensorrt-llm"),
    "tensorrt": version("tensorrt", "tensorrt-cu13", "tensorrt_cu13", "tensorrt-cu12", "tensorrt_cu12"),
    "torch": version("torch"),
    "cuda": os.environ.get("CUDA_VERSION") or None,
    "gpu_name": None,
    "gpu_sm": None,
}
smi = shutil.which("nvidia-smi")
if smi:
    try:
        line = subprocess.run([smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
        name, cap = [part.strip() for part in line.rsplit(",", 1)]
        out["gpu_name"] = name
        out["gpu_sm"] = int(cap.replace(".", ""))
    except (OSError, IndexError, ValueError, subprocess.SubprocessError):
        pass
print(json.dumps(out))
"""


def interpreter_for(executable: str) -> str:
    """The Python that runs a console script (its shebang), else this process's interpreter."""
    try:
        with open(executable, "rb") as f:
            first = f.readline(300).decode(errors="replace").strip()
    except OSError:
        return sys.executable
    if not first.startswith("#!"):
        return sys.executable
    parts = first[2:].split()
    if not parts:
        return sys.executable
    if Path(parts[0]).name == "env" and len(parts) > 1:
        found = shutil.which(parts[-1])
        return found or sys.executable
    return parts[0] if Path(parts[0]).is_file() else sys.executable


def probe_versions(python: str, timeout: float = 60.0) -> dict[str, Any]:
    """Versions as seen by `python` (the build or serve environment). Never raises: unknown -> None."""
    empty: dict[str, Any] = {key: None for key in (*TRTLLM_KEYS, "torch")}
    try:
        done = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "PYTHONWARNINGS": "ignore"})
        found = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {}
    except (OSError, subprocess.SubprocessError, json.JSONDecodeError, IndexError):
        found = {}
    return {**empty, **{k: v for k, v in found.items() if k in empty}}


def runtime_versions(python: str | None = None) -> dict[str, Any]:
    """What `serve` compares against an engine manifest: the serving environment's versions."""
    found = probe_versions(python or sys.executable)
    found["reference_format"] = REFERENCE_FORMAT
    return found


def versions_mismatch(manifest: dict[str, Any], runtime_versions: dict[str, Any]) -> list[str]:
    """One message per version the engine was built with that differs from the runtime's ([] = compatible).

    Only values known on both sides are compared. For the trtllm backend that is TensorRT-LLM,
    TensorRT, CUDA (major.minor), the GPU name and SM; for the reference backend, its format version.
    """
    recorded = manifest.get("tool_versions") or {}
    keys = REFERENCE_KEYS if manifest.get("backend") == "reference" else TRTLLM_KEYS
    problems = []
    for key in keys:
        built, running = recorded.get(key), runtime_versions.get(key)
        if built is None or running is None:
            continue
        a, b = str(built), str(running)
        if key == "cuda":
            a, b = ".".join(a.split(".")[:2]), ".".join(b.split(".")[:2])
        if a != b:
            problems.append(
                f"{key}: the engine was built with {built}, the runtime has {running}. "
                "Rebuild the engine in the serving image (`specbuild build --force`)."
            )
    return problems
