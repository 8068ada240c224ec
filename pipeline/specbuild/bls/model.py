"""`tensorrt_llm_bls`: the speculative draft/verify loop served by Triton's Python backend.

The loop itself is `specbuild.speculative.loop` (shared with the in-process runtime); this model only
moves tensors: text -> `preprocessing` -> loop over BLS calls to `tensorrt_llm_draft` (propose) and
`tensorrt_llm` (verify) -> `postprocessing` -> text. The two LLM models are TensorRT-LLM engines on GPU
or specbuild's reference models on CPU; both speak the same tensor contract (NVIDIA's `tensorrt_llm` tensors).

Beyond NVIDIA's BLS: streams accepted tokens as they are verified (decoupled mode), several requests at
once (a thread each), EOS and stop words handled at once, K clamped and adapted, INVALID_ARG errors
instead of tracebacks, cancellation, per-response acceptance outputs and Prometheus metrics.

Like NVIDIA's BLS (NVIDIA/TensorRT-LLM `triton_backend/all_models/inflight_batcher_llm/tensorrt_llm_bls/1/`):
`text_output` is one string per sequence ([1] for one request, as postprocessing's OUTPUT); a final,
non-streamed text is postprocessing's decoding of the target's output_ids, which include the prompt
unless exclude_input_in_output says otherwise (the generated tensorrt_llm models keep the input, and
NVIDIA's BLS follows the target's setting); draft logits reach the target in the declared logits dtype.
"""

from __future__ import annotations

import json
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from specbuild.bls.metrics import SpeculationMetrics
from specbuild.bls.request import BlsRequest, InvalidRequest, parse_request
from specbuild.runtime.textstream import TextStream
from specbuild.triton.models.postprocessing import decode_ids
from specbuild.speculative.contract_client import ContractDrafter, ContractVerifier
from specbuild.speculative.loop import GenerationRequest, generate

TARGET_EXCLUDES_INPUT = False  # the generated tensorrt_llm models' exclude_input_in_output
NUMPY_LOGITS = {"TYPE_FP16": "float16", "TYPE_FP32": "float32"}


class ModelCallError(RuntimeError):
    """A BLS sub-request to another model failed; the message is the server's."""


