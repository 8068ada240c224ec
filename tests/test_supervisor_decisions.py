"""The supervisor's decisions, each driven through `watch()` in a scripted world: the server's process and its stubs
are fakes (the /proc readers answer from a table the test sets), the server is never started, and its stops, starts
and model-control calls are recorded. What each fault must lead to is asserted: the event and its kind, the metric,
the recovery (a reload, or a server restart for a decoupled model or a server that exited or froze), and nothing for
a model unloaded on purpose. The same decisions run against a real tritonserver in tests/test_triton_faults.py and
tests/test_triton_hung.py; here they run on every machine in a second, so a wrong branch fails here first."""

from __future__ import annotations

import signal
from pathlib import Path
from types import SimpleNamespace

import pytest

from specbuild.triton import procfs
from specbuild.triton import supervisor as module
from specbuild.triton.server import ServerOptions
from specbuild.triton.supervisor import Supervisor, SupervisorSettings, is_decoupled, python_models

SERVER_PID = 4321


class World:
    """The server's process and its stubs as /proc would show them; stubs come back when their model is loaded."""

    def __init__(self, monkeypatch, models: dict[str, int]):
        self.stubs = {f"{model}_0_0": procfs.Stub(pid, f"{model}_0_0", model, "r") for model, pid in models.items()}
        self.alive = set(self.stubs)  # instances whose stub lives
        self.frozen: set[int] = set()  # pids stopped (the server's own included)
        self.killed: list[tuple[int, int]] = []
        self.exit_code: int | None = None
        self.stop_result = None  # what the server's stop returns (None: nothing was running)
        self.abandon = None  # the stop's abandon check, as serve passed it
        monkeypatch.setattr(module.procfs, "python_stubs", lambda pid: [self.stubs[i] for i in sorted(self.alive)])
        monkeypatch.setattr(module.procfs, "stopped", lambda pid: pid in self.frozen)
        monkeypatch.setattr(module.procfs, "state", lambda pid: "T" if pid in self.frozen else "S")
        monkeypatch.setattr(module.procfs, "age_seconds", lambda pid: 60.0)
        monkeypatch.setattr(module.procfs, "alive", lambda pid: False)  # a killed stub is gone at once
        monkeypatch.setattr(module.os, "kill", lambda pid, sig: self.killed.append((pid, sig)))
        monkeypatch.setattr(module.time, "sleep", lambda s: None)

    def process(self):
        world = self

        class Process:  # what the supervisor reads of a Popen
            pid = SERVER_PID

            def poll(self):
                return world.exit_code

            @property
            def returncode(self):
                return world.exit_code

        return Process()


def scripted_clock(monkeypatch, now: float) -> SimpleNamespace:
    """The supervisor's time.monotonic reads `clock.now`, which the test moves (set it, or a scripted sleep adds)."""
    clock = SimpleNamespace(now=now)
    monkeypatch.setattr(module.time, "monotonic", lambda: clock.now)
    return clock


def supervised(tmp_path: Path, monkeypatch, models: dict[str, int], decoupled: tuple[str, ...] = (), **settings):
    """A Supervisor over a repository of Python models (those in `decoupled` stream), in a World."""
    repo = tmp_path / "repo"
    for model in models:
        (repo / model).mkdir(parents=True, exist_ok=True)
        policy = "model_transaction_policy { decoupled: true }\n" if model in decoupled else ""
        (repo / model / "config.pbtxt").write_text(f'name: "{model}"\nbackend: "python"\n{policy}')
    world = World(monkeypatch, models)
    settings = {"poll_s": 0.0, "canary_interval_s": 0.0, **settings}
    sup = Supervisor(
        ServerOptions(repo=repo),
        install=object(),
        log_path=tmp_path / "server.log",
        settings=SupervisorSettings(**settings),
    )
    (tmp_path / "server.log").write_text("I1207 a line of the server's log\n")
    calls: list[tuple] = []

    def start(timeout):
        calls.append(("start",))
        world.exit_code = None
        world.frozen.discard(SERVER_PID)
        world.alive = set(world.stubs)
        sup.handle.process = world.process()
        sup._expected = sup._live_instances()
        sup._serving = True

    def control(action, model, timeout=600.0):
        calls.append((action, model))
        if action == "load":
            world.alive |= {i for i, s in world.stubs.items() if s.model == model}

    def stop(graceful=True, abandon=None, **kwargs):
        calls.append(("stop", graceful))
        world.abandon = abandon
        return world.stop_result

    sup.handle.stop = stop
    sup.handle.model_control = control
    sup._start = start
    sup._model_ready = lambda model: model not in world.unloaded
    world.unloaded = set()
    start(0)
    calls.clear()
    return sup, world, calls


def one_look(sup: Supervisor) -> None:
    """One pass of watch(): its checks run once, then it returns."""
    looks = iter([False, True])
    sup.watch(until=lambda: next(looks))


def kinds(sup: Supervisor) -> list[tuple[str, str]]:
    return [(e.get("model"), e.get("kind") or e.get("action")) for e in sup.events]


def test_a_healthy_server_is_left_alone(tmp_path, monkeypatch):
    sup, _, calls = supervised(tmp_path, monkeypatch, {"m": 11})
    one_look(sup)
    assert calls == [] and sup.events == []


def test_a_server_that_exited_is_restarted_and_its_code_and_signal_named(tmp_path, monkeypatch):
    sup, world, calls = supervised(tmp_path, monkeypatch, {"m": 11})
    world.exit_code = -signal.SIGSEGV
    one_look(sup)
    assert calls == [("stop", False), ("start",)]
    assert kinds(sup) == [("tritonserver", "server_exited"), ("tritonserver", None), ("tritonserver", "restart")]
    assert sup.events[0]["message"].startswith("tritonserver exited with code -11 (SIGSEGV); last lines of its log:\n")
    assert sup.events[0]["message"].endswith("I1207 a line of the server's log")
    assert sup.metrics.get("specbuild_supervisor_failures_total", kind="server_exited", model="tritonserver") == 1
    assert sup.metrics.get("specbuild_supervisor_recoveries_total", action="restart", model="tritonserver") == 1
    assert sup.metrics.get("specbuild_supervisor_serving") == 0  # _start, faked here, is what sets it to 1


def test_a_frozen_server_is_killed_and_restarted(tmp_path, monkeypatch):
    sup, world, calls = supervised(tmp_path, monkeypatch, {"m": 11})
    world.frozen.add(SERVER_PID)
    one_look(sup)
    assert calls == [("stop", False), ("start",)]
    assert sup.events[0]["message"] == f"tritonserver (pid {SERVER_PID}) is frozen (stopped, state T): killing it"
    assert kinds(sup) == [("tritonserver", "server_hung"), ("tritonserver", None), ("tritonserver", "restart")]


CRASH_LOG = "Signal (6) received.\n 0# 0x000055AB273FE52D in tritonserver\n 1# abort in libc.so.6\n"


