"""`run_check`: the pair verdict, from the spec alone (no GPU, no model loaded).

A target-only spec (no [draft]) gets the same checks of its one model; the pair's (tokenizers alike, logits of one
width) have nothing to compare. Order: read the checkpoints' facts (a missing or pickle-only checkpoint raises
CheckpointError),
then architecture, position limit, tokenizer equivalence, vocabulary padding, the memory plan and
a scan of the safetensors weights for NaN/Inf (check.weights; reads every weight byte once).
Every finding lands in one `CheckReport`; nothing after the checkpoint reading raises.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specbuild import backends, drafters, families
from specbuild.check.advice import plan_memory
from specbuild.check.advice import summary_lines as engine_summary_lines
from specbuild.check.llmapi_memory import plan_memory as plan_llmapi_memory
from specbuild.check.llmapi_memory import summary_lines as llmapi_summary_lines
from specbuild.check.report import CheckReport
from specbuild.check.tokenizer import compare_tokenizers, load_tokenizer_facts
from specbuild.check.weights import check_weights
from specbuild.config import Spec
from specbuild.contract import build_rules as rules
from specbuild.contract import llmapi as llmapi_contract
from specbuild.errors import CheckpointError
from specbuild.hfmodel import ModelInfo, read_model_info
from specbuild.quantization import dtype_refusal


def read_pair_infos(spec: Spec, allow_pickle: bool = False) -> dict[str, ModelInfo]:
    """Each checkpoint's facts (spec.roles); when any is unreadable, one CheckpointError naming every failing role."""
    infos, failures = {}, []
    for role in spec.roles:
        try:
            infos[role] = read_model_info(spec.role(role).checkpoint, allow_pickle=allow_pickle, role=role)
        except CheckpointError as err:
            failures.append(str(err))
    if len(failures) > 1:
        raise CheckpointError("both checkpoints are unusable:\n  " + "\n  ".join(failures))
    if failures:
        raise CheckpointError(failures[0])
    return infos


@dataclass(frozen=True)
class PathMemory:
    """A path's memory plan (by `backends.Backend.path`): what `up --dry-run` calls it, the planner, and the lines
    `specbuild check` prints for its to_dict()."""

    name: str
    plan: Callable
    summary_lines: Callable[[dict[str, Any]], list[str]]


MEMORY_PLANS = {
    "engine": PathMemory("memory plan", plan_memory, engine_summary_lines),
    "llmapi": PathMemory("LLM API memory plan", plan_llmapi_memory, llmapi_summary_lines),
}


def run_check(
    spec: Spec, allow_pickle: bool = False, scan_weights: bool = True, progress: bool = False, backend: str = "trtllm"
) -> CheckReport:
    """scan_weights: read every weight for NaN/Inf (check.weights); progress: a progress bar on stderr for it.
    backend "llmapi": the LLM API path's memory plan and limits (check.llmapi_memory) instead of the engines'."""
    infos = read_pair_infos(spec, allow_pickle)
    report = CheckReport(pair=spec.name, models={role: info.summary() for role, info in infos.items()})
    for role, info in infos.items():
        check_architecture(report, role, info, spec, backend)
        check_positions(report, spec, role, info)
        check_parallelism(report, spec, role, info)
        check_dtype(report, spec, role, info)
        if not info.has_safetensors:
            report.warn(
                "pickle_weights",
                f"{role} checkpoint has pickle weights only ({', '.join(info.weight_files)}); allowed by "
                "--allow-pickle. Its parameter count is estimated from config.json.",
                "Convert it to safetensors (save_pretrained(dir, safe_serialization=True)).",
            )
    if refusal := drafters.path_refusal(spec.speculative.drafter, backends.path_of(backend)):
        report.problem("drafter_not_on_path", *refusal)
    if backends.get(backend).engines:  # max_num_tokens is a limit trtllm-build writes into an engine
        check_max_num_tokens(report, spec)
    tokenizer_size = check_tokenizers(report, spec)
    check_vocab(report, infos["target"], infos.get("draft"), tokenizer_size)
    plan = MEMORY_PLANS[backends.path_of(backend)].plan(spec, infos["target"], infos.get("draft"))
    report.memory = plan.to_dict()
    report.problems.extend(plan.problems)
    report.warnings.extend(plan.warnings)
    if scan_weights:
        check_weights(report, infos, progress=progress)
    else:
        report.sections["weights"] = {role: {"scanned": False, "reason": "--no-weight-scan"} for role in spec.roles}
    return report


