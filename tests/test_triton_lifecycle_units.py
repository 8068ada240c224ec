"""The parts of the drain and the hung-stub watch that need no server: reading Triton's metrics for the requests
an entry model holds, the drain's one-line verdicts, and reading the server log for "not healthy" stubs once."""

from __future__ import annotations

from pathlib import Path

import pytest
from backend_utils_fake import FINAL, BackendUtils, Request

from specbuild.triton.drain import DrainResult, running_requests
from specbuild.triton.server import ServerOptions
from specbuild.triton.supervisor import Supervisor

METRICS = """# HELP specbuild_bls_active_requests Requests the BLS is running now
# TYPE specbuild_bls_active_requests gauge
specbuild_bls_active_requests{model="tensorrt_llm_bls"} 2
specbuild_bls_queue_depth{model="tensorrt_llm_bls"} 1
nv_inference_pending_request_count{model="tensorrt_llm_bls",version="1"} 3
nv_inference_pending_request_count{model="ensemble",version="1"} 0
nv_inference_pending_request_count{model="tensorrt_llm",version="1"} 5
"""


def test_running_requests_counts_the_bls_gauges_and_tritons_queue_of_the_entry_models_only():
    assert running_requests(METRICS, ["tensorrt_llm_bls"]) == 2 + 1 + 3
    # the ensemble exports no running count: with nothing queued either, the count is unknown, not 0
    assert running_requests(METRICS, ["tensorrt_llm_bls", "ensemble"]) == 6
    assert running_requests(METRICS, ["ensemble"]) is None
    assert running_requests(METRICS, ["tensorrt_llm"]) == 5  # queued requests are at least known
    # a model that exported its count at the drain's start and has none now has ended (its stub finalized)
    assert running_requests("", ["tensorrt_llm_bls"], counting={"tensorrt_llm_bls"}) == 0
    assert running_requests("", ["tensorrt_llm_bls"]) is None


def test_the_drains_verdicts_name_what_happened():
    assert DrainResult(["m"], 3.04, 4).describe() == "drained in 3.0 s; 4 requests ran to their end"
    assert (
        DrainResult(["m"], 1.0, 4, 3, "timeout").describe()
        == "the drain gave up after 1.0 s (--exit-timeout): cut 3 requests"
    )
    assert (
        DrainResult(["m"], 0.1, None, None, "second signal").describe()
        == "the drain was stopped by a second signal after 0.1 s: cut the requests still running"
    )
    assert DrainResult(["m"], 1.0, 4, 3, "timeout").cut_short and not DrainResult(["m"], 1.0, 4).cut_short
    assert not DrainResult(["m"], 0.0, None, None, "error", "frozen").cut_short  # the server's own stop then


def test_the_server_log_is_read_once_for_unhealthy_stubs(tmp_path: Path):
    (tmp_path / "repo").mkdir()
    supervisor = Supervisor(ServerOptions(repo=tmp_path / "repo"), install=object(), log_path=tmp_path / "server.log")
    log = tmp_path / "server.log"
    log.write_text(
        "I1203 model loaded\nE1203 tensorrt_llm_bls: model 'tensorrt_llm' failed: Stub process "
        "'tensorrt_llm_0_0' is not healthy.\n"
    )
    assert supervisor._unhealthy_in_log() == {"tensorrt_llm_0_0"}
    assert supervisor._unhealthy_in_log() == set()  # the same line is not read twice
    with log.open("a") as f:
        f.write("E1203 x: Stub process 'tensorrt_llm_draft_0_0' is not healthy.\n")
    assert supervisor._unhealthy_in_log() == {"tensorrt_llm_draft_0_0"}
    log.write_text("I1203 a new, shorter log after a restart\n")  # rotated: read from its start
    assert supervisor._unhealthy_in_log() == set()


def test_the_gate_refuses_with_unavailable_only_while_it_is_closed():
    from specbuild.contract.serving_gate import GATE_PARAMETER, MODEL_NAME, REFUSAL, Gate

    utils = BackendUtils({MODEL_NAME: False})
    gate = Gate(utils, {GATE_PARAMETER: MODEL_NAME})
    assert gate.refusal() is None  # never seen open: a server started without the gate (--load-model) serves
    utils.ready[MODEL_NAME] = True
    assert gate.refusal() is None and utils.asked == [MODEL_NAME] * 2
    utils.ready[MODEL_NAME] = False  # the drain unloaded it
    error = gate.refusal("preprocessing: ")
    assert error.code == "UNAVAILABLE" and error.message == "preprocessing: " + REFUSAL
    # a repository written before the gate (no parameter) never refuses for it, nor asks
    utils.asked.clear()
    assert Gate(utils, {}).refusal() is None and utils.asked == []


