"""Every request the LLM API model accepts gets a final response (specbuild.llmapi.answered): NVIDIA's llmapi model
sends nothing to a non-streaming request a `stop` request aborted, so the wrapper answers it CANCELLED, and leaves
every other request to NVIDIA's code. Run here on a class with the shape of NVIDIA's (an async
`_execute_single_request`, `_convert_request`) and on the stand-in's synchronous one."""

from __future__ import annotations

import asyncio
import sys

import pytest
from test_llmapi_end_ids import Logger

from specbuild.contract import llmapi as contract
from specbuild.llmapi.answered import every_request_answered

FINAL = 1


class TritonError:
    CANCELLED = 7

    def __init__(self, message, code=None):
        self.text, self.code = message, code


class InferenceResponse:
    def __init__(self, output_tensors=(), error=None):
        self.outputs, self.error = list(output_tensors), error


class BackendUtils:
    """What the wrapper uses of triton_python_backend_utils."""

    Logger, TritonError, InferenceResponse = Logger, TritonError, InferenceResponse
    TRITONSERVER_RESPONSE_COMPLETE_FINAL = FINAL


class Sender:
    def __init__(self):
        self.sent: list[tuple[object, int]] = []

    def send(self, response, flags=0):
        self.sent.append((response, flags))


class Request:
    """A Triton request as NVIDIA's code reads it: its inputs, its id, its one response sender."""

    def __init__(self, streaming=False, stop=False, user_id="r1", fail=False):
        self.inputs_ = {"streaming": streaming, "stop": stop, "fail": fail}
        self.sender, self.user_id = Sender(), user_id

    def get_response_sender(self):
        return self.sender

    def request_id(self):
        return self.user_id

    def inputs(self):
        return self.inputs_


class NvidiaLike:
    """The shape of NVIDIA's model.py (@044a90d) as the wrapper relies on it: execute hands each request to a
    coroutine `_execute_single_request`, which converts it (`_convert_request` -> prompt, SamplingParams keyword
    arguments, streaming, output config) and sends its responses; `aborted` plays a `stop` request that removed it."""

    def initialize(self, args):
        self.tasks = []
        self.aborted: set[str] = set()

    def execute(self, requests):
        for request in requests:
            if request is not None:
                self.tasks.append(self._execute_single_request(request))
        return None

    async def _execute_single_request(self, request):
        sender = request.get_response_sender()
        if request.inputs()["stop"]:  # handle_stop_request answers the stop request itself
            sender.send(InferenceResponse(error=TritonError(contract.MSG_CANCELLED, 7)), flags=FINAL)
            return
        try:
            _, _, streaming, _ = self._convert_request(request)
            if streaming:  # the last output goes out through the response thread, later
                self.queued = (sender, InferenceResponse(["cancelled"]), FINAL)
            elif request.request_id() not in self.aborted:
                sender.send(InferenceResponse(["text"]), flags=FINAL)
        except Exception as e:
            sender.send(InferenceResponse(["N/A"], TritonError(f"Error generating request: {e}")), flags=FINAL)
            raise e

    def _convert_request(self, request):
        if request.inputs()["fail"]:
            raise ValueError("bad input")
        return "a prompt", {}, request.inputs()["streaming"], {}


class StandInLike(NvidiaLike):
    """The stand-in's shape: the same two methods, `_execute_single_request` synchronous (run in a thread pool)."""

    def execute(self, requests):
        for request in requests:
            if request is not None:
                try:  # a pool thread's future would hold the error
                    self._execute_single_request(request)
                except ValueError:
                    pass

    def _execute_single_request(self, request):
        asyncio.run(NvidiaLike._execute_single_request(self, request))


def loaded(model_class):
    Logger.lines = []
    sys.modules["triton_python_backend_utils"] = BackendUtils
    model = every_request_answered(model_class)()
    model.initialize({})
    return model


def run(model, *requests):
    model.execute(list(requests))
    for task in getattr(model, "tasks", []):
        try:
            asyncio.run(task)
        except ValueError:
            pass
    model.tasks = []


@pytest.fixture(autouse=True)
def backend_utils():
    yield
    sys.modules.pop("triton_python_backend_utils", None)


@pytest.mark.parametrize("model_class", [NvidiaLike, StandInLike])
def test_a_non_streaming_request_a_stop_aborted_is_answered_cancelled_once(model_class):
    model = loaded(model_class)
    model.aborted.add("r1")
    request = Request(streaming=False)
    run(model, request)
    assert len(request.sender.sent) == 1
    response, flags = request.sender.sent[0]
    assert flags == FINAL and response.error.text == contract.MSG_CANCELLED and response.error.code == 7
    assert Logger.lines == [
        ("info", "[specbuild] request 'r1' ended without a response (a `stop` request aborted it): answered CANCELLED")
    ]


@pytest.mark.parametrize("model_class", [NvidiaLike, StandInLike])
def test_every_other_request_is_left_to_nvidias_code(model_class):
    model = loaded(model_class)
    answered, streaming, stop, failing = Request(), Request(streaming=True), Request(stop=True), Request(fail=True)
    model.aborted.add("r1")  # aborted, but streaming: its last output is in the response thread's queue
    run(model, Request(user_id="r2"), streaming, stop, failing)
    model.aborted.clear()
    run(model, answered)
    assert [[r.outputs for r, _ in x.sender.sent] for x in (answered, streaming, stop, failing)] == [
        [["text"]],
        [],
        [[]],
        [["N/A"]],
    ]
    assert Logger.lines == []


def test_an_error_nvidias_code_raises_still_propagates():
    model = loaded(NvidiaLike)
    request = Request(fail=True)
    model.execute([request])
    with pytest.raises(ValueError, match="bad input"):
        asyncio.run(model.tasks[0])
    assert len(request.sender.sent) == 1


def test_a_model_py_without_the_hooks_is_served_as_it_is_with_a_warning():
    class Later:
        def initialize(self, args):
            pass

        def execute(self, requests):
            self.seen = requests

    model = loaded(Later)
    request = Request()
    model.execute([request])
    assert model.seen == [request]  # not wrapped
    assert Logger.lines[0][0] == "warn" and "no _execute_single_request or _convert_request" in Logger.lines[0][1]
