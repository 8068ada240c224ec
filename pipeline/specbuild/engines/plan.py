"""What an engine build is asked to do, per role, from the spec and the checkpoint manifest.

A `RolePlan` is the single source for the trtllm-build argv, the reference engine's `engine.json`,
the input hash, and the check of the built engine's `config.json`. Planning works without a
converted checkpoint (dry-run): the checkpoint path is the one convert would write.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbuild.artifacts import MANIFEST
from specbuild.contract import build_rules as rules
from specbuild.config import Spec
from specbuild.errors import ArtifactError, BuildError, SpecError

ROLES = ("target", "draft")
SPEC_MODE = "draft_tokens_external"


@dataclass(frozen=True)
class EngineLimits:
    max_batch_size: int
    max_input_len: int
    max_seq_len: int  # as passed to trtllm-build (prompt + generated tokens)
    max_num_tokens: int


@dataclass(frozen=True)
class RolePlan:
    role: str  # "target" | "draft"
    checkpoint_dir: Path  # <pair>/<role>/checkpoint
    engine_dir: Path  # <pair>/<role>/engine
    limits: EngineLimits  # what the argv asks for
    max_draft_len: int  # K; the target is built for it, the draft records it for reference
    gather_generation_logits: bool  # draft only: sampling with the draft's logits
    dtype: str
    quant_algo: str | None  # from the checkpoint manifest; None = not converted yet (dry-run) or no quantization
    kv_cache_quant_algo: str | None
    world_size: int  # tp_size * pp_size
    checkpoint_manifest: dict[str, Any] | None  # None when the checkpoint is not there (dry-run only)
    notes: tuple[str, ...] = ()  # adjustments made to the spec's limits, for the log

    @property
    def speculative_decoding_mode(self) -> str | None:
        return SPEC_MODE if self.role == "target" else None

    def expected_build_config(self) -> dict[str, Any]:
        """What the engine's config.json `build_config` must say, including the builder's own adjustments."""
        limits = self.limits
        expected: dict[str, Any] = {
            "max_batch_size": limits.max_batch_size,
            "max_input_len": limits.max_input_len,
            "max_seq_len": limits.max_seq_len,
            "max_num_tokens": limits.max_num_tokens,
            "max_beam_width": 1,
            "max_draft_len": 0,
            "speculative_decoding_mode": "none",
            "gather_context_logits": False,
        }
        if self.role == "target":
            expected["max_seq_len"], expected["max_num_tokens"] = rules.built_target_limits(
                limits.max_batch_size, limits.max_seq_len, limits.max_num_tokens, self.max_draft_len)
            expected["max_draft_len"] = self.max_draft_len
            expected["speculative_decoding_mode"] = SPEC_MODE
        if self.role == "draft" and self.gather_generation_logits:
            expected["gather_generation_logits"] = True
        return expected

    def settings(self) -> dict[str, Any]:
        """Everything that determines the engine apart from the checkpoint's content (for hashing and manifests)."""
        return {
            "role": self.role,
            "limits": dataclasses.asdict(self.limits),
            "max_draft_len": self.max_draft_len,
            "speculative_decoding_mode": self.speculative_decoding_mode,
            "gather_generation_logits": self.gather_generation_logits,
            "dtype": self.dtype,
            "quant_algo": self.quant_algo,
            "kv_cache_quant_algo": self.kv_cache_quant_algo,
            "world_size": self.world_size,
        }


def read_checkpoint_manifest(spec: Spec, role: str, checkpoint_dir: Path) -> dict[str, Any]:
    """The convert stage's manifest, checked to belong to this pair and role."""
    if not (checkpoint_dir / "config.json").is_file():
        raise ArtifactError(
            f"no TensorRT-LLM checkpoint for the {role} at {checkpoint_dir} (config.json missing). "
            "Run `specbuild convert` first (or `specbuild up`)."
        )
    path = checkpoint_dir / MANIFEST
    if not path.is_file():
        raise ArtifactError(
            f"{checkpoint_dir} has no {MANIFEST}: it was not written by `specbuild convert`, or convert did not finish. "
            "Run `specbuild convert --force`."
        )
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ArtifactError(f"{path} is unreadable ({err}). Run `specbuild convert --force`.") from None
    if not isinstance(manifest, dict):
        raise ArtifactError(f"{path} is not a JSON object. Run `specbuild convert --force`.")
    if manifest.get("pair", spec.name) != spec.name or manifest.get("role", role) != role:
        raise ArtifactError(
            f"{path} belongs to pair {manifest.get('pair')!r} role {manifest.get('role')!r}, not pair {spec.name!r} "
            f"role {role!r}. Run `specbuild convert --force` for this spec."
        )
    if "input_hash" not in manifest:
        raise ArtifactError(f"{path} has no input_hash. Run `specbuild convert --force`.")
    return manifest