def test_a_python_backend_without_the_model_loading_api_has_no_gate():
    from specbuild.contract.serving_gate import GATE_PARAMETER, Gate

    class Old:
        TritonError = BackendUtils({}).TritonError

    assert Gate(Old(), {GATE_PARAMETER: "serving_gate"}).refusal() is None


def test_gated_refuses_new_requests_of_a_class_it_does_not_change_and_counts_the_running_ones():
    """`gated` puts the gate in front of NVIDIA's llmapi model (and its CPU stand-in): its execute answers through
    response senders and returns None. A stop request (it cancels a running stream) is never refused. The requests
    let through are counted until their final response, in the gauge the drain waits on."""
    import json
    import sys

    from specbuild.contract.serving_gate import GATE_PARAMETER, MODEL_NAME, REFUSAL, RUNNING_GAUGE, gated

    class NvidiaLike:
        def initialize(self, args):
            self.seen = []

        def execute(self, requests):
            self.seen.append(list(requests))
            return None

    utils = BackendUtils({MODEL_NAME: True})
    sys.modules["triton_python_backend_utils"] = utils
    try:
        model = gated(NvidiaLike)()
        model.initialize(
            {
                "model_name": "tensorrt_llm",
                "model_config": json.dumps({"parameters": {GATE_PARAMETER: {"string_value": MODEL_NAME}}}),
            }
        )
    finally:
        del sys.modules["triton_python_backend_utils"]
    running = lambda: utils.gauges[(RUNNING_GAUGE, "tensorrt_llm")]  # noqa: E731
    assert gated(NvidiaLike).__name__ == "NvidiaLike" and issubclass(gated(NvidiaLike), NvidiaLike)
    first = [Request(None), Request(False)]
    model.execute(first)  # the gate is open: everything goes to the model, as the same requests
    seen = model.seen[-1]
    assert [r.stop for r in seen] == [None, False] and not any(r.sent for r in first) and running() == 2
    seen[0].get_response_sender().send("a piece", 0)
    assert running() == 2 and first[0].sent == [("a piece", 0)]  # a streamed piece: still running
    seen[0].get_response_sender().send("the end", flags=FINAL)
    assert running() == 1
    utils.ready[MODEL_NAME] = False  # the drain closed the gate
    new, stop = Request(False), Request(True)
    assert model.execute([new, stop]) is None
    assert [r.stop for r in model.seen[-1]] == [True]  # the cancellation of a running stream still reaches it
    ((response, flags),) = new.sent
    assert flags == FINAL  # its one, final response
    assert response.error.code == "UNAVAILABLE" and response.error.message == REFUSAL
    assert running() == 2  # the refused request was never counted; the stop request is, until it is answered
    model.execute([Request(False)])
    assert len(model.seen) == 2  # nothing left for the model: it is not called with an empty batch


# ---- the stop after a reload: an old instance that never unloads ------------------------------------------------
BEFORE_STOP = "\n".join(
    [
        "\"successfully loaded 'serving_gate'\"",
        "\"successfully loaded 'tensorrt_llm'\"",
        "\"successfully loaded 'tensorrt_llm_draft'\"",
        "\"successfully loaded 'tensorrt_llm_bls'\"",
        "\"successfully loaded 'tensorrt_llm_draft'\"",  # the reload (the old instance's unload never logged)
        "\"successfully unloaded 'tensorrt_llm_bls' version 1\"",
        "\"successfully unloaded 'serving_gate' version 1\"",
    ]
)  # the drain unloaded the entry models before the stop


def _since_stop(*live_after: int) -> str:
    lines = [
        '"Timeout 29: Found 3 live models and 0 in-flight non-inference requests"',
        "\"successfully unloaded 'tensorrt_llm' version 1\"",
        "\"successfully unloaded 'tensorrt_llm_draft' version 1\"",
    ]
    return "\n".join(
        lines + [f'"Timeout 26: Found {n} live models and 0 in-flight non-inference requests"' for n in live_after]
    )


