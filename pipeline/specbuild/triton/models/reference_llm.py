"""`tensorrt_llm` / `tensorrt_llm_draft` on CPU: the PyTorch reference engine behind NVIDIA's tensor contract.

The C++ `tensorrtllm` backend's tensors, the same semantics for what specbuild uses: a request with
`draft_input_ids` is verified (output = prefix + accepted draft tokens + one token, and with
`return_perf_metrics` the acceptance outputs), one without decodes `request_output_len` tokens. Requests of one `execute`
call (Triton's dynamic batcher groups concurrent ones) run as one batched forward.

What the C++ backend refuses, this model refuses with the backend's message (NVIDIA/TensorRT-LLM
`triton_backend/inflight_batcher_llm/src/`, commit c8c6df0): a config without a parameter the
backend reads with no fallback (`specbuild.contract.backend_params`), a request of batch size > 1 or with
streaming = true to a model that is not decoupled (`utils.cc` `createRequestsFromInputTensors`), and
generation logits whose declared type differs from the engine's logits dtype
(`model_instance_state.cc` `fillTritonResponse`: `TLLM_CHECK(generationLogitsType ==
model_state_->getLogitsDataType())`). The executor's request rules are in `specbuild.contract.executor`.

What the backend treats as absent is accepted: an empty `embedding_bias` (`utils.cc` drops a bias of
shape [0]), empty stop/bad word lists, and decoder_input_ids / decoder_input_lengths, which a
decoder-only engine does not read (NVIDIA's preprocessing always sends them). Inputs the reference
runtime cannot honour (beam search, log probs, context logits, penalties, bad words of several tokens or beside
draft tokens, a non-empty bias,
LoRA, multimodal) are refused by name with INVALID_ARG; stop words are honoured (the ensemble's clients send
them, and preprocessing adds a checkpoint's other end ids as stop words); sent with their neutral values they
are accepted. `min_tokens` is accepted and not enforced (NVIDIA's BLS sends it on draft calls; it
only delays EOS there).

A timed stand-in: with $SPECBUILD_STANDIN_TIMING in tritonserver's environment (`serve --timed` sets it), each call
takes the time its steps would take on a GPU, waiting (not computing) for what its computation left, as a GPU call
leaves the host free; the outputs are unchanged (specbuild.reference.timing). The server log says so when the model
loads. Tests use it to make a request outlast a bound on any machine, however fast.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from specbuild.contract import tensors
from specbuild.contract.backend_params import BackendParams
from specbuild.contract.logits import TRITON_TYPES
from specbuild.errors import RequestError
from specbuild.triton.models.common import request_inputs, resolve_path

PER_ROW = (
    "input_ids",
    "input_lengths",
    "request_output_len",
    "draft_input_ids",
    "draft_logits",
    "end_id",
    "pad_id",
    "temperature",
    "runtime_top_k",
    "runtime_top_p",
    "seed",
    "return_generation_logits",
    "return_perf_metrics",
    "stop_words_list",
    "bad_words_list",
)
IGNORED = (
    "min_tokens",
    "len_penalty",
    "early_stopping",
    "beam_search_diversity_rate",
    "return_num_input_tokens",
    "return_num_output_tokens",
    "exclude_input_in_output",
    "runtime_top_p_min",
    "runtime_top_p_decay",
    "runtime_top_p_reset_ids",
    "decoder_input_ids",
    "decoder_input_lengths",
)  # the decoder inputs: read only by encoder-decoder engines
NEUTRAL = {  # input -> the value that asks for nothing
    "beam_width": 1,
    "num_return_sequences": 1,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "return_log_probs": False,
    "return_context_logits": False,
    "streaming": False,
    "stop": False,
}
NOT_DECOUPLED_BATCH = "Batch size > 1 requires the tensorrt_llm backend to be using decoupled transaction policy"
NOT_DECOUPLED_STREAMING = "Streaming is only supported if model is deployed using decoupled mode."
LOGITS_TYPE_CHECK = (
    "Error encountered while populating response: [TensorRT-LLM][ERROR] Assertion failed: "
    "generationLogitsType == model_state_->getLogitsDataType()"
)


def check_supported(inputs: dict[str, np.ndarray], decoupled: bool = False) -> None:
    batch = np.asarray(inputs["input_ids"]).shape[0] if "input_ids" in inputs else 1
    if not decoupled and batch > 1:
        raise RequestError(NOT_DECOUPLED_BATCH)
    if not decoupled and "streaming" in inputs and np.any(np.asarray(inputs["streaming"])):
        raise RequestError(NOT_DECOUPLED_STREAMING)
    for name, value in inputs.items():
        if name in PER_ROW or name in IGNORED:
            continue
        if name in NEUTRAL:
            if np.any(np.asarray(value).reshape(-1) != NEUTRAL[name]):
                raise RequestError(
                    f"input {name!r} = {np.asarray(value).reshape(-1).tolist()} is not supported by the "
                    f"reference model (only {NEUTRAL[name]!r}); the TensorRT-LLM backend serves it."
                )
            continue
        if name == "embedding_bias" and (np.asarray(value).size == 0 or not np.any(np.asarray(value))):
            continue  # empty: absent to the backend; all zeros: adds nothing
        raise RequestError(f"input {name!r} is not supported by the reference model: remove it.")


def split_rows(inputs: dict[str, np.ndarray], decoupled: bool = False) -> list[dict[str, np.ndarray]]:
    """One contract request per batch row; inputs carry the batch dimension first."""
    for name in ("input_ids", "input_lengths", "request_output_len"):
        if name not in inputs:
            raise RequestError(f"input {name!r} is required.")
    check_supported(inputs, decoupled)
    batch = inputs["input_ids"].shape[0]
    rows = []
    for i in range(batch):
        rows.append({name: np.asarray(inputs[name][i]) for name in PER_ROW if name in inputs})
    return rows


def _per_row_flag(inputs: dict[str, np.ndarray], name: str, i: int, default: bool) -> bool:
    if name not in inputs:
        return default
    return bool(np.asarray(inputs[name]).reshape(inputs[name].shape[0], -1)[i, 0])


def assemble(
    inputs: dict[str, np.ndarray], results: list[dict[str, np.ndarray]], exclude_default: bool
) -> dict[str, np.ndarray]:
    """Stack per-row contract responses into the request's outputs ([b, beam = 1, ...])."""
    batch = len(results)
    ids, lengths = [], []
    for i, r in enumerate(results):
        row = np.asarray(r["output_ids"]).reshape(-1)[: int(np.asarray(r["sequence_length"]).reshape(-1)[0])]
        if _per_row_flag(inputs, "exclude_input_in_output", i, exclude_default):
            row = row[int(np.asarray(inputs["input_lengths"][i]).reshape(-1)[0]) :]
        ids.append(row)
        lengths.append(len(row))
    pad = int(np.asarray(inputs["pad_id"][0]).reshape(-1)[0]) if "pad_id" in inputs else 0
    width = max(1, max(lengths))
    output_ids = np.full((batch, 1, width), pad, dtype=np.int32)
    for i, row in enumerate(ids):
        output_ids[i, 0, : len(row)] = row
    out = {"output_ids": output_ids, "sequence_length": np.array(lengths, dtype=np.int32).reshape(batch, 1)}
    if all("generation_logits" in r for r in results):  # kept in the engine's logits dtype
        logits = [np.asarray(r["generation_logits"]).reshape(-1, r["generation_logits"].shape[-1]) for r in results]
        stacked = np.zeros((batch, 1, max(len(x) for x in logits), logits[0].shape[-1]), dtype=logits[0].dtype)
        for i, x in enumerate(logits):
            stacked[i, 0, : len(x)] = x
        out["generation_logits"] = stacked
    for name, dtype in (
        ("acceptance_rate", np.float32),
        ("total_accepted_draft_tokens", np.int32),
        ("total_draft_tokens", np.int32),
    ):
        if all(name in r for r in results):
            out[name] = np.array([np.asarray(r[name]).reshape(-1)[0] for r in results], dtype=dtype).reshape(batch, 1)
    input_lengths = np.asarray(inputs["input_lengths"]).reshape(batch, -1)[:, :1].astype(np.int32)
    if "return_num_input_tokens" in inputs:
        out["num_input_tokens"] = input_lengths
    if "return_num_output_tokens" in inputs:
        generated = [
            len(np.asarray(r["output_ids"]).reshape(-1)) - int(input_lengths[i, 0]) for i, r in enumerate(results)
        ]
        out["num_output_tokens"] = np.array(generated, dtype=np.int32).reshape(batch, 1)
    return out