def test_a_server_whose_log_says_it_crashed_is_killed_and_restarted_before_it_exits(tmp_path, monkeypatch):
    """tritonserver's SIGABRT/SIGSEGV handler writes the line, then the process may take minutes to go (a CI run:
    ten) while it answers nothing: the line is the crash."""
    sup, world, calls = supervised(tmp_path, monkeypatch, {"m": 11})
    with open(tmp_path / "server.log", "a") as log:
        log.write(CRASH_LOG)
    one_look(sup)
    assert calls == [("stop", False), ("start",)]
    assert kinds(sup) == [("tritonserver", "server_crashed"), ("tritonserver", None), ("tritonserver", "restart")]
    assert sup.events[0]["message"] == (
        f"tritonserver (pid {SERVER_PID}) crashed: its log says 'Signal (6) received.' (its stack trace follows "
        "there): killing it"
    )
    assert sup.metrics.get("specbuild_supervisor_failures_total", kind="server_crashed", model="tritonserver") == 1
    calls.clear()
    one_look(sup)  # the same line is not a second crash (a start rotates the log; here it stays)
    assert calls == []


@pytest.mark.parametrize("line", ["Signal (15) received.", "Signal (2) received.", "  Signal (6) received. later"])
def test_a_stop_signal_or_a_line_that_only_quotes_one_is_no_crash(tmp_path, monkeypatch, line):
    """SIGINT and SIGTERM get the same words from tritonserver's graceful handler (server src/triton_signal.cc)."""
    sup, _, calls = supervised(tmp_path, monkeypatch, {"m": 11})
    with open(tmp_path / "server.log", "a") as log:
        log.write(line + "\n")
    one_look(sup)
    assert calls == [] and sup.events == []


@pytest.mark.parametrize("down", ["crashed", "exited"])
def test_a_reload_stops_waiting_for_a_server_that_went_down_and_restarts_it(tmp_path, monkeypatch, down):
    """What the CI run showed: a stub killed mid-request, the server aborting in python_backend while the reload's
    load call waited on it. The load is given up as soon as the server is down, not when its request times out."""
    import threading

    sup, world, calls = supervised(tmp_path, monkeypatch, {"m": 11}, start_timeout_s=45.0)
    released = threading.Event()

    def control(action, model, timeout=600.0):
        calls.append((action, model, timeout))
        if action == "load":
            if down == "crashed":
                with open(tmp_path / "server.log", "a") as log:
                    log.write(CRASH_LOG)
            else:
                world.exit_code = -signal.SIGABRT
            released.wait(60)  # the server never answers

    sup.handle.model_control = control
    world.alive.discard("m_0_0")
    try:
        one_look(sup)
    finally:
        released.set()
    assert calls == [("unload", "m", 600.0), ("load", "m", 45.0), ("stop", False), ("start",)]  # a start's bound
    kind = "server_crashed" if down == "crashed" else "server_exited"
    assert kinds(sup) == [
        ("m", "stub_died"),
        ("tritonserver", kind),
        ("m", None),
        ("m", None),
        ("m", "restart"),
    ]
    assert sup.events[2]["message"] == "reloading m did not help (loading m was cut short: tritonserver went down)"


def test_a_failed_model_control_call_is_raised_in_the_supervisor_thread(tmp_path, monkeypatch):
    from specbuild.errors import ServeError

    sup, _, _ = supervised(tmp_path, monkeypatch, {"m": 11})

    def refused():
        raise ServeError("load of m failed: HTTP 400 no such model")

    with pytest.raises(ServeError, match="HTTP 400 no such model"):
        sup._while_up("loading m", refused)
    assert sup._while_up("loading m", lambda: None) is None


def test_a_dead_stub_reloads_its_model_and_only_it(tmp_path, monkeypatch):
    sup, world, calls = supervised(tmp_path, monkeypatch, {"m": 11, "n": 12})
    world.alive.discard("m_0_0")
    one_look(sup)
    assert calls == [("unload", "m"), ("load", "m")]
    assert sup.events[0]["message"] == "the Python backend stub of m (m_0_0) died"
    assert sup.events[1]["message"].startswith("m serving again after an unload and load (")
    assert kinds(sup) == [("m", "stub_died"), ("m", "reload")]
    assert sup.metrics.get("specbuild_supervisor_recoveries_total", action="reload", model="m") == 1
    assert sup._stub_died == {"m"}
    one_look(sup)  # it serves again: nothing more
    assert len(calls) == 2


def test_a_dead_stub_of_a_decoupled_model_restarts_the_server(tmp_path, monkeypatch):
    """Its open streams hang until the server goes away, so no reload: a restart."""
    sup, world, calls = supervised(tmp_path, monkeypatch, {"bls": 11, "m": 12}, decoupled=("bls",))
    world.alive -= {"bls_0_0", "m_0_0"}
    one_look(sup)
    assert calls == [("stop", False), ("start",)]
    assert sup.metrics.get("specbuild_supervisor_recoveries_total", action="restart", model="bls") == 1
    assert sup.metrics.get("specbuild_supervisor_failures_total", kind="stub_died", model="m") == 1


def test_a_model_unloaded_on_purpose_is_not_recovered(tmp_path, monkeypatch):
    sup, world, calls = supervised(tmp_path, monkeypatch, {"m": 11, "n": 12})
    world.alive.discard("n_0_0")
    world.unloaded.add("n")
    one_look(sup)
    assert calls == [] and sup.events == []
    assert "n_0_0" not in sup._expected and "n" not in sup._python_models  # and no longer expected


def test_a_python_model_whose_stub_was_never_seen_counts_as_dead(tmp_path, monkeypatch):
    """A stub may die before the first look: every Python model must have one."""
    sup, world, calls = supervised(tmp_path, monkeypatch, {"m": 11})
    sup._expected = {}
    world.alive.clear()
    assert sup.dead_models() == {"m": ["m_0_0"]}


def test_a_frozen_stub_is_killed_then_its_model_reloaded(tmp_path, monkeypatch):
    sup, world, calls = supervised(tmp_path, monkeypatch, {"m": 11, "n": 12})
    world.frozen.add(12)

    def kill(pid, sig):  # the kill ends the frozen stub
        world.killed.append((pid, sig))
        world.alive.discard("n_0_0")

    monkeypatch.setattr(module.os, "kill", kill)
    one_look(sup)
    assert world.killed == [(12, signal.SIGKILL)]
    assert calls == [("unload", "n"), ("load", "n")]
    assert (
        sup.events[0]["message"]
        == "the Python backend stub of n (n_0_0, pid 12) is frozen (stopped, state T): killing it"
    )
    assert kinds(sup) == [("n", "stub_hung"), ("n", "reload")]  # reported once, not again as died