def test_the_stop_gives_up_waiting_only_for_the_old_instances_of_models_whose_stub_died():
    """Seen (python_backend in nvidia-pytriton 0.7): a stub frozen while it held a request, killed and its model
    reloaded; at the stop every model unloaded, then "Found 1 live models" until --exit-timeout, exit 1."""
    from specbuild.triton.supervisor import lingering_only

    reason = lingering_only(BEFORE_STOP, _since_stop(1), {"tensorrt_llm_draft"})
    assert reason and "tensorrt_llm_draft" in reason and "never unload" in reason
    assert lingering_only(BEFORE_STOP, _since_stop(1), set()) is None  # no stub died: wait as usual
    assert lingering_only(BEFORE_STOP, _since_stop(), {"tensorrt_llm_draft"}) is None  # not counted since: exiting
    assert lingering_only(BEFORE_STOP, _since_stop(2), {"tensorrt_llm_draft"}) is None  # more live than stubs died
    unloading = _since_stop(1).replace("\"successfully unloaded 'tensorrt_llm' version 1\"", "")
    assert lingering_only(BEFORE_STOP, unloading, {"tensorrt_llm_draft"}) is None  # a model still unloading
    # The stop came before the dead stub's model was reloaded (tests/test_soak.py's last fault, just before its
    # stop): its one instance is the old one, which never logs its unload.
    never_reloaded = BEFORE_STOP.replace("\"successfully loaded 'tensorrt_llm_draft'\"", "", 1)
    not_unloaded = _since_stop(1).replace("\"successfully unloaded 'tensorrt_llm_draft' version 1\"", "")
    reason = lingering_only(never_reloaded, not_unloaded, {"tensorrt_llm_draft"})
    assert reason and "tensorrt_llm_draft" in reason
    assert lingering_only(never_reloaded, not_unloaded, {"preprocessing"}) is None  # the draft may still unload
    counted_never = "\n".join(line for line in _since_stop(1).splitlines() if "live models" not in line)
    assert lingering_only(BEFORE_STOP, counted_never, {"tensorrt_llm_draft"}) is None  # not counting: not stopping
    assert lingering_only(BEFORE_STOP, _since_stop(1, 0), {"tensorrt_llm_draft"}) is None  # none live: it exits
    reason = lingering_only(BEFORE_STOP, _since_stop(2), {"tensorrt_llm_draft", "tensorrt_llm"})
    assert reason.endswith(
        "2 old instance(s) of tensorrt_llm, tensorrt_llm_draft, whose stub died holding a request (they never unload)"
    )


def test_a_stub_death_counts_for_the_stop_from_the_moment_it_is_seen_or_the_stop_comes(tmp_path: Path):
    """The stop gives up on an old instance only for a model whose stub died; a stop that interrupts the reload, or
    comes before the supervisor looked, must still know which (seen: exit 1 after the whole exit timeout)."""
    from types import SimpleNamespace

    from specbuild.triton.server import StopRequested

    supervisor, calls, _, _ = _supervised(tmp_path)

    def control(action, model, timeout=600.0):
        calls.append((action, model))
        if action == "load":
            raise StopRequested()  # SIGTERM while the reload runs

    supervisor.handle.model_control = control
    with pytest.raises(StopRequested):
        supervisor._recover({"m": ["m_0_0"]})
    assert calls == [("unload", "m"), ("load", "m")] and supervisor._stub_died == {"m"}

    supervisor2, _, _, _ = _supervised(tmp_path / "second")
    supervisor2.handle.process = SimpleNamespace(pid=4321, poll=lambda: None)
    supervisor2._expected = {"m_0_0": "m"}  # seen alive
    supervisor2._live_instances = lambda: {"m_0_0": "m"}
    assert supervisor2._models_with_dead_stubs() == set()
    supervisor2._live_instances = lambda: {}  # gone, and the supervisor has not looked since
    assert supervisor2._models_with_dead_stubs() == {"m"}
    supervisor2.handle.process = SimpleNamespace(pid=4321, poll=lambda: 0)  # the server itself exited: no stop to help
    assert supervisor2._models_with_dead_stubs() == set()


