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
        self.now, self.alive, self.frozen = 100.0, True, False  # a clock that does not start at 0

        def model_control(action, model, timeout=600.0):
            assert timeout == module.CALL_TIMEOUT_S  # a server that does not answer is not drained
            self.calls.append((action, model))

        self.handle = SimpleNamespace(
            process=SimpleNamespace(pid=4321),
            metrics_url="127.0.0.1:1/metrics",
            http_url="127.0.0.1:2",
            admin_headers=lambda: {"admin": "key"},
            model_control=model_control,
        )

        def close_gate(handle, gate):
            assert handle is self.handle
            self.calls.append(("close", gate))
            if gate_error is not None:
                raise gate_error

        def next_of(items):  # each look takes the next value; the last one stays
            return items.pop(0) if len(items) > 1 else items[0]

        def read_metrics(url, timeout=2.0):
            assert url == self.handle.metrics_url
            return next_of(self.metrics)

        def model_states(url, headers, timeout=5.0):
            assert (url, headers, timeout) == (self.handle.http_url, {"admin": "key"}, module.CALL_TIMEOUT_S)
            return next_of(self.states)

        monkeypatch.setattr(module, "read_metrics", read_metrics)
        monkeypatch.setattr(module, "model_states", model_states)
        monkeypatch.setattr(module, "close_gate", close_gate)
        monkeypatch.setattr(module.procfs, "stopped", lambda pid: pid == 4321 and self.frozen)
        monkeypatch.setattr(module.time, "monotonic", lambda: self.now)
        monkeypatch.setattr(module.time, "sleep", self.sleep)

    def sleep(self, seconds: float) -> None:
        assert seconds == 0.1  # the poll_s given
        self.now += 1.0  # each poll is a second of the test's clock

    def run(self, timeout_s: float = 10.0, gate: str | None = "serving_gate", models=(BLS, "ensemble")):
        return module.drain(
            self.handle, list(models), timeout_s, self.logged.append, lambda: self.alive, gate=gate, poll_s=0.1
        )


UNLOADING = {BLS: "UNLOADING", "ensemble": "UNAVAILABLE"}
GONE = {BLS: "UNAVAILABLE", "ensemble": "UNAVAILABLE"}


def test_the_gate_closes_the_running_requests_finish_then_the_entry_models_unload(monkeypatch):
    world = World(monkeypatch, [gauges(2, 1), gauges(1), gauges(0)], [UNLOADING, GONE])
    result = world.run()
    assert result.reason == "drained" and result.complete and not result.cut_short
    assert result.running_at_start == 3 and result.refused_with == "UNAVAILABLE" and result.cut == 0
    assert result.models == [BLS, "ensemble"]
    assert world.calls == [("close", "serving_gate"), ("unload", BLS), ("unload", "ensemble")]
    assert world.logged == [
        "draining: readiness is false, new requests are refused (UNAVAILABLE); 3 requests running; waiting up to "
        "10 s for running requests to finish (a second Ctrl-C stops at once)"
    ]
    assert result.describe() == f"drained in {result.seconds:.1f} s; 3 requests ran to their end"
    assert result.seconds == 2.0  # a poll for the requests (the first look saw 1), one for the unload
    assert result.to_dict() == {
        "models": [BLS, "ensemble"],
        "seconds": 2.0,
        "running_at_start": 3,
        "cut": 0,
        "reason": "drained",
        "error": "",
        "refused_with": "UNAVAILABLE",
        "complete": True,
    }


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
    assert result.models == [BLS, "ensemble"]
    assert world.calls == []


@pytest.mark.parametrize("ended", ["UNAVAILABLE", None])
def test_a_model_gone_from_the_index_or_unavailable_has_unloaded(monkeypatch, ended):
    states = {BLS: ended} if ended else {}
    world = World(monkeypatch, [gauges(0)], [states])
    assert world.run().complete


def test_a_repository_that_exports_no_count_drains_by_its_unload(monkeypatch):
    world = World(monkeypatch, [""], [UNLOADING, GONE])
    result = world.run()
    assert result.complete and result.running_at_start is None
    assert world.logged == [
        "draining: readiness is false, new requests are refused (UNAVAILABLE); waiting up to 10 s for running "
        "requests to finish (a second Ctrl-C stops at once)"
    ]
    assert result.describe() == "drained in 1.0 s"


def test_a_bls_whose_gauges_are_gone_holds_nothing(monkeypatch):
    """Its stub finalized: a model that counted its requests before and exports nothing now holds none."""
    world = World(monkeypatch, [gauges(1), ""], [GONE])
    assert world.run().complete
    world = World(monkeypatch, [gauges(0), gauges(0), ""], [UNLOADING])
    result = world.run(timeout_s=3.0, models=[BLS])
    assert result.reason == "timeout" and result.cut == 0  # the unload never ended, but nothing was held


def test_an_error_once_the_server_is_gone_is_its_exit(monkeypatch):
    world = World(monkeypatch, [gauges(0)], [GONE])

    def gone(action, model, timeout=0):
        world.alive = False
        raise ServeError("connection refused")

    world.handle.model_control = gone
    result = world.run()
    assert (result.reason, result.error, result.cut) == ("server exited", "", None)
    assert result.describe() == (
        f"the drain ended after {result.seconds:.1f} s: tritonserver exited: cut the requests still running"
    )


