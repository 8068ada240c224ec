"""Text that exists on every machine: the running Python's standard library, plus generated JSON.

Used to train the built-in example pair and, by `bench`, as its code / prose / json workloads.
Everything is deterministic: a fixed, sorted file list, seeded generators, and a train/held-out
split decided by a hash of each file's name (so one missing file never reshuffles the others).

    code_texts("train")         stdlib module sources (`<stdlib>/*.py`)
    prose_texts("train")        docstrings of those modules, plus the stdlib LICENSE text
    json_records(n, seed)       JSON records (users, orders, events, log lines), one per string
    heldout_prompts(kind, n)    prompt strings taken from files/records never used for training
"""

from __future__ import annotations

import ast
import hashlib
import json
import random
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

KINDS = ("code", "prose", "json")
HELDOUT_EVERY = 8  # about one file in eight is held out
TRAIN_JSON_SEED = 1234
HELDOUT_JSON_SEED = 98765  # a different stream: held-out records never appear in training


@dataclass(frozen=True)
class SourceFile:
    name: str  # e.g. "argparse.py"
    text: str
    heldout: bool


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _is_heldout(name: str) -> bool:
    return int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) % HELDOUT_EVERY == 0


def _fallback_dir() -> Path:
    """specbuild's own sources: used only when the interpreter ships no stdlib .py files."""
    return Path(__file__).resolve().parent


@lru_cache(maxsize=4)
def source_files(root: str | None = None) -> tuple[SourceFile, ...]:
    """The sorted top-level `.py` files of the stdlib (or of `root`), decoded as UTF-8."""
    folder = Path(root) if root else stdlib_dir()
    paths = sorted(folder.glob("*.py")) if folder.is_dir() else []
    if len(paths) < 16:
        paths = sorted(_fallback_dir().rglob("*.py"))
    files = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # unreadable or not UTF-8: skip, the rest of the corpus is unchanged
        if text.strip():
            files.append(SourceFile(path.name, text.replace("\r\n", "\n"), _is_heldout(path.name)))
    return tuple(files)


def _split(split: str) -> bool:
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    return split == "heldout"


def code_texts(split: str = "train") -> list[str]:
    heldout = _split(split)
    return [f.text for f in source_files() if f.heldout == heldout]


def _docstrings(text: str) -> list[str]:
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    docs = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc and len(doc) >= 80:
                docs.append(doc)
    return docs


@lru_cache(maxsize=2)
def _prose(heldout: bool) -> tuple[str, ...]:
    texts = []
    for f in source_files():
        if f.heldout == heldout:
            texts.extend(_docstrings(f.text))
    license_file = stdlib_dir() / "LICENSE.txt"
    if not heldout and license_file.is_file():
        texts.append(license_file.read_text(encoding="utf-8", errors="replace"))
    return tuple(texts)


def prose_texts(split: str = "train") -> list[str]:
    """English prose: docstrings (>= 80 characters) of the split's modules; training also gets LICENSE.txt."""
    return list(_prose(_split(split)))


_FIRST = [
    "Ada",
    "Alan",
    "Grace",
    "Linus",
    "Guido",
    "Barbara",
    "Ken",
    "Dennis",
    "Margaret",
    "John",
    "Frances",
    "Edsger",
    "Donald",
    "Radia",
    "Tim",
    "Katherine",
    "Bjarne",
    "Niklaus",
    "Leslie",
    "Hedy",
]
_LAST = [
    "Lovelace",
    "Turing",
    "Hopper",
    "Torvalds",
    "Rossum",
    "Liskov",
    "Thompson",
    "Ritchie",
    "Hamilton",
    "McCarthy",
    "Allen",
    "Dijkstra",
    "Knuth",
    "Perlman",
    "Peters",
    "Johnson",
    "Stroustrup",
    "Wirth",
]
_CITIES = ["Berlin", "Paris", "Lagos", "Tokyo", "Lima", "Oslo", "Austin", "Pune", "Seoul", "Nairobi", "Quito"]
_ITEMS = ["keyboard", "monitor", "cable", "laptop", "mouse", "headset", "webcam", "dock", "charger", "stand"]
_TAGS = ["new", "sale", "priority", "gift", "bulk", "returned", "vip", "backorder"]
_LEVELS = ["DEBUG", "INFO", "INFO", "INFO", "WARNING", "ERROR"]
_EVENTS = ["login", "logout", "page_view", "purchase", "signup", "search", "click"]
_MESSAGES = [
    "request served",
    "cache miss",
    "retrying connection",
    "user not found",
    "slow query",
    "token refreshed",
    "disk usage high",
    "job finished",
]