def test_free_ports_are_distinct():
    """Seen: ports asked for one at a time came back equal (gRPC and metrics), and tritonserver refused to start."""
    from specbuild.triton.server import free_ports

    for _ in range(50):
        ports = free_ports("127.0.0.1", 3)
        assert len(set(ports)) == 3 and all(port > 0 for port in ports)


def _supervised(tmp_path: Path, **settings):
    """A Supervisor over a one-model repository (a Python model, not decoupled), its server never started: its
    starts, stops and model-control calls are recorded instead, and its clock is the test's."""
    from types import SimpleNamespace

    from specbuild.triton import supervisor as module
    from specbuild.triton.supervisor import SupervisorSettings

    repo = tmp_path / "repo"
    (repo / "m").mkdir(parents=True, exist_ok=True)
    (repo / "m" / "config.pbtxt").write_text('name: "m"\nbackend: "python"\n')
    supervisor = Supervisor(
        ServerOptions(repo=repo),
        install=object(),
        log_path=tmp_path / "server.log",
        settings=SupervisorSettings(**settings),
    )
    calls: list[tuple] = []
    supervisor.handle.stop = lambda graceful=True: calls.append(("stop", graceful))
    supervisor.handle.model_control = lambda action, model, timeout=600.0: calls.append((action, model))
    supervisor.handle.process = SimpleNamespace(pid=4321)
    supervisor._start = lambda timeout: calls.append(("start",))
    clock = SimpleNamespace(now=1000.0)
    return supervisor, calls, clock, module


def test_restarts_older_than_the_window_no_longer_count(tmp_path: Path, monkeypatch):
    import pytest

    from specbuild.errors import ServeError

    supervisor, calls, clock, module = _supervised(tmp_path, max_restarts=2, restart_window_s=60.0)
    monkeypatch.setattr(module.time, "monotonic", lambda: clock.now)
    supervisor._restart("m", clock.now)
    clock.now += 10
    supervisor._restart("m", clock.now)
    clock.now += 61  # both earlier restarts are now outside the window
    supervisor._restart("m", clock.now)
    clock.now += 1
    supervisor._restart("m", clock.now)  # two within the window: still allowed
    clock.now += 1
    with pytest.raises(ServeError, match="needed 2 restarts within 60 s; giving up"):
        supervisor._restart("m", clock.now)
    assert [c for c in calls if c == ("start",)] == [("start",)] * 4


def test_a_reload_that_brings_no_stub_back_falls_back_to_a_server_restart(tmp_path: Path, monkeypatch):
    supervisor, calls, clock, module = _supervised(tmp_path)

    def tick() -> float:  # every look at the clock moves it on 1 s: the 3 s wait for the stub runs out at once
        clock.now += 1.0
        return clock.now

    monkeypatch.setattr(module.time, "monotonic", tick)
    monkeypatch.setattr(module.time, "sleep", lambda s: None)
    supervisor._live_instances = lambda: {}  # the reloaded model's stub never appears
    supervisor._recover({"m": ["m_0_0"]})
    assert calls[:2] == [("unload", "m"), ("load", "m")]  # a reload first
    assert ("stop", False) in calls and calls[-1] == ("start",)  # then the server killed and started again
    messages = [e["message"] for e in supervisor.events]
    assert any(
        m.startswith("reloading m did not help (no live stub for m_0_0 after unload and load)") for m in messages
    )
    assert supervisor.metrics.get("specbuild_supervisor_recoveries_total", model="m", action="restart") == 1
    assert supervisor.metrics.get("specbuild_supervisor_recoveries_total", model="m", action="reload") == 0

    # and where the stub comes back, the reload is the whole recovery
    supervisor2, calls2, _, _ = _supervised(tmp_path / "second")
    supervisor2._live_instances = lambda: {"m_0_0": "m"}
    supervisor2._recover({"m": ["m_0_0"]})
    assert calls2 == [("unload", "m"), ("load", "m")]
    assert supervisor2.metrics.get("specbuild_supervisor_recoveries_total", model="m", action="reload") == 1


