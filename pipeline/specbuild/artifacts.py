"""Stage outputs: manifests, content hashes, locks, and atomic (temp dir + rename) writes.

Every stage writes its output folder through `stage_output(...)`:

    with stage_output(final_dir, force=force) as out:
        if out.up_to_date(input_hash): ...      # skipped, says so
        ... write files into out.tmp ...
        out.commit(manifest)                    # manifest.json written, tmp renamed into place

A failure or Ctrl-C inside the block removes the temporary folder; the previous output (if any)
stays untouched until the new one is complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

from filelock import FileLock, Timeout

from specbuild.errors import ArtifactError

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1


def hash_file(path: Path, h: "hashlib._Hash | None" = None) -> str:
    h = h or hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def hash_tree(root: Path, ignore: tuple[str, ...] = (MANIFEST,)) -> dict[str, str]:
    """sha256 of every regular file under `root`, keyed by relative posix path, sorted."""
    root = Path(root)
    if root.is_file():
        return {root.name: hash_file(root)}
    hashes = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.name not in ignore and not path.name.endswith(".lock"):
            hashes[path.relative_to(root).as_posix()] = hash_file(path)
    return hashes


def combined_hash(*parts: Any) -> str:
    """One stable sha256 over JSON-serialisable parts (settings, file hash maps, versions)."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def tool_versions(*distributions: str) -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("specbuild", *distributions):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def read_manifest(folder: Path) -> dict[str, Any]:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise ArtifactError(f"{folder} has no {MANIFEST}: it was not written by specbuild, or its stage did not finish. "
                            "Run the previous stage again.")
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ArtifactError(f"{path} is unreadable ({err}). Remove the folder and run its stage again.") from None


def write_json(path: Path, data: Any) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)


@dataclass
class StageOutput:
    final: Path
    tmp: Path
    force: bool
    committed: bool = False

    def existing_manifest(self) -> dict[str, Any] | None:
        path = self.final / MANIFEST
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            return None

    def up_to_date(self, input_hash: str) -> bool:
        """True when the final folder exists with a manifest for exactly these inputs (and no --force)."""
        manifest = self.existing_manifest()
        return bool(not self.force and manifest and manifest.get("input_hash") == input_hash)

    def commit(self, manifest: dict[str, Any]) -> dict[str, Any]:
        manifest = {"manifest_version": MANIFEST_VERSION, "created_unix": round(time.time(), 3), **manifest}
        write_json(self.tmp / MANIFEST, manifest)
        old = None
        if self.final.exists():
            old = self.final.with_name(f".{self.final.name}.old-{os.getpid()}")
            os.replace(self.final, old)
        os.replace(self.tmp, self.final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        self.committed = True
        return manifest


@contextmanager
def stage_output(final: Path, force: bool = False, lock_timeout: float = 0.0) -> Iterator[StageOutput]:
    """Lock `final`, give a fresh temporary sibling folder to write into, clean up on failure."""
    final = Path(final).resolve()
    final.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(final.parent / f".{final.name}.lock"))
    try:
        lock.acquire(timeout=lock_timeout)
    except Timeout:
        raise ArtifactError(
            f"{final} is locked by another specbuild process (lock file {lock.lock_file}). "
            "Wait for it to finish; if none is running, delete the lock file."
        ) from None
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    try:
        for stale in final.parent.glob(f".{final.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)  # left by an interrupted run; we hold the lock
        tmp.mkdir()
        out = StageOutput(final=final, tmp=tmp, force=force)
        yield out
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        lock.release()