def test_canary_answers_count_by_kind_and_three_failures_restart(tmp_path, monkeypatch):
    sup, _, calls = supervised(tmp_path, monkeypatch, {"m": 11}, canary_failures=3)
    probe = lambda error: SimpleNamespace(model="m", error=error)  # noqa: E731
    sup._canary_result(probe("connection reset"))
    sup._canary_result(probe("connection reset"))
    sup._canary_result(probe(None))  # a success resets the count
    assert sup._canary_failed == 0 and calls == []
    sup._canary_result(probe(f"{module.QUEUE_FULL} (the queue of m)"))  # busy: neither
    assert sup.metrics.get("specbuild_supervisor_canary_total", result="busy") == 1
    assert sup._canary_failed == 0
    for _ in range(2):
        sup._canary_result(probe("connection reset"))
    assert calls == [] and sup.events[-1]["message"] == "canary through m failed (2/3): connection reset"
    sup._canary_result(probe("connection reset"))
    assert calls == [("stop", False), ("start",)] and sup._canary_failed == 0
    assert kinds(sup)[-4:] == [("m", "canary"), ("m", "canary"), ("m", None), ("m", "restart")]
    assert sup.metrics.get("specbuild_supervisor_canary_total", result="failed") == 5
    assert sup.metrics.get("specbuild_supervisor_canary_total", result="ok") == 1


def test_the_repositorys_python_and_decoupled_models_are_read_from_their_configs(tmp_path):
    repo = tmp_path / "repo"
    for name, text in {
        "a": 'backend: "python"\nmodel_transaction_policy {\n  decoupled: true\n}\n',
        "b": 'backend :  "python"\n',
        "c": 'backend: "tensorrtllm"\n',
        "d": 'backend: "python"\nmodel_transaction_policy { decoupled: false }\n',
    }.items():
        (repo / name).mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(text)
    assert python_models(repo) == ["a", "b", "d"]
    assert python_models(repo, only=("b", "c")) == ["b"]
    assert [m for m in "abcd" if is_decoupled(repo, m)] == ["a"]
    assert not is_decoupled(repo, "missing")


def test_the_metrics_file_is_written_on_every_change(tmp_path):
    metrics = module.SupervisorMetrics(tmp_path / "s.prom")
    metrics.add("specbuild_supervisor_failures_total", kind="stub_died", model="m")
    metrics.add("specbuild_supervisor_failures_total", 2.0, kind="stub_died", model="m")
    metrics.set("specbuild_supervisor_serving", 1)
    text = (tmp_path / "s.prom").read_text()
    assert 'specbuild_supervisor_failures_total{kind="stub_died",model="m"} 3.0' in text
    assert "specbuild_supervisor_serving 1.0" in text
    assert metrics.get("specbuild_supervisor_failures_total", kind="stub_died", model="m") == 3.0
    assert metrics.get("specbuild_supervisor_failures_total", kind="canary", model="m") == 0.0
    module.SupervisorMetrics(None).add("specbuild_supervisor_server_starts_total")  # no file: nothing written


def test_a_server_that_exits_without_supervision_ends_serve(tmp_path, monkeypatch):
    from specbuild.errors import ServeError

    sup, world, _ = supervised(tmp_path, monkeypatch, {"m": 11}, enabled=False)
    world.exit_code = 3
    monkeypatch.setattr(sup._stop, "wait", lambda timeout: False)
    with pytest.raises(
        ServeError,
        match=r"(?s)^tritonserver exited with code 3; last lines of its log:\n.*\n\(--no-supervise: not restarted\)$",
    ):
        sup._wait_unsupervised()


# ---- serve(): start, ready, a signal, the drain, the stop --------------------------------------------------------
def sigterm() -> None:
    """What SIGTERM does while serve runs: its handler, called as the signal would (no signal is sent, so a handler
    not installed fails the test instead of ending it)."""
    handler = signal.getsignal(signal.SIGTERM)
    assert callable(handler) and handler is not signal.default_int_handler, handler
    handler(signal.SIGTERM, None)


def _drained(cut_short: bool = False):
    from specbuild.triton.drain import DrainResult

    return DrainResult(["m"], 1.5, 2, 1 if cut_short else None, "timeout" if cut_short else None)


def test_serve_once_starts_reports_ready_and_stops(tmp_path, monkeypatch):
    sup, _, calls = supervised(tmp_path, monkeypatch, {"m": 11})
    ready = []
    outcome = sup.serve(ready.append, once=True, canary_models=False)
    assert ready == [{}] and calls == [("start",), ("stop", True)]
    assert outcome == {"stopped_by": "once", "ready": True, "restarts": 0, "events": []}
    assert sup.metrics.get("specbuild_supervisor_serving") == 0


def test_a_signal_drains_then_stops_gracefully(tmp_path, monkeypatch):
    from specbuild.triton.server import StopResult

    sup, world, calls = supervised(tmp_path, monkeypatch, {"m": 11})
    world.stop_result = StopResult(0, 2.0)
    sup.drain = lambda: _drained()
    before = signal.getsignal(signal.SIGTERM)
    outcome = sup.serve(lambda answers: sigterm(), canary_models=False)
    assert calls == [("start",), ("stop", True)] and world.abandon is None  # no stub died: nothing to give up on
    assert outcome["stopped_by"] == "signal" and outcome["drain"]["seconds"] == 1.5
    assert outcome["stop"] == {
        "exit_code": 0,
        "seconds": 2.0,
        "killed": False,
        "removed_shm_regions": 0,
        "abandoned": None,
    }
    assert signal.getsignal(signal.SIGTERM) is before and sup._stop.is_set()  # its handler is put back


def test_a_stop_after_a_stub_died_may_give_up_on_its_old_instance(tmp_path, monkeypatch):
    sup, world, calls = supervised(tmp_path, monkeypatch, {"m": 11, "bls": 12})
    sup.drain = lambda: _drained()

    def ready(answers):
        world.alive.discard("m_0_0")  # dies just before the signal: the supervisor never looked
        sigterm()

    sup.serve(ready, canary_models=False)
    assert sup._stub_died == {"m"} and callable(world.abandon)


def test_a_drain_that_cut_requests_kills_the_server_and_says_so(tmp_path, monkeypatch):
    from specbuild.errors import ServeError

    sup, _, calls = supervised(tmp_path, monkeypatch, {"m": 11})
    sup.drain = lambda: _drained(cut_short=True)
    with pytest.raises(ServeError, match="; tritonserver was then killed. Clients of the cut requests got an error"):
        sup.serve(lambda answers: sigterm(), canary_models=False)
    assert calls == [("start",), ("stop", False)]


def test_a_stop_that_is_not_clean_fails_serve(tmp_path, monkeypatch):
    from specbuild.errors import ServeError
    from specbuild.triton.server import StopResult

    sup, world, _ = supervised(tmp_path, monkeypatch, {"m": 11})
    world.stop_result = StopResult(1, 30.5)
    with pytest.raises(ServeError, match=r"^tritonserver did not stop cleanly: it exited with code 1 after 30.5 s"):
        sup.serve(lambda answers: None, once=True, canary_models=False)


def test_a_failure_while_serving_stops_the_server_first(tmp_path, monkeypatch):
    sup, _, calls = supervised(tmp_path, monkeypatch, {"m": 11})

    def broken(answers):
        raise RuntimeError("the ready callback broke")

    with pytest.raises(RuntimeError, match="the ready callback broke"):
        sup.serve(broken, once=True, canary_models=False)
    assert calls == [("start",), ("stop", True)]