def test_a_second_signal_while_the_cut_is_counted_leaves_it_unknown(monkeypatch):
    world = World(monkeypatch, [gauges(1)], [UNLOADING])
    looks = {"n": 0}

    def read_metrics(url, timeout=2.0):
        looks["n"] += 1
        if looks["n"] > 4:  # the count of the cut, after the bound
            raise StopRequested()
        return gauges(1)

    monkeypatch.setattr(module, "read_metrics", read_metrics)
    result = world.run(timeout_s=3.0)
    assert (result.reason, result.cut) == ("second signal", None)


def test_metrics_of_one_model_are_summed_and_a_bad_sample_skipped():
    text = (
        f'nv_inference_pending_request_count{{model="{BLS}",version="1"}} 2\n'
        f'specbuild_bls_active_requests{{model="{BLS}"}} not-a-number\n'
        f'nv_inference_pending_request_count{{model="{BLS}",version="2"}} 3\n'
        'specbuild_bls_active_requests{model="ensemble"} 4\n'
        'nv_gpu_utilization{gpu_uuid="x"} 1\n'
    )
    assert module.parse_metrics(text) == {
        ("nv_inference_pending_request_count", BLS): 5.0,
        ("specbuild_bls_active_requests", "ensemble"): 4.0,
    }
    assert module.counting_models(text, [BLS, "ensemble"]) == {"ensemble"}
    assert module.running_requests(gauges(0), [BLS]) == 0
    assert module.running_requests(text, ["ensemble"]) == 4


# ---- the drain's three calls to the server, against a local HTTP server that answers as Triton's does -----------
def test_model_states_posts_to_the_repository_index(endpoint):
    url, seen, answers = endpoint
    answers["/v2/repository/index"] = (200, [{"name": BLS, "state": "UNLOADING"}, {"name": "ensemble"}])
    assert module.model_states(url, {"admin": "key"}) == {BLS: "UNLOADING", "ensemble": ""}
    assert seen == [("POST", "/v2/repository/index", "key", b"{}")]


def test_read_metrics_returns_the_text_or_nothing(endpoint):
    url, seen, answers = endpoint
    answers["/metrics"] = (200, gauges(2))
    assert module.read_metrics(f"http://{url}/metrics") == gauges(2)
    assert module.read_metrics(f"http://{url}/elsewhere") == ""  # an error: no figures, not an exception
    assert [s[:2] for s in seen] == [("GET", "/metrics"), ("GET", "/elsewhere")]


def test_metrics_that_are_not_utf8_are_read_with_a_replacement_character(endpoint):
    url, _, answers = endpoint
    answers["/metrics"] = (200, gauges(2).encode() + b"# \xff\n")
    assert module.read_metrics(f"http://{url}/metrics") == gauges(2) + "# \ufffd\n"


def test_a_server_that_never_answers_is_given_up_on_after_the_call_timeout(silent_endpoint, monkeypatch):
    """Each of the drain's calls is bounded: a hung server (it takes the connection and answers nothing) costs the
    bound, not the drain (which has its own bound, --exit-timeout, only between calls)."""
    assert module.read_metrics(f"http://{silent_endpoint}/metrics", timeout=0.2) == ""
    with pytest.raises(OSError, match="timed out"):
        module.model_states(silent_endpoint, {}, timeout=0.2)
    monkeypatch.setattr(module, "CALL_TIMEOUT_S", 0.2)
    handle = SimpleNamespace(http_url=silent_endpoint, admin_headers=dict)
    with pytest.raises(OSError, match="timed out"):
        module.close_gate(handle, "serving_gate")


def test_the_gate_closes_by_a_load_that_fails_on_purpose(endpoint):
    from specbuild.contract import serving_gate

    url, seen, answers = endpoint
    answers["/v2/models/serving_gate/config"] = (200, {"name": "serving_gate", "backend": "python"})
    calls = []

    def model_control(action, model, timeout=600.0, config=None):
        calls.append((action, model, timeout, config))
        if action == "load":
            raise ServeError(f"load of {model} failed: unable to find backend '{serving_gate.CLOSED_BACKEND}'")

    handle = SimpleNamespace(http_url=url, admin_headers=lambda: {"admin": "key"}, model_control=model_control)
    module.close_gate(handle, "serving_gate")
    closed = {"name": "serving_gate", "backend": serving_gate.CLOSED_BACKEND}
    assert calls == [
        ("unload", "serving_gate", module.CALL_TIMEOUT_S, None),
        ("load", "serving_gate", module.CALL_TIMEOUT_S, closed),
    ]
    assert seen == [("GET", "/v2/models/serving_gate/config", "key", b"")]

    def loads(action, model, timeout=600.0, config=None):  # a server that has such a backend: the gate is open
        if action == "load" and model == "other":
            raise ServeError("some other failure")

    handle.model_control = loads
    with pytest.raises(ServeError, match=f"serving_gate loaded with backend '{serving_gate.CLOSED_BACKEND}'"):
        module.close_gate(handle, "serving_gate")
    answers["/v2/models/other/config"] = (200, {"name": "other"})
    with pytest.raises(ServeError, match="some other failure"):
        module.close_gate(handle, "other")
