"""`tensorrt_llm` of an llmapi repository on CPU: a stand-in for NVIDIA's llmapi model.py that serves the
same contract (`protocol`, contract MODEL) with the reference runtime (`llm.StandInLLM`).

What it does the way NVIDIA's model does it:
- model.yaml is read from the model's version folder: a YAML error -> "Failed to parse YAML engine
  config: ...", a missing file -> "'model.yaml' containing TRT-LLM engine args not found in '<dir>'";
  triton_config must hold max_batch_size and decoupled; cancellation_check_period_ms defaults to 100;
  every other key goes to the LLM (refused as TensorRT-LLM refuses it: the model does not load);
- execute() returns None and answers through each request's response sender, one request at a time per
  thread (NVIDIA: one asyncio task each), the loop driven by `decode.driver.drive` (`llm.StandInLLM`);
  streamed responses go out through one response thread;
- streaming on a model that is not decoupled -> "Streaming is only supported in decoupled mode.";
- any failure -> a response with text_output ["N/A"] and the error "Error generating request: <error>";
- `stop: true` -> "A request id must be provided for request cancellation" without a request id, else
  every request with that id is aborted and the stop request gets CANCELLED "Request cancelled by client"; an
  aborted streaming request gets a last response with finish_reason "cancelled", a non-streaming one nothing;
- a request the client cancels is found by a loop every cancellation_check_period_ms and answered with
  CANCELLED "Request cancelled by client".
What it adds, as the GPU repository adds it to NVIDIA's class: while `specbuild serve` drains, new requests
are refused with UNAVAILABLE (`specbuild.contract.serving_gate.gated`); the checkpoint's end ids other than the
tokenizer's eos go with every request as stop_token_ids (`specbuild.llmapi.end_ids.every_end_id`), since the LLM,
and this stand-in like it, ends at the tokenizer's eos only; a non-streaming request a `stop` request aborted gets
CANCELLED as its final response (`specbuild.llmapi.answered.every_request_answered`).
Where it differs: concurrent requests share forward passes through `reference.batcher.Batcher` (NVIDIA: the LLM's
own in-flight batching).
"""

from __future__ import annotations

import json
import queue
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specbuild.contract import llmapi as contract
from specbuild.contract.serving_gate import gated
from specbuild.llmapi.answered import cancelled_response, every_request_answered
from specbuild.llmapi.end_ids import every_end_id
from specbuild.llmapi.protocol import (
    MODEL_YAML_ENV,
    CompletionOutput,
    ModelException,
    RequestOutput,
    parse_request,
    read_model_yaml,
    response_tensors,
    scalar,
)


class SharedModel:
    """One contract model for every request thread: a direct call while one request runs, a Batcher (shared
    forward passes) while several do. Either way one call at a time reaches the model (the lock)."""

    def __init__(self, model: Any, active: ActiveCount):
        from specbuild.reference.batcher import Batcher

        self.model, self.active, self.lock = model, active, threading.Lock()
        self.batcher = Batcher(self, max_batch_size=model.limits.max_batch_size)
        self.limits = model.limits

    def execute(self, requests: list[dict], errors: str = "raise") -> list[Any]:
        with self.lock:
            return self.model.execute(requests, errors=errors)

    def __call__(self, request: dict) -> dict:
        if self.active.value <= 1:
            with self.lock:
                return self.model(request)
        return self.batcher(request)

    def close(self) -> None:
        self.batcher.close()


@dataclass
class ActiveCount:
    value: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, n: int) -> None:
        with self.lock:
            self.value += n


@dataclass
class Tracked:
    request: Any
    sender: Any
    user_id: str
    cancelled: threading.Event = field(default_factory=threading.Event)  # aborted: stop generating
    stopped: bool = False  # aborted by a `stop` request (not by its client's cancel)