# ---- the rest of what the supervisor decides and says --------------------------------------------------------------
def test_drain_unloads_the_loaded_entry_models_behind_the_gate(tmp_path, monkeypatch):
    from specbuild.triton.drain import DrainResult

    sup, world, _ = supervised(tmp_path, monkeypatch, {"tensorrt_llm_bls": 11, "ensemble": 12, "serving_gate": 13})
    seen = {}

    def drain(handle, models, timeout_s, log, server_alive, gate=None):
        seen.update(handle=handle, models=models, timeout=timeout_s, log=log, alive=server_alive(), gate=gate)
        seen["interruptible"] = sup._interruptible
        return DrainResult(models, 1.25, 2)

    monkeypatch.setattr(module.drain, "drain", drain)
    repo = sup.handle.opts.repo
    monkeypatch.setattr(module, "entry_models", lambda of: ["tensorrt_llm_bls", "ensemble"] if of == repo else [])
    monkeypatch.setattr(module, "gate_model", lambda of: "serving_gate" if of == repo else "")
    result = sup.drain()
    assert seen == {
        "handle": sup.handle,
        "models": ["tensorrt_llm_bls", "ensemble"],
        "timeout": sup.handle.opts.exit_timeout_s,
        "log": sup.log,
        "alive": True,
        "gate": "serving_gate",
        "interruptible": True,  # a second signal ends the drain
    }
    assert sup._interruptible is False and result.seconds == 1.25
    assert sup.events[-1]["message"] == "drained in 1.2 s; 2 requests ran to their end"
    assert sup.events[-1]["kind"] == "drain" and sup.events[-1]["running_at_start"] == 2
    assert "models" not in sup.events[-1]
    sup.handle.opts = ServerOptions(repo=repo, models=("ensemble",))  # only some models loaded
    sup.drain()
    assert seen["models"] == ["ensemble"] and seen["gate"] is None
    sup.handle.opts = ServerOptions(repo=repo, models=("ensemble", "serving_gate"))
    sup.drain()
    assert seen["models"] == ["ensemble"] and seen["gate"] == "serving_gate"
    world.exit_code = 0
    sup.drain()
    assert seen["alive"] is False  # the server exited: the drain's wait ends
    sup.handle.process = None
    sup.drain()
    assert seen["alive"] is False


def test_a_clients_failure_is_matched_to_what_the_supervisor_saw(tmp_path, monkeypatch):
    """recovered_after: True once an event since the mark is a recovery, False when one failed and nothing recovered
    in time, None when it saw nothing within a few looks (the failure was not the server's)."""
    sup, _, _ = supervised(tmp_path, monkeypatch, {"m": 11}, poll_s=2.0)
    clock = scripted_clock(monkeypatch, 50.0)

    def sleep(seconds):
        clock.now += seconds

    monkeypatch.setattr(module.time, "sleep", sleep)
    assert sup.recovered_after(0, timeout=60.0) is None
    assert clock.now == pytest.approx(50.0 + 3 * 2.0 + 1.0, abs=0.21)  # three looks and a second, then no
    sup.events.append({"message": "the stub of m died", "kind": "stub_died"})
    clock.now = 100.0
    assert sup.recovered_after(0, timeout=30.0) is False and clock.now == pytest.approx(130.0, abs=0.21)
    sup.events.append({"message": "m serving again", "action": "reload"})
    assert sup.recovered_after(0, timeout=30.0) is True
    assert sup.recovered_after(2, timeout=0.0) is False  # nothing looked at in no time
    assert sup.recovered_after(1, timeout=0.0) is False  # not even a recovery already there


def test_a_start_resets_what_the_last_server_left(tmp_path, monkeypatch):
    sup, world, _ = supervised(tmp_path, monkeypatch, {"m": 11})
    del sup._start  # the real one, around a fake handle.start
    started = []
    sup.handle.start = lambda timeout, should_stop: started.append((timeout, should_stop())) or sup.handle
    sup._stub_died, sup._serving = {"m"}, False
    sup._unhealthy_log.offset = sup._crash_log.offset = 99
    sup._start(12.0)
    assert started == [(12.0, False)]
    assert (
        sup._expected == {"m_0_0": "m"}
        and sup._stub_died == set()
        and sup._unhealthy_log.offset == sup._crash_log.offset == 0
    )
    assert sup._serving
    assert sup.metrics.get("specbuild_supervisor_server_starts_total") == 1
    assert sup.metrics.get("specbuild_supervisor_serving") == 1


def test_for_repo_puts_the_log_and_metrics_beside_the_repository(tmp_path):
    (tmp_path / "triton_repo").mkdir()
    install = object()
    sup = Supervisor.for_repo(ServerOptions(repo=tmp_path / "triton_repo"), install=install)
    assert sup.handle.install is install
    assert sup.handle.log_path == tmp_path / ".triton_repo.tritonserver.log"
    assert sup.metrics.path == tmp_path / ".triton_repo.supervisor.prom"
    assert sup.settings == SupervisorSettings()
    messages = []
    sup = Supervisor.for_repo(
        ServerOptions(repo=tmp_path / "triton_repo"), object(), SupervisorSettings(poll_s=3.0), messages.append
    )
    sup._event("a thing happened", model="m")
    assert sup.settings.poll_s == 3.0 and messages == ["supervisor: a thing happened"]
    assert sup.events[0]["model"] == "m" and sup.events[0]["message"] == "a thing happened"


def test_model_ready_asks_tritons_ready_endpoint(tmp_path, monkeypatch, endpoint):
    url, seen, answers = endpoint
    (tmp_path / "repo").mkdir()
    sup = Supervisor(ServerOptions(repo=tmp_path / "repo"), install=object(), log_path=tmp_path / "log")
    monkeypatch.setattr(type(sup.handle), "http_url", property(lambda self: url))
    answers["/v2/models/m/ready"] = (200, "")
    assert sup._model_ready("m") is True
    assert sup._model_ready("n") is False  # 404: not ready
    assert [s[1] for s in seen] == ["/v2/models/m/ready", "/v2/models/n/ready"]
    assert sup._canary_model() == module.entry_model(tmp_path / "repo")


def test_a_restart_is_counted_logged_and_timed(tmp_path, monkeypatch):
    sup, _, calls = supervised(tmp_path, monkeypatch, {"m": 11})
    scripted_clock(monkeypatch, 200.0)
    sup._canary_failed = 2
    started = []
    fake_start = sup._start
    sup._start = lambda timeout: started.append(timeout) or fake_start(timeout)
    sup._restart("m", detected=197.51234)
    assert calls == [("stop", False), ("start",)] and sup._canary_failed == 0 and sup._restarts == [200.0]
    assert started == [sup.settings.start_timeout_s]
    assert sup.events[0]["message"] == "restarting tritonserver (killed; 0 shared-memory regions of it removed)"
    assert (
        sup.events[1]["message"] == f"tritonserver restarted, serving again (2.5 s after the failure; pid {SERVER_PID})"
    )
    assert (sup.events[1]["action"], sup.events[1]["seconds"], sup.events[1]["model"]) == ("restart", 2.488, "m")
    assert sup.metrics.get("specbuild_supervisor_recovery_seconds", model="m") == 2.488  # to the millisecond