def load_engine(engine_dir: Path, device: str | None = None):
    """The runtime's ContractModel over a reference engine folder (config.json, weights, engine.json), with the
    engine's limits: max_num_tokens (the input limit) and logits_dtype included."""
    from specbuild.reference.loading import REFERENCE_ENGINE, ModelSource, load_contract_model

    try:
        limits = json.loads((engine_dir / "engine.json").read_text())
        manifest = json.loads((engine_dir / "manifest.json").read_text())
    except (OSError, ValueError):
        raise FileNotFoundError(
            f"{engine_dir} is not a finished reference engine (engine.json, manifest.json): "
            "run `specbuild build --backend reference`, or fix gpt_model_path with `specbuild repo`."
        ) from None
    if manifest.get("backend") != "reference":
        raise ValueError(f"{engine_dir} holds a {manifest.get('backend')!r} engine, not a reference engine.")
    source = ModelSource(limits.get("role", "target"), engine_dir, REFERENCE_ENGINE, limits)
    _share_cpu(source, device)  # before loading: the exactness probe holds for the thread count it ran at
    # limits from engine.json (Limits.from_engine); the row block chosen goes to the server's log
    return load_contract_model(source, device=device, announce=True)


def declared_logits_type(config: dict) -> str | None:
    """The model's logits type as the C++ backend takes it (model_state.cc `LoadParameters`): the data_type of
    the first output named generation_logits or context_logits."""
    for output in config.get("output", []):
        if output.get("name") in ("generation_logits", "context_logits"):
            return output.get("data_type")
    return None


