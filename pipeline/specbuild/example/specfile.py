"""Write a fully commented spec file (`specbuild.toml`), generated from `specbuild.config`'s dataclasses.

Every key of every section is written with its value and a one-line reason; keys whose default is
"unset" (None) are written commented out. `REASONS` must name every dataclass field: a test checks
it, so a new field in `config.py` cannot silently go undocumented here.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from specbuild import config
from specbuild.config import DTYPES, GPUS, KV_CACHE_DTYPES, QUANTIZATIONS

SECTIONS: dict[str, type] = config.SECTIONS  # the spec's tables, in the order a spec file shows them
SECTION_HEADINGS = {
    "target": "The large model whose output you want (a Hugging Face checkpoint folder).",
    "draft": "The small model that proposes tokens; it must share the target's tokenizer.",
    "speculative": "Draft/verify settings.",
    "build": "Engine limits (trtllm-build); they also size the KV cache in the memory plan.",
    "gpu": "The GPU the engines are built for and served on.",
    "serve": "tritonserver settings.",
    "llmapi": "The LLM API path (--backend llmapi: TensorRT-LLM's PyTorch backend, no engines; docs/llmapi.md).",
    "lookup": "Prompt lookup, the drafter that needs no model (speculative.drafter lookup or hybrid; "
    "docs/speculative.md).",
}
MODEL_REASONS = {
    "checkpoint": "required: Hugging Face model folder (config.json, *.safetensors, tokenizer files)",
    "quantization": f"weight quantization at convert time: {', '.join(QUANTIZATIONS)}",
    "kv_cache": f"KV-cache quantization: {', '.join(KV_CACHE_DTYPES)} (int8 is refused: it breaks KV reuse)",
    "dtype": f"activation / export dtype: {', '.join(DTYPES)}",
}
REASONS: dict[str, str] = {
    "name": "names the output folder <output_dir>/<name>; letters, digits, '-', '_', '.'",
    "output_dir": "where converted checkpoints, engines and the Triton repository go (relative to this file)",
    **{f"target.{k}": v for k, v in MODEL_REASONS.items()},
    **{f"draft.{k}": v for k, v in MODEL_REASONS.items()},
    "speculative.max_draft_len": "engine limit: the target is built to verify up to this many draft tokens",
    "speculative.num_draft_tokens": "K per request by default (<= max_draft_len; 0 = target only)",
    "speculative.use_draft_logits": "exact rejection sampling (temperature > 0) needs the draft's logits",
    "speculative.adaptive": "adapt K to the running acceptance rate and fall back to K = 0 when it stops paying",
    "speculative.overlap": 'draft the next step while the target verifies this one: true, false, or "auto" '
    "(in-process: on with 2 free cores, off while its early drafts rarely hit)",
    "speculative.drafter": "what proposes the draft tokens: model (the draft model), lookup (n-grams of the text so "
    "far, no model), hybrid (per step the lookup where the text repeats, else the draft model)",
    "build.max_batch_size": "most requests in flight per engine",
    "build.max_input_len": "longest prompt in tokens",
    "build.max_seq_len": "prompt + generated tokens (must exceed max_input_len)",
    "build.max_num_tokens": "most tokens in one engine step across the batch (packed, remove-padding)",
    "build.tp_size": "tensor parallelism: GPUs per model",
    "build.pp_size": "pipeline parallelism: stages per model",
    "build.backend": "default --backend of check/convert/build/repo/serve/up: trtllm (engines, GPU), reference (CPU), "
    "llmapi (TensorRT-LLM LLM API, GPU; CPU stand-in); unset: trtllm where trtllm-build is on "
    "PATH, else reference",
    "gpu.name": f"known GPUs: {', '.join(GPUS)}",
    "gpu.memory_gib": "usable memory per GPU in GiB; overrides the known figure, or set it for an unlisted GPU",
    "gpu.count": "GPUs available (>= tp_size x pp_size)",
    "gpu.draft_device_ids": "GPUs of the draft engine, e.g. [1]: its own lets it draft ahead without slowing the "
    "target (unset: its own when count >= 2 x tp_size x pp_size, else the target's)",
    "serve.host": "address to bind; loopback unless you mean to expose the server",
    "serve.http_port": "Triton HTTP port (0 = pick a free one)",
    "serve.grpc_port": "Triton gRPC port (0 = pick a free one)",
    "serve.metrics_port": "Prometheus metrics port (0 = pick a free one)",
    "serve.bls_instance_count": "instances of the speculative-decoding BLS model",
    "serve.preprocessing_instance_count": "instances of the tokenizer (preprocessing) model",
    "serve.postprocessing_instance_count": "instances of the detokenizer (postprocessing) model",
    "serve.max_queue_delay_microseconds": "dynamic batching delay (0 = send at once)",
    "serve.max_queue_size": "requests waiting for the BLS before it refuses more (UNAVAILABLE); unset = 4 x the "
    "requests it runs at once (build.max_batch_size x bls_instance_count); 0 = unbounded",
    "serve.decoupled": "stream accepted tokens as they are verified",
    "serve.target_retry_s": "seconds a request waits for a failed target model to serve again before it ends "
    "UNAVAILABLE (its steps are tried again: the text is unchanged); 0 = end it at once",
    "llmapi.free_gpu_memory_fraction": "KV cache of target + draft as a share of free GPU memory; TensorRT-LLM's "
    "default is 0.9 (`specbuild check --backend llmapi` shows what it holds)",
    "llmapi.enable_block_reuse": "reuse KV-cache blocks across requests that share a prefix",
    "llmapi.disable_overlap_scheduler": "true as in NVIDIA's draft/target examples",
    "lookup.max_matching_ngram_size": "the longest n-gram of the text's end looked up (TensorRT-LLM's NGram name)",
    "lookup.is_keep_all": "false: one match per n-gram is kept, the newest (TensorRT-LLM's NGram name)",
    "lookup.is_use_oldest": "of several matches the oldest (true) or the newest (TensorRT-LLM's NGram name)",
    "lookup.is_public_pool": "look up recent requests' text too, not only the request's own (the pool)",
    "lookup.pool_max_tokens": "the pool's cap in tokens; the oldest request's text goes first",
    "lookup.hybrid_min_match": "the hybrid drafts by lookup when at least this many tokens matched",
}
PLACEHOLDER_CHECKPOINTS = {"target": "models/target", "draft": "models/draft"}


def all_keys() -> list[str]:
    """Every key a spec file can hold, as "section.key" ("name" and "output_dir" at the top)."""
    keys = ["name", "output_dir"]
    for section, cls in SECTIONS.items():
        keys.extend(f"{section}.{f.name}" for f in dataclasses.fields(cls))
    return keys


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (str, Path)):
        return json.dumps(str(value))  # a JSON string is a valid TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def _default(cls: type, name: str) -> Any:
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


# shown, commented out, for keys whose default is unset
UNSET_EXAMPLES = {
    "memory_gib": 80.0,
    "backend": "llmapi",
    "free_gpu_memory_fraction": 0.9,
    "max_queue_size": 64,
    "draft_device_ids": [1],
}


def _line(key: str, value: Any, default: Any, reason: str) -> list[str]:
    note = ""
    if default is not dataclasses.MISSING and value != default and default is not None:
        note = f" (default {toml_value(default)})"
    if value is None:
        example = toml_value(UNSET_EXAMPLES[key]) if key in UNSET_EXAMPLES else '"..."'
        return [f"# {reason} (unset by default; uncomment to set)", f"# {key} = {example}"]
    return [f"# {reason}{note}", f"{key} = {toml_value(value)}"]


def render_spec(overrides: dict[str, Any] | None = None, header: str | None = None) -> str:
    """The text of a commented spec: defaults from `specbuild.config`, changed by `overrides`.

    overrides: {"name": ..., "output_dir": ..., "<section>": {"<key>": value}}; "draft": None leaves [draft] out (a
    target-only spec: its drafter needs no model).
    """
    overrides = overrides or {}
    unknown = set(overrides) - {"name", "output_dir", *SECTIONS}
    if unknown:
        raise ValueError(f"unknown spec sections {sorted(unknown)}")
    lines = [f"# {line}" if line else "#" for line in (header or "specbuild spec file").splitlines()]
    lines += ["# Every key is listed with its value; change what you need. Docs: `specbuild <command> --help`.", ""]
    spec_fields = {f.name: f for f in dataclasses.fields(config.Spec)}
    for key in ("name", "output_dir"):
        default = spec_fields[key].default
        if default is dataclasses.MISSING:
            default = "pair"  # what spec_from_dict uses when the file has no name
        lines += _line(key, overrides.get(key, default), default, REASONS[key])
    for section, cls in SECTIONS.items():
        if section == "draft" and overrides.get(section, {}) is None:
            lines += [
                "",
                "# No [draft]: a target-only deployment, drafting by prompt lookup (speculative.drafter). For a draft "
                "model,",
                '# add [draft] with checkpoint = "<its Hugging Face folder>" and set speculative.drafter.',
            ]
            continue
        values = dict(overrides.get(section, {}))
        names = [f.name for f in dataclasses.fields(cls)]
        if set(values) - set(names):
            raise ValueError(f"unknown keys in [{section}]: {sorted(set(values) - set(names))}")
        lines += ["", f"# {SECTION_HEADINGS[section]}", f"[{section}]"]
        for name in names:
            default = _default(cls, name)
            value = values.get(name, default)
            if value is dataclasses.MISSING:
                value = PLACEHOLDER_CHECKPOINTS[section] if name == "checkpoint" else None
            lines += _line(name, value, default, REASONS[f"{section}.{name}"])
    return "\n".join(lines) + "\n"


def best_num_draft_tokens(agreement: float, cost_ratio: float, max_draft_len: int) -> int:
    """K maximising the closed-form speedup (1 - a^(K+1)) / ((1 - a)(K c + 1)), for K in 1..max_draft_len."""
    a = min(max(agreement, 0.0), 0.999)

    def speedup(k: int) -> float:
        return (1 - a ** (k + 1)) / (1 - a) / (k * cost_ratio + 1)

    return max(range(1, max_draft_len + 1), key=speedup)


def example_overrides(pair: Any, variant: str, max_draft_len: int = 6) -> dict[str, Any]:
    """Spec values for the built-in example pair (`pair` is an ExamplePair)."""
    k = best_num_draft_tokens(pair.info.get("agreement", 0.5), pair.info.get("cost_ratio", 0.3), max_draft_len)
    return {
        "name": "example" if variant == "full" else f"example-{variant}",
        "target": {"checkpoint": str(pair.target)},
        "draft": {"checkpoint": str(pair.draft)},
        "speculative": {"max_draft_len": max_draft_len, "num_draft_tokens": k},
        # The example models know 2048 positions and were trained on short windows: small limits.
        "build": {"max_batch_size": 4, "max_input_len": 256, "max_seq_len": 512, "max_num_tokens": 2048},
        "gpu": {"name": "H100-80GB"},
    }


def overrides_from_check(report: dict[str, Any], source: str) -> tuple[dict[str, Any], str]:
    """Spec values and a header line from a `specbuild check --measure --json` report.

    The measured recommendation becomes speculative.max_draft_len and num_draft_tokens; the report's
    pair name and checkpoint paths are kept too (the caller may override them, e.g. with --example).
    """
    from specbuild.errors import SpecError

    measure = report.get("measure") if isinstance(report, dict) else None
    if not isinstance(measure, dict) or "recommended_max_draft_len" not in measure:
        raise SpecError(
            f"{source} has no measurement: write it with `specbuild check --measure --json > {source}` and retry."
        )
    k = int(measure["recommended_max_draft_len"] or 0)
    speculative: dict[str, Any] = {"num_draft_tokens": k}
    if k > 0:
        speculative["max_draft_len"] = k
    overrides: dict[str, Any] = {"speculative": speculative}
    if report.get("pair"):
        overrides["name"] = report["pair"]
    models = report.get("models") or {}
    for role in ("target", "draft"):
        path = (models.get(role) or {}).get("path")
        if path:
            overrides[role] = {"checkpoint": str(path)}
    cost = measure.get("cost_ratio") or {}
    verdict = (
        f"recommended max_draft_len {k}"
        if k
        else "speculation is not predicted to pay (num_draft_tokens 0: target only)"
    )
    header = (
        f"K from `specbuild check --measure` ({source}): alpha {measure.get('alpha')}, "
        f"c {cost.get('gpu') if cost.get('gpu') is not None else cost.get('this_machine')}, {verdict}."
    )
    return overrides, header


def merge_overrides(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """base with extra's keys laid over it, section by section."""
    merged = {key: dict(value) if isinstance(value, dict) else value for key, value in base.items()}
    for key, value in extra.items():
        if isinstance(value, dict):
            merged[key] = {**(merged.get(key) or {}), **value}
        else:
            merged[key] = value
    return merged


