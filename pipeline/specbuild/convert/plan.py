"""What `convert` will do for one role, resolved from the spec and CLI options before any heavy work.

Reads only config.json and safetensors headers (no torch), so `--dry-run` is fast and every
refusal (architecture, format, GPU, AWQ block size, vocabulary) happens before loading weights.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specbuild import families
from specbuild.config import Spec
from specbuild.contract import llmapi as llmapi_contract
from specbuild.convert import formats
from specbuild.errors import PairError, SpecError
from specbuild.hfmodel import ModelInfo, read_model_info
from specbuild.quantization import dtype_refusal

TOOLS = ("nvidia-modelopt", "torch", "transformers", "safetensors")


@dataclass(frozen=True)
class ConvertOptions:
    device: str = "auto"  # auto | cpu | cuda
    calib_file: Path | None = None
    calib_size: int = 64  # samples (quantize.py's default is 512; AWQ is capped at 32)
    calib_seq_len: int = 256  # tokens per sample
    awq_block_size: int | None = None  # None = 128 when every width divides, else 64
    seed: int = 1234


@dataclass(frozen=True)
class Calibration:
    source: str  # "builtin" or the --calib-file path
    size: int  # samples asked for (after the AWQ cap)
    seq_len: int
    file_sha256: str | None = None


@dataclass(frozen=True)
class RolePlan:
    role: str
    pair: str
    hf_dir: Path
    out_dir: Path
    architecture: str
    model_type: str  # the modelopt / TensorRT-LLM decoder type
    quantization: str
    quant_algo: str | None
    kv_cache: str
    kv_cache_quant_algo: str | None
    dtype: str
    tp_size: int
    pp_size: int
    vocab_rows: int  # embedding rows in the HF checkpoint
    pad_vocab_to: int | None  # the target's rows, when the draft has fewer
    awq_block_size: int | None
    pad_intermediate_to: int | None  # AWQ: MLP width padded with zeros to a multiple of block x tp
    calibration: Calibration | None
    spec_settings: dict[str, Any]
    trim_vocab_to: int | None = None  # the target's rows, when the draft's extra rows lie beyond the tokenizer

    def settings(self) -> dict[str, Any]:
        """The resolved settings that determine the output (part of the input hash)."""
        data = asdict(self)
        for key in ("hf_dir", "out_dir"):
            data[key] = str(data[key])
        return data

    @property
    def vocab_size(self) -> int:
        return self.pad_vocab_to or self.trim_vocab_to or self.vocab_rows


def _check_architecture(info: ModelInfo, role: str, path: str, max_seq_len: int) -> None:
    """The family rules `check` applies too (specbuild.families.support), and what this machine's modelopt exports."""
    verdict = families.support(info.architecture, info.config, path, max_seq_len, llmapi_contract.installed_release())
    if not verdict.ok:
        raise SpecError(f"{role}.checkpoint: {verdict.reason}. Fix: {verdict.fix}.")
    refusal = families.export_refusal(role, info.architecture, path)
    if refusal:
        raise SpecError(f"{refusal[0]} Fix: {refusal[1]}")


