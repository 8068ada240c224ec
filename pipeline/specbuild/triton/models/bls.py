"""`tensorrt_llm_bls`: the speculative draft/verify loop served by Triton's Python backend.

The loop is `specbuild.speculative.loop`, driven by `specbuild.decode.driver.drive` as in-process;
this model only moves tensors: text -> token ids (the tokenizer it holds, with preprocessing's rules)
-> loop over BLS calls to `tensorrt_llm_draft` (propose) and `tensorrt_llm` (verify) -> text. The two
LLM models are TensorRT-LLM engines on GPU or specbuild's reference models on CPU; both speak the same
tensor contract (`specbuild.contract`).

Beyond NVIDIA's BLS: streams accepted text as it is verified (decoupled mode), several requests at
once (a thread each), EOS and stop words handled at once, K clamped and adapted (the request assembled by
`decode.request.RequestRules`, as in-process), the
overlapped (draft-ahead) schedule (`_schedule`: while `tensorrt_llm` verifies a draft, the loop sends the
next step's early draft to `tensorrt_llm_draft` from a second thread of the request, `overlap.ThreadedAhead`;
`InferenceRequest.exec()` releases the GIL while it waits, triton-inference-server/python_backend r24.10
`src/infer_request.cc` `InferRequest::Exec`, so the two calls run at once in the two model processes),
INVALID_ARG errors instead of tracebacks, cancellation, Prometheus metrics, a bounded queue, prompts refused
by their size before tokenizing (`bls_request`), and on the final response `finish_reason` / `stop_reason`
(NVIDIA's LLM API names and values, `specbuild.decode.generation`) with the acceptance outputs
(`acceptance_rate`, `total_accepted_draft_tokens`, `total_draft_tokens`, always sent) and specbuild's
`output_ids`, `num_input_tokens`, `num_output_tokens`, `mean_accepted_len`, `speculation_stats` (with the K used).

Like NVIDIA's BLS (NVIDIA/TensorRT-LLM `triton_backend/all_models/inflight_batcher_llm/tensorrt_llm_bls/1/`):
`text_output` is one string per sequence ([1] for one request, as postprocessing's OUTPUT); a final,
non-streamed text is postprocessing's decoding of the target's output_ids, which include the prompt
unless exclude_input_in_output says otherwise (the generated tensorrt_llm models keep the input, and
NVIDIA's BLS follows the target's setting); draft logits reach the target in the declared logits dtype.

The queue: at most `max_concurrent_requests` requests run at once (a slot each) and at most `max_queue_size`
more wait for a slot, in the BLS (0 = no bound). `execute` never waits: it reads and checks each request (a bad
or oversized one is answered at once), then hands it to the pool of slots, or answers UNAVAILABLE "Exceeds maximum
queue size", Triton's own words for a full queue, when max_queue_size are already waiting (HTTP: 503 from /infer;
/generate's status is unreliable in tritonserver 2.51, docs/triton.md "The queue"). The bound
is the BLS's and not Triton's queue policy because any Triton bound puts the dynamic batcher on a path where a
request can wait 0.5 s beside an idle instance (specbuild.triton.configs, from core r24.10's source). Every
response goes through the request's response sender, non-decoupled ones included (Python backend >= 24.06), so
`execute` returns None. `QueueMetrics` counts the waiting, running and refused requests.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from specbuild import drafters
from specbuild.contract import models
from specbuild.contract.adapters import ContractDrafter, ContractVerifier
from specbuild.contract.bls_params import BlsParameters
from specbuild.contract.logits import NUMPY_NAMES
from specbuild.contract.serving_gate import Gate
from specbuild.contract.tensors import final_values
from specbuild.decode.drafting import Drafting
from specbuild.decode.driver import drive
from specbuild.decode.generation import Generation
from specbuild.decode.request import RequestRules
from specbuild.decode.textstream import TextStream
from specbuild.errors import RequestError
from specbuild.hfmodel import checkpoint_vocab_size, end_ids, listed_end_ids
from specbuild.speculative.overlap import AutoSchedule, available_cores, parse_setting, resolve_auto
from specbuild.speculative.shared_pool import SharedLookupPool, pool_path
from specbuild.triton.models.bls_metrics import QueueMetrics, SpeculationMetrics
from specbuild.triton.models.bls_request import BlsRequest, RequestLimits, parse_request
from specbuild.triton.models.common import ModelCallError, call_model, parameters, resolve_path
from specbuild.triton.models.postprocessing import decode_ids
from specbuild.triton.models.preprocessing import Preprocessor, load_tokenizer
from specbuild.triton.models.response_pipe import ResponsePipe
from specbuild.triton.models.target_retry import RetryingVerifier, TargetUnavailable
from specbuild.triton.models.token_bytes import max_token_bytes

TARGET_EXCLUDES_INPUT = False  # the generated tensorrt_llm models' exclude_input_in_output


class Cancelled(RuntimeError):
    """The client cancelled the request."""


# "auto" is kept where the draft and the target model processes can each have a core; then AutoSchedule measures
# whether drafting ahead is faster for this deployment, across its requests (it may not be: docs/bench/results.md).
AUTO_CORES = 2
AUTO_WHAT = "the draft and the target model processes beside the BLS and the server"


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        import triton_python_backend_utils as pb_utils

        self.pb = pb_utils
        config = json.loads(args["model_config"])
        self.model_name = args.get("model_name", models.BLS)
        settings = BlsParameters.from_parameters(parameters(args))
        self.target_model, self.draft_model = settings.tensorrt_llm_model_name, settings.tensorrt_llm_draft_model_name
        self.max_draft_len = settings.max_draft_len
        self.max_input_len = settings.max_input_len
        self.max_tokens_limit = settings.max_output_len
        self.default_use_draft_logits = settings.use_draft_logits
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        # the deployment's logits type (the engines' logits dtype), which the target's draft_logits input declares
        declared = {o.get("name"): o.get("data_type") for o in config.get("output", [])}.get("generation_logits")
        self.logits_dtype = NUMPY_NAMES.get(declared)
        # The schedule: the spec's speculative.overlap; "auto" is kept with AUTO_CORES cores (an older repository
        # without the parameter: sequential).
        self.cores = available_cores()
        self.overlap, reason = resolve_auto(settings.overlap, self.cores, AUTO_CORES, AUTO_WHAT)
        pb_utils.Logger.log_info(f"{self.model_name}: overlapped schedule {self.overlap} ({reason})")
        self.auto_schedule = AutoSchedule()  # "auto": measured across this model instance's requests
        self.slots = settings.max_concurrent_requests
        self.max_waiting = settings.max_queue_size  # absent (an older repository): no bound
        self.target_retry_s = settings.target_retry_s
        self.pool = ThreadPoolExecutor(max_workers=self.slots, thread_name_prefix="bls")  # its queue is FIFO
        self.closing = False
        self.metrics = SpeculationMetrics(pb_utils, self.model_name, self.max_draft_len)
        self.metrics_lock = threading.Lock()
        self.queue_metrics = QueueMetrics(pb_utils, self.model_name)
        self.gate = Gate(pb_utils, parameters(args))  # closed by the drain
        # Tokenizes and detokenizes in-process, by preprocessing's and postprocessing's rules: a BLS call to
        # either model per request (or per streamed step) would cost a round trip.
        tokenizer_dir = resolve_path(settings.tokenizer_dir, args)
        self.tokenizer = load_tokenizer(tokenizer_dir)
        self.pre = Preprocessor(self.tokenizer, settings.add_special_tokens)
        # a request naming no end id ends at any of the deployment's: the tokenizer's eos (preprocessing's end_id,
        # the one the models get), then the checkpoint's listed ones, as the local path reads them
        # the drafters: the draft model (a ContractDrafter per request, below), prompt lookup, the hybrid; the lookup's
        # pool is shared by every instance of this model on this server (each instance is a process)
        lookup = settings.lookup()
        shared = SharedLookupPool(pool_path(self.model_name), lookup.pool_max_tokens) if lookup.is_public_pool else None
        self.drafting = Drafting.create(
            settings.drafter,
            None,
            lookup,
            shared,
            log=lambda message: pb_utils.Logger.log_warn(f"{self.model_name}: {message}"),
        )
        self.rules = RequestRules(
            self.tokenizer,
            end_ids(self.pre.end_id, listed_end_ids(tokenizer_dir)),
            self.max_draft_len,
            settings.num_draft_tokens,
            settings.adaptive_draft_len,
            settings.drafter,
            drafters.runnable(bool(self.draft_model)),  # no draft model (a target-only deployment): lookup only
            # guided requests (structured output): the tokenizer's vocabulary and the target's rows, read from the
            # config.json beside the tokenizer (the checkpoint's, or the reference engine's), so padding is banned too
            vocab_size=checkpoint_vocab_size(tokenizer_dir) or len(self.tokenizer),
        )
        token_bytes = max_token_bytes(self.tokenizer)
        if token_bytes.longest is None:
            pb_utils.Logger.log_warn(
                f"{self.model_name}: prompts are not refused by their size in bytes, only after "
                f"tokenizing: no bytes-per-token bound for this tokenizer ({token_bytes.reason})."
            )
        self.limits = RequestLimits(
            max_tokens=self.max_tokens_limit,
            vocab_size=len(self.tokenizer),
            max_input_len=self.max_input_len,
            longest_token_bytes=token_bytes.longest,
        )

    # ---- Triton entry points -------------------------------------------------------------------
    def execute(self, requests: list) -> None:
        """Check each request, then queue it for a slot or refuse it (see the module docstring); never waits."""
        draining = self.gate.refusal()  # the drain has begun: new requests go elsewhere
        for request in requests:
            if draining is not None:
                self._answer(request, self.pb.InferenceResponse(error=draining))
                continue
            try:
                req = self._parse(request)
            except Exception as err:  # a bad request is answered before it waits for a slot
                self._answer(request, self.pb.InferenceResponse(error=self._error(err)))
                continue
            if self.closing or not self.queue_metrics.admit(self.slots, self.max_waiting):
                self._answer(
                    request,
                    self.pb.InferenceResponse(
                        error=self._unavailable(
                            f"{self.model_name} is unloading"
                            if self.closing
                            else f"Exceeds maximum queue size: {self.max_waiting} requests wait for the {self.slots} this BLS "
                            "runs at once; retry later"
                        )
                    ),
                )
                continue
            self.pool.submit(self._in_slot, request, req, time.monotonic())
        return None

    def finalize(self) -> None:
        self.closing = True  # the requests still waiting are answered UNAVAILABLE, none is left without an answer
        self.pool.shutdown(wait=True)
        self.drafting.close()

    # ---- one request -----------------------------------------------------------------------------
    def _in_slot(self, request, req: BlsRequest, received: float) -> None:
        self.queue_metrics.started(time.monotonic() - received)
        try:
            if self.closing:
                self._answer(
                    request, self.pb.InferenceResponse(error=self._unavailable(f"{self.model_name} is unloading"))
                )
            elif self.decoupled:
                self._serve_streaming(request, req)
            else:
                self._answer(request, self._serve_one_response(request, req))
        finally:
            self.queue_metrics.finished()

    def _answer(self, request, response) -> None:
        """The request's one (final) response."""
        request.get_response_sender().send(response, flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _unavailable(self, message: str):
        TritonError = self.pb.TritonError
        return TritonError(message, getattr(TritonError, "UNAVAILABLE", TritonError.UNKNOWN))

    def _serve_streaming(self, request, req: BlsRequest) -> None:
        """The streamed responses go out from a thread of their own while the loop runs on (`ResponsePipe`)."""
        log = lambda message: self.pb.Logger.log_error(f"{self.model_name}: {message}")  # noqa: E731
        pipe = ResponsePipe(
            request.get_response_sender(), self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL, request.is_cancelled, log
        )
        try:
            response = self._run(request, req, send=pipe.send, cancelled=pipe.cancelled)
        except Exception as err:  # every failure becomes an error response; the server keeps running
            response = self.pb.InferenceResponse(error=self._error(err))
        pipe.close(response)

    def _serve_one_response(self, request, req: BlsRequest):
        try:
            return self._run(request, dataclasses.replace(req, stream=False), send=None)
        except Exception as err:
            return self.pb.InferenceResponse(error=self._error(err))

    def _parse(self, request) -> BlsRequest:
        present = {tensor.name(): tensor for tensor in request.inputs()}

        def get(name: str):
            tensor = present.get(name)
            return None if tensor is None else tensor.as_numpy()

        return parse_request(get, self.limits)

    def _error(self, err: Exception):
        TritonError = self.pb.TritonError
        if isinstance(err, RequestError):
            return TritonError(str(err), TritonError.INVALID_ARG)
        if isinstance(err, Cancelled):
            return TritonError(str(err), getattr(TritonError, "CANCELLED", TritonError.UNKNOWN))
        if isinstance(err, TargetUnavailable):  # the target did not serve again in time: the client may send it again
            self.pb.Logger.log_error(f"{self.model_name}: {err}")
            return TritonError(str(err), getattr(TritonError, "UNAVAILABLE", TritonError.UNKNOWN))
        if isinstance(err, ModelCallError):  # logged: the supervisor reads "Stub process ... is not healthy" there
            self.pb.Logger.log_error(f"{self.model_name}: {err}")
            return TritonError(str(err))
        self.pb.Logger.log_error(f"{self.model_name}: {traceback.format_exc()}")
        return TritonError(f"internal error in {self.model_name}: {type(err).__name__}: {err}")

    @staticmethod
    def _parameter(request, name: str):
        """A Triton request parameter (not a tensor, so NVIDIA's clients are unaffected); None when not sent."""
        try:
            return json.loads(request.parameters() or "{}").get(name)
        except (AttributeError, ValueError):  # a server without request parameters, or none sent
            return None

    def _drafter(self, request) -> str | None:
        """The request's drafter: its parameter `drafter` (specbuild.drafters), or None for the deployment's."""
        asked = self._parameter(request, "drafter")
        if asked is not None and not isinstance(asked, str):
            raise RequestError(
                f"request parameter 'drafter' = {asked!r} is invalid: use one of {', '.join(drafters.NAMES)}."
            )
        return asked

    def _schedule(self, request) -> bool | str:
        """The request's schedule: its parameter `overlap` (true, false or "auto"; a Triton request parameter,
        not a tensor, so NVIDIA's clients are unaffected) or the deployment's. "auto" drafts ahead only while
        the cores can run every request's two models at once (requests in flight x 2 <= cores): beyond that
        the models are busy anyway, and a missed early draft takes a turn from another request."""
        asked = self._parameter(request, "overlap")
        if asked is None:
            overlap = self.overlap
        else:
            try:
                overlap = parse_setting(asked, "request parameter 'overlap'")
            except ValueError as err:
                raise RequestError(str(err)) from None
            if overlap == "auto":
                overlap, _ = resolve_auto(overlap, self.cores, AUTO_CORES, AUTO_WHAT)
        if overlap == "auto" and 2 * self.queue_metrics.active > self.cores:  # requests running now, this one included
            return False
        return overlap

    def _run(self, request, req: BlsRequest, send, cancelled=None) -> object:
        """Serve one request: stream text pieces through `send` (when req.stream), return the final response.
        cancelled: whether the client cancelled (default: the request's is_cancelled)."""
        prompt = self.pre.encode(req.text, "text_input")
        if len(prompt) > self.max_input_len:
            raise RequestError(
                f"the prompt is {len(prompt)} tokens, above this deployment's max_input_len = {self.max_input_len}; "
                "shorten it."
            )
        ready = self.rules.prepare(
            max_tokens=req.max_tokens,
            sampling=req.sampling,
            num_draft_tokens=req.num_draft_tokens,
            end_id=req.end_id,
            stop=req.stop_words,
            overlap=self._schedule(request),
            drafter=self._drafter(request),
            guide=req.guide,
        )
        pad_id = self.pre.pad_id if req.pad_id is None else req.pad_id
        use_logits = self.default_use_draft_logits if req.use_draft_logits is None else req.use_draft_logits
        model = (
            ContractDrafter(
                lambda inputs: call_model(self.pb, self.draft_model, inputs),
                end_id=ready.model_end_id,
                pad_id=pad_id,
                use_logits=use_logits,
            )
            if self.draft_model  # "" in a target-only deployment: no draft model to call
            else None
        )
        # a lookup proposal reaches the target as draft_input_ids, as NVIDIA's n-gram example sends it
        # (NVIDIA/TensorRT-LLM examples/ngram/run_dtm_ngram.py): no draft model call, no draft logits
        drafter = self.drafting.drafter(ready.drafter, model)
        cancelled = cancelled or request.is_cancelled
        verifier = RetryingVerifier(  # a failed target call is tried again until it serves (target_retry)
            ContractVerifier(
                lambda inputs: call_model(self.pb, self.target_model, inputs),
                max_draft_len=self.max_draft_len,
                end_id=ready.model_end_id,
                pad_id=pad_id,
                logits_dtype=self.logits_dtype,
                on_disagreement=self._disagreement,
            ),
            self.target_retry_s,
            log=lambda message: self.pb.Logger.log_warn(f"{self.model_name}: {message}"),
            cancelled=cancelled,
        )
        stream = TextStream(self.tokenizer, prompt) if req.stream else None
        counted = 0  # output tokens the streamed responses have counted (num_output_tokens, when asked)

        def streamed(delta: str) -> None:
            nonlocal counted
            covered, counted = stream.pushed - counted, stream.pushed
            send(self._response(delta, counts=self._counts(req, len(prompt), covered)))

        try:
            result = drive(
                prompt,
                drafter,
                verifier,
                ready.request,
                k=ready.k,
                text=stream,
                on_text=streamed,
                cancelled=cancelled,
                stop_words=ready.stop_words,
                schedule=self.auto_schedule,
                drafter_name=ready.drafter,
                guide=ready.guide,
            )
        finally:
            if verifier.retries:
                with self.metrics_lock:
                    self.metrics.target_retries(verifier.retries, verifier.waited_s)
        if result.finish_reason == "cancelled":
            with self.metrics_lock:
                self.metrics.cancelled()
            raise Cancelled("request cancelled by the client")
        self.drafting.remember(ready.drafter, prompt, result.output_ids, result.stats)
        with self.metrics_lock:
            self.metrics.record(result.stats, len(result.output_ids))
            self.metrics.pool(self.drafting.figures())
        if req.stream:  # streamed responses carry new text only, like TensorRT-LLM's; it has all been sent
            # asked for per-response counts, the final one counts what the others did not (their sum is the total)
            return self._response("", result, counted=counted if req.return_num_output_tokens else 0)
        exclude = TARGET_EXCLUDES_INPUT if req.exclude_input_in_output is None else req.exclude_input_in_output
        ids = result.output_ids if exclude else prompt + result.output_ids
        return self._response(decode_ids(self.tokenizer, ids, skip_special_tokens=True), result)

    # ---- helpers ---------------------------------------------------------------------------------
    def _disagreement(self, message: str) -> None:
        """The target's acceptance figure contradicted its tokens: logged and counted, the request goes on."""
        self.pb.Logger.log_warn(f"{self.model_name}: {message}")
        with self.metrics_lock:
            self.metrics.disagreement()

    @staticmethod
    def _counts(req: BlsRequest, input_tokens: int, output_tokens: int) -> dict[str, int]:
        """A streamed response's token counts, those the request asked for (return_num_input/output_tokens)."""
        asked = {"num_input_tokens": req.return_num_input_tokens, "num_output_tokens": req.return_num_output_tokens}
        values = {"num_input_tokens": input_tokens, "num_output_tokens": output_tokens}
        return {name: values[name] for name, wanted in asked.items() if wanted}

    def _response(
        self, text: str, result: Generation | None = None, counts: dict[str, int] | None = None, counted: int = 0
    ):
        """One response; every tensor carries the batch dimension of 1 (max_batch_size > 0). counts: a streamed
        response's token counts; counted: output tokens earlier responses counted (the final one gives the rest)."""
        tensors = [self.pb.Tensor("text_output", np.array([text.encode("utf-8")], dtype=object))]  # [1], as NVIDIA's
        tensors += [self.pb.Tensor(name, np.array([[value]], dtype=np.int32)) for name, value in (counts or {}).items()]
        if result is not None:
            stats, reason = result.stats, result.stop_reason
            tensors += [
                self.pb.Tensor(name, array)
                for name, array in final_values(
                    {
                        "finish_reason": str(result.finish_reason),
                        "stop_reason": reason if reason is None or isinstance(reason, str) else json.dumps(reason),
                        "acceptance_rate": stats.acceptance_rate,
                        "total_accepted_draft_tokens": stats.accepted,
                        "total_draft_tokens": stats.drafted,
                        "mean_accepted_len": stats.mean_accepted_len,
                        "num_input_tokens": len(result.prompt_ids or ()),
                        "num_output_tokens": len(result.output_ids) - counted,
                        "output_ids": list(result.output_ids),
                        "speculation_stats": {
                            **stats.to_dict(),
                            "overlap": result.overlap,
                            "drafter": result.drafter,
                            **({"k": result.k.to_dict()} if result.k else {}),
                        },
                    }
                ).items()
            ]
        return self.pb.InferenceResponse(output_tensors=tensors)