def test_a_reload_is_counted_logged_and_timed(tmp_path, monkeypatch):
    sup, world, calls = supervised(tmp_path, monkeypatch, {"m": 11, "n": 12})
    scripted_clock(monkeypatch, 300.0)
    world.alive -= {"m_0_0", "n_0_0"}
    sup._recover({"m": ["m_0_0"], "n": ["n_0_0"]}, detected=298.76543)
    assert calls == [("unload", "m"), ("load", "m"), ("unload", "n"), ("load", "n")]
    assert [e["message"] for e in sup.events] == [
        "the Python backend stub of m (m_0_0) died",
        "the Python backend stub of n (n_0_0) died",
        "m serving again after an unload and load (1.2 s)",
        "n serving again after an unload and load (1.2 s)",
    ]
    assert (  # to the millisecond
        sup.events[2]["seconds"] == 1.235
        and sup.metrics.get("specbuild_supervisor_recovery_seconds", model="n") == 1.235
    )
    sup.events.clear()
    sup._recover({"m": ["m_0_0"]}, detected=299.0, reported=True)  # already reported (a hung stub): no "died"
    assert [e.get("kind") for e in sup.events] == [None]


def test_the_stop_reads_only_the_log_written_after_it_began(tmp_path, monkeypatch):
    """_lingering_only reads the log once when the stop begins, then only what follows it, for lingering_only."""
    sup, _, _ = supervised(tmp_path, monkeypatch, {"tensorrt_llm_draft": 11, "tensorrt_llm": 12})
    log = tmp_path / "server.log"
    log.write_text(
        "\"successfully loaded 'tensorrt_llm'\"\n\"successfully loaded 'tensorrt_llm_draft'\"\n"
        "\"successfully unloaded 'tensorrt_llm_draft' version 1\"\n"
    )
    sup._stub_died = {"tensorrt_llm_draft"}
    check = sup._lingering_only()
    assert check() is None  # nothing since: it may still stop by itself
    with log.open("a") as f:
        f.write("\"successfully unloaded 'tensorrt_llm' version 1\"\n")
        f.write('"Timeout 20: Found 1 live models and 0 in-flight non-inference requests"\n')
    assert "tensorrt_llm_draft, whose stub died holding a request" in check()
    log.unlink()
    assert check() is None  # a log that went away: no reason
    assert sup._lingering_only()() is None


def test_the_canary_runs_every_interval_and_its_result_is_read_on_a_later_look(tmp_path, monkeypatch):
    import threading

    sup, _, calls = supervised(tmp_path, monkeypatch, {"m": 11}, canary_interval_s=5.0, canary_timeout_s=7.0)
    clock = scripted_clock(monkeypatch, 0.0)
    probes = []

    class Probe:  # its request has failed by the next look
        def __init__(self, url, model, timeout):
            self.url, self.model, self.timeout, self.error = url, model, timeout, "connection reset"
            self.done = threading.Event()
            self.done.set()
            probes.append((url, model, timeout, clock.now))

    monkeypatch.setattr(module, "CanaryProbe", Probe)
    monkeypatch.setattr(sup, "_canary_model", lambda: "m")

    def looks(n):
        seen = iter(range(n + 1))

        def until():  # each look is a second later
            clock.now += 1.0
            return next(seen) >= n

        return until

    sup.watch(looks(9))  # looks at 1..9 s: a probe at 5 s, its result read at 6 s, the next due at 11 s
    assert probes == [(sup.handle.http_url, "m", 7.0, 5.0)]
    assert sup._canary_failed == 1 and sup.events[-1]["message"] == "canary through m failed (1/3): connection reset"
    assert calls == []
    sup.settings = SupervisorSettings(poll_s=0.0, canary_interval_s=0.5, canary_timeout_s=7.0)
    clock.now, probes[:] = 20.0, []
    sup.watch(looks(3))  # looks at 21, 22, 23 s: a probe at 21 s (due at 20.5 s), read at 22 s, one more at 23 s
    assert [p[3] for p in probes] == [21.0, 23.0]
    sup.settings = SupervisorSettings(poll_s=0.0, canary_interval_s=0.0)
    sup.watch(looks(5))
    assert len(probes) == 2  # an interval of 0: no canary


def test_a_stop_that_gave_up_on_an_old_instance_is_told_and_clean(tmp_path, monkeypatch):
    from specbuild.triton.server import StopResult

    sup, world, _ = supervised(tmp_path, monkeypatch, {"m": 11})
    world.stop_result = StopResult(-9, 3.5, abandoned="every other model had unloaded")
    outcome = sup.serve(lambda answers: None, once=True, canary_models=False)
    assert outcome["stop"]["abandoned"] == "every other model had unloaded" and outcome["stop"]["exit_code"] == -9
    assert sup.events[-1] == {
        "time": sup.events[-1]["time"],
        "message": "tritonserver was killed (SIGKILL) after 3.5 s, with nothing left to wait for: every other model "
        "had unloaded",
        "kind": "stop",
    }


def test_a_failure_and_an_unclean_stop_are_both_told(tmp_path, monkeypatch):
    from specbuild.triton.server import StopResult

    sup, world, _ = supervised(tmp_path, monkeypatch, {"m": 11})
    world.stop_result = StopResult(1, 12.0)
    said = []
    sup.log = said.append

    def broken(answers):
        raise RuntimeError("broken")

    with pytest.raises(RuntimeError):
        sup.serve(broken, once=True, canary_models=False)
    assert said[-1] == "tritonserver exited with code 1 after 12.0 s while stopping after the failure."


def test_a_server_not_yet_ready_when_the_signal_comes_is_stopped_at_once(tmp_path, monkeypatch):
    sup, world, calls = supervised(tmp_path, monkeypatch, {"m": 11})

    def start(timeout):  # the signal comes while it starts
        calls.append(("start",))
        sup.handle.process = world.process()
        sigterm()

    sup._start = start
    sup._serving = Supervisor(ServerOptions(repo=tmp_path / "repo"), object(), tmp_path / "log")._serving  # a new one's
    monkeypatch.setattr(sup.handle, "ready", lambda: False)
    outcome = sup.serve(lambda answers: None, canary_models=False)
    assert calls == [("start",), ("stop", False), ("stop", True)]  # killed at once; the final stop finds nothing
    assert outcome["stopped_by"] == "signal" and outcome["ready"] is False and "drain" not in outcome


def test_a_model_control_call_refused_because_the_server_exited_counts_the_exit(tmp_path, monkeypatch):
    """The unload's connection refused by a server that exited in between: the exit is the failure to count, once."""
    from specbuild.errors import ServeError

    sup, world, _ = supervised(tmp_path, monkeypatch, {"m": 11})

    def refused():
        world.exit_code = -signal.SIGABRT
        raise ServeError("unload of m failed: <urlopen error [Errno 111] Connection refused>")

    with pytest.raises(ServeError, match="^unloading m was cut short: tritonserver went down$"):
        sup._while_up("unloading m", refused)
    assert kinds(sup) == [("tritonserver", "server_exited")]
    assert sup.events[0]["message"].startswith("tritonserver exited with code -6 (SIGABRT)")