def test_a_stub_named_not_healthy_is_hung_only_once_it_is_older_than_the_line(tmp_path: Path, monkeypatch):
    """A "not healthy" line names an instance; a stub of that name younger than FRESH_STUB_S was started after it (a
    reload just made it), so the line is about its predecessor; an older one is hung. A frozen stub is hung whatever
    the log says."""
    from specbuild.triton import procfs
    from specbuild.triton.supervisor import FRESH_STUB_S

    supervisor, _, _, module = _supervised(tmp_path)
    stub = procfs.Stub(pid=999999, instance="m_0_0", model="m", region="r")
    state = {"age": FRESH_STUB_S - 1, "stopped": False}
    monkeypatch.setattr(module.procfs, "python_stubs", lambda pid: [stub])
    monkeypatch.setattr(module.procfs, "stopped", lambda pid: state["stopped"])
    monkeypatch.setattr(module.procfs, "state", lambda pid: "T")
    monkeypatch.setattr(module.procfs, "age_seconds", lambda pid: state["age"])
    log = tmp_path / "server.log"
    line = "E1203 tensorrt_llm_bls: model 'm' failed: Stub process 'm_0_0' is not healthy.\n"
    log.write_text(line)
    assert supervisor.hung_stubs() == {}  # too young: the line is about the stub before it
    state["age"] = FRESH_STUB_S + 1
    assert supervisor.hung_stubs() == {}  # that line was read once, and no other names it
    with log.open("a") as f:
        f.write(line)
    assert supervisor.hung_stubs() == {stub: 'does not answer: Triton reports it "not healthy"'}
    assert supervisor.hung_stubs({"m_0_0"}) == {stub: 'does not answer: Triton reports it "not healthy"'}  # a canary's
    state["stopped"] = True
    assert supervisor.hung_stubs() == {stub: "is frozen (stopped, state T)"}


def test_a_failed_canary_that_names_a_hung_stub_recovers_it_at_once(tmp_path: Path, monkeypatch):
    """The canary's error names a stub Triton found not healthy: it is killed and its model reloaded on the first
    failure, not after canary_failures of them; a failure naming no stub only counts toward a restart."""
    import subprocess
    import sys
    from types import SimpleNamespace

    from specbuild.triton import procfs

    supervisor, calls, _, module = _supervised(tmp_path, canary_failures=3)
    hung = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        stub = procfs.Stub(pid=hung.pid, instance="m_0_0", model="m", region="r")
        monkeypatch.setattr(module.procfs, "python_stubs", lambda pid: [stub])
        monkeypatch.setattr(module.procfs, "age_seconds", lambda pid: 60.0)
        supervisor._live_instances = lambda: {"m_0_0": "m"}  # the reloaded model's new stub
        unnamed = SimpleNamespace(model="tensorrt_llm_bls", error="tensorrt_llm_bls: connection reset")
        supervisor._canary_result(unnamed)
        assert calls == [] and supervisor._canary_failed == 1
        named = SimpleNamespace(
            model="tensorrt_llm_bls", error="tensorrt_llm_bls: model 'm' failed: Stub process 'm_0_0' is not healthy."
        )
        supervisor._canary_result(named)
        assert hung.wait(timeout=30) == -9  # killed at once
        assert calls == [("unload", "m"), ("load", "m")]  # and its model reloaded: no server restart
        assert supervisor.metrics.get("specbuild_supervisor_failures_total", kind="stub_hung", model="m") == 1
    finally:
        hung.kill()
        hung.wait()


class FakeBlsBackend:
    """What the BLS's answers use of triton_python_backend_utils: TritonError's codes, responses, the logger."""

    TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1

    class TritonError:
        UNKNOWN, UNAVAILABLE, INVALID_ARG, CANCELLED = "UNKNOWN", "UNAVAILABLE", "INVALID_ARG", "CANCELLED"

        def __init__(self, message: str, code: str = "UNKNOWN"):
            self.message, self.code = message, code

    class InferenceResponse:
        def __init__(self, output_tensors=(), error=None):
            self.error = error

    def __init__(self):
        self.logged: list[str] = []
        self.Logger = type("Logger", (), {"log_error": staticmethod(self.logged.append)})


class AnsweredRequest:
    def __init__(self):
        self.sent: list = []

    def get_response_sender(self):
        return type("Sender", (), {"send": lambda _, response, flags=0: self.sent.append((response, flags))})()


