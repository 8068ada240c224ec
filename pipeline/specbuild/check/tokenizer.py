"""Tokenizer equivalence: the draft must read and write exactly the target's token ids.

The served pair uses one tokenizer (the target's) for both models, so the draft's id -> token map,
added tokens and special-token ids must equal the target's. Different merges or normalization with
an identical vocabulary do not break correctness (the draft only ever sees ids) but change how text
splits, so they are reported as warnings.

Loading: `tokenizers.Tokenizer.from_file("tokenizer.json")` when present, else
`transformers.AutoTokenizer` offline with `trust_remote_code=False` (slow tokenizers).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specbuild.errors import CheckpointError

SPECIAL_ROLES = ("bos", "eos", "pad", "unk")


@dataclass(frozen=True)
class TokenizerFacts:
    path: Path
    source: str  # "tokenizer.json" or "transformers"
    id_to_token: dict[int, str]  # the full map, added tokens included
    added_tokens: dict[int, tuple[str, bool]]  # id -> (content, special)
    special_tokens: dict[str, str | None]  # role -> token text, e.g. {"bos": "<s>", ...}
    special_ids: dict[str, Any]  # role -> id (eos may be a list, from generation_config.json)
    pipeline: dict[str, str] = field(default_factory=dict)  # part -> sha256 (model/merges, normalizer, ...)

    @property
    def size(self) -> int:
        return len(self.id_to_token)

    @property
    def max_id(self) -> int:
        return max(self.id_to_token, default=-1)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise CheckpointError(f"{path} cannot be read ({err.strerror}). Check its permissions.") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path} is not valid JSON ({err}). Download or save the tokenizer again.") from None
    return data if isinstance(data, dict) else {}


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _special_tokens(folder: Path) -> dict[str, str | None]:
    config = _read_json(folder / "tokenizer_config.json")
    special_map = _read_json(folder / "special_tokens_map.json")
    return {
        role: _token_text(config.get(f"{role}_token")) or _token_text(special_map.get(f"{role}_token"))
        for role in SPECIAL_ROLES
    }


def _special_ids(folder: Path, tokens: dict[str, str | None], token_to_id: dict[str, int]) -> dict[str, Any]:
    """Ids from the token texts; generation_config.json (then config.json) wins where it names ids."""
    ids: dict[str, Any] = {role: token_to_id.get(text) if text else None for role, text in tokens.items()}
    for name in ("config.json", "generation_config.json"):  # later files override earlier ones
        data = _read_json(folder / name)
        for role in ("bos", "eos", "pad"):
            value = data.get(f"{role}_token_id")
            if isinstance(value, list) and len(value) == 1:
                value = value[0]
            if isinstance(value, int) or (isinstance(value, list) and all(isinstance(v, int) for v in value)):
                ids[role] = sorted(value) if isinstance(value, list) else value
    return ids


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def load_tokenizer_facts(path: str | Path, role: str = "model") -> TokenizerFacts:
    folder = Path(path)
    tokenizer_json = folder / "tokenizer.json"
    if tokenizer_json.is_file():
        return _from_tokenizer_json(folder, tokenizer_json, role)
    return _from_transformers(folder, role)


def _from_tokenizer_json(folder: Path, tokenizer_json: Path, role: str) -> TokenizerFacts:
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(tokenizer_json))
    except Exception as err:  # the Rust library raises plain Exception subclasses for parse errors
        raise CheckpointError(
            f"{role} tokenizer {str(tokenizer_json)!r} cannot be loaded ({err}). Save the tokenizer again."
        ) from None
    token_to_id = tok.get_vocab(with_added_tokens=True)
    added = {i: (t.content, bool(t.special)) for i, t in tok.get_added_tokens_decoder().items()}
    raw = _read_json(tokenizer_json)
    model = raw.get("model") if isinstance(raw.get("model"), dict) else {}
    pipeline = {
        "model_type": str(model.get("type")),
        "merges": _digest(model.get("merges")),
        "normalizer": _digest(raw.get("normalizer")),
        "pre_tokenizer": _digest(raw.get("pre_tokenizer")),
        "post_processor": _digest(raw.get("post_processor")),
    }
    tokens = _special_tokens(folder)
    return TokenizerFacts(
        path=folder,
        source="tokenizer.json",
        id_to_token={i: t for t, i in token_to_id.items()},
        added_tokens=added,
        special_tokens=tokens,
        special_ids=_special_ids(folder, tokens, token_to_id),
        pipeline=pipeline,
    )


def _from_transformers(folder: Path, role: str) -> TokenizerFacts:
    known = ("tokenizer.model", "vocab.json", "vocab.txt", "spiece.model", "tokenizer_config.json")
    if not any((folder / name).is_file() for name in known):
        raise CheckpointError(
            f"{role} checkpoint {str(folder)!r} has no tokenizer (tokenizer.json, tokenizer.model, vocab.json). "
            "Copy the tokenizer files of the model into the folder (the draft needs the same ones as the target)."
        )
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    except Exception as err:  # transformers raises OSError, ValueError, ImportError...; all mean the same here
        raise CheckpointError(
            f"{role} tokenizer in {str(folder)!r} cannot be loaded ({type(err).__name__}: {err}). "
            "Save it as tokenizer.json (tokenizer.save_pretrained) or install what the message names."
        ) from None
    token_to_id = dict(tok.get_vocab())
    added = {int(i): (str(t.content), bool(t.special)) for i, t in tok.added_tokens_decoder.items()}
    tokens = _special_tokens(folder)
    for role_name in SPECIAL_ROLES:
        tokens[role_name] = tokens[role_name] or getattr(tok, f"{role_name}_token", None)
    return TokenizerFacts(
        path=folder,
        source="transformers",
        id_to_token={i: t for t, i in token_to_id.items()},
        added_tokens=added,
        special_tokens=tokens,
        special_ids=_special_ids(folder, tokens, token_to_id),
        pipeline={"class": type(tok).__name__},
    )


@dataclass(frozen=True)
class TokenizerComparison:
    identical: bool  # same id -> token map, added tokens and special tokens
    first_difference: dict[str, Any] | None  # {"id", "target", "draft"} for the lowest differing id
    differences: list[str]  # every kind of difference found, in words
    pipeline_differences: list[str]  # merges/normalizer/... (warnings only)

    def to_dict(self, target: TokenizerFacts, draft: TokenizerFacts) -> dict[str, Any]:
        return {
            "identical": self.identical,
            "size": {"target": target.size, "draft": draft.size},
            "source": {"target": target.source, "draft": draft.source},
            "special_tokens": {
                r: {"token": target.special_tokens.get(r), "id": target.special_ids.get(r)} for r in SPECIAL_ROLES
            },
            "first_difference": self.first_difference,
            "differences": self.differences,
            "pipeline_differences": self.pipeline_differences,
        }


def first_differing_id(target: dict[int, str], draft: dict[int, str]) -> dict[str, Any] | None:
    """The lowest id whose token differs, or that exists on one side only (None: identical maps)."""
    for token_id in sorted(set(target) | set(draft)):
        a, b = target.get(token_id), draft.get(token_id)
        if a != b:
            return {"id": token_id, "target": a, "draft": b}
    return None


def _describe(diff: dict[str, Any]) -> str:
    def side(token: str | None) -> str:
        return repr(token) if token is not None else "no token"

    return f"id {diff['id']}: target has {side(diff['target'])}, draft has {side(diff['draft'])}"


def compare_tokenizers(target: TokenizerFacts, draft: TokenizerFacts) -> TokenizerComparison:
    differences = []
    first = first_differing_id(target.id_to_token, draft.id_to_token)
    if first is not None:
        differing = sum(
            1
            for i in set(target.id_to_token) | set(draft.id_to_token)
            if target.id_to_token.get(i) != draft.id_to_token.get(i)
        )
        differences.append(f"vocabulary differs at {differing} id(s), the first is {_describe(first)}")
    added_first = first_differing_id(
        {i: f"{c} (special={s})" for i, (c, s) in target.added_tokens.items()},
        {i: f"{c} (special={s})" for i, (c, s) in draft.added_tokens.items()},
    )
    if added_first is not None:
        differences.append(f"added tokens differ, the first is {_describe(added_first)}")
        first = first or added_first
    for role in SPECIAL_ROLES:
        t_tok, d_tok = target.special_tokens.get(role), draft.special_tokens.get(role)
        t_id, d_id = target.special_ids.get(role), draft.special_ids.get(role)
        if t_tok != d_tok or t_id != d_id:
            differences.append(f"{role} token differs: target {t_tok!r} (id {t_id}), draft {d_tok!r} (id {d_id})")
    pipeline = [
        f"{part} differs"
        for part in sorted(set(target.pipeline) | set(draft.pipeline))
        if target.pipeline.get(part) != draft.pipeline.get(part)
    ]
    return TokenizerComparison(not differences, first, differences, pipeline)
