"""How many bytes of text one token can cover, for a Hugging Face fast tokenizer: the bound that lets the BLS
refuse a prompt by its size in bytes, before tokenizing it.

The argument: if every token covers at most L bytes of the prompt, a prompt of B bytes needs at least
ceil(B / L) tokens (special tokens such as BOS only add to that). A prompt of more than max_input_len * L
bytes therefore has more than max_input_len tokens and would be refused after tokenizing anyway; refusing it
by its size first never refuses a prompt that would fit.

L is read from the tokenizer's own definition (`tokenizer.json`, the `tokenizers` library's format):
- a vocabulary token of a byte-level tokenizer (GPT-2 / Llama 3 style `ByteLevel` pre-tokenizer) covers one
  byte per character of its string, each byte of the text being mapped to one character
  (huggingface/tokenizers `tokenizers/src/pre_tokenizers/byte_level.rs`, `bytes_char`);
- any other vocabulary token covers at most its own UTF-8 length: a SentencePiece-style token's text is the
  prompt's text with a space written as "\u2581" (3 bytes for 1), and a byte-fallback token "<0x0A>" covers
  one byte;
- an added (special) token covers its content; an unknown character, one character (at most 4 bytes).

That holds only when nothing before the model removes or shortens text. The steps known never to do so are
allowed; any other (Unicode normalization, lowercasing, stripping, a pre-tokenizer that drops whitespace,
added tokens that swallow neighbouring spaces, unknown characters fused into one token) gives no bound, and
the BLS then checks the prompt only after tokenizing it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

UTF8_MAX_CHAR_BYTES = 4
# pre-tokenizers that split or map the text but keep every byte of it (Split/Punctuation unless "Removed")
_KEEPING_PRE_TOKENIZERS = {"ByteLevel", "Metaspace", "Digits", "UnicodeScripts", "Split", "Punctuation"}


@dataclass(frozen=True)
class TokenBytes:
    longest: int | None  # most bytes of text one token covers; None = no bound for this tokenizer
    reason: str = ""  # why there is no bound

    def limit(self, tokens: int) -> int | None:
        """Most bytes a text of at most `tokens` tokens can have; None without a bound."""
        return None if self.longest is None else tokens * self.longest


def _steps(node: dict[str, Any] | None, key: str) -> list[dict[str, Any]]:
    if node is None:
        return []
    if node.get("type") == "Sequence":
        return [step for child in node.get(key, []) for step in _steps(child, key)]
    return [node]


def _shortens(spec: dict[str, Any]) -> str:
    """Why this tokenizer may turn some text into fewer bytes before its model sees it ('' if it never does)."""
    for step in _steps(spec.get("normalizer"), "normalizers"):
        kind = step.get("type")
        if kind == "Prepend":
            continue
        pattern = (step.get("pattern") or {}).get("String") if kind == "Replace" else None
        if pattern is not None and len(step.get("content", "").encode()) >= len(pattern.encode()):
            continue  # e.g. " " -> "\u2581": never shorter
        return f"its normalizer {kind} may shorten the text"
    for step in _steps(spec.get("pre_tokenizer"), "pretokenizers"):
        kind = step.get("type")
        if kind not in _KEEPING_PRE_TOKENIZERS or str(step.get("behavior", "")).lower() == "removed":
            return f"its pre-tokenizer {kind} may drop characters"
    for token in spec.get("added_tokens", []):
        if token.get("lstrip") or token.get("rstrip"):
            return f"its added token {token.get('content')!r} swallows neighbouring whitespace"
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        return f"its model is {model.get('type')}, not BPE"
    if model.get("unk_token") is not None and model.get("fuse_unk") and not model.get("byte_fallback"):
        return "it fuses a run of unknown characters into one token"
    return ""


def max_token_bytes(tokenizer: Any) -> TokenBytes:
    """The most bytes of text one token of `tokenizer` (a transformers fast tokenizer) can cover."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return TokenBytes(None, "it is not a fast (tokenizers) tokenizer")
    spec = json.loads(backend.to_str())
    reason = _shortens(spec)
    if reason:
        return TokenBytes(None, reason)
    byte_level = any(step.get("type") == "ByteLevel" for step in _steps(spec.get("pre_tokenizer"), "pretokenizers"))
    vocab = spec["model"].get("vocab") or {}
    longest = max((len(token) if byte_level else len(token.encode()) for token in vocab), default=0)
    longest = max([longest, *(len(t.get("content", "").encode()) for t in spec.get("added_tokens", []))])
    if spec["model"].get("unk_token") is not None:
        longest = max(longest, UTF8_MAX_CHAR_BYTES)
    return TokenBytes(max(longest, 1))
