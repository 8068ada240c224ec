"""Every request the LLM API model accepts gets its final response, one ended by a `stop` request too.

NVIDIA's llmapi model answers a `stop` request (input `stop` true, with the request id of running requests) by
aborting every request with that id and removing it from its table (`handle_stop_request`). The aborted request's
own coroutine then sends a last response only when it streams (the LLM's last output, finish_reason "cancelled",
through the response thread); a non-streaming one finds itself removed and sends nothing ("If the request was
cancelled, we don't need to send the last response", `_execute_single_request`,
triton_backend/all_models/llmapi/tensorrt_llm/1/model.py @044a90d). Its client then waits with no answer until the
server stops, and `specbuild serve`'s drain, which waits for the final response of every request the model accepted
(`specbuild.contract.serving_gate`), waits for it until --exit-timeout.

`every_request_answered(model_class)` closes that without changing NVIDIA's code: a subclass that watches each
request's response sender (`WatchedRequest`) and, when `_execute_single_request` returns for a non-streaming request
that got no final response, sends the answer NVIDIA's cancellation loop gives a request its client cancelled:
CANCELLED "Request cancelled by client". A streaming request is left alone: its final response may still be in the
response thread's queue when the coroutine returns. Whether a request streams is what NVIDIA's own
`_convert_request` said; a request it was not asked about (a `stop` request, or one whose conversion failed and was
answered with the error) is left alone too. The CPU stand-in has the same two methods and gets the same subclass.
"""

from __future__ import annotations

import inspect
from typing import Any

from specbuild.contract import llmapi as contract
from specbuild.contract.watched_request import WatchedRequest

HOOKS = ("_execute_single_request", "_convert_request")


def cancelled_response(pb_utils: Any) -> Any:
    """NVIDIA's answer to a cancelled request: CANCELLED "Request cancelled by client" (model.py
    `cancellation_loop` and `handle_stop_request`; UNKNOWN on a Python backend without the CANCELLED code)."""
    TritonError = pb_utils.TritonError
    code = getattr(TritonError, "CANCELLED", None)
    error = TritonError(contract.MSG_CANCELLED, code) if code is not None else TritonError(contract.MSG_CANCELLED)
    return pb_utils.InferenceResponse(error=error)


class _Request(WatchedRequest):
    streaming: bool | None = None  # what _convert_request said; None before (or without) it


def every_request_answered(model_class: type) -> type:
    """`model_class` (NVIDIA's llmapi TritonPythonModel, or the CPU stand-in of it) with a final CANCELLED response
    for a non-streaming request that ended without one. The class itself is not changed. A class without
    `_execute_single_request` or `_convert_request` (a later model.py) is served as it is, with a warning at load."""
    hooked = all(callable(getattr(model_class, name, None)) for name in HOOKS)
    run_async = hooked and inspect.iscoroutinefunction(model_class._execute_single_request)

    class EveryRequestAnswered(model_class):
        def initialize(self, args: dict) -> Any:
            import triton_python_backend_utils as pb_utils

            self._answering = pb_utils
            if not hooked:
                pb_utils.Logger.log_warn(
                    f"[specbuild] this model.py has no {' or '.join(HOOKS)}: a non-streaming request ended by a `stop` "
                    "request may get no response, and then holds the drain until --exit-timeout"
                )
            return super().initialize(args)

        def execute(self, requests: list) -> Any:
            if not hooked:
                return super().execute(requests)
            final = self._answering.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            return super().execute([None if r is None else _Request(r, final) for r in requests])

        def _convert_request(self, request: Any) -> Any:
            converted = super()._convert_request(request)
            if isinstance(request, _Request) and isinstance(converted, tuple) and len(converted) > 2:
                request.streaming = bool(converted[2])
            return converted

        if run_async:

            async def _execute_single_request(self, request: Any) -> Any:
                try:
                    return await super()._execute_single_request(request)
                finally:
                    self._answer_if_unanswered(request)
        elif hooked:

            def _execute_single_request(self, request: Any) -> Any:
                try:
                    return super()._execute_single_request(request)
                finally:
                    self._answer_if_unanswered(request)

        def _answer_if_unanswered(self, request: Any) -> None:
            if not isinstance(request, _Request) or request.streaming is not False or request.answered:
                return
            pb_utils = self._answering
            try:
                request.get_response_sender().send(
                    cancelled_response(pb_utils), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                )
            except Exception as err:  # noqa: BLE001 - the client is gone
                pb_utils.Logger.log_error(f"[specbuild] a response could not be sent: {err}")
                return
            pb_utils.Logger.log_info(
                f"[specbuild] request {request.request_id()!r} ended without a response (a `stop` "
                "request aborted it): answered CANCELLED"
            )

    EveryRequestAnswered.__name__ = EveryRequestAnswered.__qualname__ = model_class.__name__
    EveryRequestAnswered.__module__ = model_class.__module__
    return EveryRequestAnswered
