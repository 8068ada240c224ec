"""Drain a serving tritonserver before it stops: new top-level requests refused, running ones finished.

Why not a plain SIGTERM: tritonserver's own graceful stop (core src/server.cc, InferenceServer::Stop) lets the
requests it holds finish, but from the moment it starts it refuses every new inference, and a BLS step *is* a new
inference: each step of the speculative BLS sends one request to `tensorrt_llm_draft` and one to `tensorrt_llm`,
which then fail with "Server not ready" (measured on tritonserver 2.51: streams in flight at SIGTERM were cut).

What is done instead, with Triton's own model lifecycle, in two phases:
1. The serving gate closes (specbuild.contract.serving_gate; both repository kinds have one):
   `/v2/health/ready` answers 400 at once, so a load balancer or a Kubernetes readiness probe stops routing here,
   and the entry points refuse each new request with UNAVAILABLE, the code clients and proxies retry elsewhere
   (HTTP 503): the BLS and preprocessing (the ensemble's first step), or an llmapi repository's model (NVIDIA's
   class behind the gate's check, `serving_gate.gated`). Requests already running, and those already waiting for
   one of the BLS's slots (its own queue), run to their final response; the BLS's gauges count them (the llmapi
   model's, the gate's wrapper), and this phase ends when they read zero.
2. The entry models (the BLS and the ensemble; the llmapi model) are unloaded through the model-repository API;
   a repository without a gate (written before it existed) starts its drain here. A model being unloaded stays
   in state UNLOADING until the last request that holds it has ended (core src/model_lifecycle.cc: a request
   holds the model, and the model is destroyed when the last holder lets go), while the models it calls stay
   loaded and keep answering its steps; this covers the ensemble's running requests, which export no count.
   A new request for a model being unloaded is refused by Triton itself: "Request for unknown model: '<model>'
   has no available versions" (gRPC NOT_FOUND, HTTP 404; measured on 2.51), and readiness stays false.
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
from collections.abc import Callable
from dataclasses import asdict, dataclass

from specbuild.contract import serving_gate
from specbuild.triton import procfs

# How many requests an entry model holds, from the metrics Triton exports (the BLS's own gauges, see
# specbuild.triton.models.bls_metrics; the llmapi model's, counted by the gate's wrapper, contract.serving_gate.gated;
# and Triton's queue in front of each model). A model that exports no running count (an llmapi repository written
# before the gate existed) has only its queued requests counted.
RUNNING_GAUGES = ("specbuild_bls_active_requests", "specbuild_bls_queue_depth", serving_gate.RUNNING_GAUGE)
QUEUED_GAUGE = "nv_inference_pending_request_count"
_SAMPLE = re.compile(r"^(\w+)\{([^}]*)\}\s+(\S+)$")
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
    refused_with: str = "NOT_FOUND"  # what a new request got: UNAVAILABLE (the gate closed), else Triton's answer
    # for a model being unloaded

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
        why = {
            "timeout": f"gave up after {self.seconds:.1f} s (--exit-timeout)",
            "second signal": f"was stopped by a second signal after {self.seconds:.1f} s",
            "server exited": f"ended after {self.seconds:.1f} s: tritonserver exited",
        }[self.reason]
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


def read_metrics(url: str, timeout: float = CALL_TIMEOUT_S) -> str:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.read().decode(errors="replace")
    except (urllib.error.URLError, OSError):
        return ""


def model_states(http_url: str, headers: dict[str, str], timeout: float = CALL_TIMEOUT_S) -> dict[str, str]:
    """Triton's repository index: model -> state (READY, UNLOADING, UNAVAILABLE, ...)."""
    request = urllib.request.Request(
        f"http://{http_url}/v2/repository/index", data=b"{}", method="POST", headers=headers
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        rows = json.loads(response.read())
    return {row["name"]: row.get("state", "") for row in rows}


def close_gate(handle, gate: str) -> None:
    """Close the serving gate (specbuild.contract.serving_gate): unload it and at once load it with a backend
    that does not exist, a load that fails on purpose. Readiness is false from the unload on. Raises ServeError if
    the gate is not closed."""
    from specbuild.errors import ServeError

    headers = handle.admin_headers()
    request = urllib.request.Request(f"http://{handle.http_url}/v2/models/{gate}/config", headers=headers)
    with urllib.request.urlopen(request, timeout=CALL_TIMEOUT_S) as response:
        config = json.loads(response.read())
    config["backend"] = serving_gate.CLOSED_BACKEND
    handle.model_control("unload", gate, timeout=CALL_TIMEOUT_S)  # the gate is UNLOADING: closed from now on
    try:
        handle.model_control("load", gate, timeout=CALL_TIMEOUT_S, config=config)
    except ServeError as err:
        if serving_gate.CLOSED_BACKEND in str(err):
            return  # refused to load, as asked
        raise
    raise ServeError(f"{gate} loaded with backend {serving_gate.CLOSED_BACKEND!r}: is there such a backend?")


def _wait(
    done: Callable[[], bool], started: float, timeout_s: float, server_alive: Callable[[], bool], poll_s: float
) -> str:
    """Poll `done` until it holds ("drained"), or until the server exits or the bound passes (the reason)."""
    while not done():
        if not server_alive():
            return "server exited"
        if time.monotonic() - started >= timeout_s:
            return "timeout"
        time.sleep(poll_s)
    return "drained"


def drain(
    handle,
    models: list[str],
    timeout_s: float,
    log: Callable[[str], None],
    server_alive: Callable[[], bool],
    gate: str | None = None,
    poll_s: float = 0.1,
) -> DrainResult:
    """Close the serving gate `gate` (when the repository has one) and wait until the models that count their
    requests (the BLS) hold none, then unload `models` (the entry models) and wait until none is UNLOADING, all
    within timeout_s. A second signal reaches here as StopRequested from the caller's handler; it is turned into
    a result."""
    from specbuild.errors import ServeError
    from specbuild.triton.server import StopRequested

    started = time.monotonic()
    if procfs.stopped(handle.process.pid):  # it would answer nothing: its own stop (then SIGKILL) is all there is
        return DrainResult(models, 0.0, None, None, "error", "tritonserver is frozen (stopped)")
    metrics = lambda: read_metrics(handle.metrics_url)  # noqa: E731
    first = metrics()
    at_start, counting = running_requests(first, models), counting_models(first, models)
    result = DrainResult(models, 0.0, at_start)
    held = "" if at_start is None else f"{at_start} requests running; "
    wait = f"waiting up to {timeout_s:.0f} s for running requests to finish (a second Ctrl-C stops at once)"

    def idle() -> bool:  # the models that count their requests hold none
        return not counting or running_requests(metrics(), sorted(counting), counting) == 0

    def unloaded() -> bool:  # no entry model is UNLOADING any more
        states = model_states(handle.http_url, handle.admin_headers(), timeout=CALL_TIMEOUT_S)
        return all(states.get(model, "UNAVAILABLE") in GONE for model in models)

    try:
        closed = False
        if gate:
            try:
                close_gate(handle, gate)
                closed, result.refused_with = True, "UNAVAILABLE"
            except (ServeError, OSError, ValueError) as err:
                log(
                    f"draining: the serving gate did not close ({err}); new requests are refused as their models unload"
                )
        if closed:
            log(f"draining: readiness is false, new requests are refused (UNAVAILABLE); {held}{wait}")
            # Phase 1: the gate refuses, the BLS finishes what it holds (its gauges count it exactly).
            result.reason = _wait(idle, started, timeout_s, server_alive, poll_s)
        if result.complete:
            # Phase 2 (the only one without a gate): Triton unloads each entry model once its last request ends.
            for model in models:
                handle.model_control("unload", model, timeout=CALL_TIMEOUT_S)  # returns at once; Triton goes on
            if not closed:
                log(
                    f"draining: {', '.join(models)} unloading ({held}readiness is false, new requests are refused); "
                    + wait
                )
            result.reason = _wait(unloaded, started, timeout_s, server_alive, poll_s)
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
