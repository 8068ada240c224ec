"""Guides for structured output, with xgrammar (the grammar library TensorRT-LLM 1.2 pins: 0.1.25).

A request names a guide as NVIDIA's Triton models do: `guided_decoding_guide_type` and `guided_decoding_guide`
(NVIDIA/TensorRT-LLM `triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt`):

    json           any JSON value (the guide text is not read)
    json_schema    JSON that validates against the schema in the guide text
    regex          text that matches the regular expression in the guide text
    ebnf_grammar   text of the EBNF grammar in the guide text (xgrammar's dialect, root rule `root`)

`Grammars` is made once per deployment (the tokenizer's vocabulary, the model's vocabulary size, the end ids that
end a generation) and compiles each request's guide; a guide that does not compile is refused by name
(RequestError, INVALID_ARG on the BLS). Each request gets its own `XgrammarGuide` (the grammar's state), which the
loop drives (`speculative.guide`). Only xgrammar calls of 0.1.25 are used: `TokenizerInfo.from_huggingface`,
`GrammarCompiler.compile_*`, `GrammarMatcher.accept_token / rollback / fill_next_token_bitmask`.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from specbuild.errors import RequestError

__all__ = ["GUIDE_TYPES", "GuideRequest", "Grammars", "XgrammarGuide"]

GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar")  # NVIDIA's guided_decoding_guide_type values
# what xgrammar puts before its reason: "[22:51:44] /project/cpp/x.cc:75: ", then maybe "Check failed: (...) is false: "
_XGRAMMAR_PREFIX = re.compile(r"^\[[\d:]+\]\s+\S+:\d+:\s*(Check failed: \(.*?\) is false:\s*)?")


@dataclass(frozen=True)
class GuideRequest:
    """What a request asks for: a guide type and its text (empty for "json")."""

    type: str
    text: str = ""

    def __post_init__(self) -> None:
        if self.type not in GUIDE_TYPES:
            raise RequestError(
                f"guided_decoding_guide_type = {self.type!r} is unknown: use one of {', '.join(GUIDE_TYPES)}."
            )
        if self.type != "json" and not self.text.strip():
            raise RequestError(
                f"guided_decoding_guide is empty: a {self.type} guide needs its text (the schema, regex or grammar)."
            )

    @classmethod
    def from_inputs(cls, guide_type: str | None, guide: str | None) -> GuideRequest | None:
        """The guide of a request's two inputs; None when neither is set (an empty type with no guide is unset)."""
        if not guide_type and not guide:
            return None
        if not guide_type:
            raise RequestError(
                "guided_decoding_guide is set without guided_decoding_guide_type: name its type "
                f"({', '.join(GUIDE_TYPES)})."
            )
        return cls(guide_type, guide or "")


class XgrammarGuide:
    """One request's grammar state (speculative.guide.Guide) over xgrammar's GrammarMatcher."""

    def __init__(self, matcher: Any, vocab_size: int, bitmask: Any):
        self.matcher, self._vocab_size, self._bitmask = matcher, vocab_size, bitmask

    def allowed_prefix(self, tokens: Sequence[int]) -> int:
        taken = 0
        for token in tokens:
            if not (0 <= int(token) < self._vocab_size) or not self.matcher.accept_token(int(token)):
                break
            taken += 1
        if taken:
            self.matcher.rollback(taken)
        return taken

    def advance(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            if not self.matcher.accept_token(int(token)):
                raise RequestError(f"token {int(token)} is not allowed by the guide here.")

    def allowed(self) -> np.ndarray:
        """[vocab] bool: the tokens the grammar allows next."""
        self.matcher.fill_next_token_bitmask(self._bitmask)
        bits = np.unpackbits(self._bitmask.numpy().view(np.uint8), bitorder="little")  # bit j of word i: 32i + j
        return bits[: self._vocab_size].astype(bool)


class Grammars:
    """A deployment's grammar compiler: the tokenizer's vocabulary read once, each guide compiled per request
    (xgrammar caches what it compiled)."""

    def __init__(self, tokenizer: Any, vocab_size: int, end_ids: Sequence[int]):
        self.tokenizer, self.vocab_size, self.end_ids = tokenizer, int(vocab_size), [int(i) for i in end_ids]
        self._compiler: Any = None
        self._lock = threading.Lock()

    def _compile(self, guide: GuideRequest) -> Any:
        import xgrammar

        with self._lock:
            if self._compiler is None:
                info = xgrammar.TokenizerInfo.from_huggingface(
                    self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.end_ids
                )
                self._compiler = xgrammar.GrammarCompiler(info, max_threads=1)
        compile_ = {
            "json": lambda _text: self._compiler.compile_builtin_json_grammar(),
            "json_schema": self._compiler.compile_json_schema,
            "regex": self._compiler.compile_regex,
            "ebnf_grammar": self._compiler.compile_grammar,
        }[guide.type]
        try:
            return compile_(guide.text)
        except (RuntimeError, ValueError, TypeError) as err:
            reason = _XGRAMMAR_PREFIX.sub("", str(err).strip()).splitlines()[0]
            raise RequestError(f"guided_decoding_guide ({guide.type}) does not compile: {reason}") from None

    def guide(self, guide: GuideRequest) -> XgrammarGuide:
        """A fresh grammar state for one request; RequestError names a guide that does not compile."""
        import xgrammar

        if not self.end_ids:
            raise RequestError("a guided request needs an end id to end on, and this deployment has none.")
        compiled = self._compile(guide)
        return XgrammarGuide(
            xgrammar.GrammarMatcher(compiled), self.vocab_size, xgrammar.allocate_token_bitmask(1, self.vocab_size)
        )
