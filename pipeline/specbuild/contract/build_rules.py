"""What trtllm-build and the TensorRT-LLM runtime do to an engine by themselves, in one place.

The plan (`specbuild.engines.plan`), `check`, `convert` and the fake trtllm-build in the tests all
follow these rules, so a plan the real builder would quietly change is refused before any GPU time.
No torch, no TensorRT-LLM: plain arithmetic on checkpoint and spec values.

Sources, as read (NVIDIA/TensorRT-LLM; the v1.2.1 tag itself could not be read, see docs/build.md):
- `tensorrt_llm/builder.py::build` @008b2b8 (the same block is in a later 1.x copy of the file):
  `max_seq_len += max_draft_len` and `max_num_tokens >= max_batch_size * (max_draft_len + 1)` when a
  speculative decoding mode is set; the "Logics to control paged_context_fmha and fp8_context_fmha"
  block, which turns `use_paged_context_fmha` off for an FP8 KV cache unless quant_algo is FP8,
  W4A8_AWQ or NVFP4 on SM89+ ("FP8 Paged Context FMHA is disabled because FP8 context FMHA is
  disabled."), and for an INT8 KV cache ("Paged Context FMHA is disabled because it doesn't work with
  int8 kv cache currently."); on SM100-119 INT8/INT4 weight-only, an INT8 KV cache and SmoothQuant
  raise RuntimeError.
- `tensorrt_llm/plugin/plugin.py` @c20322ff (the 1.x pydantic PluginConfig): `tokens_per_block` 32.
- `cpp/tensorrt_llm/batch_manager/trtGptModel.h` @c8c6df08: with context FMHA and packed input (and
  no chunked context) the runtime's largest input is `min(maxSequenceLen - 1, maxNumTokens)`.
- `triton_backend/inflight_batcher_llm/src/model_state.cc` and `model_instance_state.cc` @c8c6df08:
  `max_tokens_in_paged_kv_cache` is read with `std::stoi` into an int32; a larger value throws, the
  throw is caught and the cap is silently dropped ("max_tokens_in_paged_kv_cache is not specified").
Draft-tokens-external needs paged context FMHA: the target reuses the KV cache of the accepted prefix
(`examples/draft_target_model/README.md`: "`--use_paged_context_fmha=enable` must be specified").
"""

from __future__ import annotations

from typing import Any, NamedTuple

from specbuild.quantization import BLACKWELL_SM, FORMATS, FP8_MIN_SM, one_of, usable_on  # noqa: F401

MIN_SM = 80  # draft/target speculative decoding support matrix (draft_target_model README): SM >= 80
# spec quantizations trtllm-build refuses on BLACKWELL_SM (specbuild.quantization, with its source)
BLACKWELL_REJECTED = tuple(name for name, fmt in FORMATS.items() if fmt.blackwell == "refused")
FP8_CONTEXT_FMHA_ALGOS = ("FP8", "W4A8_AWQ", "NVFP4")  # quant_algos that keep paged context FMHA with an FP8 KV cache
TOKENS_PER_BLOCK = 32  # PluginConfig.tokens_per_block default (1.x)
INT32_MAX = 2**31 - 1  # the backend parses integer parameters with std::stoi


def norm_algo(value: Any) -> str | None:
    """A QuantAlgo as written in a checkpoint or engine config.json ("QuantAlgo.FP8", "fp8", None)."""
    if value in (None, "", "NO_QUANT", "none", "None"):
        return None
    return str(value).rsplit(".", 1)[-1].upper()


def paged_context_fmha_loss(quant_algo: Any, kv_cache_quant_algo: Any, sm: int | None) -> str | None:
    """Why trtllm-build would turn `use_paged_context_fmha` off for this checkpoint on an SM`sm` GPU, or None.

    `sm` None (unknown GPU): only the reasons that hold on every GPU are reported.
    """
    algo, kv = norm_algo(quant_algo), norm_algo(kv_cache_quant_algo)
    if kv == "FP8":
        if algo not in FP8_CONTEXT_FMHA_ALGOS:
            return (
                f"an FP8 KV cache with quant_algo {algo or 'none'} makes trtllm-build turn paged context FMHA off "
                f"(it keeps it with an FP8 KV cache only for {', '.join(FP8_CONTEXT_FMHA_ALGOS)} weights, which "
                "use FP8 context FMHA)"
            )
        if sm is not None and sm < FP8_MIN_SM:
            return (
                f"an FP8 KV cache on SM{sm} makes trtllm-build turn paged context FMHA off (FP8 context FMHA "
                f"needs SM{FP8_MIN_SM}+)"
            )
    if kv == "INT8":
        return (
            "an INT8 KV cache makes trtllm-build turn paged context FMHA off (it does not work with an INT8 KV cache)"
        )
    return None


# The TensorRT-LLM QuantAlgo convert writes for each spec `quantization` name (specbuild.quantization)
QUANT_ALGO: dict[str, str | None] = {name: fmt.quant_algo for name, fmt in FORMATS.items()}


def spec_paged_context_fmha_loss(quantization: str, kv_cache: str, sm: int | None) -> str | None:
    """`paged_context_fmha_loss` for a spec's `quantization` / `kv_cache` names (what convert will write)."""
    return paged_context_fmha_loss(QUANT_ALGO.get(quantization, quantization), kv_cache, sm)  # norm_algo reads "none"


def fp8_kv_cache_keeps_paged_context_fmha(quantization: str, sm: int | None) -> bool:
    """Whether `kv_cache = "fp8"` is safe with this weight format on this GPU (for advice; unknown GPU: no)."""
    return sm is not None and spec_paged_context_fmha_loss(quantization, "fp8", sm) is None


