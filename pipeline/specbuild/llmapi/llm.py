"""The CPU stand-in for TensorRT-LLM's `LLM(**model.yaml)`: both models in one process, the project's
draft/verify loop driven by `specbuild.decode.driver.drive` over the reference runtime, as the LLM API runs
its draft/target "two model" speculation inside one executor.

It takes the LLM arguments as model.yaml holds them and refuses what TensorRT-LLM 1.2.1 refuses
(as pinned in contract ARGS): keys that are not LLM-argument fields (extra = "forbid"), a decoding_type the
parser does not know ("Invalid decoding type: ..."), a DraftTarget config without max_draft_len > 0 or
without the draft path, a backend other than pytorch. A prompt longer than max_num_tokens is refused per
request with the LLM API's own message (llm.py `_check_arguments`, pytorch backend).

Generation follows the LLM API's draft/target mode: max_draft_len tokens drafted at every step (no
adaptive K), greedy acceptance by token match or rejection sampling when sampling, one RequestOutput per
step when streaming (its text cumulative), the draft's tokens and the target's verdicts counted in the
per-request speculative-decoding metrics (acceptance_rate = accepted / drafted). Sampling parameters the
reference runtime cannot honour (best_of > 1, frequency/presence penalties) are refused by name.
An NGram config (prompt lookup, `decoding_type: NGram`) drafts with `specbuild.speculative.lookup` under the
config's max_matching_ngram_size, is_keep_all, is_use_oldest and is_public_pool, no draft model loaded; its
proposals may differ from NVIDIA's pool, which is updated every step and has no cap, so acceptance figures may
differ while the text, verified by the target, cannot.
The stand-in has no paged KV cache: the kv_cache_* metrics are what a fresh cache without reuse would
report (blocks of 32 tokens for the prompt and output), and say so in docs/llmapi.md.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbuild import drafters
from specbuild.contract import llmapi as contract
from specbuild.decode.drafting import Drafting
from specbuild.decode.grammar import GuideRequest
from specbuild.decode.request import RequestRules
from specbuild.errors import RequestError
from specbuild.llmapi.protocol import CompletionOutput, ModelException, RequestOutput, stop_strings


class LlmArgsError(ValueError):
    """model.yaml holds arguments TensorRT-LLM refuses (the model fails to load, as NVIDIA's would)."""


def validate_args(args: dict[str, Any]) -> dict[str, Any]:
    """The arguments as the pinned release parses them: the speculative config with decoding_type consumed."""
    unknown = contract.unknown_llm_args(args)
    if unknown:
        raise LlmArgsError(
            f"{', '.join(unknown)}: Extra inputs are not permitted (not an LLM argument of "
            f"TensorRT-LLM {contract.RELEASE})"
        )
    if "model" not in args:
        raise LlmArgsError("model: Field required")
    backend = args.get("backend") or "pytorch"  # TorchLlmArgs.init_backend: None -> pytorch
    spec = args.get("speculative_config")
    if spec is not None:
        spec = dict(spec)
        decoding_type = spec.pop(contract.DECODING_TYPE_KEY, None)
        if decoding_type not in contract.DECODING_TYPES:
            raise LlmArgsError(f"Invalid decoding type: {decoding_type}")
        if decoding_type not in (contract.DECODING_TYPE, contract.NGRAM_DECODING_TYPE):
            raise LlmArgsError(
                f"decoding_type {decoding_type!r}: the CPU stand-in runs {contract.DECODING_TYPE} and "
                f"{contract.NGRAM_DECODING_TYPE} only"
            )
        if backend != "pytorch":
            raise LlmArgsError(contract.MSG_DRAFT_BACKEND)
        if not isinstance(spec.get("max_draft_len"), int) or spec["max_draft_len"] <= 0:
            raise LlmArgsError(contract.MSG_DRAFT_LEN)
        if decoding_type == contract.DECODING_TYPE and not spec.get(contract.DRAFT_MODEL_KEY):
            raise LlmArgsError(contract.MSG_DRAFT_PATH)
        size = spec.get("max_matching_ngram_size", 1)
        if decoding_type == contract.NGRAM_DECODING_TYPE and (not isinstance(size, int) or size < 1):
            raise LlmArgsError(f"max_matching_ngram_size: Input should be greater than 0 (got {size!r})")
    fraction = (args.get("kv_cache_config") or {}).get("free_gpu_memory_fraction")
    if fraction is not None and not 0.0 <= float(fraction) <= 1.0:
        raise LlmArgsError("free_gpu_memory_fraction must be a float between 0 and 1")
    return {**args, "backend": backend, "speculative_config": spec}


def load_model(folder: Path, limits: dict[str, int], device: str = "cpu", role: str = "target"):
    """A ContractModel over a checkpoint written by `convert --backend llmapi` (FP8 weights read back); a timed
    stand-in's when $SPECBUILD_STANDIN_TIMING asks (reference.timing)."""
    from specbuild.contract.executor import Limits
    from specbuild.llmapi.hfexport import load_export
    from specbuild.reference.contract_model import ContractModel
    from specbuild.reference.engine import ReferenceEngine
    from specbuild.reference.loading import timed_clock
    from specbuild.reference.model import LlamaModel, args_from_config

    loaded = load_export(folder)
    model = LlamaModel(
        release_args(args_from_config(loaded.hf_config, str(folder)), loaded.hf_config),
        loaded.state_dict,
        device=device,
    )
    return ContractModel(ReferenceEngine(model), Limits(**limits), timed_clock(role, model, announce=True))


def release_args(args, hf_config: dict[str, Any]):
    """The model as the stood-in release's PyTorch backend runs it (specbuild.families.LLM_API_RELEASES): an
    architecture it does not register stops with its error (tensorrt_llm/_torch/models/modeling_auto.py,
    `AutoModelForCausalLM.from_config`), and a sliding window its attention does not apply is not applied."""
    from dataclasses import replace

    from specbuild import families
    from specbuild.contract import llmapi as contract

    release = families.llm_api_release(contract.installed_release())
    architecture = (hf_config.get("architectures") or [None])[0]
    if architecture not in release.loads:
        raise ValueError(f"Unknown architecture for AutoModelForCausalLM: {architecture}")
    if architecture in release.applies_window:
        return args
    return replace(args, windows=(None,) * len(args.windows))


@dataclass
class Sampling:
    """A validated SamplingParams equivalent (the parts the stand-in runs)."""

    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    seed: int | None
    exclude_input_from_output: bool
    return_perf_metrics: bool
    stop: list[str]
    stop_token_ids: list[int]
    guide: GuideRequest | None = None  # SamplingParams.guided_decoding as a guide (decode.grammar)


def guide_from_params(guided: Any) -> GuideRequest | None:
    """SamplingParams.guided_decoding (GuidedDecodingParams, or its fields as a mapping) as a guide; ModelException
    names what is refused: more than one guide (the LLM API's own rule), a structural tag."""
    if guided is None:
        return None
    fields = (
        dict(guided)
        if isinstance(guided, dict)
        else {name: getattr(guided, name, None) for name in (*contract.GUIDED_FIELDS, *contract.GUIDED_UNSUPPORTED)}
    )
    given = {name: value for name, value in fields.items() if value}
    if len(given) > 1:
        raise ModelException(f"Only one guide can be used for a request, but got {len(given)}.")
    if not given:
        return None
    ((name, value),) = given.items()
    if name not in contract.GUIDED_FIELDS:
        raise ModelException(f"guided_decoding.{name} is not supported by the CPU stand-in: use json, regex or grammar")
    text = "" if name == "json_object" else value if isinstance(value, str) else json.dumps(value)
    try:
        return GuideRequest(contract.GUIDED_FIELDS[name], text)
    except RequestError as err:
        raise ModelException(str(err)) from None


def sampling_from_request(params: dict[str, Any]) -> Sampling:
    """SamplingParams(**params) as the stand-in takes it; ModelException names what it refuses."""
    best_of = params.get("best_of", 1)
    if best_of != 1:
        raise ModelException(f"best_of = {best_of}: the CPU stand-in generates one sequence per request (best_of 1)")
    for name in ("frequency_penalty", "presence_penalty"):
        if params.get(name) not in (None, 0.0):
            raise ModelException(f"{name} = {params[name]}: not supported by the CPU stand-in (0 only)")
    max_tokens = params.get("max_tokens", contract.DEFAULT_MAX_TOKENS)
    if max_tokens is None or int(max_tokens) < 1:
        raise ModelException(f"max_tokens ({max_tokens}) must be greater than 0")
    temperature, top_k, top_p = params.get("temperature"), params.get("top_k"), params.get("top_p")
    if temperature is not None and (temperature < 0 or not math.isfinite(temperature)):
        raise ModelException(f"temperature ({temperature}) must be a finite number >= 0")
    if top_k is not None and top_k < 0:
        raise ModelException(f"top_k ({top_k}) must be >= 0")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ModelException(f"top_p ({top_p}) must be in (0, 1]")
    if temperature is None:  # unset: greedy unless top_k / top_p ask for sampling (then temperature 1)
        temperature = 1.0 if (top_k not in (None, 0, 1) or top_p not in (None, 1.0)) else 0.0
    return Sampling(
        max_tokens=int(max_tokens),
        temperature=float(temperature),
        top_k=int(top_k or 0),
        top_p=float(1.0 if top_p is None else top_p),
        seed=params.get("seed"),
        exclude_input_from_output=bool(params.get("exclude_input_from_output", True)),
        return_perf_metrics=bool(params.get("return_perf_metrics", False)),
        stop=stop_strings(params.get("stop")),
        stop_token_ids=[int(i) for i in params.get("stop_token_ids") or ()],
        guide=guide_from_params(params.get("guided_decoding")),
    )


class StandInLLM:
    def __init__(self, args: dict[str, Any], device: str = "cpu"):
        from transformers import AutoTokenizer

        self.args = validate_args(args)
        self.target_dir = Path(self.args["model"])
        spec = self.args["speculative_config"]
        self.k = spec["max_draft_len"] if spec else 0
        self.max_num_tokens = int(self.args.get("max_num_tokens") or 8192)  # BaseLlmArgs default
        self.max_seq_len = int(self.args.get("max_seq_len") or 0) or None
        batch = int(self.args.get("max_batch_size") or 8)
        seq = self.max_seq_len or 4096
        self.target = load_model(
            self.target_dir, {"max_batch_size": batch, "max_seq_len": seq + self.k, "max_draft_len": self.k}, device
        )
        # NGram: prompt lookup with the config's settings, its pool shared by the requests (a Drafting of the lookup)
        self.lookup: Drafting | None = None
        if spec and contract.DRAFT_MODEL_KEY not in spec:  # NGram: DraftTarget needs the draft path (validate_args)
            from specbuild.drafters import LookupSettings

            # the fields as NGramDecodingConfig reads them (its defaults where absent); the pool is bounded here
            # (LookupSettings.pool_max_tokens), NVIDIA's grows with its requests
            settings = LookupSettings(**{name: spec.get(name, d) for name, d in contract.NGRAM_DEFAULTS.items()})
            self.lookup = Drafting.create(drafters.LOOKUP, None, settings)
        self.draft = (
            load_model(
                Path(spec[contract.DRAFT_MODEL_KEY]),
                {"max_batch_size": batch, "max_seq_len": seq, "max_draft_len": 0},
                device,
                role="draft",
            )
            if spec and self.lookup is None
            else None
        )
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.target_dir), local_files_only=True)
        self.vocab_size = self.target.engine.vocab_size  # the target's rows: the ids a guided request may ban
        # one end id, the tokenizer's eos, as SamplingParams._setup sets it (tensorrt_llm/sampling_params.py @a98a906);
        # the checkpoint's other end ids come with each request as stop_token_ids (specbuild.llmapi.end_ids). The LLM
        # API drafts max_draft_len at every step (0: target only), and K does not adapt
        eos = self.tokenizer.eos_token_id
        drafts = self.draft is not None or self.lookup is not None
        self.rules = RequestRules(
            self.tokenizer,
            () if eos is None else (eos,),
            self.k if drafts else 0,
            self.k if drafts else 0,
            default_drafter=self.lookup.default if self.lookup else drafters.MODEL,
            runnable_drafters=(self.lookup.default,) if self.lookup else (drafters.MODEL,),
            # the LLM compiles guides only with its guided_decoding_backend
            vocab_size=self.vocab_size
            if self.args.get("guided_decoding_backend") == contract.GUIDED_DECODING_BACKEND
            else None,
        )
        self.max_batch_size = batch

    def encode(self, prompt: str) -> list[int]:
        """A prompt's ids as the LLM API tokenizes it (special tokens added: `contract.ADD_SPECIAL_TOKENS`)."""
        return list(self.tokenizer(prompt, add_special_tokens=contract.ADD_SPECIAL_TOKENS)["input_ids"])

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def generate(
        self,
        prompt: str,
        sampling: Sampling,
        streaming: bool,
        call=None,
        on_output: Callable[[RequestOutput], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> RequestOutput:
        """Run one request to its end (`decode.driver.drive`) and return its last RequestOutput. When
        streaming, on_output gets one RequestOutput per draft/verify step before the last (text cumulative).
        cancelled: polled before each step; True ends the request with finish_reason "cancelled".
        call: (role) -> the contract call to use (a shared batcher under concurrency); default the models."""
        from specbuild.contract.adapters import ContractDrafter, ContractVerifier
        from specbuild.decode.driver import drive
        from specbuild.speculative.interfaces import SamplingParams

        arrival = time.monotonic_ns()
        prompt_ids = self.encode(prompt)
        if len(prompt_ids) > self.max_num_tokens:
            raise ModelException(
                contract.MSG_PROMPT_TOO_LONG.format(prompt_len=len(prompt_ids) / 1, max_num_tokens=self.max_num_tokens)
            )
        max_tokens = sampling.max_tokens
        if self.max_seq_len is not None:
            if len(prompt_ids) >= self.max_seq_len:
                raise ModelException(
                    f"the prompt ({len(prompt_ids)} tokens) does not fit max_seq_len = {self.max_seq_len}"
                )
            max_tokens = min(max_tokens, self.max_seq_len - len(prompt_ids))
        if sampling.guide is not None and self.rules.grammars is None:
            raise ModelException(
                "guided_decoding needs the LLM argument guided_decoding_backend: "
                f"{contract.GUIDED_DECODING_BACKEND} (specbuild writes it into model.yaml; this one lacks it)"
            )
        ready = self.rules.prepare(
            max_tokens=max_tokens,
            stop=sampling.stop,
            stop_token_ids=sampling.stop_token_ids,
            sampling=SamplingParams(sampling.temperature, sampling.top_k, sampling.top_p, sampling.seed),
            guide=sampling.guide,
        )
        target = call("target") if call else self.target
        verifier = ContractVerifier(target, max_draft_len=self.k, end_id=ready.model_end_id)
        if self.draft is not None:
            drafter = ContractDrafter(call("draft") if call else self.draft, end_id=ready.model_end_id)
        else:
            drafter = self.lookup.drafter(ready.drafter) if self.lookup is not None else NoDraft()
        counts = [0, 0]  # drafted, accepted so far
        times = {"scheduled": None, "first": None}

        def on_step(step, output: list[int]) -> None:
            now = time.monotonic_ns()
            times["scheduled"] = times["scheduled"] or now
            times["first"] = times["first"] or (now if output else None)
            counts[0], counts[1] = counts[0] + step.drafted, counts[1] + step.accepted
            if streaming and on_output is not None and step.finish_reason is None:
                on_output(
                    self._output(
                        prompt_ids, list(output), None, None, sampling, False, counts, self._times(arrival, times)
                    )
                )

        try:
            result = drive(
                prompt_ids,
                drafter,
                verifier,
                ready.request,
                k=ready.k,
                cancelled=cancelled,
                stop_words=ready.stop_words,
                on_step=on_step,
                drafter_name=ready.drafter,
                guide=ready.guide,
            )
        except RequestError as err:
            raise ModelException(str(err)) from None
        if self.lookup is not None and result.finish_reason != "cancelled":
            self.lookup.remember(ready.drafter, prompt_ids, result.output_ids, result.stats)
        tokens, stop_reason = list(result.output_ids), None
        if isinstance(result.stop_reason, (str, int)):  # a stop string or id is left out (include_stop_str_in_output
            stop_reason = result.stop_reason  # False), as result.py's _handle_sequence does
            matched = next(ids for ids, word in ready.stop_words.items() if word == stop_reason)
            tokens = tokens[: -len(matched)]
        return self._output(
            prompt_ids, tokens, result.finish_reason, stop_reason, sampling, True, counts, self._times(arrival, times)
        )

    @staticmethod
    def _times(arrival: int, times: dict[str, int | None]) -> tuple[int, int, int, int]:
        now = time.monotonic_ns()
        scheduled = times["scheduled"] or now
        return arrival, scheduled, times["first"] or scheduled, now

    def _output(
        self, prompt_ids, tokens, finish, stop_reason, sampling: Sampling, finished, counts, times
    ) -> RequestOutput:
        """finish: NVIDIA's finish_reason ("length", "stop", "cancelled"; None before the end)."""
        ids = tokens if sampling.exclude_input_from_output else prompt_ids + tokens
        metrics = self._metrics(len(prompt_ids), len(tokens), counts, times) if sampling.return_perf_metrics else None
        return RequestOutput(
            [CompletionOutput(self._decode(ids), ids, finish, stop_reason, request_perf_metrics=metrics)], finished
        )

    def _metrics(self, prompt_len: int, out_len: int, counts: list[int], times) -> dict[str, Any]:
        """The perf-metric values NVIDIA's model sends, per contract PERF_OUTPUTS. Times: monotonic ns;
        draft counts so far (a streamed response carries the running totals)."""
        drafted, accepted = counts
        blocks = math.ceil((prompt_len + out_len) / contract.KV_TOKENS_PER_BLOCK)
        arrival, scheduled, first, last = times
        import numpy as np

        rate = float(np.float32(accepted / drafted)) if drafted else 0.0  # a C++ float in TensorRT-LLM
        return {
            "kv_cache_reused_block": 0,
            "kv_cache_hit_rate": 0.0,
            "kv_cache_alloc_new_blocks": blocks,
            "kv_cache_alloc_total_blocks": blocks,
            "kv_cache_missed_block": math.ceil(prompt_len / contract.KV_TOKENS_PER_BLOCK),
            "arrival_time_ns": arrival,
            "first_scheduled_time_ns": scheduled,
            "first_token_time_ns": first,
            "last_token_time_ns": last,
            "acceptance_rate": rate,
            "total_accepted_draft_tokens": accepted,
            "total_draft_tokens": drafted,
        }


class NoDraft:
    """Target only (no speculative_config): the loop never calls it with k = 0."""

    def propose(self, tokens, k, sampling):  # pragma: no cover - unreachable with num_draft_tokens 0
        raise AssertionError("no draft model")
