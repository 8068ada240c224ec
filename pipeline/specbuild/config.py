"""The spec file (`specbuild.toml`): one typed, validated description of a target/draft pair, or of a target alone
(no [draft]: a drafter without a model, `speculative.drafter = "lookup"`).

Built in one place (`load_spec` / `spec_from_dict`); every other module receives a `Spec`.
An invalid value raises `SpecError` naming the field, the bad value and the fix.
Relative paths are resolved against the spec file's folder.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from specbuild import backends, drafters, gpus, quantization
from specbuild.drafters import LookupSettings
from specbuild.errors import SpecError

QUANTIZATIONS = quantization.NAMES  # specbuild.quantization: one record per format
KV_CACHE_DTYPES = ("none", "fp8")  # int8 is refused: it disables paged context FMHA (KV reuse)
DTYPES = ("float16", "bfloat16", "float32")
# trtllm: TensorRT engines (trtllm-build, GPU); reference: PyTorch reference engines (any machine);
# llmapi: TensorRT-LLM's LLM API / PyTorch backend, no engines (GPU), served on CPU by a stand-in.
BACKENDS = backends.NAMES  # specbuild.backends: one record each

# Known GPUs: usable memory in GiB as reported by the driver, and the SM version (records: specbuild.gpus).
GPUS: dict[str, tuple[float, int]] = {name: (gpu.memory_gib, gpu.sm) for name, gpu in gpus.GPUS.items()}


def known_gpu(memory_gib: float, sm: int) -> str | None:
    """The GPUS key of a device seen (torch's total memory in GiB, its SM): the one of that SM whose usable memory is
    within 3 % of it; None when none is (the spec then gives memory_gib). Device names are not matched: drivers
    spell them many ways ("NVIDIA H100 80GB HBM3", "NVIDIA H100 NVL")."""
    close = [(abs(gib - memory_gib) / gib, name) for name, (gib, gpu_sm) in GPUS.items() if gpu_sm == sm]
    best = min(close, default=None)
    return best[1] if best and best[0] <= 0.03 else None


@dataclass(frozen=True)
class ModelSpec:
    checkpoint: Path  # a Hugging Face model folder (config.json, *.safetensors, tokenizer)
    quantization: str = "none"  # one of QUANTIZATIONS
    kv_cache: str = "none"  # one of KV_CACHE_DTYPES
    dtype: str = "float16"  # activation/export dtype


@dataclass(frozen=True)
class SpeculativeSpec:
    max_draft_len: int = 4  # engine limit: the target is built for up to this many draft tokens
    num_draft_tokens: int = 4  # default K per request (<= max_draft_len; 0 = target only)
    use_draft_logits: bool = False  # exact rejection sampling needs the draft's logits
    adaptive: bool = True  # adapt K to the running acceptance rate, fall back to K = 0
    overlap: bool | str = (
        "auto"  # draft the next step while the target verifies: true, false, or "auto" (where it pays)
    )
    drafter: str = drafters.DEFAULT  # what proposes the draft tokens: one of specbuild.drafters.NAMES


@dataclass(frozen=True)
class BuildSpec:
    max_batch_size: int = 4
    max_input_len: int = 1024
    max_seq_len: int = 2048  # prompt + generated tokens (the builder adds max_draft_len on the target)
    max_num_tokens: int = 8192
    tp_size: int = 1
    pp_size: int = 1
    backend: str | None = None  # default --backend of convert/build/repo/serve/up; None: backends.default's rule


@dataclass(frozen=True)
class LlmApiSpec:
    """Settings only the LLM API path (backend "llmapi") uses; the limits come from [build]."""

    free_gpu_memory_fraction: float | None = None  # KV cache (target + draft) share of free memory; None = 0.9
    enable_block_reuse: bool = True  # KV-cache block reuse across requests sharing a prefix
    disable_overlap_scheduler: bool = True  # as NVIDIA's draft/target examples run it


@dataclass(frozen=True)
class GpuSpec:
    name: str | None = "H100-80GB"  # a key of GPUS, or None when memory_gib is given
    memory_gib: float | None = None  # per GPU; overrides the known figure
    count: int = 1
    # GPUs of the draft engine (tp_size x pp_size of them, like the target's 0..n-1): the target's own, or GPUs
    # of its own, so that it drafts ahead without slowing the target. None: its own when count allows, else shared
    draft_device_ids: tuple[int, ...] | None = None

    @property
    def memory_per_gpu_gib(self) -> float:
        if self.memory_gib is not None:
            return self.memory_gib
        return GPUS[self.name][0]  # type: ignore[index]

    @property
    def sm(self) -> int | None:
        return GPUS[self.name][1] if self.name in GPUS else None


# The default queue: 4 waiting requests per request the BLS runs, so a request that gets in waits for about four
# others per slot at most, and an overload is refused at once instead of piling up.
QUEUE_PER_SLOT = 4


@dataclass(frozen=True)
class ServeSpec:
    host: str = "127.0.0.1"  # loopback unless told otherwise
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    bls_instance_count: int = 1
    preprocessing_instance_count: int = 1
    postprocessing_instance_count: int = 1
    max_queue_delay_microseconds: int = 0
    # requests waiting for a slot in the BLS (all instances together) before it refuses more with UNAVAILABLE
    # "Exceeds maximum queue size"; None = QUEUE_PER_SLOT x the requests the BLS runs at once; 0 = unbounded.
    # The BLS's own bound: no model has a Triton queue bound (specbuild.triton.configs says why).
    max_queue_size: int | None = None
    decoupled: bool = True  # stream accepted tokens as they are verified
    # seconds a request waits for a failed target to serve again (its verify call tried again), counted from the
    # step's first failure; past it the request ends UNAVAILABLE (specbuild.triton.models.target_retry). 30 s covers
    # a model reload (2-13 s measured on the CPU example) with room; 0 = a failure ends the request at once
    target_retry_s: int = 30

    def queue_size(self, max_batch_size: int) -> int:
        """The BLS's queue bound: the setting, or the default for a BLS running max_batch_size requests at once per
        instance."""
        if self.max_queue_size is not None:
            return self.max_queue_size
        return QUEUE_PER_SLOT * max_batch_size * self.bls_instance_count


@dataclass(frozen=True)
class Spec:
    name: str
    target: ModelSpec
    draft: ModelSpec | None  # None: a target-only deployment (its drafter needs no model)
    speculative: SpeculativeSpec = field(default_factory=SpeculativeSpec)
    build: BuildSpec = field(default_factory=BuildSpec)
    gpu: GpuSpec = field(default_factory=GpuSpec)
    serve: ServeSpec = field(default_factory=ServeSpec)
    llmapi: LlmApiSpec = field(default_factory=LlmApiSpec)
    lookup: LookupSettings = field(default_factory=LookupSettings)  # prompt lookup's settings (specbuild.drafters)
    output_dir: Path = Path("engines")
    path: Path | None = None  # the spec file this came from, if any

    def device_ids(self, role: str) -> tuple[int, ...]:
        """The GPUs a role's engine runs on: the target on 0..n-1 (n = tp_size x pp_size); the draft on
        gpu.draft_device_ids when given, else on the next n GPUs when gpu.count >= 2 n, else on the target's."""
        n = self.build.tp_size * self.build.pp_size
        if role == "draft" and self.gpu.draft_device_ids is not None:
            return tuple(self.gpu.draft_device_ids)
        first = n if role == "draft" and self.gpu.count >= 2 * n else 0
        return tuple(range(first, first + n))

    @property
    def roles(self) -> tuple[str, ...]:
        """The models the deployment has, each converted, built and served: ("target", "draft") or ("target",)."""
        return ("target", "draft") if self.draft is not None else ("target",)

    def role(self, role: str) -> ModelSpec:
        if role not in ("target", "draft"):
            raise SpecError(f"unknown role {role!r}: use 'target' or 'draft'")
        if role == "draft" and self.draft is None:
            raise SpecError(
                f"the spec {self.name!r} has no [draft] (a target-only deployment): there is no draft model to "
                'convert, build or serve. Add [draft] with checkpoint = "<HF model dir>" for one.'
            )
        return self.target if role == "target" else self.draft  # type: ignore[return-value]

    @property
    def pair_dir(self) -> Path:
        return self.output_dir / self.name

    def to_dict(self) -> dict[str, Any]:
        def plain(value: Any) -> Any:
            if isinstance(value, Path):
                return str(value)
            if isinstance(value, dict):
                return {k: plain(v) for k, v in value.items()}
            return value

        data = plain(dataclasses.asdict(self))
        data.pop("path", None)
        return data


SECTIONS = {
    "target": ModelSpec,
    "draft": ModelSpec,
    "speculative": SpeculativeSpec,
    "build": BuildSpec,
    "gpu": GpuSpec,
    "serve": ServeSpec,
    "llmapi": LlmApiSpec,
    "lookup": LookupSettings,
}
_TOP_LEVEL = ("name", "output_dir", *SECTIONS)


def _unknown_key(where: str, key: str, known: list[str]) -> SpecError:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f' Did you mean "{close[0]}"?' if close else f" Known keys: {', '.join(known)}."
    return SpecError(f"{where}: unknown key {key!r}.{hint}")


def _coerce(where: str, value: Any, annotation: str) -> Any:
    """Check one TOML value against a field annotation (given as a string by `from __future__`)."""
    kind = annotation.replace(" ", "")
    optional = "|None" in kind
    kind = kind.replace("|None", "")
    if value is None and optional:
        return None
    if kind == "bool":
        if isinstance(value, bool):
            return value
        raise SpecError(f"{where} = {value!r}: expected true or false.")
    if kind == "bool|str":  # a switch with an "auto" setting (validate checks the word)
        if isinstance(value, (bool, str)):
            return value
        raise SpecError(f'{where} = {value!r}: expected true, false or "auto".')
    if kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise SpecError(f"{where} = {value!r}: expected an integer.")
    if kind == "tuple[int,...]":
        if isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return tuple(value)
        raise SpecError(f"{where} = {value!r}: expected a list of integers, e.g. [1].")
    if kind == "float":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise SpecError(f"{where} = {value!r}: expected a number.")
    if kind in ("str", "Path"):
        if isinstance(value, str) and value.strip():
            return Path(value) if kind == "Path" else value
        raise SpecError(f"{where} = {value!r}: expected a non-empty string.")
    raise AssertionError(f"unhandled annotation {annotation}")  # a bug in this module, not user input


def _section(name: str, cls: type, raw: Any, base_dir: Path) -> Any:
    if not isinstance(raw, dict):
        raise SpecError(f"[{name}] must be a table, got {raw!r}.")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = {}
    for key, value in raw.items():
        if key not in fields:
            raise _unknown_key(f"[{name}]", key, list(fields))
        coerced = _coerce(f"{name}.{key}", value, str(fields[key].type))
        if isinstance(coerced, Path):
            coerced = coerced.expanduser()  # "~/models/x" means the home folder, not <spec dir>/~
            if not coerced.is_absolute():
                coerced = (base_dir / coerced).resolve()
        values[key] = coerced
    missing = [
        f.name
        for f in fields.values()
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in values
    ]
    if missing:
        raise SpecError(f'[{name}] is missing {", ".join(missing)}: add e.g. {missing[0]} = "..." to the spec.')
    return cls(**values)


def _choice(where: str, value: str, choices: tuple[str, ...] | list[str]) -> None:
    if value not in choices:
        lowered = value.lower()  # "h100-80gb" or "H100" first match by case and prefix, then by spelling
        close = (
            [c for c in choices if c.lower() == lowered]
            or [c for c in choices if c.lower().startswith(lowered)]
            or difflib.get_close_matches(value, list(choices), n=1)
        )
        hint = " Did you mean " + " or ".join(f'"{c}"' for c in close[:2]) + "?" if close else ""
        raise SpecError(f"{where} = {value!r} is not supported.{hint} Choose one of: {', '.join(choices)}.")


def _positive(where: str, value: int | float, minimum: int | float = 1) -> None:
    if value < minimum:
        raise SpecError(f"{where} = {value!r}: must be >= {minimum}.")


def validate(spec: Spec) -> Spec:
    """Cross-field checks; raises SpecError on the first problem."""
    if not spec.name.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise SpecError(f"name = {spec.name!r}: use letters, digits, '-', '_' or '.' (it names a folder).")
    for role in spec.roles:
        model = spec.role(role)
        _choice(f"{role}.quantization", model.quantization, QUANTIZATIONS)
        if model.kv_cache == "int8":
            raise SpecError(
                f"{role}.kv_cache = 'int8' cannot be used: an INT8 KV cache disables paged context FMHA in "
                "trtllm-build, and draft/target speculative decoding needs it for KV-cache reuse. "
                "Use kv_cache = 'fp8' (SM89+) or 'none'."
            )
        _choice(f"{role}.kv_cache", model.kv_cache, KV_CACHE_DTYPES)
        _choice(f"{role}.dtype", model.dtype, DTYPES)
    sp, b, g, s = spec.speculative, spec.build, spec.gpu, spec.serve
    _positive("speculative.max_draft_len", sp.max_draft_len)
    _positive("speculative.num_draft_tokens", sp.num_draft_tokens, 0)
    if sp.num_draft_tokens > sp.max_draft_len:
        raise SpecError(
            f"speculative.num_draft_tokens = {sp.num_draft_tokens} exceeds max_draft_len = {sp.max_draft_len}: "
            "the target engine rejects longer drafts. Lower num_draft_tokens or raise max_draft_len."
        )
    if isinstance(sp.overlap, str) and sp.overlap != "auto":
        raise SpecError(f'speculative.overlap = {sp.overlap!r}: expected true, false or "auto".')
    _choice("speculative.drafter", sp.drafter, drafters.NAMES)
    if spec.draft is None and drafters.get(sp.drafter).needs_draft_model:
        raise SpecError(
            f"the spec has no [draft] table, and speculative.drafter = {sp.drafter!r} needs a draft model: add [draft] "
            'with checkpoint = "<HF model dir>", or set speculative.drafter = "lookup" (a target-only deployment).'
        )
    lk = spec.lookup
    _positive("lookup.max_matching_ngram_size", lk.max_matching_ngram_size)
    _positive("lookup.pool_max_tokens", lk.pool_max_tokens, 2)
    _positive("lookup.hybrid_min_match", lk.hybrid_min_match)
    if lk.hybrid_min_match > lk.max_matching_ngram_size:
        raise SpecError(
            f"lookup.hybrid_min_match = {lk.hybrid_min_match} exceeds max_matching_ngram_size = "
            f"{lk.max_matching_ngram_size}: no match could ever be long enough, so the hybrid would never look up. "
            "Lower hybrid_min_match or raise max_matching_ngram_size."
        )
    for key in ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "tp_size", "pp_size"):
        _positive(f"build.{key}", getattr(b, key))
    if b.backend is not None:
        _choice("build.backend", b.backend, BACKENDS)
    fraction = spec.llmapi.free_gpu_memory_fraction
    if fraction is not None and not 0.0 < fraction <= 1.0:
        raise SpecError(
            f"llmapi.free_gpu_memory_fraction = {fraction!r}: must be a number in (0, 1] (TensorRT-LLM's "
            "KvCacheConfig rejects others). Remove it for TensorRT-LLM's default, 0.9."
        )
    if b.max_input_len >= b.max_seq_len:
        raise SpecError(
            f"build.max_input_len = {b.max_input_len} must be below build.max_seq_len = {b.max_seq_len} "
            "(max_seq_len counts prompt and generated tokens). Raise max_seq_len or lower max_input_len."
        )
    if g.name is None and g.memory_gib is None:
        raise SpecError('[gpu] needs a name (e.g. "H100-80GB") or memory_gib.')
    if g.name is not None and g.name not in GPUS and g.memory_gib is None:
        _choice("gpu.name", g.name, list(GPUS))
    if g.memory_gib is not None:
        _positive("gpu.memory_gib", g.memory_gib, 1)
    _positive("gpu.count", g.count)
    if b.tp_size * b.pp_size > g.count:
        raise SpecError(
            f"build.tp_size x pp_size = {b.tp_size * b.pp_size} needs that many GPUs, but gpu.count = {g.count}. "
            "Raise gpu.count or lower tp_size/pp_size."
        )
    if g.draft_device_ids is not None:
        _check_draft_device_ids(spec)
    for key in ("http_port", "grpc_port", "metrics_port"):
        port = getattr(s, key)
        if not 0 <= port <= 65535:
            raise SpecError(f"serve.{key} = {port}: must be a TCP port in 0..65535 (0 = pick a free one).")
    for key in ("bls_instance_count", "preprocessing_instance_count", "postprocessing_instance_count"):
        _positive(f"serve.{key}", getattr(s, key))
    _positive("serve.max_queue_delay_microseconds", s.max_queue_delay_microseconds, 0)
    if s.max_queue_size is not None:
        _positive("serve.max_queue_size", s.max_queue_size, 0)
    _positive("serve.target_retry_s", s.target_retry_s, 0)
    return spec


