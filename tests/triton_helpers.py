"""Helpers for the Triton tests: a served tiny example pair (reference engines + repository)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

PYTHON_MODELS = ("preprocessing", "postprocessing", "tensorrt_llm", "tensorrt_llm_draft", "ensemble")


@dataclass
class TinyDeployment:
    root: Path  # holds specbuild.toml, engines/, triton_repo/
    spec_path: Path
    spec: object
    repo: Path


_BUILT: dict[Path, Path] = {}  # example pair -> a folder of its converted checkpoints and engines, never served


def make_deployment(root: Path, example_tiny) -> TinyDeployment:
    """Spec for the tiny example pair -> converted checkpoints -> reference engines -> reference repository.
    The convert and build run once per test session, in a folder of their own; each deployment gets a copy of
    their output, which its own convert and build then find up to date (their manifests' input hashes), so every
    deployment still goes through both stages, and no test can change another's engines."""
    import shutil

    from specbuild.config import load_spec
    from specbuild.convert import convert_pair
    from specbuild.engines.stage import build_engines
    from specbuild.example import specfile
    from specbuild.triton.repository import write_repository

    text = specfile.render_spec(specfile.example_overrides(example_tiny, "tiny"), header="triton tests")
    spec_path = specfile.write_spec(root / "specbuild.toml", text, force=True)
    spec = load_spec(spec_path)
    built = _BUILT.get(Path(example_tiny.root))
    if built is not None:
        shutil.copytree(built, Path(spec.output_dir), symlinks=True, dirs_exist_ok=True)
    convert_pair(spec, ["target", "draft"], log=lambda m: None)
    build_engines(spec, ["target", "draft"], "reference")
    if built is None:
        pristine = root.parent / f"{root.name}-built-once"
        shutil.copytree(Path(spec.output_dir), pristine, symlinks=True)
        _BUILT[Path(example_tiny.root)] = pristine
    repo = root / "triton_repo"
    write_repository(spec, "reference", repo)
    return TinyDeployment(root, spec_path, spec, repo)


def make_llmapi_deployment(root: Path, example_tiny) -> TinyDeployment:
    """Spec for the tiny example pair -> Hugging Face checkpoints -> LLM arguments -> the llmapi repository (the
    CPU stand-in of Triton's llmapi model) in root/llmapi_repo."""
    from specbuild.config import load_spec
    from specbuild.example import specfile
    from specbuild.llmapi import build
    from specbuild.llmapi.checkpoint import convert_pair
    from specbuild.llmapi.repository import write_repository

    text = specfile.render_spec(specfile.example_overrides(example_tiny, "tiny"), header="llmapi triton tests")
    spec_path = specfile.write_spec(root / "specbuild.toml", text, force=True)
    spec = load_spec(spec_path)
    convert_pair(spec, ["target", "draft"], log=lambda m: None)
    build.build(spec, log=lambda m: None)
    repo = root / "llmapi_repo"
    write_repository(spec, repo, runtime="reference")
    return TinyDeployment(root, spec_path, spec, repo)


def alive(pid: int) -> bool:
    """True while pid exists and is not a zombie."""
    from specbuild.triton import procfs

    return procfs.alive(pid)


def read_ready_document(
    process: subprocess.Popen, timeout: float = 400.0, stderr_tail: Callable[[], str] | None = None
) -> dict:
    """`specbuild serve --json`'s ready document: its stdout up to the line that closes it. If serve exits first,
    an AssertionError with the end of its stderr (stderr_tail() where another reader consumes the stream)."""
    lines, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            tail = stderr_tail() if stderr_tail is not None else process.stderr.read()[-3000:]
            raise AssertionError(f"serve exited ({process.wait()}): {tail}")
        lines.append(line)
        if line.rstrip() == "}":
            return json.loads("".join(lines))
    raise AssertionError(f"serve did not print its ready document within {timeout:.0f} s")


def run_concurrently(work: Callable[[int], None], count: int, timeout: float) -> list[Exception]:
    """work(0) .. work(count - 1), each on a thread of its own; the exceptions they raised (joined within timeout)."""
    errors: list[Exception] = []

    def run(i: int) -> None:
        try:
            work(i)
        except Exception as err:  # noqa: BLE001 - returned to the caller, who asserts on them
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return errors


def limit_threads() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@contextmanager
def serving(repo: Path, log_path: Path, clean: bool = False, **options) -> Iterator:
    """tritonserver on `repo` for a test (ServerOptions `options`; free ports, loopback): started within 300 s,
    stopped whatever the test did, and then no process of it may be left. clean: the stop is tritonserver's own
    (SIGTERM), which must be clean (exit within the server's timeout) and leave no shared-memory region; without
    it, for a test of something else, the server is killed at once: its own stop takes 3-4 s on 2 cores (it
    unloads each Python model in turn, then polls once a second), and the cleanup after it (every process of this
    start, its regions) is the same. The one way the tests start a server."""
    from specbuild.triton import procfs
    from specbuild.triton.server import SHM_ROOT, ServerHandle, ServerOptions

    handle = ServerHandle(ServerOptions(repo=repo, **options), log_path=log_path)
    handle.start(timeout=300)
    pids = [handle.process.pid, *procfs.descendants(handle.process.pid)]
    prefix = handle.shm_prefix
    try:
        yield handle
    finally:
        result = handle.stop(graceful=clean)
    if clean:
        assert result.clean, f"tritonserver {result.describe()}"
        assert not list(SHM_ROOT.glob(prefix + "*")), "shared-memory regions left behind"
    left = [pid for pid in pids if alive(pid)]
    assert not left, f"processes left behind after stop: {left}"