def _limits(spec: Spec, role: str, max_draft_len: int) -> tuple[EngineLimits, tuple[str, ...]]:
    b = spec.build
    if b.max_input_len > b.max_seq_len:
        raise SpecError(
            f"build.max_input_len = {b.max_input_len} is above build.max_seq_len = {b.max_seq_len}: trtllm-build "
            "would clip it. max_seq_len counts prompt and generated tokens; raise it or lower max_input_len."
        )
    if max_draft_len < 1:
        raise SpecError(
            f"speculative.max_draft_len = {max_draft_len}: the target must be built for at least 1 draft token "
            "(0 means no speculative decoding). Set max_draft_len >= 1."
        )
    budget = b.max_seq_len - b.max_input_len
    if max_draft_len > budget:
        raise SpecError(
            f"speculative.max_draft_len = {max_draft_len} is above the generation budget max_seq_len - max_input_len "
            f"= {budget}: a draft can never be that long. Lower max_draft_len or raise build.max_seq_len."
        )
    max_num_tokens, notes = rules.planned_max_num_tokens(b.max_batch_size, b.max_seq_len, b.max_num_tokens)
    return (EngineLimits(b.max_batch_size, b.max_input_len, b.max_seq_len, max_num_tokens),
            tuple(f"{role}: {note}" for note in notes))


def plan_role(spec: Spec, role: str, require_checkpoint: bool = True) -> RolePlan:
    if role not in ROLES:
        raise SpecError(f"unknown role {role!r}: use 'target' or 'draft'")
    model = spec.role(role)
    checkpoint_dir = spec.pair_dir / role / "checkpoint"
    engine_dir = spec.pair_dir / role / "engine"
    max_draft_len = spec.speculative.max_draft_len
    limits, notes = _limits(spec, role, max_draft_len)
    manifest = None
    if require_checkpoint or (checkpoint_dir / MANIFEST).is_file():
        manifest = read_checkpoint_manifest(spec, role, checkpoint_dir)
    for refusal in rules.gpu_refusals(role, model.quantization, model.kv_cache, spec.gpu.sm, spec.gpu.name):
        if refusal.code != "paged_context_fmha_disabled":  # that one is judged below, on what the checkpoint holds
            raise SpecError(f"{refusal.message} {refusal.fix} (`specbuild check` reports this as {refusal.code}.)")
    quant_algo = rules.norm_algo(manifest.get("quant_algo")) if manifest else None
    kv_algo = rules.norm_algo(manifest.get("kv_cache_quant_algo")) if manifest else None
    if manifest is None and model.kv_cache != "none":  # dry-run before convert: what convert will write
        kv_algo = rules.norm_algo(model.kv_cache)
    if manifest is None:
        loss = rules.spec_paged_context_fmha_loss(model.quantization, model.kv_cache, spec.gpu.sm)
    else:
        loss = rules.paged_context_fmha_loss(quant_algo, kv_algo, spec.gpu.sm)
    if loss is not None:
        where = f"the {role} checkpoint at {checkpoint_dir}" if manifest else f"the {role}'s spec"
        raise BuildError(
            f"{where} would lose paged context FMHA: {loss}"
            + (f" on {spec.gpu.name}" if spec.gpu.name and spec.gpu.sm else "") + ". "
            + rules.paged_context_fmha_fix(role, spec.gpu.sm)
            + " Then run `specbuild convert --force`."
        )
    world_size = spec.build.tp_size * spec.build.pp_size
    if manifest and isinstance(manifest.get("mapping"), dict):
        mapping = manifest["mapping"]
        ckpt_world = int(mapping.get("world_size", mapping.get("tp_size", 1) * mapping.get("pp_size", 1)))
        if ckpt_world != world_size:
            raise BuildError(
                f"the {role} checkpoint at {checkpoint_dir} is sharded for world_size {ckpt_world}, but the spec asks for "
                f"tp_size x pp_size = {world_size}. Run `specbuild convert --force` after changing [build]."
            )
    return RolePlan(
        role=role,
        checkpoint_dir=checkpoint_dir,
        engine_dir=engine_dir,
        limits=limits,
        max_draft_len=max_draft_len,
        gather_generation_logits=role == "draft" and spec.speculative.use_draft_logits,
        dtype=model.dtype,
        quant_algo=quant_algo,
        kv_cache_quant_algo=kv_algo,
        world_size=world_size,
        checkpoint_manifest=manifest,
        notes=notes,
    )


def _limits_of(side: RolePlan | dict[str, Any]) -> dict[str, Any]:
    return dataclasses.asdict(side.limits) if isinstance(side, RolePlan) else dict(side)


def check_consistent(target: RolePlan | dict[str, Any], draft: RolePlan | dict[str, Any]) -> None:
    """The draft's limits must equal the target's (as asked, before the builder's own target adjustments).

    Each side is a plan, or the `settings.limits` dict recorded in an existing engine's manifest.
    """
    ours, theirs = _limits_of(target), _limits_of(draft)
    for key in ("max_batch_size", "max_input_len", "max_seq_len"):
        if theirs.get(key) != ours.get(key):
            raise BuildError(
                f"draft {key} = {theirs.get(key)} disagrees with the target's {ours.get(key)}: the draft/verify loop "
                "runs both engines on the same requests. Build both roles from the same spec (`--role both`)."
            )


def plan_build(spec: Spec, roles: list[str], require_checkpoint: bool = True) -> list[RolePlan]:
    plans = [plan_role(spec, role, require_checkpoint) for role in roles]
    by_role = {plan.role: plan for plan in plans}
    if "target" in by_role and "draft" in by_role:
        check_consistent(by_role["target"], by_role["draft"])
    return plans