def test_the_server_log_is_read_once_from_where_the_last_look_ended(tmp_path):
    """Only what was written since (at most the last MiB); a shorter file is a new log, read from its start; bytes
    that are not UTF-8 are replaced, not an error; no file, no news."""
    log = tmp_path / "server.log"
    follower = module.LogFollower(log)
    assert follower.news() == ""
    log.write_bytes(b"first\n")
    assert follower.news() == "first\n"
    assert follower.news() == ""
    with open(log, "ab") as out:
        out.write(b"second \xff\n")
    assert follower.news() == "second \ufffd\n"
    log.write_bytes(b"new\n")  # rotated: shorter than what was read
    assert follower.news() == "new\n"
    log.write_bytes(b"x" * 10 + b"y" * (1 << 20))
    assert follower.news() == "y" * (1 << 20)
    with open(log, "ab") as out:
        out.write(b"z")
    follower.skip()
    assert follower.news() == ""


def test_a_crash_seen_with_no_server_process_names_no_pid(tmp_path, monkeypatch):
    sup, _, _ = supervised(tmp_path, monkeypatch, {"m": 11})
    sup.handle.process = None
    with open(tmp_path / "server.log", "a") as log:
        log.write(CRASH_LOG)
    assert sup._crash_in_log().startswith("tritonserver (pid ?) crashed: ")


def test_a_reload_cut_short_in_its_unload_says_so(tmp_path, monkeypatch):
    sup, world, calls = supervised(tmp_path, monkeypatch, {"m": 11})

    def control(action, model, timeout=600.0):
        calls.append((action, model))
        world.exit_code = -signal.SIGKILL
        raise module.ServeError(f"{action} of {model} failed: Connection refused")

    sup.handle.model_control = control
    world.alive.discard("m_0_0")
    one_look(sup)
    assert calls == [("unload", "m"), ("stop", False), ("start",)]
    assert sup.events[2]["message"] == "reloading m did not help (unloading m was cut short: tritonserver went down)"


def test_an_abandoned_model_control_request_never_holds_serve_at_exit(tmp_path, monkeypatch):
    """The request left waiting on a server that went down runs in a daemon thread, named for what it does."""
    import threading

    sup, world, _ = supervised(tmp_path, monkeypatch, {"m": 11})
    released = threading.Event()

    def hangs():
        world.exit_code = -signal.SIGABRT
        released.wait(60)

    before = set(threading.enumerate())  # another test's thread of the same name may not have ended yet
    try:
        with pytest.raises(module.ServeError):
            sup._while_up("loading m", hangs)
        waiting = [t for t in threading.enumerate() if t.name == "supervisor loading m" and t not in before]
        assert len(waiting) == 1 and waiting[0].daemon
    finally:
        released.set()


def test_a_model_with_several_dead_instances_names_each(tmp_path, monkeypatch):
    sup, world, calls = supervised(tmp_path, monkeypatch, {"m": 11})
    world.stubs["m_1_0"] = procfs.Stub(12, "m_1_0", "m", "r")
    sup._expected["m_1_0"] = "m"
    world.alive -= {"m_0_0", "m_1_0"}
    sup.handle.model_control = lambda action, model, timeout=600.0: calls.append((action, model))  # nothing back
    one_look(sup)
    assert sup.events[0]["message"] == "the Python backend stub of m (m_0_0, m_1_0) died"
    assert sup.events[1]["message"] == (
        "reloading m did not help (no live stub for m_0_0, m_1_0 after unload and load)"
    )


@pytest.mark.parametrize("error", [ProcessLookupError, PermissionError])
def test_a_hung_stub_that_cannot_be_signalled_is_still_recovered(tmp_path, monkeypatch, error):
    """Gone before the kill (ProcessLookupError) or not ours to kill (PermissionError): the recovery goes on."""
    sup, world, calls = supervised(tmp_path, monkeypatch, {"m": 11})
    world.frozen.add(11)

    def refuse(pid, sig):
        raise error()

    monkeypatch.setattr(module.os, "kill", refuse)
    one_look(sup)
    assert ("unload", "m") in calls and ("load", "m") in calls


def test_serve_runs_the_canary_by_default_and_hands_its_answers_on(tmp_path, monkeypatch):
    sup, _, _ = supervised(tmp_path, monkeypatch, {"m": 11})
    asked = []
    monkeypatch.setattr(module, "canary", lambda handle: asked.append(handle) or {"m": "an answer"})
    ready = []
    sup.serve(ready.append, once=True)
    assert asked == [sup.handle] and ready == [{"m": "an answer"}]


def test_serve_starts_within_its_timeout_or_the_settings(tmp_path, monkeypatch):
    sup, _, _ = supervised(tmp_path, monkeypatch, {"m": 11}, start_timeout_s=45.0)
    started = []
    fake_start = sup._start
    sup._start = lambda timeout: started.append(timeout) or fake_start(timeout)
    sup.serve(lambda answers: None, once=True, canary_models=False, timeout=7.0)
    sup.serve(lambda answers: None, once=True, canary_models=False)
    assert started == [7.0, 45.0]


@pytest.mark.parametrize("supervise", [True, False])
def test_until_is_watched_only_with_once(tmp_path, monkeypatch, supervise):
    """`once` with `until`: supervised (or not) until it holds; `until` without `once` means nothing: serve waits for a
    signal; `once` alone returns at once. The outcome says which stop it was."""
    sup, _, _ = supervised(tmp_path, monkeypatch, {"m": 11}, enabled=supervise)
    waited = []
    if supervise:
        sup.watch = waited.append
    else:
        sup._wait_unsupervised = waited.append
    until = lambda: True  # noqa: E731
    assert sup.serve(lambda answers: None, once=True, canary_models=False, until=until)["stopped_by"] == "once"
    assert sup.serve(lambda answers: None, canary_models=False, until=until)["stopped_by"] == "signal"
    assert sup.serve(lambda answers: None, once=True, canary_models=False)["stopped_by"] == "once"
    assert waited == [until, None]
    assert sup._interruptible is False and sup._serving is False  # serve's own state, reset when it ends


def test_an_unclean_stop_says_why_from_the_log_or_the_drain(tmp_path, monkeypatch):
    from specbuild.errors import ServeError
    from specbuild.triton.drain import DrainResult
    from specbuild.triton.server import StopResult

    sup, world, _ = supervised(tmp_path, monkeypatch, {"m": 11})
    world.stop_result = StopResult(1, 30.4567)
    sup.handle.stop_diagnosis = lambda: "tritonserver waited for models to unload (1 live models)"
    with pytest.raises(ServeError) as error:
        sup.serve(lambda answers: None, once=True, canary_models=False)
    assert str(error.value) == (
        "tritonserver did not stop cleanly: it exited with code 1 after 30.5 s (--exit-timeout-secs="
        f"{sup.handle.opts.exit_timeout_s}). tritonserver waited for models to unload (1 live models). See the server "
        f"log: {sup.handle.log_path}"
    )
    sup.handle.stop_diagnosis = lambda: ""
    failed = DrainResult(["m"], 1.0, 1, None, "error", "the drain's own error")
    sup.drain = lambda: failed
    with pytest.raises(ServeError) as error:
        sup.serve(lambda answers: sigterm(), canary_models=False)
    assert f"(--exit-timeout-secs={sup.handle.opts.exit_timeout_s}). {failed.describe()}. See the server" in str(
        error.value
    )
    sup.drain = lambda: _drained()
    with pytest.raises(ServeError) as error:
        sup.serve(lambda answers: sigterm(), canary_models=False)
    assert f"(--exit-timeout-secs={sup.handle.opts.exit_timeout_s}). See the server log" in str(error.value)


