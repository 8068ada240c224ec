"""Benchmark prompt sets: the built-in code, prose, JSON and chat sets, the input-grounded sets, or a JSONL file.

The built-in sets come from `specbuild.corpus` (text shipped with the package, the same on
every machine) and are held out from the example pair's training text; "chat" is the prose set sent as user
messages through the target tokenizer's chat template (`session.chat`).

The input-grounded sets hold text whose answer is already in the prompt, where drafting by lookup pays
(`specbuild.drafters`):
- "edit": a code file, then the same file begun again, as an edit of a given file is written back;
- "quote": a prose passage, then the passage begun again, as an answer quoting a given text;
- "agent": every prompt twice in a row, an agent loop's turn resent with the same files (the second request
  finds the first's text in the lookup's pool);
- "mixed": edit prompts and open prose prompts interleaved. A JSONL file has one object per line:
{"prompt": "...", "max_tokens": 64}, or {"messages": [{"role": "user", "content": "..."}]} for a conversation
through the template; max_tokens is optional.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from specbuild import jsonl
from specbuild.errors import BenchError

BUILTIN = ("code", "prose", "json")  # the corpus's kinds (check --measure measures each)
GROUNDED = ("edit", "quote", "agent", "mixed")  # prompts that hold their answer's text (the module docstring)
NAMED = BUILTIN + ("chat",) + GROUNDED  # what --workload takes by name
GIVEN_CHARS = 480  # the text an input-grounded prompt gives
RESTART_CHARS = 48  # how much of it the prompt begins again


@dataclass(frozen=True)
class Prompt:
    text: str
    max_tokens: int | None = None  # overrides --max-tokens for this prompt


@dataclass(frozen=True)
class Workload:
    name: str  # "code", "prose", "json" or the file's name
    prompts: tuple[Prompt, ...]


def builtin(kind: str, n: int, tokenizer_dir: Path | None = None) -> Workload:
    if kind not in NAMED:
        raise BenchError(f"unknown workload {kind!r}: use one of {', '.join(NAMED)} or a path to a .jsonl file.")
    from specbuild.corpus import heldout_prompts

    if kind in GROUNDED:
        return Workload(kind, tuple(Prompt(t) for t in grounded(kind, n)))
    texts = list(heldout_prompts("prose" if kind == "chat" else kind, n))
    if kind == "chat":
        texts = [_chat(tokenizer_dir, [{"role": "user", "content": text}], "the chat workload") for text in texts]
    if not texts:
        raise BenchError(f"the built-in {kind!r} prompt set is empty: this is a packaging bug, reinstall specbuild.")
    return Workload(kind, tuple(Prompt(t) for t in texts))


def grounded(kind: str, n: int) -> list[str]:
    """`n` prompts of an input-grounded set (kind: one of GROUNDED), from held-out text."""
    from specbuild.corpus import heldout_prompts

    def restated(source: str, texts: list[str], lead: str) -> list[str]:
        return [f"{text}\n\n{lead}\n{text[:RESTART_CHARS]}" for text in texts] or [source]

    edits = restated("", list(heldout_prompts("code", n, chars=GIVEN_CHARS)), "# The same file, edited:")
    if kind == "edit":
        return edits[:n]
    quotes = restated("", list(heldout_prompts("prose", n, chars=GIVEN_CHARS)), "Quoted:")
    if kind == "quote":
        return quotes[:n]
    if kind == "agent":
        return [edits[i // 2 % len(edits)] for i in range(n)]
    open_prose = list(heldout_prompts("prose", n))
    return [edits[i // 2 % len(edits)] if i % 2 == 0 else open_prose[i // 2 % len(open_prose)] for i in range(n)]


def _chat(tokenizer_dir: Path | None, messages: list, where: str) -> str:
    from specbuild.errors import RequestError
    from specbuild.session.chat import chat_text

    if tokenizer_dir is None:
        raise BenchError(f"{where} needs the target's tokenizer for its chat template.")
    try:
        return chat_text(_tokenizer(str(tokenizer_dir)), messages)
    except RequestError as err:
        raise BenchError(f"{where}: {err}") from None


@functools.lru_cache(maxsize=4)
def _tokenizer(folder: str) -> object:  # loaded once per run, not per prompt
    from specbuild.session.chat import load_tokenizer

    return load_tokenizer(folder)


def from_jsonl(path: Path, tokenizer_dir: Path | None = None) -> Workload:
    path = Path(path)
    if not path.is_file():
        raise BenchError(f"workload file {str(path)!r} not found: pass code, prose, json, or an existing .jsonl file.")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise BenchError(f"workload file {path} cannot be read ({err}).") from None
    prompts = []
    example = 'Write one object per line, e.g. {"prompt": "def add(a, b):"}.'
    for where, line, record in jsonl.records(text, path, BenchError, example):
        if isinstance(record, dict) and isinstance(record.get("messages"), list) and "prompt" not in record:
            record["prompt"] = _chat(tokenizer_dir, record["messages"], where)
        if not isinstance(record, dict) or not isinstance(record.get("prompt"), str) or not record["prompt"]:
            raise BenchError(
                f'{where}: expected an object with a non-empty "prompt" string (or "messages"), got {line[:80]!r}.'
            )
        max_tokens = record.get("max_tokens")
        if max_tokens is not None and (
            not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
        ):
            raise BenchError(f"{where}: max_tokens = {max_tokens!r} must be a positive integer.")
        prompts.append(Prompt(record["prompt"], max_tokens))
    if not prompts:
        raise BenchError(f'workload file {path} has no prompts: add lines like {{"prompt": "..."}}.')
    return Workload(path.name, tuple(prompts))


def load(workload: str, n: int, tokenizer_dir: Path | None = None) -> Workload:
    """`workload` is a built-in name or a path; `n` caps how many prompts are used (cycled if fewer); tokenizer_dir:
    the target's tokenizer, whose chat template the chat workload and "messages" records go through."""
    if workload in NAMED:
        loaded = builtin(workload, n, tokenizer_dir)
    elif workload.endswith(".jsonl") or Path(workload).exists():
        loaded = from_jsonl(Path(workload), tokenizer_dir)
    else:
        raise BenchError(f"unknown workload {workload!r}: use one of {', '.join(NAMED)} or a path to a .jsonl file.")
    prompts = loaded.prompts
    return Workload(loaded.name, tuple(prompts[i % len(prompts)] for i in range(n)))
