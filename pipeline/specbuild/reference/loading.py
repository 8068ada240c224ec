"""Which weights the reference runtime runs for a spec, and loading a target/draft pair in-process.

For each role: the reference engine at `<pair_dir>/<role>/engine` when its manifest says backend
"reference" (the converted, possibly quantized-then-dequantized weights), else the Hugging Face
checkpoint named in the spec. The choice is reported as "reference-engine" or "hf-checkpoint".
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specbuild.config import Spec
from specbuild.errors import CheckpointError
from specbuild.hfmodel import listed_end_ids
from specbuild.progress import detail
from specbuild.speculative.overlap import available_cores, resolve_auto

REFERENCE_ENGINE = "reference-engine"
HF_CHECKPOINT = "hf-checkpoint"


@dataclass(frozen=True)
class ModelSource:
    role: str
    path: Path  # an HF-layout folder: config.json + *.safetensors (+ tokenizer files)
    kind: str  # REFERENCE_ENGINE | HF_CHECKPOINT
    limits: dict[str, Any] = field(default_factory=dict)  # engine.json (reference engine) or the spec's build limits


def _reference_engine(folder: Path) -> dict[str, Any] | None:
    """engine.json of a finished reference engine in folder, else None."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
        engine = json.loads((folder / "engine.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if manifest.get("backend") != "reference" or not (folder / "config.json").is_file():
        return None
    return engine if isinstance(engine, dict) else None


def model_source(spec: Spec, role: str) -> ModelSource:
    """The folder the runtime loads for role ("target" | "draft"), and which kind it is."""
    engine_dir = spec.pair_dir / role / "engine"
    engine = _reference_engine(engine_dir)
    if engine is not None:
        return ModelSource(role, engine_dir, REFERENCE_ENGINE, engine)
    b, sp = spec.build, spec.speculative
    limits = {
        "max_batch_size": b.max_batch_size,
        "max_input_len": b.max_input_len,
        "max_seq_len": b.max_seq_len + (sp.max_draft_len if role == "target" else 0),
        "max_draft_len": sp.max_draft_len if role == "target" else 0,
    }
    path = spec.role(role).checkpoint
    if not (path / "config.json").is_file():
        raise CheckpointError(
            f"{role} checkpoint {str(path)!r} has no config.json and no reference engine exists at {engine_dir}. "
            "Fix [" + role + "] checkpoint in the spec, or run `specbuild build` first."
        )
    return ModelSource(role, path, HF_CHECKPOINT, limits)


def resolve_device(device: str | None) -> str:
    """ "auto"/None -> "cuda" when available, else "cpu"; anything else is checked."""
    import torch

    if device in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise CheckpointError(f"device {device!r} asked for, but torch sees no CUDA GPU here: use --device cpu.")
    return device


def load_contract_model(
    source: ModelSource,
    device: str | None = None,
    use_cache: bool = True,
    row_block: int | None = None,
    probe: bool = True,
    announce: bool = False,
):
    """A ContractModel (the tensorrt_llm contract) over the reference engine built from source.

    row_block: rows per matmul block (reference/model.py). None: the first of the device's candidates
    that passes the exactness probe on this machine, else 1 (reference/exactness.py); N: N if it passes
    the probe, else SpecError. probe=False: row_block (or the device's first candidate) unchecked, for
    a baseline that needs no invariance. The choice goes to model.exactness, and to stderr with --verbose, when
    `announce` (a server's log, where operators look) or when it fell back to the safe mode (slower)."""
    from specbuild.reference.contract_model import ContractModel, Limits
    from specbuild.reference.engine import ReferenceEngine
    from specbuild.reference.model import LlamaModel

    max_seq_len = source.limits.get("max_seq_len")
    model = LlamaModel.from_folder(
        source.path,
        device=resolve_device(device),
        row_block=row_block,
        probe=probe,
        max_len=int(max_seq_len) if max_seq_len else None,
    )
    if model.exactness is not None:
        threads = model.exactness.threads
        where = f"cpu, {threads} thread{'s' if threads != 1 else ''}" if threads else model.device.type
        line = f"specbuild: {source.role} ({where}): {model.exactness.describe()}"  # not exact: a warning too
        if announce or model.exactness.mode == "safe":
            print(line, file=sys.stderr, flush=True)
        else:
            detail(line)
    limits = Limits.from_engine(source.limits, model.args.max_position_embeddings)  # logits dtype, max_num_tokens too
    return ContractModel(ReferenceEngine(model, use_cache=use_cache), limits, timed_clock(source.role, model, announce))


def timed_clock(role: str, model, announce: bool = False):
    """The clock of a timed stand-in ($SPECBUILD_STANDIN_TIMING, reference.timing) for `role`'s model, None when
    untimed. `role` may carry a note after the name ("draft (own process, drafts ahead)")."""
    from specbuild.reference import timing

    asked = timing.from_environ()
    clock = asked.clock_for(role.split()[0], model) if asked is not None else None
    if clock is not None:
        line = f"specbuild: {role}: a timed stand-in: {asked.describe()} ({timing.TIMING_ENV})"
        if announce:
            print(line, file=sys.stderr, flush=True)
        else:
            detail(line)
    return clock


@dataclass
class LocalPair:
    """Target and draft in-process, behind the same Drafter/Verifier adapters the Triton BLS uses (a target-only
    spec: the draft's fields are None)."""

    target: ModelSource
    draft: ModelSource | None
    target_model: Any  # ContractModel
    draft_model: Any  # ContractModel, or None
    drafter: Any  # ContractDrafter, or None
    verifier: Any  # ContractVerifier
    tokenizer_dir: Path
    end_id: int | None  # the checkpoint's first listed end id, the one the models get
    max_draft_len: int
    overlap: bool | str = False  # the schedule requests get (resolve_overlap): False, True or "auto"
    overlap_reason: str = "overlap off"
    ahead_drafter: Any = None  # the draft model in a child process (draftproc.DraftProcess), when drafting ahead
    other_end_ids: tuple[int, ...] = ()  # the checkpoint's other listed end ids: they end a request too

    @property
    def engine_source(self) -> str:
        return self.target.kind

    def drafter_for(self, overlap: bool | str) -> Any:
        """The drafter for a schedule: the child-process one when drafting ahead and there is one."""
        return self.ahead_drafter if overlap and self.ahead_drafter is not None else self.drafter

    def close(self) -> None:
        """Stop the draft model's child process, if any."""
        if self.ahead_drafter is not None:
            self.ahead_drafter.close()
            self.ahead_drafter = None


def _has_tokenizer(folder: Path) -> bool:
    return any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer.model", "vocab.json"))


SMALL_HIDDEN = 1024  # up to this hidden size one CPU thread is fastest: the ops are too small to split


def configure_threads(threads: int | None, source: ModelSource, device: str) -> int | None:
    """Set torch's CPU thread count: `threads`, or 1 for small models when None. Returns what was set."""
    import torch

    if device != "cpu":
        return None
    if threads is None:
        try:
            hidden = int(json.loads((source.path / "config.json").read_text()).get("hidden_size", 0))
        except (OSError, ValueError, TypeError):
            return None
        if not 0 < hidden <= SMALL_HIDDEN:
            return None
        threads = 1
    torch.set_num_threads(threads)
    return threads


def resolve_overlap(setting: bool | str, device: str) -> tuple[bool | str, str]:
    """What the loop gets in-process for an overlap setting (spec or CLI), and why (`overlap.resolve_auto`).

    "auto" stays "auto" when the drafter's process and this one each find their own cores: 2 x torch's
    intra-op threads on CPU (both models run on the same pool of cores), 2 when a GPU does the arithmetic.
    """
    if device == "cpu" and not (setting is True or setting is False):
        import torch

        threads = torch.get_num_threads()
        return resolve_auto(
            setting, available_cores(), 2 * threads, f"2 x {threads} torch thread{'s' if threads != 1 else ''}"
        )
    return resolve_auto(setting, available_cores(), 2, "a thread each for the draft and the target")


def load_pair(
    spec: Spec,
    device: str | None = None,
    use_cache: bool = True,
    threads: int | None = None,
    row_block: int | None = None,
    overlap: bool | str = False,
) -> LocalPair:
    """Target and draft in-process. threads: CPU threads for torch (None: 1 for small models, else torch's default),
    set before loading: the row-block probe runs with them. row_block: see load_contract_model.

    overlap: the schedule asked for (the spec's speculative.overlap, or a CLI override), resolved by
    resolve_overlap. When it drafts ahead, a second copy of the draft model is started in a child process
    (reference/draftproc.py: two models on two threads of one process mostly wait for each other's GIL);
    `pair.drafter_for(pair.overlap)` is then that drafter. Call pair.close() when done."""
    from specbuild.contract.adapters import ContractDrafter, ContractVerifier
    from specbuild.reference.draftproc import DraftProcess

    target = model_source(spec, "target")
    draft = model_source(spec, "draft") if spec.draft is not None else None
    device = resolve_device(device)
    configure_threads(threads, target, device)
    schedule, overlap_reason = resolve_overlap(overlap, device)
    if draft is None:  # only a draft model drafts ahead
        schedule, overlap_reason = False, "overlap off: no draft model"
    listed = listed_end_ids(spec.target.checkpoint if target.kind == HF_CHECKPOINT else target.path)
    end_id = listed[0] if listed else None
    use_logits = spec.speculative.use_draft_logits
    process = None
    if schedule:  # loads while this process loads its own models
        import torch

        process = DraftProcess.start(
            draft,
            device,
            torch.get_num_threads() if device == "cpu" else None,
            row_block,
            use_cache,
            end_id,
            use_logits,
        )
    try:
        target_model = load_contract_model(target, device, use_cache, row_block)
        draft_model = load_contract_model(draft, device, use_cache, row_block) if draft is not None else None
        if draft_model is not None and target_model.engine.vocab_size != draft_model.engine.vocab_size:
            raise CheckpointError(
                f"target vocab_size {target_model.engine.vocab_size} != draft vocab_size "
                f"{draft_model.engine.vocab_size}: run `specbuild convert` (it pads the draft's vocabulary) and "
                "`specbuild build`, then retry."
            )
        if process is not None:
            process = process.matching(draft_model.engine.model.row_block)
    except BaseException:
        if process is not None:
            process.close()
        raise
    max_draft_len = target_model.limits.max_draft_len
    return LocalPair(
        target=target,
        draft=draft,
        target_model=target_model,
        draft_model=draft_model,
        drafter=ContractDrafter(draft_model, end_id=end_id, use_logits=use_logits) if draft_model else None,
        verifier=ContractVerifier(target_model, max_draft_len=max_draft_len, end_id=end_id),
        tokenizer_dir=target.path if _has_tokenizer(target.path) else spec.target.checkpoint,
        end_id=end_id,
        max_draft_len=max_draft_len,
        overlap=schedule,
        overlap_reason=overlap_reason,
        ahead_drafter=process,
        other_end_ids=tuple(listed[1:]),
    )