def _param(config: dict, key: str, default: str | None = None) -> str:
    value = config.get("parameters", {}).get(key, {}).get("string_value")
    if value is None or value == "" or value.startswith("${"):
        if default is None:
            raise ValueError(f"model config parameter '{key}' is required")
        return default
    return value


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        import triton_python_backend_utils as pb_utils

        self.pb = pb_utils
        config = json.loads(args["model_config"])
        self.model_name = args.get("model_name", "tensorrt_llm_bls")
        self.target_model = _param(config, "tensorrt_llm_model_name", "tensorrt_llm")
        self.draft_model = _param(config, "tensorrt_llm_draft_model_name", "tensorrt_llm_draft")
        self.max_draft_len = int(_param(config, "max_draft_len"))
        self.default_k = int(_param(config, "num_draft_tokens", str(self.max_draft_len)))
        self.max_input_len = int(_param(config, "max_input_len"))
        self.max_tokens_limit = int(_param(config, "max_output_len"))
        self.adaptive = _param(config, "adaptive_draft_len", "true").lower() in ("1", "true", "yes")
        self.default_use_draft_logits = _param(config, "use_draft_logits", "false").lower() in ("1", "true", "yes")
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        # the deployment's logits type (the engines' logits dtype), which the target's draft_logits input declares
        declared = {o.get("name"): o.get("data_type") for o in config.get("output", [])}.get("generation_logits")
        self.logits_dtype = NUMPY_LOGITS.get(declared)
        workers = int(_param(config, "max_concurrent_requests", "16"))
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bls")
        self.metrics = SpeculationMetrics(pb_utils, self.model_name, self.max_draft_len)
        self.metrics_lock = threading.Lock()
        # Detokenize in-process when the tokenizer is named (one BLS call to `postprocessing` per streamed
        # step costs a round trip and re-decodes the whole output); else through `postprocessing`.
        self.tokenizer = None
        tokenizer_dir = _param(config, "tokenizer_dir", "")
        if tokenizer_dir:
            from specbuild.triton.models.common import resolve_path
            from specbuild.triton.models.preprocessing import load_tokenizer

            self.tokenizer = load_tokenizer(resolve_path(tokenizer_dir, args))

    # ---- Triton entry points -------------------------------------------------------------------
    def execute(self, requests: list) -> list | None:
        if self.decoupled:
            for request in requests:
                self.pool.submit(self._serve_streaming, request)
            return None
        return [self._serve_one_response(request) for request in requests]

    def finalize(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)

    # ---- one request -----------------------------------------------------------------------------
    def _serve_streaming(self, request) -> None:
        sender = request.get_response_sender()
        final = self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        try:
            parsed = self._parse(request)
            for response in self._run(request, parsed):
                sender.send(response)
            sender.send(flags=final)
        except Exception as err:  # every failure becomes an error response; the server keeps running
            sender.send(self.pb.InferenceResponse(error=self._error(err)), flags=final)

    def _serve_one_response(self, request):
        try:
            parsed = self._parse(request)
            responses = list(self._run(request, dataclass_replace_stream(parsed, False)))
            return responses[-1]
        except Exception as err:
            return self.pb.InferenceResponse(error=self._error(err))

    def _parse(self, request) -> BlsRequest:
        present = {tensor.name(): tensor for tensor in request.inputs()}

        def get(name: str):
            tensor = present.get(name)
            return None if tensor is None else tensor.as_numpy()

        return parse_request(get, self.max_tokens_limit, self.max_draft_len)

    def _error(self, err: Exception):
        if isinstance(err, InvalidRequest):
            return self.pb.TritonError(str(err), self.pb.TritonError.INVALID_ARG)
        if isinstance(err, ModelCallError):
            return self.pb.TritonError(str(err))
        self.pb.Logger.log_error(f"{self.model_name}: {traceback.format_exc()}")
        return self.pb.TritonError(f"internal error in {self.model_name}: {type(err).__name__}: {err}")

    def _run(self, request, req: BlsRequest):
        """Yield the responses of one request: stream chunks (if req.stream), then the final one."""
        pre = self._call("preprocessing", self._preprocessing_inputs(req))
        prompt = pre["INPUT_ID"].reshape(-1)[: int(pre["REQUEST_INPUT_LEN"].reshape(-1)[0])].astype(np.int64).tolist()
        if len(prompt) > self.max_input_len:
            raise InvalidRequest(
                f"the prompt is {len(prompt)} tokens, above this deployment's max_input_len = {self.max_input_len}; "
                "shorten it."
            )
        end_id = int(pre["OUT_END_ID"].reshape(-1)[0]) if "OUT_END_ID" in pre else req.end_id
        stop_sequences = _stop_sequences(pre.get("STOP_WORDS_IDS"))
        k = self.default_k if req.num_draft_tokens is None else req.num_draft_tokens
        use_logits = self.default_use_draft_logits if req.use_draft_logits is None else req.use_draft_logits
        pad_id = int(pre["OUT_PAD_ID"].reshape(-1)[0]) if "OUT_PAD_ID" in pre else req.pad_id
        drafter = ContractDrafter(lambda inputs: self._call(self.draft_model, inputs, batch_dim=True),
                                  end_id=end_id, pad_id=pad_id, use_logits=use_logits)
        verifier = ContractVerifier(lambda inputs: self._call(self.target_model, inputs, batch_dim=True),
                                    max_draft_len=self.max_draft_len, end_id=end_id, pad_id=pad_id,
                                    logits_dtype=self.logits_dtype)
        gen = GenerationRequest(max_tokens=req.max_tokens, num_draft_tokens=k, sampling=req.sampling,
                                end_id=end_id, stop_sequences=stop_sequences, adaptive=self.adaptive and k > 0)
        output: list[int] = []
        sent_text = ""
        text_stream = TextStream(self.tokenizer, prompt) if self.tokenizer is not None else None
        started = time.perf_counter()
        result = None
        steps = generate(prompt, drafter, verifier, gen)
        for step in steps:
            if request.is_cancelled():
                steps.close()
                raise ModelCallError("request cancelled by the client")
            output.extend(step.tokens)
            if req.stream and step.tokens:
                if text_stream is not None:
                    delta = text_stream.push(step.tokens)
                else:
                    text = self._detokenize(output)
                    complete = not text.endswith("\ufffd")  # wait for a whole UTF-8 character
                    delta = text[len(sent_text):] if complete and len(text) > len(sent_text) else ""
                if delta:
                    yield self._response(delta, None, output)
                    sent_text += delta
            result = step
        stats = result.stats if result is not None else None
        if req.stream:  # streamed responses carry new text only, like TensorRT-LLM's
            if text_stream is not None:
                text_stream.finish()
                text = text_stream.text
            else:
                text = self._detokenize(output)
        else:
            exclude = TARGET_EXCLUDES_INPUT if req.exclude_input_in_output is None else req.exclude_input_in_output
            text = self._final_text(output if exclude else prompt + output)
        with self.metrics_lock:
            if stats is not None:
                self.metrics.record(stats, len(output))
        remaining = text[len(sent_text):] if req.stream else text
        yield self._response(remaining, stats, output, elapsed=time.perf_counter() - started)

    # ---- helpers ---------------------------------------------------------------------------------
    def _preprocessing_inputs(self, req: BlsRequest) -> dict[str, np.ndarray]:
        inputs = {
            "QUERY": np.array([[req.text.encode("utf-8")]], dtype=object),
            "REQUEST_OUTPUT_LEN": np.array([[req.max_tokens]], dtype=np.int32),
        }
        if req.stop_words:
            inputs["STOP_WORDS_DICT"] = np.array([[w.encode("utf-8") for w in req.stop_words]], dtype=object)
        if req.end_id is not None:
            inputs["END_ID"] = np.array([[req.end_id]], dtype=np.int32)
        if req.pad_id is not None:
            inputs["PAD_ID"] = np.array([[req.pad_id]], dtype=np.int32)
        return inputs

    def _final_text(self, tokens: list[int]) -> str:
        """tokens decoded as postprocessing decodes them: NVIDIA's BLS sends its final ids there."""
        if self.tokenizer is not None:
            return decode_ids(self.tokenizer, tokens, skip_special_tokens=True)
        return self._detokenize(tokens)

    def _detokenize(self, tokens: list[int]) -> str:
        if not tokens:
            return ""
        if self.tokenizer is not None:
            return self.tokenizer.decode(tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        out = self._call("postprocessing", {
            "TOKENS_BATCH": np.array([[tokens]], dtype=np.int32),
            "SEQUENCE_LENGTH": np.array([[len(tokens)]], dtype=np.int32),
        })
        value = out["OUTPUT"].reshape(-1)[0]
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)

    def _call(self, model: str, inputs: dict[str, np.ndarray], batch_dim: bool = False) -> dict[str, np.ndarray]:
        """One BLS request to `model`. With batch_dim, contract tensors ([len], [1], ...) get Triton's
        leading batch dimension of 1; without, the inputs already carry it."""
        tensors = [
            self.pb.Tensor(name, np.ascontiguousarray(value[None] if batch_dim else value))
            for name, value in inputs.items()
        ]
        response = self.pb.InferenceRequest(model_name=model, inputs=tensors, requested_output_names=[]).exec()
        if response.has_error():
            raise ModelCallError(f"model '{model}' failed: {response.error().message()}")
        return {t.name(): t.as_numpy() for t in response.output_tensors()}

    def _response(self, text: str, stats, output: list[int], elapsed: float | None = None):
        """One response; every tensor carries the batch dimension of 1 (max_batch_size > 0)."""
        tensors = [self.pb.Tensor("text_output", np.array([text.encode("utf-8")], dtype=object))]  # [1], as NVIDIA's
        if stats is not None:
            tensors += [
                self.pb.Tensor("acceptance_rate", np.array([[stats.acceptance_rate]], dtype=np.float32)),
                self.pb.Tensor("total_accepted_draft_tokens", np.array([[stats.accepted]], dtype=np.int32)),
                self.pb.Tensor("total_draft_tokens", np.array([[stats.drafted]], dtype=np.int32)),
                self.pb.Tensor("mean_accepted_len", np.array([[stats.mean_accepted_len]], dtype=np.float32)),
                self.pb.Tensor("num_output_tokens", np.array([[len(output)]], dtype=np.int32)),
                self.pb.Tensor("output_ids", np.array([output], dtype=np.int32).reshape(1, -1)),
                self.pb.Tensor("speculation_stats",
                               np.array([[json.dumps(stats.to_dict()).encode()]], dtype=object)),
            ]
        return self.pb.InferenceResponse(output_tensors=tensors)


def dataclass_replace_stream(req: BlsRequest, stream: bool) -> BlsRequest:
    import dataclasses

    return dataclasses.replace(req, stream=stream)


def _stop_sequences(stop_words_ids: np.ndarray | None) -> list[list[int]]:
    """Decode TensorRT-LLM's [2, n] word-list format (flat ids; cumulative end offsets padded with -1)."""
    if stop_words_ids is None or np.asarray(stop_words_ids).size == 0:  # [b, 2, 0]: no stop words
        return []
    array = np.asarray(stop_words_ids).reshape(-1, 2, np.asarray(stop_words_ids).shape[-1])[0]
    ids, offsets = array[0], array[1]
    sequences, start = [], 0
    for end in offsets:
        if end < 0:
            break
        if end > start:
            sequences.append([int(t) for t in ids[start:end]])
        start = int(end)
    return sequences