def test_the_stops_seconds_are_rounded_to_hundredths(tmp_path, monkeypatch):
    from specbuild.triton.server import StopResult

    sup, world, _ = supervised(tmp_path, monkeypatch, {"m": 11})
    world.stop_result = StopResult(0, 2.3456)
    assert sup.serve(lambda answers: None, once=True, canary_models=False)["stop"]["seconds"] == 2.35


# ---- edges the mutation run showed untested (docs/mutation.md) ---------------------------------------------------
def test_a_signal_interrupts_once_then_only_asks_to_stop(tmp_path, monkeypatch):
    """The handler raises StopRequested only while interruptible, and turns that off as it does: a second signal
    while the first is being handled (the drain's set-up) must not raise inside the handling."""
    from specbuild.triton.server import StopRequested

    sup, _, _ = supervised(tmp_path, monkeypatch, {"m": 11})
    previous = sup._install_signals()
    try:
        sup._interruptible = True
        with pytest.raises(StopRequested):
            sigterm()
        assert sup._interruptible is False and sup._stop.is_set()
        sigterm()  # only the flag, already set
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_a_signal_after_serve_once_started_says_signal(tmp_path, monkeypatch):
    sup, _, _ = supervised(tmp_path, monkeypatch, {"m": 11})
    monkeypatch.setattr(sup, "_answering", lambda: False)
    assert sup.serve(lambda answers: sigterm(), once=True, canary_models=False)["stopped_by"] == "signal"


def test_only_the_models_the_server_loads_are_expected_to_have_a_stub(tmp_path, monkeypatch):
    sup, _, _ = supervised(tmp_path, monkeypatch, {"m": 11, "n": 12})
    only_m = Supervisor(ServerOptions(repo=sup.handle.opts.repo, models=("m",)), object(), tmp_path / "log")
    assert only_m._python_models == ["m"] and sup._python_models == ["m", "n"]


def test_a_server_is_answering_only_while_its_process_runs(tmp_path, monkeypatch):
    sup, world, _ = supervised(tmp_path, monkeypatch, {"m": 11})
    monkeypatch.setattr(sup.handle, "ready", lambda: False)
    assert sup._answering() is True  # serving since its start
    sup._serving = False
    assert sup._answering() is False  # not serving, and not (yet) ready
    sup.handle.ready = lambda: True
    assert sup._answering() is True  # ready before serve's own checks ended: clients may be there
    world.exit_code, sup._serving = 1, True
    assert sup._answering() is False
    sup.handle.process = None
    assert sup._answering() is False


def test_an_event_is_stamped_to_the_millisecond(tmp_path, monkeypatch):
    sup, _, _ = supervised(tmp_path, monkeypatch, {"m": 11})
    monkeypatch.setattr(module.time, "time", lambda: 1765000000.123456)
    sup._event("a thing")
    assert sup.events == [{"time": 1765000000.123, "message": "a thing"}]


def test_an_exit_message_names_the_code_a_known_signal_and_the_logs_last_five_lines(tmp_path, monkeypatch):
    sup, world, _ = supervised(tmp_path, monkeypatch, {"m": 11})
    log = tmp_path / "server.log"
    log.write_text("".join(f"line {i}\n" for i in range(1, 8)))
    world.exit_code = -99  # no such signal: the code alone
    message = sup._exit_message(world.process())
    assert message == "tritonserver exited with code -99; last lines of its log:\n" + "\n".join(
        f"line {i}" for i in range(3, 8)
    )
    log.write_text("")
    world.exit_code = 1
    assert sup._exit_message(world.process()) == "tritonserver exited with code 1"  # an empty log: nothing added
    assert sup._exit_message(None) == "tritonserver exited with code None"  # never started


@pytest.mark.parametrize(
    ("clock", "alive_at", "expected"),
    [
        ([100.0, 101.0], 2, True),  # not yet at the first look, alive at the second
        ([100.0, 103.0], 2, False),  # the bound (3 s) reached at the first look: no second
    ],
)
def test_new_stubs_are_waited_for_three_seconds(tmp_path, monkeypatch, clock, alive_at, expected):
    sup, _, _ = supervised(tmp_path, monkeypatch, {"m": 11})
    times, looks, sleeps = iter(clock), [], []
    monkeypatch.setattr(module.time, "monotonic", lambda: next(times))
    monkeypatch.setattr(module.time, "sleep", sleeps.append)

    def live():
        looks.append(1)
        return {"m_0_0": "m"} if len(looks) >= alive_at else {}

    sup._live_instances = live
    assert sup._instances_live(["m_0_0"]) is expected
    assert sleeps == ([0.2] if expected else [])


def test_the_stubs_are_read_from_the_servers_own_process(tmp_path, monkeypatch):
    sup, world, _ = supervised(tmp_path, monkeypatch, {"m": 11})
    asked = []
    monkeypatch.setattr(module.procfs, "python_stubs", lambda pid: asked.append(pid) or [world.stubs["m_0_0"]])
    assert sup._live_instances() == {"m_0_0": "m"} and sup.hung_stubs() == {}
    assert asked == [SERVER_PID, SERVER_PID]
    sup.handle.process = None
    assert sup._live_instances() == {} and sup.hung_stubs() == {} and len(asked) == 2


@pytest.mark.parametrize(("age", "hung"), [(5.0, True), (4.9, False), (None, False)])
def test_a_stub_named_not_healthy_is_hung_from_five_seconds_of_age(tmp_path, monkeypatch, age, hung):
    """A younger one was started after the failure that named its instance: the line is about its predecessor. A stub
    whose age cannot be read counts as young."""
    sup, _, _ = supervised(tmp_path, monkeypatch, {"m": 11, "n": 12})
    monkeypatch.setattr(module.procfs, "age_seconds", lambda pid: age if pid == 11 else 60.0)
    assert module.FRESH_STUB_S == 5.0
    found = sup.hung_stubs({"m_0_0"})
    assert [stub.instance for stub in found] == (["m_0_0"] if hung else [])


def test_a_readiness_check_of_a_server_that_never_answers_is_bounded(tmp_path, monkeypatch, silent_endpoint):
    (tmp_path / "repo").mkdir()
    sup = Supervisor(ServerOptions(repo=tmp_path / "repo"), install=object(), log_path=tmp_path / "log")
    monkeypatch.setattr(type(sup.handle), "http_url", property(lambda self: silent_endpoint))
    monkeypatch.setattr(module, "READY_TIMEOUT_S", 0.2)
    assert sup._model_ready("m") is False