def check_architecture(report: CheckReport, role: str, info: ModelInfo, spec: Spec, backend: str) -> None:
    """The family rules convert and the reference runtime apply (specbuild.families.support), for this backend; where
    only the other path takes the model, the fix names it."""
    path = backends.path_of(backend)
    verdict = families.support(
        info.architecture, info.config, path, spec.build.max_seq_len, llmapi_contract.installed_release()
    )
    if not verdict.ok:
        report.problem(
            "unsupported_architecture", f"{role}: {verdict.reason}.", verdict.fix[:1].upper() + verdict.fix[1:] + "."
        )
    elif refusal := families.export_refusal(role, info.architecture, path):
        report.problem("modelopt_cannot_export", *refusal)


def check_positions(report: CheckReport, spec: Spec, role: str, info: ModelInfo) -> None:
    limit = info.position_limit
    b = spec.build
    if limit is None:
        report.warn(
            "position_limit_unknown",
            f"{role} config.json has no max_position_embeddings; "
            f"build.max_seq_len = {b.max_seq_len} was not checked against the model.",
        )
        return
    if b.max_seq_len > limit:
        report.problem(
            "max_seq_len_above_position_limit",
            f"build.max_seq_len = {b.max_seq_len} exceeds the {role} model's position limit of {limit} "
            f"(max_position_embeddings = {info.max_position_embeddings}"
            + (f", rope scaling {info.rope_scaling}" if info.rope_scaling else "")
            + ").",
            # the whole fix: on the target, the draft tokens the builder adds must fit too (the warning below)
            f"Set build.max_seq_len <= {limit - spec.speculative.max_draft_len if role == 'target' else limit}.",
        )
    elif role == "target" and b.max_seq_len + spec.speculative.max_draft_len > limit:
        report.warn(
            "draft_tokens_beyond_position_limit",
            f"build.max_seq_len + max_draft_len = {b.max_seq_len + spec.speculative.max_draft_len} exceeds the "
            f"target's position limit {limit}: the last drafts of a full-length sequence sit past it.",
            f"Set build.max_seq_len <= {limit - spec.speculative.max_draft_len}.",
        )


def check_max_num_tokens(report: CheckReport, spec: Spec) -> None:
    """The runtime refuses inputs longer than min(max_seq_len - 1, max_num_tokens); the BLS re-sends prompt +
    generated tokens every step, so the build raises max_num_tokens to max_seq_len - 1 (specbuild.contract.build_rules)."""
    b = spec.build
    planned = rules.planned_max_num_tokens(b.max_batch_size, b.max_seq_len, b.max_num_tokens)[0]
    if planned > b.max_num_tokens:
        report.warn(
            "max_num_tokens_raised",
            f"build.max_num_tokens = {b.max_num_tokens} is below max_seq_len - 1 = {b.max_seq_len - 1}: TensorRT-LLM "
            "refuses an input longer than min(max_seq_len - 1, max_num_tokens), and the draft/verify loop sends "
            f"prompt + generated tokens on every step, so a long generation would fail midway. The build uses "
            f"max_num_tokens = {planned} (the memory plan counts it).",
            f"Set build.max_num_tokens = {planned} (or more) to silence this, or lower build.max_seq_len.",
        )


def check_parallelism(report: CheckReport, spec: Spec, role: str, info: ModelInfo) -> None:
    tp, pp = spec.build.tp_size, spec.build.pp_size
    if info.num_heads % tp:
        report.problem(
            "heads_not_divisible_by_tp",
            f"the {role} model has {info.num_heads} attention heads, which tp_size = {tp} does not divide.",
            "Set build.tp_size to a divisor of " + str(info.num_heads) + ".",
        )
    if pp > info.num_layers:
        report.problem(
            "more_stages_than_layers",
            f"build.pp_size = {pp} exceeds the {role} model's {info.num_layers} layers.",
            f"Set build.pp_size <= {info.num_layers}.",
        )


def check_dtype(report: CheckReport, spec: Spec, role: str, info: ModelInfo) -> None:
    wanted = spec.role(role).dtype
    refusal = dtype_refusal(role, wanted)
    if refusal:
        report.problem("dtype_not_exported", *refusal)
    if info.torch_dtype == "bfloat16" and wanted == "float16":
        report.warn(
            "dtype_narrower_than_checkpoint",
            f"the {role} checkpoint is bfloat16 but {role}.dtype = 'float16': models trained in bf16 can "
            "overflow fp16 activations (inf/NaN logits).",
            f'Set {role}.dtype = "bfloat16" unless the model is known to run in fp16.',
        )