def _share_cpu(source, device: str | None) -> None:
    """Two LLM models (target, draft) run in separate stub processes on the same cores: with torch's default
    thread count each, OpenMP spin-waits oversubscribe the CPU and a step takes many times longer
    (docs/bench/results.md). One thread for small models, else half the cores."""

    import torch

    from specbuild.reference.loading import configure_threads, resolve_device

    if resolve_device(device) != "cpu":
        return
    if configure_threads(None, source, "cpu") is None:
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        import triton_python_backend_utils as pb_utils

        self.pb = pb_utils
        config = json.loads(args["model_config"])
        self.name = args.get("model_name", "tensorrt_llm")
        params = BackendParams(config)
        engine_dir = params.check_required(lambda value: resolve_path(value, args))
        self.contract = load_engine(engine_dir, params.values.get("device") or None)
        self.exclude_default = params.boolean("exclude_input_in_output", False)
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        engine_type = TRITON_TYPES[self.contract.limits.logits_dtype]
        self.logits_type_ok = declared_logits_type(config) in (None, engine_type)
        self.names = [t.name for t in tensors.LLM_INPUTS]

    def execute(self, requests: list) -> list:
        """A timed stand-in's call lasts its steps from the moment Triton hands it over to the moment it answers: the
        tensors read and written here are the C++ backend's work, which takes microseconds, so they fall inside the
        timed step instead of adding to it."""
        clock = self.contract.clock
        started = clock.now() if clock is not None else 0.0
        self.contract.timed_steps = []  # what this call's execute ran, if it ran one
        responses = self._execute(requests)
        if clock is not None and self.contract.timed_steps:
            clock.finish(started, self.contract.timed_steps)
        return responses

    def _execute(self, requests: list) -> list:
        pb = self.pb
        prepared: list[Any] = []
        rows: list[dict[str, np.ndarray]] = []
        for request in requests:
            inputs = request_inputs(request, self.names)
            try:
                request_rows = split_rows(inputs, self.decoupled)
                prepared.append((inputs, len(rows), len(request_rows)))
                rows += request_rows
            except RequestError as err:
                prepared.append(err)
        try:
            results = self.contract.execute(rows, errors="return", wait=False) if rows else []
        except Exception as err:  # noqa: BLE001 - every request of the batch gets the error; the server keeps serving
            import traceback

            pb.Logger.log_error(f"{self.name}: {traceback.format_exc()}")
            message = f"{self.name}: internal error: {type(err).__name__}: {err}"
            return [pb.InferenceResponse(error=pb.TritonError(message)) for _ in requests]
        responses = []
        for request, item in zip(requests, prepared):
            if isinstance(item, RequestError):
                responses.append(self._invalid(str(item)))
                continue
            inputs, start, count = item
            mine = results[start : start + count]
            failed = [r for r in mine if isinstance(r, Exception)]
            if failed:
                responses.append(self._invalid(str(failed[0])))
                continue
            outputs = assemble(inputs, mine, self.exclude_default)
            if "generation_logits" in outputs and not self.logits_type_ok and _requested(request, "generation_logits"):
                responses.append(pb.InferenceResponse(error=pb.TritonError(f"{self.name}: {LOGITS_TYPE_CHECK}")))
                continue
            responses.append(
                pb.InferenceResponse(output_tensors=[pb.Tensor(k, np.ascontiguousarray(v)) for k, v in outputs.items()])
            )
        return responses

    def _invalid(self, message: str):
        return self.pb.InferenceResponse(
            error=self.pb.TritonError(f"{self.name}: {message}", self.pb.TritonError.INVALID_ARG)
        )


def _requested(request, name: str) -> bool:
    """Whether the request asked for output `name` (the C++ backend fills only requested outputs)."""
    try:
        names = request.requested_output_names()
    except AttributeError:
        return True
    return not names or name in names
