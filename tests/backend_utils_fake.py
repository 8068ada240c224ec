"""A stand-in for triton_python_backend_utils, the module Triton's Python backend hands a model (python_backend
src/resources/triton_python_backend_utils.py), as much of it as the serving gate (specbuild.contract.serving_gate)
uses: is_model_ready, TritonError and its codes, InferenceResponse, the final-response flag, a gauge family, and the
`stop` input of a request. Install an instance as sys.modules["triton_python_backend_utils"]; what the gate asked and
set is recorded on it."""

from __future__ import annotations

import numpy as np

FINAL = 1  # TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonError:
    UNKNOWN, UNAVAILABLE = "UNKNOWN", "UNAVAILABLE"

    def __init__(self, message: str, code: str = "UNKNOWN"):
        self.message, self.code = message, code


class OldTritonError:
    """A Python backend's TritonError from before UNAVAILABLE existed."""

    UNKNOWN = "UNKNOWN"

    def __init__(self, message: str, code: str = "UNKNOWN"):
        self.message, self.code = message, code


class InferenceResponse:
    def __init__(self, error=None):
        self.error = error


class BackendUtils:
    TRITONSERVER_RESPONSE_COMPLETE_FINAL = FINAL
    InferenceResponse = InferenceResponse

    def __init__(self, ready: dict[str, bool], unavailable: bool = True):
        """ready: model -> whether is_model_ready says so (a model not named is not ready)."""
        self.ready, self.asked = ready, []
        self.TritonError = TritonError if unavailable else OldTritonError
        self.families: list = []  # each family made, (name, description, kind), then the labels of each metric
        self.values: list = []  # every value a gauge was set to, in order
        self.gauges: dict = {}  # (family name, model label) -> the gauge's value now
        utils = self

        class MetricFamily:
            GAUGE = "gauge"

            def __init__(self, name, description, kind):
                self.name = name
                utils.families.append((name, description, kind))

            def Metric(self, labels):
                utils.families.append(labels)
                key = (self.name, labels.get("model"))

                class Gauge:
                    def set(self, value):
                        utils.values.append(value)
                        utils.gauges[key] = value

                return Gauge()

        self.MetricFamily = MetricFamily

    def is_model_ready(self, name: str) -> bool:
        self.asked.append(name)
        return self.ready.get(name, False)

    @staticmethod
    def get_input_tensor_by_name(request, name):
        """The request's `stop` input when it has one (request.stop not None), else no tensor."""
        stop = getattr(request, "stop", None)
        if name != "stop" or stop is None:
            return None

        class Tensor:
            def as_numpy(self):
                return np.array([stop])

        return Tensor()


class Request:
    """A request whose responses are kept in `sent`; `stop` is its stop input (None: it has none)."""

    def __init__(self, stop: bool | None = None):
        self.stop, self.sent = stop, []

    def get_response_sender(self):
        return self

    def send(self, response, flags=0):
        self.sent.append((response, flags))

    def is_cancelled(self):
        return "asked the real sender"