def test_the_stubs_a_drain_takes_with_it_are_no_dead_stubs_at_the_stop(tmp_path, monkeypatch):
    models = {"tensorrt_llm_bls": 11, "serving_gate": 12, "tensorrt_llm_draft": 13}
    sup, world, _ = supervised(tmp_path, monkeypatch, models)
    monkeypatch.setattr(module, "entry_models", lambda repo: ["tensorrt_llm_bls"])
    monkeypatch.setattr(module, "gate_model", lambda repo: "serving_gate")
    world.alive.clear()
    assert sup._models_with_dead_stubs() == {"tensorrt_llm_draft"}
    world.exit_code = 0
    assert sup._models_with_dead_stubs() == set()  # the server is gone: its stubs with it


@pytest.mark.parametrize(("alive_looks", "seconds"), [(2, 2.0), (99, 5.0)])
def test_a_hung_stubs_recovery_is_timed_from_its_detection_through_the_kill_wait(
    tmp_path, monkeypatch, alive_looks, seconds
):
    """Up to 5 s for the killed stub to go (a look every 0.05 s), then the reload: the recovery's seconds count from
    when the stub was found hung."""
    sup, world, _ = supervised(tmp_path, monkeypatch, {"m": 11})
    clock, sleeps, looks = scripted_clock(monkeypatch, 100.0), [], []

    def sleep(s):
        sleeps.append(s)
        clock.now += 1.0  # whole seconds: the bound's edge is exact

    def alive(pid):
        looks.append(pid)
        return pid == 11 and len(looks) <= alive_looks

    monkeypatch.setattr(module.time, "sleep", sleep)
    monkeypatch.setattr(module.procfs, "alive", alive)
    world.alive.discard("m_0_0")
    sup._recover_hung({world.stubs["m_0_0"]: "is frozen"})
    assert sleeps == [0.05] * int(seconds) and set(looks) == {11}
    assert sup.events[-1]["action"] == "reload" and sup.events[-1]["seconds"] == seconds


def test_restarts_older_than_the_window_are_forgotten(tmp_path, monkeypatch):
    from specbuild.errors import ServeError

    sup, _, _ = supervised(tmp_path, monkeypatch, {"m": 11}, max_restarts=1, restart_window_s=600.0)
    clock = scripted_clock(monkeypatch, 700.0)
    sup._restarts = [100.0]  # exactly the window ago: out of it
    sup._restart("m", 700.0)
    assert sup._restarts == [700.0]
    clock.now = 1299.0
    with pytest.raises(ServeError, match="needed 1 restarts within 600 s; giving up"):
        sup._restart("m", 1299.0)


def test_a_restart_counts_the_shared_memory_regions_its_stop_removed(tmp_path, monkeypatch):
    from specbuild.errors import ServeError
    from specbuild.triton.server import StopResult

    sup, world, _ = supervised(tmp_path, monkeypatch, {"m": 11})
    world.stop_result = StopResult(-9, 0.1, removed_regions=["/a", "/b"])
    sup._restart("m", module.time.monotonic())
    assert sup.events[0]["message"] == "restarting tritonserver (killed; 2 shared-memory regions of it removed)"

    def start(timeout):
        raise ServeError("it did not start")

    sup._start = start
    with pytest.raises(ServeError):
        sup._restart("m", module.time.monotonic())
    assert not sup._serving and sup.metrics.get("specbuild_supervisor_serving") == 0


def test_without_supervision_the_wait_ends_on_a_stop_or_until_and_a_running_server_is_left_alone(tmp_path, monkeypatch):
    sup, _, _ = supervised(tmp_path, monkeypatch, {"m": 11}, enabled=False)
    looks = iter([False, True])
    sup._wait_unsupervised(lambda: next(looks))  # the server runs: one look, then until() holds
    sup.request_stop()
    sup._wait_unsupervised()  # stopped: returns


def test_the_quiet_wait_for_a_clients_failure_ends_at_three_looks_and_a_second(tmp_path, monkeypatch):
    sup, _, _ = supervised(tmp_path, monkeypatch, {"m": 11}, poll_s=2.0)
    clock, sleeps = scripted_clock(monkeypatch, 10.0), []

    def sleep(seconds):
        sleeps.append(seconds)
        clock.now += 7.0  # to the edge at once: 10 + 3 x 2 + 1

    monkeypatch.setattr(module.time, "sleep", sleep)
    assert sup.recovered_after(0, timeout=60.0) is None and sleeps == [0.2]


def test_the_stop_reads_a_log_that_is_not_utf8(tmp_path, monkeypatch):
    sup, _, _ = supervised(tmp_path, monkeypatch, {"tensorrt_llm_draft": 11})
    log = tmp_path / "server.log"
    log.write_bytes(b"\"successfully loaded 'tensorrt_llm_draft'\"\n\xff\n")
    sup._stub_died = {"tensorrt_llm_draft"}
    check = sup._lingering_only()
    with log.open("ab") as f:
        f.write(b'\xfe\n"Timeout 20: Found 1 live models and 0 in-flight non-inference requests"\n')
    assert "tensorrt_llm_draft, whose stub died holding a request" in check()


def test_the_log_follower_reads_up_to_the_end_it_measured(tmp_path, monkeypatch):
    """A log that grows while it is read: what came after the measured end is read at the next look, once."""
    import io

    path = tmp_path / "server.log"
    path.write_bytes(b"one\n")
    follower = module.LogFollower(path)
    assert follower.news() == "one\n"
    path.write_bytes(b"one\ntwo\n")

    class Growing(io.BytesIO):  # the server writes a line just after the follower measured the end
        def seek(self, offset, whence=0):
            at = super().seek(offset, whence)
            if whence == 2:
                self.write(b"three\n")
                super().seek(at)
            return at

    monkeypatch.setattr(module, "open", lambda p, mode: Growing(Path(p).read_bytes()), raising=False)
    assert follower.news() == "two\n"
    path.write_bytes(b"one\ntwo\nthree\n")
    monkeypatch.undo()
    assert follower.news() == "three\n"
    assert follower.news() == ""


def test_a_failed_canary_that_names_a_hung_stub_recovers_it_at_once(tmp_path, monkeypatch):
    """Triton's answer names the stub it found not healthy: that stub is killed and its model reloaded on this first
    failure, without waiting for canary_failures of them."""
    sup, world, calls = supervised(tmp_path, monkeypatch, {"m": 11, "n": 12}, canary_failures=3)

    def kill(pid, sig):
        world.killed.append((pid, sig))
        world.alive.discard("n_0_0")

    monkeypatch.setattr(module.os, "kill", kill)
    sup._canary_result(SimpleNamespace(model="m", error="Stub process 'n_0_0' is not healthy."))
    assert world.killed == [(12, signal.SIGKILL)] and calls == [("unload", "n"), ("load", "n")]
    assert kinds(sup) == [("n", "stub_hung"), ("n", "reload")] and sup._canary_failed == 0
    assert sup.metrics.get("specbuild_supervisor_canary_total", result="failed") == 1
