"""The drain's decisions (specbuild.triton.drain.drain), in a scripted world: the server's metrics and its model
states come from lists the test sets, the gate's closing and the unloads are recorded, and the clock is the test's.
Each way a drain ends is asserted (drained; the bound; the server gone; a second signal; an error; a frozen
server), with what it logs and what it counts. The same drain runs against a real tritonserver in
tests/test_triton_drain.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from specbuild.errors import ServeError
from specbuild.triton import drain as module
from specbuild.triton.server import StopRequested

BLS = "tensorrt_llm_bls"


def gauges(active: int, queued: int = 0) -> str:
    return (
        f'specbuild_bls_active_requests{{model="{BLS}"}} {active}\n'
        f'specbuild_bls_queue_depth{{model="{BLS}"}} {queued}\n'
        f'nv_inference_pending_request_count{{model="ensemble",version="1"}} 0\n'
    )


class World:
    def __init__(
        self, monkeypatch, metrics: list[str], states: list[dict[str, str]], gate_error: Exception | None = None
    ):
        self.metrics, self.states, self.calls, self.logged = list(metrics), list(states), [], []
        self.now, self.alive, self.frozen = 0.0, True, False
        self.handle = SimpleNamespace(
            process=SimpleNamespace(pid=4321),
            metrics_url="metrics",
            http_url="http",
            admin_headers=lambda: {},
            model_control=lambda action, model, timeout=0: self.calls.append((action, model)),
        )

        def close_gate(handle, gate):
            self.calls.append(("close", gate))
            if gate_error is not None:
                raise gate_error

        def next_of(items):  # each look takes the next value; the last one stays
            return items.pop(0) if len(items) > 1 else items[0]

        monkeypatch.setattr(module, "read_metrics", lambda url, timeout=2.0: next_of(self.metrics))
        monkeypatch.setattr(module, "model_states", lambda url, headers, timeout=5.0: next_of(self.states))
        monkeypatch.setattr(module, "close_gate", close_gate)
        monkeypatch.setattr(module.procfs, "stopped", lambda pid: self.frozen)
        monkeypatch.setattr(module.time, "monotonic", lambda: self.now)
        monkeypatch.setattr(module.time, "sleep", self.sleep)

    def sleep(self, seconds: float) -> None:
        self.now += 1.0  # each poll is a second of the test's clock

    def run(self, timeout_s: float = 10.0, gate: str | None = "serving_gate"):
        return module.drain(
            self.handle, [BLS, "ensemble"], timeout_s, self.logged.append, lambda: self.alive, gate=gate, poll_s=0.1
        )


UNLOADING = {BLS: "UNLOADING", "ensemble": "UNAVAILABLE"}
GONE = {BLS: "UNAVAILABLE", "ensemble": "UNAVAILABLE"}


def test_the_gate_closes_the_running_requests_finish_then_the_entry_models_unload(monkeypatch):
    world = World(monkeypatch, [gauges(2, 1), gauges(1), gauges(0)], [UNLOADING, GONE])
    result = world.run()
    assert result.reason == "drained" and result.complete and not result.cut_short
    assert result.running_at_start == 3 and result.refused_with == "UNAVAILABLE" and result.cut == 0
    assert world.calls == [("close", "serving_gate"), ("unload", BLS), ("unload", "ensemble")]
    assert world.logged == [
        "draining: readiness is false, new requests are refused (UNAVAILABLE); 3 requests running; waiting up to "
        "10 s for running requests to finish (a second Ctrl-C stops at once)"
    ]
    assert result.describe() == f"drained in {result.seconds:.1f} s; 3 requests ran to their end"
    assert result.seconds == 2.0  # a poll for the requests (the first look saw 1), one for the unload


def test_without_a_gate_the_unload_is_the_drain(monkeypatch):
    world = World(monkeypatch, [gauges(1), gauges(0)], [UNLOADING, UNLOADING, GONE])
    result = world.run(gate=None)
    assert result.complete and result.refused_with == "NOT_FOUND"
    assert world.calls == [("unload", BLS), ("unload", "ensemble")]  # at once: nothing refuses before the unload
    assert world.logged[0].startswith(f"draining: {BLS}, ensemble unloading (1 requests running; readiness is false")


def test_a_gate_that_does_not_close_is_said_and_the_unload_drains(monkeypatch):
    world = World(monkeypatch, [gauges(0)], [GONE], gate_error=ServeError("no such backend"))
    result = world.run()
    assert result.complete and result.refused_with == "NOT_FOUND"
    assert world.logged[0] == (
        "draining: the serving gate did not close (no such backend); new requests are refused as their models unload"
    )
    assert world.calls == [("close", "serving_gate"), ("unload", BLS), ("unload", "ensemble")]


def test_the_bound_cuts_what_is_still_running_and_counts_it(monkeypatch):
    world = World(monkeypatch, [gauges(2)], [UNLOADING])
    result = world.run(timeout_s=3.0)
    assert result.reason == "timeout" and result.cut_short and result.cut == 2
    assert ("unload", BLS) not in world.calls  # phase 2 never began
    assert result.describe() == "the drain gave up after 3.0 s (--exit-timeout): cut 2 requests"


def test_a_server_that_exits_ends_the_drain(monkeypatch):
    world = World(monkeypatch, [gauges(1)], [UNLOADING])
    world.alive = False
    result = world.run()
    assert result.reason == "server exited" and not result.cut_short and result.cut is None


def test_a_second_signal_ends_the_drain_and_cuts_what_runs(monkeypatch):
    world = World(monkeypatch, [gauges(1)], [UNLOADING])

    def sleep(seconds):
        world.now += 1.0
        if world.now >= 2.0:
            raise StopRequested()

    monkeypatch.setattr(module.time, "sleep", sleep)
    result = world.run()
    assert result.reason == "second signal" and result.cut_short and result.cut == 1


def test_an_error_ends_the_drain_and_says_why(monkeypatch):
    world = World(monkeypatch, [gauges(0)], [GONE])
    world.handle.model_control = lambda action, model, timeout=0: (_ for _ in ()).throw(ServeError("refused"))
    result = world.run()
    assert result.reason == "error" and result.error == "refused" and not result.cut_short
    assert result.describe() == "no drain: refused; tritonserver was asked to stop as it is"


def test_a_frozen_server_is_not_drained(monkeypatch):
    world = World(monkeypatch, [gauges(1)], [UNLOADING])
    world.frozen = True
    result = world.run()
    assert (result.reason, result.error, result.seconds) == ("error", "tritonserver is frozen (stopped)", 0.0)
    assert world.calls == []


@pytest.mark.parametrize("ended", ["UNAVAILABLE", None])
def test_a_model_gone_from_the_index_or_unavailable_has_unloaded(monkeypatch, ended):
    states = {BLS: ended} if ended else {}
    world = World(monkeypatch, [gauges(0)], [states])
    assert world.run().complete
