"""Where `tritonserver` comes from (first found): `--tritonserver PATH`; `tritonserver` on PATH; the
TensorRT-LLM container's `/opt/tritonserver/bin/tritonserver`; the binary in the `nvidia-pytriton` wheel,
which runs Python-backend models without a GPU (see docs/triton.md). For the wheel, the CUDA runtime it
bundles goes on LD_LIBRARY_PATH and a backend folder is assembled with the Python backend library, its
utils and the stub built for the running Python; this interpreter's bin folder goes first on PATH so the
models import this environment's specbuild and torch.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from specbuild.errors import ToolNotFoundError

CONTAINER_BINARY = Path("/opt/tritonserver/bin/tritonserver")


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
        raise ToolNotFoundError(
            f"the nvidia-pytriton wheel has no Python backend stub for Python {version} "
            f"({stub}). Use Python 3.10-3.12, or run in the CPU image (docker/Dockerfile.cpu)."
        )
    from platformdirs import user_cache_dir

    cache = Path(os.environ.get("SPECBUILD_CACHE_DIR") or user_cache_dir("specbuild"))
    target = cache / "tritonserver-backends" / f"py{version}" / "python"
    target.mkdir(parents=True, exist_ok=True)
    sources = [
        root / "backends" / "python" / "libtriton_python.so",
        root / "backends" / "python" / "triton_python_backend_utils.py",
        stub,
    ]
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
        return TritonInstall(
            root / "bin" / "tritonserver", "pytriton", _pytriton_backends(root), {**path_env, "LD_LIBRARY_PATH": ld}
        )
    raise ToolNotFoundError(
        "tritonserver not found (not on PATH, not at /opt/tritonserver/bin, no nvidia-pytriton wheel). "
        "Install the serving extra (pip install 'specbuild[serve]') for the CPU server, run in the GPU image "
        "(docker/Dockerfile.gpu), or pass --tritonserver PATH."
    )
