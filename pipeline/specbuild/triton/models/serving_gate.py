"""`serving_gate`: a model that is READY while the deployment takes new requests, closed by the drain.

`specbuild serve`'s drain (specbuild.triton.drain) closes it on SIGTERM/SIGINT: it unloads the gate and at once
loads it again with its backend set to CLOSED_BACKEND, a backend that does not exist, so that load fails within
milliseconds (no process is started) and leaves the gate UNAVAILABLE, its reason naming the drain. From the
unload on, until the server stops:
- `/v2/health/ready` answers 400: with --strict-readiness a model being unloaded, or one whose load failed, makes
  the server not ready, while a model that was only unloaded would not (core src/server.cc,
  InferenceServer::IsReady: "Okay if model is not ready due to unload"), so a load balancer or a Kubernetes
  readiness probe stops routing here (measured on 2.51: never ready again between the two calls);
- the entry points (the BLS; preprocessing, the ensemble's first step) see the gate not ready
  (`pb_utils.is_model_ready`, python_backend's model-loading API; about 16 us a call measured here) and refuse
  each new request with UNAVAILABLE, the code gRPC clients and proxies retry on another replica (HTTP 503),
  while the requests they already hold run to their end;
- Triton's repository index shows the gate UNAVAILABLE, "unable to find backend library for backend
  'closed_for_the_drain'", for an operator to read.

The gate's process serves nothing, but Triton may count a dead stub as a model not ready (core src/server.cc
ModelIsReady asks the backend since March 2026), so the supervisor reloads it like any other: the entry points then
refuse new requests for the second or two the reload takes, with the same retryable code.

The entry points learn the gate's name from their config parameter `serving_gate`; a repository without it
(written before the gate existed) has no gate, and its models never refuse for it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

MODEL_NAME = "serving_gate"
GATE_PARAMETER = "serving_gate"  # in the entry models' configs: the gate's name
CLOSED_BACKEND = "closed_for_the_drain"  # no such backend: the closing load fails, and Triton's reason says why
OUTPUT = "OPEN"  # BOOL [1], always true: a request reaching the gate finds it open
REFUSAL = ("the server takes no new requests: it is draining before it stops (or reloading its serving gate); "
           "retry shortly or on another replica")


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


class TritonPythonModel:
    def execute(self, requests: list) -> list:
        import triton_python_backend_utils as pb_utils

        return [pb_utils.InferenceResponse([pb_utils.Tensor(OUTPUT, np.array([True]))]) for _ in requests]