def write_spec(path: str | Path, text: str, force: bool = False) -> Path:
    """Write `text` to `path`; refuse to overwrite an existing file unless `force`."""
    from specbuild.errors import SpecError

    path = Path(path)
    if (path.exists() or path.is_symlink()) and not force:
        raise SpecError(
            f"{path} already exists; not overwriting it. Pass --force to replace it, or --out to write elsewhere."
        )
    if path.is_dir():
        raise SpecError(
            f"{path} is a folder; a spec file is not written over a folder, not even with --force. "
            "Pass --out with a file path."
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "x", encoding="utf-8") as f:  # "x": never over a file someone else left there
            f.write(text)
    except FileExistsError:
        raise SpecError(f"{tmp} exists and was not written by this run; move it away and run again.") from None
    os.replace(tmp, path)
    return path


def pair_overrides(target: Path, draft: Path | None) -> dict[str, Any]:
    """Spec values for your own pair (draft None: the target alone, drafting by prompt lookup), from its checkpoints
    (read without torch): the name, the two folders, each
    model's dtype where the checkpoint says (float16 or bfloat16; a float32 checkpoint is exported in float16), the
    backend when only the LLM API path takes the family, and limits that fit both models' positions (the target's
    less the draft tokens the builder adds to it) and sliding windows, as `check` asks (specbuild.families.support,
    the rule check applies). SpecError, with check's reasons, when no path takes the pair."""
    import re

    from specbuild import drafters, families
    from specbuild.config import BuildSpec, SpeculativeSpec
    from specbuild.contract import llmapi as llmapi_contract
    from specbuild.errors import SpecError
    from specbuild.hfmodel import read_model_info

    folders = {"target": target, "draft": draft} if draft is not None else {"target": target}
    infos = {role: read_model_info(folder, role=role) for role, folder in folders.items()}
    k = SpeculativeSpec().max_draft_len
    limits = [
        info.position_limit - (k if role == "target" else 0)
        for role, info in infos.items()
        if info.position_limit is not None
    ]
    windows = [
        families.sliding_window(family, info.config)
        for info in infos.values()
        if (family := families.family_of(info.architecture)) is not None
    ]
    max_seq_len = min([BuildSpec().max_seq_len, *limits, *(w for w in windows if w is not None)])
    max_input_len = min(BuildSpec().max_input_len, max_seq_len // 2)
    if max_input_len < 1:
        raise SpecError(
            f"no limits fit this pair: build.max_seq_len would be {max_seq_len} (its positions and "
            "sliding windows allow no more), which leaves no room for a prompt and an answer."
        )
    overrides: dict[str, Any] = {
        "name": re.sub(r"[^A-Za-z0-9._-]+", "-", Path(target).resolve().name).strip("-") or "pair",
        "build": {"max_seq_len": max_seq_len, "max_input_len": max_input_len},
    }
    if draft is None:
        overrides["draft"] = None
        overrides["speculative"] = {"drafter": drafters.LOOKUP}
    for role, info in infos.items():
        overrides[role] = {"checkpoint": str(info.path)}
        if info.torch_dtype in ("float16", "bfloat16"):
            overrides[role]["dtype"] = info.torch_dtype
    release = llmapi_contract.installed_release()
    verdicts = {
        path: [
            (role, families.support(info.architecture, info.config, path, max_seq_len, release))
            for role, info in infos.items()
        ]
        for path in ("engine", "llmapi")
    }
    takes = {path: all(verdict.ok for _, verdict in found) for path, found in verdicts.items()}
    if not takes["engine"] and takes["llmapi"]:
        overrides["build"]["backend"] = "llmapi"  # the only path that takes the family (check says why)
    elif not takes["engine"]:
        reasons = sorted(
            {f"{role}: {verdict.reason}" for found in verdicts.values() for role, verdict in found if not verdict.ok}
        )
        raise SpecError("no path takes this pair, so init writes no spec for it:\n  " + "\n  ".join(reasons))
    return overrides
