"""Drain a serving tritonserver before it stops: new top-level requests refused, running ones finished.

Why not a plain SIGTERM: tritonserver's own graceful stop (core src/server.cc, InferenceServer::Stop) lets the
requests it holds finish, but from the moment it starts it refuses every new inference, and a BLS step *is* a new
inference: each step of the speculative BLS sends one request to `tensorrt_llm_draft` and one to `tensorrt_llm`,
which then fail with "Server not ready" (measured on tritonserver 2.51: streams in flight at SIGTERM were cut).

What is done instead, with Triton's own model lifecycle: the entry models (the BLS and the ensemble; an llmapi
repository's one model) are unloaded through the model-repository API. A model being unloaded stays in state
UNLOADING until the last request that holds it has ended (core src/model_lifecycle.cc: a request holds the
model, and the model is destroyed when the last holder lets go), while the models it calls stay loaded and
keep answering its steps. Meanwhile:
- `/v2/health/ready` answers 400 at once: with --strict-readiness a model that is neither READY nor unloaded
  makes the server not ready (core src/server.cc, IsReady), so a load balancer or a Kubernetes readiness
  probe stops routing here;
- a new request for an entry model is refused at once, never queued: Triton answers "Request for unknown
  model: '<model>' has no available versions" (gRPC NOT_FOUND, HTTP 404: the code Triton itself gives a
  model that is being unloaded, and every model during its own shutdown; measured on 2.51);
- requests already waiting for one of the BLS's slots (its own queue), and every running stream, run to their
  final response.
The drain is over when every entry model has left UNLOADING; then tritonserver is stopped as before (its own
graceful stop, for requests clients sent straight to the other models). A bound: `timeout_s` (serve's
--exit-timeout); after it, or on a second SIGINT/SIGTERM, the drain gives up and says how many requests it cut.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from typing import Callable

from specbuild.triton import procfs

# How many requests an entry model holds, from the metrics Triton exports (the BLS's own gauges, see
# specbuild.triton.models.bls_metrics, and Triton's queue in front of each model). A model that exports no
# running count (an llmapi model) has only its queued requests counted.
RUNNING_GAUGES = ("specbuild_bls_active_requests", "specbuild_bls_queue_depth")
QUEUED_GAUGE = "nv_inference_pending_request_count"
_SAMPLE = re.compile(r'^(\w+)\{([^}]*)\}\s+(\S+)$')
_LABEL = re.compile(r'(\w+)="([^"]*)"')
CALL_TIMEOUT_S = 2.0  # each call to the server during a drain: a server that does not answer is not drained
GONE = ("UNAVAILABLE",)  # states that hold no requests (Triton's index omits the state of a model it never loaded)


@dataclass
class DrainResult:
    models: list[str]  # the entry models that were unloaded
    seconds: float
    running_at_start: int | None  # requests the entry models held when the drain began (None: not exported)
    cut: int | None = 0  # requests still running when it gave up (None: some, count not exported)
    reason: str = "drained"  # drained | timeout | second signal | server exited | error
    error: str = ""  # what went wrong, for reason "error"

    @property
    def complete(self) -> bool:
        return self.reason == "drained"

    @property
    def cut_short(self) -> bool:
        """Given up on purpose (the bound, a second signal): the server is then killed, not asked to stop."""
        return self.reason in ("timeout", "second signal")

    def describe(self) -> str:
        if self.complete:
            held = "" if self.running_at_start is None else f"; {self.running_at_start} requests ran to their end"
            return f"drained in {self.seconds:.1f} s{held}"
        if self.reason == "error":
            return f"no drain: {self.error}; tritonserver was asked to stop as it is"
        cut = "the requests still running" if self.cut is None else f"{self.cut} requests"
        why = {"timeout": f"gave up after {self.seconds:.1f} s (--exit-timeout)",
               "second signal": f"was stopped by a second signal after {self.seconds:.1f} s",
               "server exited": f"ended after {self.seconds:.1f} s: tritonserver exited"}[self.reason]
        return f"the drain {why}: cut {cut}"

    def to_dict(self) -> dict:
        return {**asdict(self), "complete": self.complete}


def parse_metrics(text: str) -> dict[tuple[str, str], float]:
    """(metric name, model label) -> value, for the samples of Prometheus text that carry a model label."""
    values: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if not match:
            continue
        labels = dict(_LABEL.findall(match.group(2)))
        if "model" in labels:
            try:
                key = (match.group(1), labels["model"])
                values[key] = values.get(key, 0.0) + float(match.group(3))
            except ValueError:
                continue
    return values


def counting_models(metrics_text: str, models: list[str]) -> set[str]:
    """The models that export a running count (the BLS's gauges)."""
    values = parse_metrics(metrics_text)
    return {model for model in models if any((name, model) in values for name in RUNNING_GAUGES)}


def running_requests(metrics_text: str, models: list[str], counting: set[str] | None = None) -> int | None:
    """Requests the models hold now (queued in Triton, waiting in the BLS, running); None when one of them
    exports no running count and no other sign of a request is seen either. A model in `counting` (it exported
    its count before) whose gauges are gone has ended: its stub is finalized, so it holds nothing."""
    values = parse_metrics(metrics_text)
    total, known = 0, True
    for model in models:
        total += int(values.get((QUEUED_GAUGE, model), 0))
        running = [values[(name, model)] for name in RUNNING_GAUGES if (name, model) in values]
        if running:
            total += int(sum(running))
        elif counting is None or model not in counting:
            known = False
    return total if known or total else None


def read_metrics(url: str, timeout: float = 2.0) -> str:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.read().decode(errors="replace")
    except (urllib.error.URLError, OSError):
        return ""


def model_states(http_url: str, headers: dict[str, str], timeout: float = 5.0) -> dict[str, str]:
    """Triton's repository index: model -> state (READY, UNLOADING, UNAVAILABLE, ...)."""
    request = urllib.request.Request(f"http://{http_url}/v2/repository/index", data=b"{}", method="POST",
                                     headers=headers)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        rows = json.loads(response.read())
    return {row["name"]: row.get("state", "") for row in rows}


def drain(handle, models: list[str], timeout_s: float, log: Callable[[str], None],
          server_alive: Callable[[], bool], poll_s: float = 0.1) -> DrainResult:
    """Unload `models` (the entry models) and wait until none is UNLOADING, within timeout_s. A second
    signal reaches here as StopRequested from the caller's handler; it is turned into a result."""
    from specbuild.errors import ServeError
    from specbuild.triton.server import StopRequested

    started = time.monotonic()
    if procfs.stopped(handle.process.pid):  # it would answer nothing: its own stop (then SIGKILL) is all there is
        return DrainResult(models, 0.0, None, None, "error", "tritonserver is frozen (stopped)")
    metrics = lambda: read_metrics(handle.metrics_url)  # noqa: E731
    first = metrics()
    at_start, counting = running_requests(first, models), counting_models(first, models)
    result = DrainResult(models, 0.0, at_start)
    try:
        for model in models:
            handle.model_control("unload", model, timeout=CALL_TIMEOUT_S)  # returns at once; Triton goes on
        held = "" if at_start is None else f"{at_start} requests running; "
        log(f"draining: {', '.join(models)} unloading ({held}readiness is false, new requests are refused); "
            f"waiting up to {timeout_s:.0f} s for running requests to finish (a second Ctrl-C stops at once)")
        while True:
            if not server_alive():
                result.reason = "server exited"
                break
            states = model_states(handle.http_url, handle.admin_headers(), timeout=CALL_TIMEOUT_S)
            if all(states.get(model, "UNAVAILABLE") in GONE for model in models):
                break
            if time.monotonic() - started >= timeout_s:
                result.reason = "timeout"
                break
            time.sleep(poll_s)
    except StopRequested:
        result.reason = "second signal"
    except (ServeError, OSError, ValueError) as err:  # the server stops either way; say why the drain ended early
        result.reason, result.error = ("server exited", "") if not server_alive() else ("error", f"{err}")
    result.seconds = time.monotonic() - started
    if not result.complete:
        try:
            result.cut = running_requests(metrics(), models, counting) if server_alive() else None
        except StopRequested:  # a further signal while counting: the count is unknown, the stop goes on
            result.cut, result.reason = None, "second signal"
    return result
