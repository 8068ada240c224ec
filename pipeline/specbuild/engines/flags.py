"""The `trtllm-build` flags specbuild passes, in one table, and the argv they make.

Every flag below exists in TensorRT-LLM 1.x's `trtllm-build`: checked by reading NVIDIA/TensorRT-LLM's
`tensorrt_llm/commands/build.py` at 65f1d15 (the 1.x parser, without the auto-parallel arguments)
and the pydantic `PluginConfig` / `add_plugin_argument` of `tensorrt_llm/plugin/plugin.py` (1.x:
plugin dtypes accept "auto", booleans take enable/disable, `paged_kv_cache` is no longer a plugin
flag). The v1.2.1 tag itself was not read; the GPU image checks the installed version at build
time and `specbuild build` warns on another release line. The draft/target recipe is
TensorRT-LLM's `examples/draft_target_model/README.md`.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specbuild.engines.plan import RolePlan

TRTLLM_VERSION_CHECKED = "1.2.1"  # the release specbuild targets (the GPU image's); its tag was not read
TRTLLM_SOURCE_CHECKED = "NVIDIA/TensorRT-LLM tensorrt_llm/commands/build.py @65f1d15, plugin/plugin.py @c20322ff"


@dataclass(frozen=True)
class Flag:
    name: str  # as trtllm-build spells it
    roles: tuple[str, ...]  # which engines get it ("target", "draft")
    why: str


_BOTH = ("target", "draft")

# Order here is the order in the argv.
FLAGS: tuple[Flag, ...] = (
    Flag("--checkpoint_dir", _BOTH, "the converted TensorRT-LLM checkpoint (config.json + rank{N}.safetensors)"),
    Flag("--output_dir", _BOTH, "engine folder; specbuild points it at a temporary folder and renames on success"),
    Flag("--max_batch_size", _BOTH, "same on both engines: the BLS loop runs draft and target on the same batch"),
    Flag("--max_input_len", _BOTH, "same on both engines"),
    Flag("--max_seq_len", _BOTH, "same on both; the builder adds max_draft_len on the target by itself"),
    Flag("--max_num_tokens", _BOTH, "the builder raises it on the target to max_batch_size * (max_draft_len + 1)"),
    Flag("--max_beam_width", _BOTH, "1: draft/target has no beam search"),
    Flag("--kv_cache_type", _BOTH, "paged: KV-cache reuse between draft/verify steps needs it"),
    Flag("--context_fmha", _BOTH, "enable: paged context FMHA is off without it"),
    Flag("--use_paged_context_fmha", _BOTH, "enable: required for KV-cache reuse (draft_target_model README)"),
    Flag("--remove_input_padding", _BOTH, "enable: packed tokens, required by the inflight batcher"),
    Flag("--gpt_attention_plugin", _BOTH, "auto: the checkpoint's dtype"),
    Flag("--gemm_plugin", _BOTH, "auto: the checkpoint's dtype (only non-quantized GEMMs use it)"),
    Flag("--speculative_decoding_mode", ("target",), "draft_tokens_external: the target verifies external drafts"),
    Flag("--max_draft_len", ("target",), "K: the most draft tokens one request may send"),
    Flag("--gather_generation_logits", ("draft",), "only when the deployment samples with the draft's logits"),
    Flag("--workers", _BOTH, "only when tp_size * pp_size > 1: build the ranks in parallel"),
    Flag("--output_timing_cache", _BOTH, "inside the engine folder, never the working directory"),
    Flag("--log_level", _BOTH, "info: progress lines for the log and the progress display"),
)
FLAG_NAMES = tuple(flag.name for flag in FLAGS)

# Never passed: `--gather_context_logits` (and `--gather_all_token_logits`, which implies it) make
# trtllm-build raise "Gather context logits is not support with draft len > 0" on the target.
FORBIDDEN = ("--gather_context_logits", "--gather_all_token_logits", "--paged_kv_cache")

TIMING_CACHE = "model.cache"


def trtllm_version_note(version: str | None) -> str | None:
    """A warning when the build environment's TensorRT-LLM is not the release line specbuild targets."""
    if version is None:
        return (f"could not read the TensorRT-LLM version next to trtllm-build; specbuild targets "
                f"{TRTLLM_VERSION_CHECKED}. The engine manifest records it as unknown.")
    line = ".".join(TRTLLM_VERSION_CHECKED.split(".")[:2])
    if version == line or version.startswith(line + "."):
        return None
    return (f"trtllm-build comes from TensorRT-LLM {version}, but specbuild targets {TRTLLM_VERSION_CHECKED} "
            "(its flags and builder rules come from 1.x sources): the build may reject a flag or change the engine. "
            "Use the image from docker/Dockerfile.gpu.")


def trtllm_argv(plan: "RolePlan", executable: str, output_dir: str) -> list[str]:
    """The exact argv for one role. `output_dir` is where the engine is written (a temp folder)."""
    values: dict[str, str | None] = {
        "--checkpoint_dir": str(plan.checkpoint_dir),
        "--output_dir": output_dir,
        "--max_batch_size": str(plan.limits.max_batch_size),
        "--max_input_len": str(plan.limits.max_input_len),
        "--max_seq_len": str(plan.limits.max_seq_len),
        "--max_num_tokens": str(plan.limits.max_num_tokens),
        "--max_beam_width": "1",
        "--kv_cache_type": "paged",
        "--context_fmha": "enable",
        "--use_paged_context_fmha": "enable",
        "--remove_input_padding": "enable",
        "--gpt_attention_plugin": "auto",
        "--gemm_plugin": "auto",
        "--log_level": "info",
        "--output_timing_cache": f"{output_dir.rstrip('/')}/{TIMING_CACHE}",
    }
    if plan.role == "target":
        values["--speculative_decoding_mode"] = "draft_tokens_external"
        values["--max_draft_len"] = str(plan.max_draft_len)
    if plan.role == "draft" and plan.gather_generation_logits:
        values["--gather_generation_logits"] = None  # a switch
    if plan.world_size > 1:
        values["--workers"] = str(plan.world_size)
    argv = [executable]
    for flag in FLAGS:
        if flag.name in values and plan.role in flag.roles:
            argv.append(flag.name)
            if values[flag.name] is not None:
                argv.append(values[flag.name])  # type: ignore[arg-type]
    return argv


def argv_text(argv: list[str]) -> str:
    return shlex.join(argv)
