"""The check report: what `specbuild check` found, as data.

`problems` make the pair unusable (`ok` is false, exit 1); `warnings` are worth reading but do not
block. Each finding has a stable `code`, a `message` (what is wrong, with the offending values) and
a `fix` (what to change). Sections (`tokenizer`, `vocab`, `memory`, and later `measure`) are
plain JSON-ready dicts so other stages can add their own without touching this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Finding:
    code: str  # stable identifier, e.g. "tokenizer_mismatch", "does_not_fit"
    message: str  # what is wrong, naming the offending values
    fix: str = ""  # what to change

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message, "fix": self.fix}


@dataclass
class CheckReport:
    pair: str  # the spec's name
    models: dict[str, dict[str, Any]] = field(default_factory=dict)  # role -> ModelInfo.summary()
    tokenizer: dict[str, Any] = field(default_factory=dict)
    vocab: dict[str, Any] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)
    problems: list[Finding] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)  # extra sections, e.g. "measure"

    @property
    def ok(self) -> bool:
        return not self.problems

    def problem(self, code: str, message: str, fix: str = "") -> None:
        self.problems.append(Finding(code, message, fix))

    def warn(self, code: str, message: str, fix: str = "") -> None:
        self.warnings.append(Finding(code, message, fix))

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "pair": self.pair,
            "models": self.models,
            "tokenizer": self.tokenizer,
            "vocab": self.vocab,
            "memory": self.memory,
            **self.sections,
            "problems": [p.to_dict() for p in self.problems],
            "warnings": [w.to_dict() for w in self.warnings],
        }
