"""The serving gate's contract: a model (`specbuild.triton.models.serving_gate`) that is READY while the deployment
takes new requests, closed by the drain; its name, the config parameter that names it, the backend that closes it,
the refusal, and the check every entry model makes (`Gate`, and `gated` for a model class that is not ours).

`specbuild serve`'s drain (specbuild.triton.drain) closes it on SIGTERM/SIGINT: it unloads the gate and at once
loads it again with its backend set to CLOSED_BACKEND, a backend that does not exist, so that load fails within
milliseconds (no process is started) and leaves the gate UNAVAILABLE, its reason naming the drain. From the
unload on, until the server stops:
- `/v2/health/ready` answers 400: with --strict-readiness a model being unloaded, or one whose load failed, makes
  the server not ready, while a model that was only unloaded would not (core src/server.cc,
  InferenceServer::IsReady: "Okay if model is not ready due to unload"), so a load balancer or a Kubernetes
  readiness probe stops routing here (measured on 2.51: never ready again between the two calls);
- the entry points (the BLS; preprocessing, the ensemble's first step; an llmapi repository's model, NVIDIA's
  class wrapped by `gated`) see the gate not ready (`pb_utils.is_model_ready`, python_backend's model-loading
  API, cheap next to a request) and refuse each new request with UNAVAILABLE, the code gRPC clients and
  proxies retry on another replica (HTTP 503 from /infer; /generate's status is unreliable: it reads the code
  of an error it has already deleted, server src/http_server.cc, and gave 400 on 2.51), while the requests they
  already hold run to their end;
- Triton's repository index shows the gate UNAVAILABLE, "unable to find backend library for backend
  'closed_for_the_drain'", for an operator to read.

The gate's process serves nothing, but Triton may count a dead stub as a model not ready (core src/server.cc
ModelIsReady asks the backend since March 2026), so the supervisor reloads it like any other: the entry points then
refuse new requests for the second or two the reload takes, with the same retryable code.

The entry points learn the gate's name from their config parameter `serving_gate`; a repository without it
(written before the gate existed) has no gate, and its models never refuse for it. Both repository kinds have the
gate (the engine path's `triton.configs`, the LLM API path's `llmapi.repository`), written from `model_config`.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from specbuild.contract.pbtxt import parameter_values
from specbuild.contract.watched_request import WatchedRequest

MODEL_NAME = "serving_gate"
GATE_PARAMETER = "serving_gate"  # in the entry models' configs: the gate's name
CLOSED_BACKEND = "closed_for_the_drain"  # no such backend: the closing load fails, and Triton's reason says why
OUTPUT = "OPEN"  # BOOL [1], always true: a request reaching the gate finds it open
MODEL_MODULE = "specbuild.triton.models.serving_gate"  # what the gate's model.py imports its TritonPythonModel from
RUNNING_GAUGE = "specbuild_running_requests"  # exported by a model `gated` wraps; the drain reads it
RUNNING_HELP = "Requests the model accepted and has not yet answered with their final response"
REFUSAL = (
    "the server takes no new requests: it is draining before it stops (or reloading its serving gate); "
    "retry shortly or on another replica"
)


class Gate:
    """The check an entry model makes for each batch of new requests. It arms once it has seen the gate open: a
    server started with only some of the repository's models (`--load-model`), the gate not among them, never
    refuses for it; once armed, a gate that is not ready is a closed one."""

    def __init__(self, pb_utils: Any, params: dict[str, str]):
        self.pb = pb_utils
        self.model = params.get(GATE_PARAMETER, "")
        self.armed = False
        if not hasattr(pb_utils, "is_model_ready"):  # a Python backend older than its model-loading API
            self.model = ""

    def refusal(self, prefix: str = ""):
        """The UNAVAILABLE error for new requests while the gate is closed (its message after `prefix`); None while
        it is open, or before it was ever seen open."""
        if not self.model:
            return None
        if self.pb.is_model_ready(self.model):
            self.armed = True
            return None
        if not self.armed:
            return None
        TritonError = self.pb.TritonError
        return TritonError(prefix + REFUSAL, getattr(TritonError, "UNAVAILABLE", TritonError.UNKNOWN))


def _stops(pb_utils: Any, request: Any) -> bool:
    """A request whose `stop` input is true cancels a running one (NVIDIA's llmapi contract): never refused."""
    tensor = pb_utils.get_input_tensor_by_name(request, "stop")
    return tensor is not None and bool(tensor.as_numpy().any())


class RunningCount:
    """Requests a model accepted and has not yet answered with its final response, exported as the gauge
    RUNNING_GAUGE{model=...} (the drain waits for it to read zero, specbuild.triton.drain). Without Triton's
    custom metrics (a Python backend older than them) it counts, unexported, and the drain cannot wait on it."""

    def __init__(self, pb_utils: Any, model_name: str):
        self.value, self._lock, self._metric = 0, threading.Lock(), None
        if hasattr(pb_utils, "MetricFamily"):
            # the family must outlive its metric ("the corresponding 'MetricFamily' has been deleted")
            self._family = pb_utils.MetricFamily(
                name=RUNNING_GAUGE, description=RUNNING_HELP, kind=pb_utils.MetricFamily.GAUGE
            )
            self._metric = self._family.Metric(labels={"model": model_name})
            self._metric.set(0)

    def add(self, n: int) -> None:
        with self._lock:
            self.value += n
            if self._metric is not None:
                self._metric.set(self.value)


def gated(model_class: type) -> type:
    """`model_class` with the gate's check in front of its execute, for a model that answers every request through
    the request's response sender and returns None, as NVIDIA's llmapi model.py does (its execute hands each
    request to its own event loop; triton_backend/all_models/llmapi/tensorrt_llm/1/model.py @044a90d) and the
    CPU stand-in of it. While the gate is closed each new request gets the UNAVAILABLE refusal as its one, final
    response; a `stop` request (cancelling a running one) still goes through. The requests it lets through are
    counted until their final response (`RunningCount`), which is how the drain knows when they have all ended.
    The class itself is not changed: the gate's name comes from the model's config parameter `serving_gate`, and
    without it nothing is refused. (The request the model sees is a `WatchedRequest`.)"""

    class Gated(model_class):
        def initialize(self, args: dict) -> Any:
            import triton_python_backend_utils as pb_utils

            config = json.loads(args["model_config"])
            self._serving_gate = Gate(pb_utils, parameter_values(config))
            self._running = RunningCount(pb_utils, args.get("model_name") or config.get("name", ""))
            return super().initialize(args)

        def execute(self, requests: list) -> Any:
            pb = self._serving_gate.pb
            final = pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            refusal = self._serving_gate.refusal()
            admitted = []
            for request in requests:
                if request is None:
                    continue
                if refusal is None or _stops(pb, request):
                    admitted.append(WatchedRequest(request, final, on_final=lambda: self._running.add(-1)))
                else:
                    request.get_response_sender().send(pb.InferenceResponse(error=refusal), flags=final)
            if not admitted:
                return None
            self._running.add(len(admitted))
            return super().execute(admitted)

    Gated.__name__ = Gated.__qualname__ = model_class.__name__
    Gated.__module__ = model_class.__module__
    return Gated


def model_config():
    """The gate's config.pbtxt message: a Python model with one CPU instance and no inputs."""
    from specbuild.contract.pbtxt import config_proto

    pb = config_proto()
    config = pb.ModelConfig(name=MODEL_NAME, backend="python", max_batch_size=0)
    config.output.add(name=OUTPUT, data_type=pb.TYPE_BOOL, dims=[1])
    config.instance_group.add(count=1, kind=pb.ModelInstanceGroup.KIND_CPU)
    return config
