"""The committed copy of an example pair (package data), so the demo trains nothing on the user's machine.

    pairs/<variant>/
        example.json                 what the build recorded: recipe, recipe_key, agreement, c, losses, ...
        files.json                   sha256 and size of every file below, and the storage dtype
        tokenizer/                   tokenizer.json, tokenizer_config.json, special_tokens_map.json
        target/, draft/              config.json, generation_config.json, model.float16.safetensors

The build rounds the trained float32 weights to float16 before it measures them
(`Recipe.storage_dtype`), so the float16 files hold exactly the measured weights: `unpack` widens
them back to float32 (an exact conversion) and writes the usual Hugging Face folders into the cache.
A committed pair is used only while its `recipe_key` is the key of the current recipe; change the
recipe and the pair is trained again (or rebuild the committed copy: `scripts/example_pair.py`).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbuild.artifacts import hash_file
from specbuild.errors import ArtifactError

PAIRS_DIR = Path(__file__).resolve().with_name("pairs")
FILES_JSON = "files.json"
EXAMPLE_JSON = "example.json"
ROLES = ("target", "draft")
MODEL_FILES = ("config.json", "generation_config.json")  # copied as they are
WEIGHTS = "model.safetensors"  # float32, in a built or unpacked pair
REBUILD = "python scripts/example_pair.py --variant {variant} --write"


def packed_weights(dtype: str) -> str:
    return f"model.{dtype}.safetensors"


@dataclass(frozen=True)
class PackagedPair:
    folder: Path  # pairs/<variant>
    info: dict[str, Any]  # example.json
    files: dict[str, Any]  # files.json

    @property
    def key(self) -> str:
        return self.info["recipe_key"]


def read(folder: Path) -> PackagedPair:
    try:
        info = json.loads((folder / EXAMPLE_JSON).read_text())
        files = json.loads((folder / FILES_JSON).read_text())
    except (OSError, ValueError) as err:
        raise ArtifactError(f"the committed example pair in {folder} is unreadable ({err}).") from None
    return PackagedPair(folder=folder, info=info, files=files)


def key_matches(info: dict[str, Any], recipe: Any) -> bool:
    """Was this pair built from `recipe` (today's code version included)? Its own corpus fingerprint
    counts, not this machine's: the committed pair serves every Python version."""
    fingerprint = (info.get("corpus") or {}).get("fingerprint")
    return fingerprint is not None and info.get("recipe_key") == recipe.key(fingerprint)


def find(variant: str, pairs_dir: Path | None = None) -> PackagedPair | None:
    """The committed pair for `variant` if there is one built from the current recipe, else None."""
    from specbuild.example.recipe import VARIANTS

    folder = (pairs_dir or PAIRS_DIR) / variant
    if variant not in VARIANTS or not (folder / FILES_JSON).is_file():
        return None
    pair = read(folder)
    return pair if key_matches(pair.info, VARIANTS[variant]) else None


def damaged_files(pair: PackagedPair) -> list[str]:
    """Files whose size or sha256 differs from files.json (or that are missing)."""
    bad = []
    for rel, want in pair.files["files"].items():
        path = pair.folder / rel
        if not path.is_file() or path.stat().st_size != want["bytes"] or hash_file(path) != want["sha256"]:
            bad.append(rel)
    return bad


def unpack(pair: PackagedPair, dest: Path) -> dict[str, Any]:
    """Write target/, draft/ (float32 Hugging Face checkpoints) and example.json into `dest`."""
    import torch
    from safetensors.torch import load_file, save_file

    bad = damaged_files(pair)
    if bad:
        raise ArtifactError(
            f"the committed example pair in {pair.folder} is damaged: {', '.join(bad)} differ from {FILES_JSON}. "
            f"Restore it (git checkout -- {pair.folder}) or rebuild it with "
            f"`{REBUILD.format(variant=pair.info['variant'])}`."
        )
    packed = packed_weights(pair.files["storage_dtype"])
    for role in ROLES:
        out = dest / role
        out.mkdir(parents=True)
        for name in MODEL_FILES:
            shutil.copy2(pair.folder / role / name, out / name)
        for path in sorted((pair.folder / "tokenizer").iterdir()):
            shutil.copy2(path, out / path.name)
        tensors = load_file(str(pair.folder / role / packed))
        save_file(
            {name: t.to(torch.float32).contiguous() for name, t in tensors.items()},
            str(out / WEIGHTS),
            metadata={"format": "pt"},
        )
    shutil.copy2(pair.folder / EXAMPLE_JSON, dest / EXAMPLE_JSON)
    return pair.info


def pack(built: Path, dest: Path) -> dict[str, Any]:
    """Write the committed form of the built pair at `built` into the empty folder `dest`; return files.json.

    Refuses a pair whose weights are not exactly representable in its storage dtype (they would not
    unpack to the weights that were measured).
    """
    import torch
    from safetensors.torch import load_file, save_file

    info = json.loads((built / EXAMPLE_JSON).read_text())
    dtype_name = info.get("storage_dtype")
    if not dtype_name:
        raise ArtifactError(f"{built} records no storage_dtype: it was built by an older recipe; rebuild it.")
    dtype = getattr(torch, dtype_name)
    dest.mkdir(parents=True, exist_ok=True)
    tokenizer_files = sorted(p.name for p in (built / "target").iterdir() if p.name not in (*MODEL_FILES, WEIGHTS))
    (dest / "tokenizer").mkdir()
    for name in tokenizer_files:
        if hash_file(built / "target" / name) != hash_file(built / "draft" / name):
            raise ArtifactError(f"{built}: target and draft disagree on {name}; the pair must share one tokenizer.")
        shutil.copy2(built / "target" / name, dest / "tokenizer" / name)
    for role in ROLES:
        (dest / role).mkdir()
        for name in MODEL_FILES:
            shutil.copy2(built / role / name, dest / role / name)
        tensors = load_file(str(built / role / WEIGHTS))
        narrow = {name: t.to(dtype).contiguous() for name, t in tensors.items()}
        inexact = [name for name, t in tensors.items() if not torch.equal(narrow[name].to(t.dtype), t)]
        if inexact:
            raise ArtifactError(
                f"{built}/{role}: {len(inexact)} tensors (e.g. {inexact[0]}) are not exact in "
                f"{dtype_name}; the build must round them before measuring."
            )
        save_file(narrow, str(dest / role / packed_weights(dtype_name)), metadata={"format": "pt"})
    shutil.copy2(built / EXAMPLE_JSON, dest / EXAMPLE_JSON)
    files = {
        "variant": info["variant"],
        "recipe_key": info["recipe_key"],
        "storage_dtype": dtype_name,
        "files": {
            p.relative_to(dest).as_posix(): {"bytes": p.stat().st_size, "sha256": hash_file(p)}
            for p in sorted(dest.rglob("*"))
            if p.is_file()
        },
    }
    (dest / FILES_JSON).write_text(json.dumps(files, indent=2, sort_keys=True) + "\n")
    return files