def _bls():
    """The BLS model without its initialize (no tokenizer, no models): what execute and the error mapping use."""
    from concurrent.futures import ThreadPoolExecutor

    from specbuild.triton.models.bls import TritonPythonModel

    bls = TritonPythonModel.__new__(TritonPythonModel)
    bls.pb, bls.model_name, bls.closing = FakeBlsBackend(), "tensorrt_llm_bls", False
    bls.gate = type("Open", (), {"refusal": lambda _: None})()
    bls.queue_metrics = type(
        "Admit", (), {"admit": lambda *_: True, "started": lambda *_: None, "finished": lambda _: None}
    )()
    bls.slots, bls.max_waiting = 4, 16
    bls.pool = ThreadPoolExecutor(max_workers=1)
    bls._parse = lambda request: object()
    return bls


def test_the_bls_maps_each_failure_to_its_triton_code_and_logs_what_needs_a_look():
    from specbuild.errors import RequestError
    from specbuild.triton.models.bls import Cancelled
    from specbuild.triton.models.common import ModelCallError

    bls = _bls()
    bad = bls._error(RequestError("max_tokens = 0 is invalid"))
    assert (bad.code, bad.message) == ("INVALID_ARG", "max_tokens = 0 is invalid") and bls.pb.logged == []
    cancelled = bls._error(Cancelled("request cancelled by the client"))
    assert cancelled.code == "CANCELLED" and bls.pb.logged == []
    failed = bls._error(ModelCallError("model 'tensorrt_llm' failed: Stub process 'tensorrt_llm_0_0' is not healthy."))
    assert failed.code == "UNKNOWN" and bls.pb.logged == [
        "tensorrt_llm_bls: model 'tensorrt_llm' failed: Stub process 'tensorrt_llm_0_0' is not healthy."
    ]  # logged as is: the supervisor reads the stub's name there
    try:
        raise KeyError("slot")
    except KeyError as err:
        internal = bls._error(err)
    assert internal.message == "internal error in tensorrt_llm_bls: KeyError: 'slot'" and internal.code == "UNKNOWN"
    assert "Traceback" in bls.pb.logged[-1]  # the traceback goes to the server log, not to the client
    bls.pool.shutdown()


def test_an_unloading_bls_refuses_new_requests_and_those_still_waiting_with_unavailable():
    bls = _bls()
    bls.drafting = type("NoPool", (), {"close": lambda _: None})()
    bls.finalize()  # Triton unloads the model: its slots' pool is shut, nothing more can be queued there
    request = AnsweredRequest()
    bls.execute([request])  # answered here and now, not queued
    ((response, flags),) = request.sent
    assert response.error.code == "UNAVAILABLE" and response.error.message == "tensorrt_llm_bls is unloading"
    assert flags == FakeBlsBackend.TRITONSERVER_RESPONSE_COMPLETE_FINAL
    waiting = AnsweredRequest()  # admitted before the unload began, given a slot after it
    bls._in_slot(waiting, object(), 0.0)
    assert waiting.sent[0][0].error.message == "tensorrt_llm_bls is unloading"


def test_the_stop_diagnosis_names_what_took_most_of_the_exit_timeout(tmp_path: Path):
    """An open HTTP keep-alive connection spends the budget in the HTTP front end's countdown; a model that never
    unloads spends it in the models' countdown (after a second of HTTP): each is told as what it is."""
    from specbuild.triton.server import ServerHandle

    log = tmp_path / "server.log"
    handle = ServerHandle(ServerOptions(repo=tmp_path), install=object(), log_path=log)

    def countdown(http: int, models: int) -> str:
        lines = [f'I1207 http_server.cc:248] "Timeout {10 - i}: Found 1 HTTP service connections"' for i in range(http)]
        lines += [
            f'I1207 server.cc:345] "Timeout {10 - http - i}: Found 1 live models and 0 in-flight non-inference requests"'
            for i in range(models)
        ]
        return "\n".join([*lines, 'E1207 main.cc:535] "failed to stop server: Internal - Exit timeout expired."'])

    log.write_text(countdown(http=9, models=2))
    assert handle.stop_diagnosis().startswith("tritonserver spent 9 s of it waiting for open HTTP connections")
    log.write_text(countdown(http=1, models=9))
    assert handle.stop_diagnosis() == (
        "tritonserver waited for models to unload (1 live models and 0 in-flight non-inference requests), e.g. a "
        "decoupled model with open streams, or the old instance of a model whose stub died holding a request"
    )
    log.write_text("I1207 stopped in time\n")
    assert handle.stop_diagnosis() == ""