def _awq_widths(info: ModelInfo, tp: int) -> list[int]:
    """Input widths per TP rank of the quantized linears other than down_proj (qkv, gate/up: hidden; dense)."""
    return [info.hidden_size, info.num_heads * info.head_dim // tp]


def _awq_intermediate(info: ModelInfo, tp: int, block: int) -> int | None:
    """The padded intermediate size when down_proj's input width per rank is not a multiple of the block.

    Zero rows in gate_proj/up_proj and zero columns in down_proj add silu(0) * 0 = 0: the model is unchanged.
    """
    unit = block * tp
    if info.intermediate_size % unit == 0:
        return None
    return -(-info.intermediate_size // unit) * unit


def _check_tp(info: ModelInfo, tp: int, role: str) -> None:
    for what, value in (("num_attention_heads", info.num_heads), ("intermediate_size", info.intermediate_size)):
        if value % tp:
            raise SpecError(
                f"build.tp_size = {tp} does not divide the {role}'s {what} = {value}. Use a tp_size that does."
            )
    if info.num_kv_heads % tp and tp % info.num_kv_heads:
        raise SpecError(
            f"build.tp_size = {tp} and the {role}'s num_key_value_heads = {info.num_kv_heads}: "
            "one must divide the other. Use another tp_size."
        )


def plan_role(
    spec: Spec, role: str, options: ConvertOptions, target_info: ModelInfo | None = None, path: str = "engine"
) -> RolePlan:
    """path: the backend's path (`backends.Backend.path`); the LLM API's ("llmapi", a Hugging Face export) has
    family rules of its own (specbuild.families)."""
    model = spec.role(role)
    info = read_model_info(model.checkpoint, role=role)
    _check_architecture(info, role, path, spec.build.max_seq_len)
    fmt = formats.get_format(model.quantization)
    kv_algo = formats.check_kv_cache(model.kv_cache, role)
    formats.check_gpu(fmt, model.kv_cache, spec.gpu.sm, spec.gpu.name, role)
    refusal = dtype_refusal(role, model.dtype)
    if refusal:
        raise SpecError(f"{refusal[0]} {refusal[1]}")
    tp, pp = spec.build.tp_size, spec.build.pp_size
    _check_tp(info, tp, role)
    if info.num_layers < pp:
        raise SpecError(f"build.pp_size = {pp} exceeds the {role}'s {info.num_layers} layers. Lower pp_size.")
    block = formats.awq_block_size(_awq_widths(info, tp), options.awq_block_size, role) if fmt.awq else None
    pad_intermediate = _awq_intermediate(info, tp, block) if block else None

    pad_to = trim_to = None
    if role == "draft":
        target_info = target_info or read_model_info(spec.target.checkpoint, role="target")
        if info.vocab_size > target_info.vocab_size:
            trim_to = trim_draft_rows_to(spec, info.vocab_size, target_info.vocab_size)
        if info.vocab_size < target_info.vocab_size:
            pad_to = target_info.vocab_size

    calibration = None
    if fmt.calibrated or model.kv_cache != "none":
        size = min(options.calib_size, formats.AWQ_MAX_CALIB_SIZE) if fmt.awq else options.calib_size
        source, digest = "builtin", None
        if options.calib_file is not None:
            from specbuild.artifacts import hash_file

            path = Path(options.calib_file)
            if not path.is_file():
                raise SpecError(f"--calib-file {str(path)!r} does not exist. Pass a text or JSONL file.")
            source, digest = str(path.resolve()), hash_file(path)
        calibration = Calibration(source=source, size=size, seq_len=options.calib_seq_len, file_sha256=digest)

    return RolePlan(
        role=role,
        pair=spec.name,
        hf_dir=Path(model.checkpoint),
        out_dir=spec.pair_dir / role / "checkpoint",
        architecture=info.architecture,
        model_type=info.trtllm_model_type or "llama",
        quantization=fmt.name,
        quant_algo=fmt.quant_algo,
        kv_cache=model.kv_cache,
        kv_cache_quant_algo=kv_algo,
        dtype=model.dtype,
        tp_size=tp,
        pp_size=pp,
        vocab_rows=info.vocab_size,
        pad_vocab_to=pad_to,
        awq_block_size=block,
        pad_intermediate_to=pad_intermediate,
        calibration=calibration,
        spec_settings={
            "checkpoint": str(model.checkpoint),
            "quantization": model.quantization,
            "kv_cache": model.kv_cache,
            "dtype": model.dtype,
        },
        trim_vocab_to=trim_to,
    )


def tokenizer_rows(spec: Spec) -> int | None:
    """Rows any token of the pair can index: the larger tokenizer's highest id + 1 (None: unreadable)."""
    from specbuild.check.tokenizer import load_tokenizer_facts
    from specbuild.errors import CheckpointError

    try:
        return max(
            load_tokenizer_facts(spec.role(role).checkpoint, role=role).max_id + 1 for role in ("target", "draft")
        )
    except CheckpointError:
        return None


def trim_draft_rows_to(spec: Spec, draft_rows: int, target_rows: int) -> int:
    """The draft has more embedding rows than the target. TensorRT-LLM's external-draft-tokens buffers need
    equal logits widths; cutting the extra rows is safe when no token maps to them (they lie beyond the
    tokenizer, and the target has no such ids to accept). Returns the target's rows, or raises when the
    rows are real tokens."""
    tokens = tokenizer_rows(spec)
    if tokens is None or tokens > target_rows:
        what = (
            "the tokenizers cannot be read, so it is unknown whether tokens map to them"
            if tokens is None
            else f"the tokenizer has ids up to {tokens - 1}, so rows {target_rows}..{tokens - 1} are real tokens"
        )
        raise PairError(
            f"the draft's embedding has {draft_rows} rows, more than the target's {target_rows}, and {what}: "
            "TensorRT-LLM needs both engines to emit logits of the same width, and cutting rows that tokens use "
            "would change the draft. Use a draft whose vocabulary is no larger than the target's."
        )
    return target_rows


def plan_roles(spec: Spec, roles: list[str], options: ConvertOptions, path: str = "engine") -> list[RolePlan]:
    if options.calib_size < 1 or options.calib_seq_len < 8:
        raise SpecError(
            f"--calib-size {options.calib_size} / --calib-seq-len {options.calib_seq_len}: "
            "need at least 1 sample of at least 8 tokens."
        )
    target_info = read_model_info(spec.target.checkpoint, role="target") if "draft" in roles else None
    return [plan_role(spec, role, options, target_info, path) for role in roles]


def describe(plan: RolePlan) -> dict[str, Any]:
    """The --dry-run view: settings plus the files that would be written."""
    ranks = plan.tp_size * plan.pp_size
    return {
        **plan.settings(),
        "vocab_size": plan.vocab_size,
        "mapping": {"world_size": ranks, "tp_size": plan.tp_size, "pp_size": plan.pp_size},
        "would_write": [
            str(plan.out_dir / name)
            for name in ("config.json", *(f"rank{r}.safetensors" for r in range(ranks)), "manifest.json")
        ],
    }
