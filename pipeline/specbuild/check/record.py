"""The last passing check of a pair (`<output_dir>/<pair>/check.json`), so `specbuild up` can skip the check
stage while its inputs are unchanged.

The inputs are what `check` reads: the spec, each checkpoint's config and tokenizer files (hashed), and its
weight files' sizes and modification times (the NaN scan reads them; hashing would cost as much), so a
weight file rewritten in place, same size, is checked again. The LLM API path's check (its own memory plan)
is recorded under its own key, so switching paths checks again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specbuild.artifacts import combined_hash, hash_file, write_json
from specbuild.config import Spec

CHECK_RECORD = "check.json"  # in the pair folder


def check_inputs_hash(spec: Spec) -> str:
    from specbuild import __version__

    parts: dict[str, Any] = {"spec": spec.to_dict(), "specbuild": __version__}
    for role in ("target", "draft"):
        folder = Path(spec.role(role).checkpoint)
        files: dict[str, Any] = {}
        if folder.is_dir():
            for path in sorted(folder.iterdir()):
                if not path.is_file():
                    continue
                if path.suffix in (".json", ".model", ".txt", ".jinja"):
                    files[path.name] = hash_file(path)
                else:
                    stat = path.stat()
                    files[path.name] = [stat.st_size, stat.st_mtime_ns]
        parts[role] = files
    return combined_hash(parts)


def record_path(spec: Spec) -> Path:
    return spec.pair_dir / CHECK_RECORD


def _key(spec: Spec, backend: str | None) -> str:
    return check_inputs_hash(spec) + (":llmapi" if backend == "llmapi" else "")


def passed_unchanged(spec: Spec, backend: str | None = None) -> bool:
    """A check passed on exactly these inputs (for the LLM API path with backend "llmapi")."""
    try:
        return json.loads(record_path(spec).read_text()).get("input_hash") == _key(spec, backend)
    except (OSError, ValueError, AttributeError):
        return False


def record_pass(spec: Spec, warnings: list[dict[str, Any]], backend: str | None = None) -> None:
    path = record_path(spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, {"input_hash": _key(spec, backend), "ok": True, "warnings": warnings})


def forget(spec: Spec) -> None:
    """After a failing check: the next run checks again."""
    record_path(spec).unlink(missing_ok=True)
