"""Incremental detokenization: text deltas as tokens arrive, without splitting a character.

Decoding token by token breaks multi-byte characters (a byte-level BPE piece may hold half of
"é" or of an emoji) and word spacing (SentencePiece drops a leading space at the start of a
decode). So each step decodes a short window that starts a few tokens back and emits only the
text past what was already shown, holding it back while it ends in an incomplete character
(U+FFFD). The same approach as Hugging Face TGI and vLLM. No torch import: a tokenizer is enough.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_CONTEXT = 5  # prompt tokens kept as left context so the first piece decodes with its spacing


class TextStream:
    def __init__(self, tokenizer: Any, prompt_ids: Sequence[int] = ()):
        self.tokenizer = tokenizer
        self.ids: list[int] = [int(t) for t in prompt_ids[-_CONTEXT:]]  # [context + generated]
        self.prefix_offset = 0  # start of the window decoded for comparison
        self.read_offset = len(self.ids)  # tokens before this are already shown
        self.text = ""  # everything emitted so far
        self.pushed = 0  # generated tokens pushed so far (their text is emitted or held back)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def push(self, tokens: Sequence[int]) -> str:
        """Add generated tokens; return the new text that is now complete ("" if none yet)."""
        self.ids.extend(int(t) for t in tokens)
        self.pushed += len(tokens)
        shown = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        if len(full) <= len(shown) or full.endswith("\ufffd"):
            return ""  # an incomplete character (or nothing visible): wait for more tokens
        delta = full[len(shown) :]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        self.text += delta
        return delta

    def finish(self) -> str:
        """Flush what is still held back (an incomplete character at the very end shows as U+FFFD)."""
        shown = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        delta = full[len(shown) :] if len(full) > len(shown) else ""
        self.prefix_offset = self.read_offset = len(self.ids)
        self.text += delta
        return delta