class StandInModel:
    def initialize(self, args: dict) -> None:
        import os

        import triton_python_backend_utils as pb_utils

        from specbuild.llmapi.llm import StandInLLM

        self.pb = pb_utils
        self.logger = pb_utils.Logger
        self.model_config = json.loads(args["model_config"])
        model_dir = Path(args["model_repository"]) / str(args["model_version"])
        config = read_model_yaml(model_dir, os.environ.get(MODEL_YAML_ENV, "model.yaml"))
        triton_config = config["triton_config"]
        self.decoupled = bool(triton_config["decoupled"])
        self.cancellation_check_period_ms = int(
            triton_config.get("cancellation_check_period_ms", contract.CANCELLATION_CHECK_PERIOD_MS)
        )
        text_output = pb_utils.get_output_config_by_name(self.model_config, "text_output")
        self.output_dtype = pb_utils.triton_string_to_numpy(text_output["data_type"])
        engine_args = {key: value for key, value in config.items() if key != "triton_config"}
        self.logger.log_info(f"[specbuild stand-in] starting the CPU stand-in LLM with args: {engine_args}")
        self._threads(Path(engine_args.get("model", "")))
        self.llm = StandInLLM(engine_args)
        self.active = ActiveCount()
        self.shared = {"target": SharedModel(self.llm.target, self.active)}
        if self.llm.draft is not None:
            self.shared["draft"] = SharedModel(self.llm.draft, self.active)
        self.pool = ThreadPoolExecutor(max_workers=self.llm.max_batch_size, thread_name_prefix="llmapi")
        self.lock = threading.Lock()
        self.tracked: dict[int, Tracked] = {}
        self.running = True
        self._responses: queue.Queue = queue.Queue()
        self._response_thread = threading.Thread(target=self._response_loop, daemon=True)
        self._response_thread.start()
        self._cancel_thread = threading.Thread(target=self._cancellation_loop, daemon=True)
        self._cancel_thread.start()

    @staticmethod
    def _threads(target_dir: Path) -> None:
        """One torch thread for small models (the in-process runtime's choice, reference.loading)."""
        from specbuild.reference.loading import HF_CHECKPOINT, ModelSource, configure_threads

        configure_threads(None, ModelSource("target", target_dir, HF_CHECKPOINT), "cpu")

    # ---- Triton entry points -------------------------------------------------------------------
    def execute(self, requests: list) -> None:
        for request in requests:
            if request is not None:
                self.pool.submit(self._execute_single_request, request)
        return None

    def finalize(self) -> None:
        self.logger.log_info("[specbuild stand-in] finalize")
        self.running = False
        self.pool.shutdown(wait=True, cancel_futures=True)
        self._responses.put(None)
        self._response_thread.join(timeout=10)
        self._cancel_thread.join(timeout=10)
        for shared in self.shared.values():
            shared.close()

    # ---- one request ---------------------------------------------------------------------------
    def _get(self, request):
        present = {tensor.name(): tensor for tensor in request.inputs()}
        return lambda name: None if name not in present else present[name].as_numpy()

    def _convert_request(self, request) -> tuple[str, dict[str, Any], bool, dict[str, bool]]:
        """As NVIDIA's model.py `_convert_request`: (prompt, SamplingParams keyword arguments, streaming, output
        config), the hook `every_end_id` adds the checkpoint's other end ids through."""
        parsed = parse_request(self._get(request))
        return parsed.prompt, parsed.sampling, parsed.streaming, parsed.output_config

    def _untrack(self, key: int) -> bool:
        """Stop the cancellation loop querying a request; True when it was still tracked (not yet answered).
        Done before its final response: is_cancelled() on a request whose final response is out crashes
        tritonserver 2.51 (NVIDIA's model removes it first for the same reason)."""
        with self.lock:
            return self.tracked.pop(key, None) is not None

    def _execute_single_request(self, request) -> None:
        """One request, as NVIDIA's coroutine of that name serves it (the hook `every_request_answered` wraps)."""
        pb = self.pb
        sender = request.get_response_sender()
        user_id = request.request_id()
        final = pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        tracked = Tracked(request, sender, user_id)
        key = id(tracked)
        registered = sent_final = False
        self.active.add(1)
        try:
            if scalar(self._get(request), "stop"):
                self._stop_requests(user_id, sender)
                return
            with self.lock:
                self.tracked[key] = tracked
            registered = True
            prompt, sampling_args, streaming, output_config = self._convert_request(request)
            if streaming and not self.decoupled:
                raise ModelException(contract.MSG_STREAMING_NOT_DECOUPLED)
            from specbuild.llmapi.llm import sampling_from_request

            sampling = sampling_from_request(sampling_args)

            def stream(output: RequestOutput) -> None:  # sent by the response thread while the next step runs
                self._responses.put((sender, (output, output_config), 0))

            last = self.llm.generate(
                prompt,
                sampling,
                streaming,
                call=self.shared.get,
                on_output=stream if streaming else None,
                cancelled=tracked.cancelled.is_set,
            )
            if tracked.cancelled.is_set():
                self.logger.log_info(
                    f"[specbuild stand-in] request {user_id!r} cancelled: stopped after "
                    f"{len(last.outputs[0].text)} characters of text"
                )
                if streaming and tracked.stopped:  # the aborted LLM's last output; a client's cancel was answered
                    sent_final = True
                    self._send_cancelled_output(last, output_config, sender)
                # NVIDIA's non-streaming path sends a request a `stop` request removed nothing more
            elif self._untrack(key):  # else answered meanwhile: CANCELLED by the loop, or removed by a `stop`
                sent_final = True
                if streaming:
                    self._responses.put((sender, (last, output_config), final))
                else:
                    sender.send(self._response(last, output_config), flags=final)
        except Exception as err:  # noqa: BLE001 - every failure becomes NVIDIA's error response
            if not isinstance(err, ModelException):
                self.logger.log_error(f"[trtllm] {traceback.format_exc()}")
            self.logger.log_error(f"[trtllm] Error generating request: {err}")
            if not sent_final and (not registered or self._untrack(key)):
                response = pb.InferenceResponse(
                    output_tensors=[
                        pb.Tensor("text_output", np.asarray([contract.ERROR_TEXT_OUTPUT], dtype=self.output_dtype))
                    ],
                    error=pb.TritonError(contract.MSG_GENERATE.format(error=err)),
                )
                try:
                    sender.send(response, flags=final)
                except Exception as send_err:  # noqa: BLE001 - the client is gone
                    self.logger.log_error(f"An error occurred while sending a response: {send_err}")
        finally:
            self.active.add(-1)
            self._untrack(key)

    def _send_cancelled_output(self, last: RequestOutput | None, output_config: dict[str, bool], sender) -> None:
        text = last.outputs[0].text if last else ""
        output = RequestOutput([CompletionOutput(text, [], "cancelled")], True)
        self._responses.put((sender, (output, output_config), self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL))

    def _response(self, output: RequestOutput, output_config: dict[str, bool]):
        tensors = [self.pb.Tensor(name, value) for name, value in response_tensors(output, output_config)]
        return self.pb.InferenceResponse(output_tensors=tensors)

    def _stop_requests(self, user_id: str, sender) -> None:
        final = self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if not user_id:
            sender.send(self.pb.InferenceResponse(error=self.pb.TritonError(contract.MSG_STOP_WITHOUT_ID)), flags=final)
            return
        with self.lock:  # aborted and removed, as NVIDIA's handle_stop_request does
            for key, tracked in [(k, t) for k, t in self.tracked.items() if t.user_id == user_id]:
                del self.tracked[key]
                tracked.stopped = True
                tracked.cancelled.set()
        sender.send(cancelled_response(self.pb), flags=final)

    def _response_loop(self) -> None:
        while True:
            item = self._responses.get()
            if item is None:
                return
            sender, (output, output_config), flags = item
            try:
                sender.send(self._response(output, output_config), flags=flags)
            except Exception as err:  # noqa: BLE001 - e.g. the request was cancelled meanwhile
                self.logger.log_error(f"An error occurred while sending a response: {err}")

    def _cancellation_loop(self) -> None:
        import time

        while self.running:
            time.sleep(self.cancellation_check_period_ms / 1000.0)
            with self.lock:  # answered while the lock is held, as NVIDIA's loop does: a request that finds itself
                # removed (under the lock) has had its answer
                found = [(key, t) for key, t in self.tracked.items() if t.request.is_cancelled()]
                for key, tracked in found:
                    del self.tracked[key]  # answered here: never queried or answered again
                    tracked.cancelled.set()
                    try:
                        tracked.sender.send(
                            cancelled_response(self.pb), flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                        )
                    except Exception as err:  # noqa: BLE001
                        self.logger.log_error(f"An error occurred while sending a response: {err}")


TritonPythonModel = gated(every_end_id(every_request_answered(StandInModel)))  # what the repository's model.py imports