def _date(rng: random.Random) -> str:
    return f"20{rng.randint(19, 26)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _record(rng: random.Random, index: int) -> dict:
    kind = rng.choice(("user", "order", "event", "log"))
    if kind == "user":
        first, last = rng.choice(_FIRST), rng.choice(_LAST)
        return {
            "id": index,
            "type": "user",
            "name": f"{first} {last}",
            "email": f"{first.lower()}.{last.lower()}@example.com",
            "age": rng.randint(18, 90),
            "city": rng.choice(_CITIES),
            "active": rng.random() < 0.8,
            "signup_date": _date(rng),
        }
    if kind == "order":
        lines = [
            {
                "sku": f"{rng.choice(_ITEMS)}-{rng.randint(100, 999)}",
                "qty": rng.randint(1, 5),
                "price": round(rng.uniform(2, 900), 2),
            }
            for _ in range(rng.randint(1, 3))
        ]
        return {
            "id": index,
            "type": "order",
            "customer_id": rng.randint(1, 5000),
            "items": lines,
            "total": round(sum(item["qty"] * item["price"] for item in lines), 2),
            "tags": sorted(rng.sample(_TAGS, rng.randint(0, 2))),
            "status": rng.choice(("paid", "shipped", "open")),
        }
    if kind == "event":
        return {
            "id": index,
            "type": "event",
            "event": rng.choice(_EVENTS),
            "user_id": rng.randint(1, 5000),
            "timestamp": f"{_date(rng)}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}Z",
            "properties": {"path": f"/{rng.choice(_ITEMS)}s/{rng.randint(1, 300)}", "ms": rng.randint(5, 2000)},
        }
    return {
        "id": index,
        "type": "log",
        "level": rng.choice(_LEVELS),
        "logger": f"app.{rng.choice(_EVENTS)}",
        "message": rng.choice(_MESSAGES),
        "line": rng.randint(1, 900),
    }


def json_records(n: int, seed: int = TRAIN_JSON_SEED) -> list[str]:
    """`n` JSON documents (one object each, compact separators, stable key order) from a seeded stream."""
    rng = random.Random(seed)
    return [json.dumps(_record(rng, i + 1), separators=(", ", ": ")) for i in range(n)]


def _cut(text: str, chars: int) -> str:
    """At most `chars` characters of `text`, ending on a line break when there is one."""
    if len(text) <= chars:
        return text
    head = text[:chars]
    newline = head.rfind("\n")
    return head[: newline + 1] if newline > chars // 2 else head


def heldout_prompts(kind: str, n: int, chars: int = 400) -> list[str]:
    """`n` prompts of about `chars` characters from text never used for training (kind: code, prose, json)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if kind == "json":
        records = json_records(n * 4, seed=HELDOUT_JSON_SEED)
        return [_cut("\n".join(records[4 * i : 4 * i + 4]), chars) for i in range(n)]
    texts = code_texts("heldout") if kind == "code" else prose_texts("heldout")
    prompts: list[str] = []
    offset = 1  # skip each file's first window (mostly license headers and imports)
    while len(prompts) < n and texts:
        # Round-robin over held-out texts, taking successive windows, so prompts differ.
        for text in texts:
            start = offset * chars
            if start < len(text):
                window = _cut(text[start:], chars)
                if window.strip():
                    prompts.append(window)
            if len(prompts) == n:
                break
        offset += 1
        if offset * chars > max(len(t) for t in texts):
            break
    return prompts


def training_documents(json_count: int, prose: bool = True) -> dict[str, list[str]]:
    """The training split by kind, as whole documents."""
    return {
        "code": code_texts("train"),
        "prose": prose_texts("train") if prose else [],
        "json": json_records(json_count, seed=TRAIN_JSON_SEED),
    }


def describe() -> dict:
    """What the corpus was made from (stored in example.json)."""
    files = source_files()
    return {
        "stdlib_dir": str(stdlib_dir()),
        "code_files": len(files),
        "heldout_files": sorted(f.name for f in files if f.heldout),
        "fingerprint": hashlib.sha256("\n".join(f"{f.name}:{len(f.text)}" for f in files).encode()).hexdigest()[:16],
        "json_seed": TRAIN_JSON_SEED,
        "heldout_json_seed": HELDOUT_JSON_SEED,
    }
