"""Calibration text: the built-in sample set, or a user file (plain text or JSONL with a "text" field).

Plain text: one sample per paragraph (blank-line separated); a file without blank lines gives one
sample per line. JSONL: one JSON object per line with a string "text" field.
The built-in set is the example corpus (stdlib prose, code and generated JSON records) when
available, else the short fallback below. Nothing is ever downloaded.
"""

from __future__ import annotations

from pathlib import Path

from specbuild import jsonl
from specbuild.errors import SpecError

_FALLBACK = [
    "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.",
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
    '{"id": 17, "name": "Ada Lovelace", "city": "London", "tags": ["math", "engines"], "active": true}',
    "Speculative decoding lets a small draft model propose several tokens that a large target model "
    "verifies in one forward pass; the output distribution is exactly the target's.",
    "import json\nwith open('config.json') as f:\n    config = json.load(f)\nprint(config['hidden_size'])\n",
    "In 1843 Ada Lovelace published notes on the Analytical Engine, including an algorithm to compute "
    "Bernoulli numbers, often called the first computer program.",
]


def builtin_texts(n: int, chars: int) -> list[str]:
    """Up to `n` samples of about `chars` characters, interleaving prose, code and JSON."""
    try:
        from specbuild import corpus
    except ImportError:
        corpus = None
    if corpus is None:
        pools = [list(_FALLBACK)]
    else:
        pools = [
            corpus.prose_texts("train"),
            corpus.code_texts("train"),
            ["\n".join(corpus.json_records(4, seed=i)) for i in range(n)],
        ]
    samples: list[str] = []
    index = 0
    while len(samples) < n and any(index < len(p) for p in pools):
        for pool in pools:
            if index < len(pool) and pool[index].strip() and len(samples) < n:
                samples.append(pool[index][:chars])
        index += 1
    return samples


def read_calib_file(path: Path) -> list[str]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise SpecError(
            f"--calib-file {str(path)!r} cannot be read ({err}). Pass a UTF-8 text or JSONL file."
        ) from None
    if path.suffix == ".jsonl":
        samples = []
        for where, _, record in jsonl.records(text, path, SpecError, 'Each line must be {"text": "..."}.'):
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise SpecError(f'{where}: no string "text" field. Each line must be {{"text": "..."}}.')
            if record["text"].strip():
                samples.append(record["text"])
    else:
        blocks = [b.strip() for b in text.split("\n\n")]
        samples = (
            [b for b in blocks if b]
            if len([b for b in blocks if b]) > 1
            else [line for line in text.splitlines() if line.strip()]
        )
    if not samples:
        raise SpecError(f"--calib-file {str(path)!r} holds no text samples. Add some text (one sample per paragraph).")
    return samples


def tokenize_samples(tokenizer, texts: list[str], seq_len: int, device: str) -> list:
    """One [1, <= seq_len] LongTensor per sample (no padding: every token is real text)."""
    batches = []
    for text in texts:
        ids = tokenizer(text, return_tensors="pt", truncation=True, max_length=seq_len)["input_ids"]
        if ids.shape[1] > 0:
            batches.append(ids.to(device))
    return batches