def _check_draft_device_ids(spec: Spec) -> None:
    """gpu.draft_device_ids: one GPU per engine rank, each one of gpu.count, all the target's or none of them (the
    memory plan counts a GPU as shared by both engines or as the draft's own)."""
    ids, n, count = list(spec.gpu.draft_device_ids or ()), spec.build.tp_size * spec.build.pp_size, spec.gpu.count
    where = f"gpu.draft_device_ids = {ids}"
    if len(ids) != n:
        raise SpecError(
            f"{where}: the draft engine runs on tp_size x pp_size = {n} GPU{'s' if n != 1 else ''}; list {n}."
        )
    if len(set(ids)) != len(ids) or not all(0 <= i < count for i in ids):
        raise SpecError(f"{where}: list distinct GPU numbers in 0..{count - 1} (gpu.count = {count}).")
    target = set(spec.device_ids("target"))
    if set(ids) != target and not target.isdisjoint(ids):
        raise SpecError(
            f"{where} shares some GPUs with the target's {sorted(target)}: give the draft the target's "
            "GPUs or GPUs of its own, not a mix."
        )


def spec_from_dict(raw: dict[str, Any], base_dir: Path, path: Path | None = None) -> Spec:
    for key in raw:
        if key not in _TOP_LEVEL:
            raise _unknown_key("spec", key, list(_TOP_LEVEL))
    if "target" not in raw:
        raise SpecError('the spec has no [target] table: add [target] with checkpoint = "<HF model dir>".')
    # to_dict writes a target-only spec's draft as None (manifests read it back)
    present = {name: raw[name] for name in SECTIONS if raw.get(name) is not None}
    sections = {name: _section(name, SECTIONS[name], value, base_dir) for name, value in present.items()}
    sections.setdefault("draft", None)
    name = raw.get("name", "pair")
    if not isinstance(name, str) or not name:
        raise SpecError(f"name = {name!r}: expected a non-empty string.")
    output_dir = _coerce("output_dir", raw.get("output_dir", "engines"), "Path").expanduser()
    if not output_dir.is_absolute():
        output_dir = (base_dir / output_dir).resolve()
    return validate(Spec(name=name, output_dir=output_dir, path=path, **sections))


def load_spec(path: str | Path) -> Spec:
    path = Path(path)
    if path.is_dir():
        raise SpecError(
            f"spec file {str(path)!r} is a folder. Pass the spec file itself, e.g. -c {path / 'specbuild.toml'}."
        )
    if not path.is_file():
        raise SpecError(f"spec file {str(path)!r} not found. Create one with `specbuild init` (or `init --example`).")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise SpecError(f"{path}: not valid TOML ({err}).") from None
    except (OSError, UnicodeDecodeError) as err:
        raise SpecError(f"{path}: cannot be read ({err}).") from None
    return spec_from_dict(raw, base_dir=path.resolve().parent, path=path.resolve())


def replace(spec: Spec, section: str, **changes: Any) -> Spec:
    """A copy of `spec` with some fields of one section changed (CLI overrides), validated again."""
    new_section = dataclasses.replace(getattr(spec, section), **changes)
    return validate(dataclasses.replace(spec, **{section: new_section}))
