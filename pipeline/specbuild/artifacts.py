"""Stage outputs: manifests, content hashes, locks, and atomic (temp dir + rename) writes.

Every stage writes its output folder through `stage_output(...)`:

    with stage_output(final_dir, stage="repo", force=force) as out:
        if out.up_to_date(input_hash): ...      # skipped, says so
        ... write files into out.tmp ...
        out.commit(manifest)                    # manifest.json written, tmp renamed into place

A failure or Ctrl-C inside the block removes the temporary folder; the previous output (if any)
stays untouched until the new one is complete.

Ownership: specbuild replaces only folders it wrote itself. A folder is specbuild's own output of a
stage when its manifest.json (written last, by `commit`) carries `manifest_version` and that
`stage`. `stage_output` refuses, before any work and again at commit, a path that is a file, a
folder of someone else (no such manifest), or specbuild's output of another stage; `--force` does
not change that. An absent path or an empty folder is used. Its own folder is redone only when it
holds nothing but the files its manifest lists (`contents`) and Python's __pycache__ folders.
A temporary folder left by a killed run is recognised by the empty `.specbuild-partial` folder
inside it (an empty folder, so it shows in no file listing or hash) and removed at the next run.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from specbuild.errors import ArtifactError

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
PARTIAL = ".specbuild-partial"  # an empty folder inside a stage's temporary folder until commit
STAGE_OUTPUTS = {  # stage -> what its folder holds, for messages
    "example": "example pair",
    "convert": "TensorRT-LLM checkpoint",
    "build": "engine",
    "repo": "Triton model repository",
    "convert-hf": "Hugging Face checkpoint for the LLM API",
    "build-llmapi": "LLM API configuration",
    "deploy": "Helm chart",
}

REPO_FOLDER = "triton_repo"


def default_repo_dir(output_dir: Path | str) -> Path:
    """Where `repo` writes and `serve` and `up` look for the model repository unless told: `triton_repo` beside
    the spec's output_dir (the engines' folder), one rule for every command, so the relative engine paths of a
    reference repository resolve and `serve -c <spec>` finds what `up -c <spec>` wrote."""
    return Path(output_dir).parent / REPO_FOLDER


def hash_file(path: Path, h: hashlib._Hash | None = None) -> str:
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
        raise ArtifactError(
            f"{folder} has no {MANIFEST}: it was not written by specbuild, or its stage did not finish. "
            "Run the previous stage again."
        )
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ArtifactError(f"{path} is unreadable ({err}). Remove the folder and run its stage again.") from None


def recorded_hash(folder: Path) -> str | None:
    """The input_hash in `folder`'s manifest.json (None when there is none): equal to a stage's input hash, the
    stage is up to date."""
    try:
        return read_manifest(folder).get("input_hash")
    except (ArtifactError, OSError, ValueError):
        return None


UP_TO_DATE = "up to date: inputs unchanged, would be skipped"  # a dry run's word for such a stage


def write_json(path: Path, data: Any) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)


def owner_stage(folder: Path) -> str | None:
    """The stage whose output `folder` is, by its manifest.json; None when specbuild did not write it."""
    path = Path(folder) / MANIFEST
    if path.is_symlink() or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("manifest_version"), int):
        return None
    stage = data.get("stage")
    return stage if isinstance(stage, str) else None


def _describe(stage: str) -> str:
    return f"{STAGE_OUTPUTS.get(stage, 'output')} ({stage})"


def resolve_output(path: Path, stage: str) -> Path:
    """The absolute folder `stage` writes for `path`: a symbolic link is followed to an existing target."""
    given = Path(path).expanduser().absolute()
    if given.is_symlink():
        target = given.resolve()
        if not target.exists():
            raise ArtifactError(
                f"{given} is a symbolic link to {target}, which does not exist; {stage} does not create folders "
                "through a dangling link. Create that folder (empty), or choose another path."
            )
    return given.resolve()


def claim_output(final: Path, stage: str) -> str:
    """How `stage` may use `final` (an absolute, resolved path): "new" (absent), "empty" (an empty folder),
    "own" (this stage's earlier output, replaced at commit). Anything else raises ArtifactError."""
    if not final.exists():
        return "new"
    if not final.is_dir():
        raise ArtifactError(
            f"{final} is a file, not a folder: {stage} writes a folder there and will not replace the file. "
            "Choose another path, or move the file away."
        )
    found = owner_stage(final)
    if found == stage:
        return "own"
    if found is not None:
        raise ArtifactError(
            f"{final} holds specbuild's {_describe(found)}, not a {_describe(stage)}: it will not be replaced, "
            "not even with --force. Choose another folder, or delete that one yourself if you no longer need it."
        )
    if not any(final.iterdir()):
        return "empty"
    raise ArtifactError(
        f"{final} exists and was not written by specbuild (it has no specbuild manifest.json): {stage} will not "
        "replace it or delete anything in it, not even with --force. Choose another folder (a new or empty one), "
        "or move its contents away."
    )


def foreign_files(folder: Path) -> list[str]:
    """Files in specbuild's own output `folder` that its manifest does not list: someone put them there.
    Python's __pycache__ folders (tritonserver importing a repository's model.py) are specbuild's."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return []
    listed = manifest.get("contents", manifest.get("files"))  # older manifests: the stage's own file list
    if not isinstance(listed, (list, dict)):
        return []
    listed = {str(name) for name in listed} | {MANIFEST}
    found = []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if (path.is_dir() and not path.is_symlink()) or "__pycache__" in rel.parts:
            continue
        if rel.as_posix() not in listed:
            found.append(rel.as_posix())
    return found


def refuse_foreign(final: Path, stage: str) -> None:
    """Before replacing specbuild's own output: refuse when someone added files to it."""
    found = foreign_files(final)
    if found:
        named = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        raise ArtifactError(
            f"{final} is specbuild's {_describe(stage)}, but holds files specbuild did not write ({named}): "
            f"{stage} will not replace it, not even with --force. Move those files out of it, or choose another "
            "folder."
        )


def _remove_stale(final: Path) -> None:
    """Remove the temporary folders a killed run of this output left beside it (the caller holds the lock).
    Only folders specbuild marked (or left empty) go; anything else under such a name is left alone."""
    for pattern in (f".{final.name}.tmp-*", f".{final.name}.old-*"):
        for stale in sorted(final.parent.glob(pattern)):
            if stale.is_symlink() or not stale.is_dir():
                continue
            if (stale / PARTIAL).is_dir() or owner_stage(stale) is not None or not any(stale.iterdir()):
                shutil.rmtree(stale, ignore_errors=True)


@dataclass
class StageOutput:
    final: Path
    tmp: Path
    stage: str  # the manifest's "stage": what this folder is ("convert", "build", "repo", "example")
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
        """True when the final folder exists with a manifest for exactly these inputs (and no --force).
        When False, the stage is about to redo the folder: raises ArtifactError now, before the work,
        if the folder holds files specbuild did not write."""
        manifest = self.existing_manifest()
        if not self.force and manifest and manifest.get("input_hash") == input_hash:
            return True
        if self.final.is_dir():
            refuse_foreign(self.final, self.stage)
        return False

    def commit(self, manifest: dict[str, Any]) -> dict[str, Any]:
        if manifest.get("stage", self.stage) != self.stage:
            raise ValueError(f"a {self.stage} output cannot record stage {manifest['stage']!r}")
        (self.tmp / PARTIAL).rmdir()
        contents = sorted(p.relative_to(self.tmp).as_posix() for p in self.tmp.rglob("*") if not p.is_dir())
        manifest = {
            "manifest_version": MANIFEST_VERSION,
            "created_unix": round(time.time(), 3),
            **manifest,
            "stage": self.stage,
            "contents": contents,
        }
        write_json(self.tmp / MANIFEST, manifest)
        claim = claim_output(self.final, self.stage)  # again: the folder may have changed since the start
        if claim == "own":
            refuse_foreign(self.final, self.stage)
        old = self.final.with_name(f".{self.final.name}.old-{os.getpid()}")
        moved_aside = False
        try:
            if claim == "own":
                os.replace(self.final, old)
                moved_aside = True
            os.replace(self.tmp, self.final)  # over nothing, or over an empty folder (rename(2) allows that)
        except OSError as err:
            if moved_aside:
                os.replace(old, self.final)  # the previous output goes back
            raise ArtifactError(
                f"could not move the new {_describe(self.stage)} into {self.final} ({err.strerror}); nothing there "
                "was changed. If files appeared in it meanwhile, move them away and run again."
            ) from None
        if moved_aside:
            shutil.rmtree(old, ignore_errors=True)
        self.committed = True
        return manifest


@contextmanager
def stage_output(final: Path, *, stage: str, force: bool = False, lock_timeout: float = 0.0) -> Iterator[StageOutput]:
    """Lock `final`, give a fresh temporary sibling folder to write into, clean up on failure.

    Refuses (ArtifactError) when `final` is not `stage`'s to replace: see the module docstring."""
    final = resolve_output(final, stage)
    claim_output(final, stage)  # refuse before creating anything (parent folders, the lock file)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ArtifactError(f"cannot create {final.parent} ({err.strerror}). Choose another output folder.") from None
    lock = FileLock(str(final.parent / f".{final.name}.lock"))
    try:
        lock.acquire(timeout=lock_timeout)
    except Timeout:
        raise ArtifactError(
            f"{final} is locked by another specbuild process (lock file {lock.lock_file}). "
            "Wait for it to finish; if none is running, delete the lock file."
        ) from None
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    created = False
    try:
        claim_output(final, stage)  # under the lock this time
        _remove_stale(final)
        try:
            tmp.mkdir()
        except FileExistsError:
            raise ArtifactError(f"{tmp} exists and was not left by specbuild; move it away and run again.") from None
        created = True
        (tmp / PARTIAL).mkdir()
        yield StageOutput(final=final, tmp=tmp, stage=stage, force=force)
    finally:
        if created and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        lock.release()
