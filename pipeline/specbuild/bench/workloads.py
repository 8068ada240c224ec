"""Benchmark prompt sets: the built-in code, prose and JSON sets, or a JSONL file of prompts.

The built-in sets come from `specbuild.corpus` (text shipped with the package, the same on
every machine) and are held out from the example pair's training text. A JSONL file has one
object per line: {"prompt": "...", "max_tokens": 64}; max_tokens is optional.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specbuild.errors import BenchError

BUILTIN = ("code", "prose", "json")


@dataclass(frozen=True)
class Prompt:
    text: str
    max_tokens: int | None = None  # overrides --max-tokens for this prompt


@dataclass(frozen=True)
class Workload:
    name: str  # "code", "prose", "json" or the file's name
    prompts: tuple[Prompt, ...]


def builtin(kind: str, n: int) -> Workload:
    if kind not in BUILTIN:
        raise BenchError(f"unknown workload {kind!r}: use one of {', '.join(BUILTIN)} or a path to a .jsonl file.")
    from specbuild.corpus import heldout_prompts

    texts = list(heldout_prompts(kind, n))
    if not texts:
        raise BenchError(f"the built-in {kind!r} prompt set is empty: this is a packaging bug, reinstall specbuild.")
    return Workload(kind, tuple(Prompt(t) for t in texts))


def from_jsonl(path: Path) -> Workload:
    path = Path(path)
    if not path.is_file():
        raise BenchError(f"workload file {str(path)!r} not found: pass code, prose, json, or an existing .jsonl file.")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise BenchError(f"workload file {path} cannot be read ({err}).") from None
    prompts = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise BenchError(f"{path}:{number}: not valid JSON ({err.msg}). "
                             'Write one object per line, e.g. {"prompt": "def add(a, b):"}.') from None
        if not isinstance(record, dict) or not isinstance(record.get("prompt"), str) or not record["prompt"]:
            raise BenchError(f'{path}:{number}: expected an object with a non-empty "prompt" string, got {line[:80]!r}.')
        max_tokens = record.get("max_tokens")
        if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
            raise BenchError(f"{path}:{number}: max_tokens = {max_tokens!r} must be a positive integer.")
        prompts.append(Prompt(record["prompt"], max_tokens))
    if not prompts:
        raise BenchError(f"workload file {path} has no prompts: add lines like {{\"prompt\": \"...\"}}.")
    return Workload(path.name, tuple(prompts))


def load(workload: str, n: int) -> Workload:
    """`workload` is a built-in name or a path; `n` caps how many prompts are used (cycled if fewer)."""
    if workload in BUILTIN:
        loaded = builtin(workload, n)
    elif workload.endswith(".jsonl") or Path(workload).exists():
        loaded = from_jsonl(Path(workload))
    else:
        raise BenchError(f"unknown workload {workload!r}: use one of {', '.join(BUILTIN)} or a path to a .jsonl file.")
    prompts = loaded.prompts
    return Workload(loaded.name, tuple(prompts[i % len(prompts)] for i in range(n)))