def paged_context_fmha_fix(role: str, sm: int | None) -> str:
    """What to change in the spec when `paged_context_fmha_loss` is not None."""
    options = [f'{role}.kv_cache = "none"']
    if sm is None or sm >= FP8_MIN_SM:
        options.append(
            f'{role}.quantization = "fp8" (or "w4a8_awq") with {role}.kv_cache = "fp8"'
            + (" on an SM89+ GPU" if sm is None else "")
        )
    else:
        options.append("an SM89+ GPU (Ada, Hopper or newer) for an FP8 KV cache")
    return (
        "Draft/target speculative decoding needs paged context FMHA (KV-cache reuse for external draft "
        f"tokens). Set {' or '.join(options)}."
    )


class GpuRefusal(NamedTuple):
    """A reason the spec's GPU cannot build or run one role's formats: check's problem code, the message, the fix."""

    code: str
    message: str
    fix: str


def gpu_refusals(role: str, quantization: str, kv_cache: str, sm: int | None, gpu: str | None) -> list[GpuRefusal]:
    """Everything about this role's `quantization` / `kv_cache` on an SM`sm` GPU that a later stage refuses.

    The one gate check reports, convert refuses before any work and build refuses before printing or running
    trtllm-build (unknown GPU: only the rules that hold on every GPU).
    """
    if sm is not None and sm < MIN_SM:  # no format helps: each needs SM80+ too
        return [
            GpuRefusal(
                "gpu_too_old",
                f"{gpu} is SM{sm}; draft/target speculative decoding in TensorRT-LLM needs SM{MIN_SM} or newer.",
                "Use an Ampere-or-newer GPU.",
            )
        ]
    found = []
    fmt = FORMATS.get(quantization)
    why = fmt.refused_on(sm) if fmt is not None else None
    if why is not None:
        found.append(
            GpuRefusal(
                "quantization_unsupported_on_gpu",
                f"{role}.quantization = {quantization!r} on {gpu} (SM{sm}): {why}.",
                f"Use {role}.quantization = {one_of(usable_on(sm))} on this GPU.",
            )
        )
    if kv_cache == "fp8" and sm is not None and sm < FP8_MIN_SM:
        found.append(
            GpuRefusal(
                "kv_cache_unsupported_on_gpu",
                f"{role}.kv_cache = 'fp8' needs an SM{FP8_MIN_SM}+ GPU (Ada/Hopper or newer), but {gpu} is SM{sm}.",
                f'Set {role}.kv_cache = "none" on this GPU.',
            )
        )
        return found  # the paged context FMHA loss below is this same fact
    loss = spec_paged_context_fmha_loss(quantization, kv_cache, sm)
    if loss is not None:
        found.append(
            GpuRefusal(
                "paged_context_fmha_disabled",
                f"{role}.quantization = {quantization!r} with {role}.kv_cache = {kv_cache!r}: {loss}. Without paged "
                "context FMHA the engines have no KV-cache reuse and the target cannot take external draft tokens: "
                "the build would be rejected after it ran.",
                paged_context_fmha_fix(role, sm),
            )
        )
    return found


def runtime_max_input_len(engine_max_seq_len: int, engine_max_num_tokens: int) -> int:
    """The longest input the runtime accepts (context FMHA + packed input, no chunked context)."""
    return min(engine_max_seq_len - 1, engine_max_num_tokens)


def planned_max_num_tokens(max_batch_size: int, max_seq_len: int, max_num_tokens: int) -> tuple[int, list[str]]:
    """The `--max_num_tokens` to ask for, and why it differs from the spec's value.

    The BLS re-sends prompt + generated tokens on every step, so inputs grow to max_seq_len - 1 tokens;
    the runtime refuses longer inputs than `min(max_seq_len - 1, max_num_tokens)`, so max_num_tokens is
    raised to max_seq_len - 1. trtllm-build (`check_max_num_tokens`) clips it to max_batch_size *
    max_seq_len and raises it to one KV-cache block; asking for the value it keeps lets the built
    config be compared exactly.
    """
    notes = []
    value = max_num_tokens
    longest_input = max_seq_len - 1
    if value < longest_input:
        notes.append(
            f"max_num_tokens {value} -> {longest_input} (max_seq_len - 1: the runtime refuses an input longer "
            "than min(max_seq_len - 1, max_num_tokens), and the BLS re-sends prompt + generated tokens "
            "every step)"
        )
        value = longest_input
    ceiling = max_batch_size * max_seq_len
    if value > ceiling:
        notes.append(f"max_num_tokens {value} -> {ceiling} (max_batch_size * max_seq_len, as trtllm-build clips it)")
        value = ceiling
    if value < TOKENS_PER_BLOCK:
        notes.append(f"max_num_tokens {value} -> {TOKENS_PER_BLOCK} (one KV-cache block, as trtllm-build raises it)")
        value = TOKENS_PER_BLOCK
    return value, notes


def built_target_limits(
    max_batch_size: int, max_seq_len: int, max_num_tokens: int, max_draft_len: int
) -> tuple[int, int]:
    """(max_seq_len, max_num_tokens) the builder writes for a draft-tokens-external target."""
    return max_seq_len + max_draft_len, max(max_num_tokens, max_batch_size * (max_draft_len + 1))


def clamp_kv_tokens(tokens: int) -> int:
    """`max_tokens_in_paged_kv_cache` as the backend can read it: whole blocks, at most INT32_MAX."""
    return min(tokens, INT32_MAX // TOKENS_PER_BLOCK * TOKENS_PER_BLOCK)