def check_tokenizers(report: CheckReport, spec: Spec) -> int | None:
    """Compare the two tokenizers; returns the tokenizer's size (highest id + 1) when they agree. A target alone: its
    tokenizer must be readable (the BLS and the lookup tokenize with it), and there is nothing to compare."""
    facts = {}
    for role in spec.roles:
        try:
            facts[role] = load_tokenizer_facts(spec.role(role).checkpoint, role=role)
        except CheckpointError as err:
            report.problem(
                "tokenizer_unreadable",
                str(err),
                "Both checkpoints need their tokenizer files to prove they share one."
                if spec.draft is not None
                else "The target's folder needs its tokenizer files: the server tokenizes with them.",
            )
    if spec.draft is None and facts:
        report.tokenizer = {"identical": None, "target_only": True, "size": facts["target"].size}
        return facts["target"].max_id + 1
    if len(facts) < 2:
        report.tokenizer = {
            "identical": None,
            "error": [p.message for p in report.problems if p.code == "tokenizer_unreadable"],
        }
        return None
    comparison = compare_tokenizers(facts["target"], facts["draft"])
    report.tokenizer = comparison.to_dict(facts["target"], facts["draft"])
    if not comparison.identical:
        report.problem(
            "tokenizer_mismatch",
            "the target and draft tokenizers differ: " + "; ".join(comparison.differences) + ".",
            "Use a draft trained with the target's tokenizer (same family, e.g. Llama-3.2-1B for Llama-3.1-8B); "
            "the served pair decodes the draft's ids with the target's tokenizer.",
        )
        return None
    if comparison.pipeline_differences:
        report.warn(
            "tokenizer_pipeline_differs",
            "same vocabulary, but "
            + ", ".join(comparison.pipeline_differences)
            + ": the same text may split differently; acceptance may drop (correctness is not affected).",
            "Copy the target's tokenizer files into the draft folder.",
        )
    return facts["target"].max_id + 1


def check_vocab(report: CheckReport, target: ModelInfo, draft: ModelInfo | None, tokenizer_size: int | None) -> None:
    """Both engines must emit logits of the same width (TensorRT-LLM's external-draft-tokens buffers).
    `specbuild convert` pads a smaller draft's embedding and lm_head with zero rows up to the target's, and
    trims a larger draft's when the extra rows lie beyond the tokenizer (no token maps to them). A target alone:
    only that its embedding covers the tokenizer."""
    if draft is None:
        report.vocab = {"tokenizer_size": tokenizer_size, "target_rows": target.vocab_size}
        _check_embedding_covers(report, {"target": target.vocab_size}, tokenizer_size)
        return
    rows = {"target": target.vocab_size, "draft": draft.vocab_size}
    padded = rows["target"]
    trimmable = rows["draft"] > padded and tokenizer_size is not None and tokenizer_size <= padded
    report.vocab = {
        "tokenizer_size": tokenizer_size,
        "target_rows": rows["target"],
        "draft_rows": rows["draft"],
        "padded_vocab_size": padded,
        "pad_rows": {"target": 0, "draft": max(padded - rows["draft"], 0)},
        "will_pad": rows["draft"] < padded,
        "trim_rows": {"target": 0, "draft": rows["draft"] - padded if trimmable else 0},
        "will_trim": trimmable,
    }
    _check_embedding_covers(report, rows, tokenizer_size)
    if rows["draft"] > rows["target"] and not trimmable:
        why = (
            "the tokenizers could not be compared, so whether tokens use those rows is unknown"
            if tokenizer_size is None
            else f"the tokenizer has ids up to {tokenizer_size - 1}: rows "
            f"{rows['target']}..{tokenizer_size - 1} are real tokens the target cannot emit"
        )
        report.problem(
            "draft_vocab_larger_than_target",
            f"the draft's embedding has {rows['draft']} rows, more than the target's {rows['target']}, and {why}. "
            "Both engines must emit logits of the same width; convert cuts extra draft rows only when no token "
            "maps to them.",
            "Use a draft whose vocabulary is no larger than the target's (and the same tokenizer).",
        )
    elif trimmable:
        report.warn(
            "vocab_trim",
            f"the draft's embedding has {rows['draft']} rows, the target's {rows['target']}; the draft's rows "
            f"{rows['target']}..{rows['draft'] - 1} lie beyond the tokenizer ({tokenizer_size} tokens), so "
            f"`specbuild convert` cuts them: both engines emit logits of width {padded}. No token is lost.",
            "Nothing to do: `specbuild convert` trims them (the convert manifest records it).",
        )
    elif report.vocab["will_pad"] and report.tokenizer.get("identical"):
        report.warn(
            "vocab_padding",
            f"embedding rows differ (target {rows['target']}, draft {rows['draft']}): the draft's embedding and "
            f"lm_head will be padded to {padded} rows at convert time, so both engines emit logits of the same width.",
            "Nothing to do: `specbuild convert` pads them.",
        )


def _check_embedding_covers(report: CheckReport, rows: dict[str, int], tokenizer_size: int | None) -> None:
    if tokenizer_size is None:
        return
    for role, n in rows.items():
        if n < tokenizer_size:
            report.problem(
                "embedding_smaller_than_tokenizer",
                f"the {role} model has {n} embedding rows but the tokenizer has ids up to {tokenizer_size - 1}: "
                "those ids would index past the embedding.",
                f"Point {role}.checkpoint at a model whose vocab_size is at least {tokenizer_size}.",
            )
