"""`specbuild bench --workload json-schema`: does speculation keep its speedup under a grammar, and does every output
validate?

The prompts are held-out JSON Lines records of the built-in corpus (`specbuild.corpus`, the "json" kind, whole
records in their order): a prompt is a few records, and its guide is the JSON schema of the type of the held-out
record that comes next (user, order, event, log: `SCHEMAS`). Every prompt runs in four cells, interleaved request by request so a busy machine
slows them alike: unguided and guided, each at K = 0 and at K. Both ask for one record: the guided request ends
where its schema's object closes, the unguided one at the end of its line (stop word "\n"). Reported per K:

- the unguided speedup (tokens/s at K over K = 0) and the guided one, on the same prompts, and their ratio (the
  aim: >= 0.95, speculation keeps its speedup under the grammar);
- how many guided outputs parse and validate against their schema (jsonschema), of all guided outputs (the aim:
  all; an output cut by max_tokens before its record closes does not);
- whether every guided output at K equals the guided output at K = 0 token for token (exactness);
- the guided steps that needed a constrained target call (`constrained_steps`).

Figures, never a pass/fail: the aims are read from them (docs/bench/results.md records runs).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specbuild.decode.generation import Options
from specbuild.errors import BenchError

WORKLOAD = "json-schema"
_STRING = {"type": "string"}
_INT = {"type": "integer"}
_NUMBER = {"type": "number"}


def _record(kind: str, properties: dict[str, Any]) -> dict[str, Any]:
    props = {"id": _INT, "type": {"const": kind}, **properties}
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


# The corpus's record types (specbuild.corpus: its "json" kind), as JSON schemas in the order its records list them
SCHEMAS: dict[str, dict[str, Any]] = {
    "user": _record(
        "user",
        {
            "name": _STRING,
            "email": _STRING,
            "age": _INT,
            "city": _STRING,
            "active": {"type": "boolean"},
            "signup_date": _STRING,
        },
    ),
    "order": _record(
        "order",
        {
            "customer_id": _INT,
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"sku": _STRING, "qty": _INT, "price": _NUMBER},
                    "required": ["sku", "qty", "price"],
                    "additionalProperties": False,
                },
            },
            "total": _NUMBER,
            "tags": {"type": "array", "items": _STRING},
            "status": _STRING,
        },
    ),
    "event": _record(
        "event",
        {
            "event": _STRING,
            "user_id": _INT,
            "timestamp": _STRING,
            "properties": {"type": "object"},
        },
    ),
    "log": _record("log", {"level": _STRING, "logger": _STRING, "message": _STRING, "line": _INT}),
}


@dataclass(frozen=True)
class GuidedPrompt:
    text: str  # whole records, each on its line
    kind: str  # the type of the held-out record that comes next: its schema is the guide

    @property
    def schema(self) -> dict[str, Any]:
        return SCHEMAS[self.kind]


def prompts(n: int, context_records: int = 2) -> list[GuidedPrompt]:
    """n prompts: `context_records` whole held-out records, then the schema of the record that follows them."""
    from specbuild.corpus import heldout_prompts

    lines = [line for text in heldout_prompts("json", 10 * n) for line in text.splitlines() if line.strip()]
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a record the prompt cut in the middle
        if isinstance(record, dict) and record.get("type") in SCHEMAS:
            records.append(line)
    out = []
    for start in range(0, len(records) - context_records, context_records + 1):
        following = json.loads(records[start + context_records])["type"]
        out.append(GuidedPrompt("\n".join(records[start : start + context_records]) + "\n", following))
        if len(out) == n:
            return out
    if not out:
        raise BenchError("the built-in JSON records are missing: this is a packaging bug, reinstall specbuild.")
    return out


def validates(text: str, schema: dict[str, Any]) -> bool:
    """The text is one JSON value (surrounding whitespace allowed) that the schema accepts."""
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


ROUNDS = 2  # what bench runs: every prompt in every cell twice


def run_cells(ks: list[int]) -> list[tuple[bool, int]]:
    """The cells a run measures, (guided, K): unguided and guided, each at K = 0 and each K > 0 of `ks`."""
    return [(guided, k) for guided in (False, True) for k in (0, *sorted({k for k in ks if k > 0}))]


def run(
    session: Any,  # LocalSession or ServedSession: generate(prompt, Options) -> Generation
    ks: list[int],
    n_prompts: int,
    rounds: int,
    max_tokens: int,
    tick: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Every prompt in the cells (guided or not) x (K = 0, each K in ks), interleaved, `rounds` times."""
    asked = sorted({k for k in ks if k > 0})
    if not asked:
        raise BenchError("--workload json-schema compares speculation with K = 0: give a K > 0 (--num-draft-tokens).")
    work = prompts(n_prompts)
    cells = run_cells(ks)
    totals = {cell: [0, 0.0] for cell in cells}  # tokens, seconds
    outputs: dict[tuple[bool, int], list[tuple[int, list[int] | None, str]]] = {cell: [] for cell in cells}
    constrained = dict.fromkeys(asked + [0], 0)
    for r in range(rounds):
        for i, prompt in enumerate(work):
            order = cells[(r + i) % len(cells) :] + cells[: (r + i) % len(cells)]  # each cell first in turn
            for guided, k in order:
                options = Options(
                    max_tokens=max_tokens,
                    num_draft_tokens=k,
                    adaptive=False,
                    guide_type="json_schema" if guided else None,
                    guide=json.dumps(prompt.schema) if guided else None,
                    stop=() if guided else ("\n",),  # unguided, one record too: the line it writes
                )
                started = time.perf_counter()
                generation = session.generate(prompt.text, options)
                seconds = generation.seconds or time.perf_counter() - started
                totals[guided, k][0] += generation.output_tokens
                totals[guided, k][1] += seconds
                outputs[guided, k].append((i, generation.output_ids, generation.text))
                if guided:
                    constrained[k] += generation.stats.constrained_steps if generation.stats else 0
                if tick is not None:
                    tick()
    rate = {cell: (t / s if s else 0.0) for cell, (t, s) in totals.items()}
    guided_texts = [(i, text) for k in (0, *asked) for i, _, text in outputs[True, k]]
    valid = sum(validates(text, work[i].schema) for i, text in guided_texts)
    per_k = []
    for k in asked:
        free = rate[False, k] / rate[False, 0] if rate[False, 0] else None
        under = rate[True, k] / rate[True, 0] if rate[True, 0] else None
        reference = {i: ids for i, ids, _ in outputs[True, 0]}
        same = all(ids == reference[i] for i, ids, _ in outputs[True, k]) if reference else None
        per_k.append(
            {
                "k": k,
                "unguided_speedup": _round(free),
                "guided_speedup": _round(under),
                "speedup_ratio": _round(under / free if under and free else None),
                "guided_same_tokens_as_k0": same,
                "constrained_steps": constrained[k],
            }
        )
    return {
        "workload": WORKLOAD,
        "prompts": len(work),
        "rounds": rounds,
        "max_tokens": max_tokens,
        "record_types": sorted({p.kind for p in work}),
        "tokens_per_s": {f"{'guided' if g else 'unguided'}_k{k}": _round(v) for (g, k), v in rate.items()},
        "guided_outputs": len(guided_texts),
        "guided_valid": valid,
        "guided_valid_rate": _round(valid / len(guided_texts) if guided_texts else None),
        "constrained_steps_k0": constrained[0],
        "per_k": per_k,
    }


def table(doc: dict[str, Any]) -> str:
    lines = [
        f"workload {doc['workload']}: {doc['prompts']} prompts x {doc['rounds']} rounds, max_tokens "
        f"{doc['max_tokens']}, records {', '.join(doc['record_types'])}",
        f"guided outputs valid against their schema: {doc['guided_valid']}/{doc['guided_outputs']}",
        "K   unguided speedup   guided speedup   ratio   guided = K 0   constrained steps",
    ]
    for row in doc["per_k"]:
        lines.append(
            f"{row['k']:<3} {row['unguided_speedup']!s:<18} {row['guided_speedup']!s:<16} "
            f"{row['speedup_ratio']!s:<7} {row['guided_same_tokens_as_k0']!s:<14} {row['constrained_steps']}"
        )
    return "\n".join(lines)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
