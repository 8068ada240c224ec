"""Keep a tritonserver serving: start it, watch its models, recover from failures, stop it.

`Supervisor.serve` is what `specbuild serve` and `specbuild up` run. Why a supervisor is needed with
tritonserver 2.51 (python_backend r24.10):
- a Python backend stub that dies is never restarted (the restart was removed in r24.06; src/python_be.cc
  keeps only "TODO: Implement restart on decoupled"), and the server's and the model's ready endpoints
  stay 200 (core src/server.cc reads only the model lifecycle state). Requests to a non-decoupled model
  with a dead stub fail "Stub process '<instance>' is not healthy." within about 1 s;
- a decoupled model's (the BLS's, a decoupled llmapi `tensorrt_llm`'s) streams hang forever when its stub
  dies: nothing on the server side tracks the open response factories, and the model can then never be
  unloaded.

What it does, every `poll_s` (1 s): the server process exited, or its log says it crashed (see CRASH) -> restart
it; a model's stub is dead
(/proc: gone or a zombie) -> a non-decoupled model is reloaded through the model-repository API (unload,
then load: new instances, new stubs), a decoupled model gets a server restart (SIGKILL, which also ends the hung
streams); every `canary_interval_s` one short request goes through the BLS (an llmapi repository: its one
model, `tensorrt_llm`), and `canary_failures` failures in a row restart the server. Each event is logged
and counted in a Prometheus text file (node_exporter's textfile-collector format) beside the server log.

Restarts come from the thread that runs `serve` (the main thread), so the server's parent-death signal
stays tied to a thread that outlives it (PR_SET_PDEATHSIG fires when the forking thread exits).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbuild.contract import models
from specbuild.errors import ServeError
from specbuild.triton import drain, procfs
from specbuild.triton.canary import CanaryProbe, canary, entry_model, entry_models, gate_model
from specbuild.triton.drain import DrainResult
from specbuild.triton.server import ServerHandle, ServerOptions, StopRequested, TritonInstall

# The answer to a request past a full queue: the BLS's (specbuild.triton.models.bls), in the words of Triton's own
# (core src/scheduler_utils.cc, PolicyQueue::Enqueue). The server is busy, not broken, so a canary that gets it is
# neither a success nor a failure.
QUEUE_FULL = "Exceeds maximum queue size"
UNHEALTHY = models.UNHEALTHY_STUB  # Triton's answer for a model whose stub is dead or hung
LOADED = re.compile(r"successfully loaded '([^']+)'")
UNLOADED = re.compile(r"successfully unloaded '([^']+)'")
LIVE = re.compile(r"Timeout \d+: Found (\d+) live models")  # core src/server.cc, once a second while it stops
# tritonserver's handler for SIGSEGV and SIGABRT (server src/triton_signal.cc, ErrorSignalHandler) writes this line
# and a stack trace to stderr, then raises the signal again with its default action. Until the process is gone it
# keeps its ports and answers nothing: a CI run saw the server abort in python_backend's
# TRITONBACKEND_ModelInstanceExecute after a stub was killed mid-request, then stay alive for ten minutes while the
# supervisor's model load waited on it. So the line itself is the crash: the server is killed and restarted at once.
CRASH = re.compile(r"^Signal \((?:6|11)\) received\.$", re.MULTILINE)


def lingering_only(before_stop: str, since_stop: str, stub_died: set[str]) -> str | None:
    """From tritonserver's log: why its stop can only wait for old instances of models whose stub died (every other
    model still loaded when the stop began has unloaded since, and it still counts live models, no more than such
    models: their instance reloaded since or not); None while anything else may still finish."""
    loaded = set(LOADED.findall(before_stop)) - set(UNLOADED.findall(before_stop))  # the drain unloads the entry ones
    unloads = list(UNLOADED.finditer(since_stop))
    counts = list(LIVE.finditer(since_stop))
    if not stub_died or not counts or not loaded - stub_died <= {m.group(1) for m in unloads}:
        return None
    if unloads and counts[-1].start() < unloads[-1].start():  # not counted since the last unload: it may exit now
        return None
    live = int(counts[-1].group(1))
    if not 0 < live <= len(stub_died):
        return None
    return (
        f"every other model had unloaded, and tritonserver waited only for {live} old instance(s) of "
        f"{', '.join(sorted(stub_died))}, whose stub died holding a request (they never unload)"
    )


# A stub this young was started after the failure that named its instance (a reload or restart just made it): a
# "not healthy" line read now is about its predecessor.
FRESH_STUB_S = 5.0
READY_TIMEOUT_S = 5.0  # a model's readiness check (Triton answers it at once unless the server hangs)


class LogFollower:
    """What a log file gained since the last look (at most its last MiB); a file shorter than what was read is a
    new one (each start rotates the server log), read from its start."""

    def __init__(self, path: Path):
        self.path, self.offset = Path(path), 0

    def news(self) -> str:
        try:
            with open(self.path, "rb") as log:
                end = log.seek(0, os.SEEK_END)
                if end < self.offset:
                    self.offset = 0
                log.seek(max(self.offset, end - (1 << 20)))
                text = log.read(end - log.tell()).decode(errors="replace")
                self.offset = end
        except OSError:
            return ""
        return text

    def skip(self) -> None:
        """What the file says up to now is already dealt with."""
        with contextlib.suppress(OSError):
            self.offset = self.path.stat().st_size


@dataclass(frozen=True)
class SupervisorSettings:
    enabled: bool = True  # False: start, canary, serve until a signal, stop (no watching)
    poll_s: float = 1.0  # process and stub checks
    canary_interval_s: float = 10.0  # a request through the BLS (llmapi: tensorrt_llm) this often; 0 = none
    canary_timeout_s: float = 30.0
    canary_failures: int = 3  # consecutive canary failures that restart the server
    max_restarts: int = 5  # server restarts allowed within restart_window_s before giving up
    restart_window_s: float = 600.0
    start_timeout_s: float = 600.0  # readiness wait, first start and restarts


class SupervisorMetrics:
    """The supervisor's counters and gauges, in a registry of their own (prometheus_client), written to `path` as a
    Prometheus text file after every change (`write_to_textfile`: a temporary file renamed into place, so a reader
    never sees half a file). Label names are sorted, as the file shows them."""

    COUNTERS = {
        "specbuild_supervisor_failures_total": ("Failures detected, by model and kind.", ("kind", "model")),
        "specbuild_supervisor_recoveries_total": (
            "Recoveries, by model and action (reload, restart).",
            ("action", "model"),
        ),
        "specbuild_supervisor_server_starts_total": ("tritonserver starts, the first one included.", ()),
        "specbuild_supervisor_canary_total": ("Periodic canary requests, by result.", ("result",)),
    }
    GAUGES = {
        "specbuild_supervisor_recovery_seconds": (
            "Seconds from detection to serving again, last recovery.",
            ("model",),
        ),
        "specbuild_supervisor_serving": ("Whether the server is ready and watched (1) or not (0).", ()),
    }

    def __init__(self, path: Path | None):
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.path = path
        self.registry = CollectorRegistry()
        self.metrics = {
            name: Counter(name, text, labels, registry=self.registry) for name, (text, labels) in self.COUNTERS.items()
        }
        self.metrics.update(
            {name: Gauge(name, text, labels, registry=self.registry) for name, (text, labels) in self.GAUGES.items()}
        )

    def _child(self, name: str, labels: dict[str, str]):
        metric = self.metrics[name]
        return metric.labels(**labels) if labels else metric

    def add(self, name: str, amount: float = 1.0, **labels: str) -> None:
        self._child(name, labels).inc(amount)
        self.write()

    def set(self, name: str, value: float, **labels: str) -> None:
        self._child(name, labels).set(value)
        self.write()

    def get(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def write(self) -> None:
        if self.path is not None:
            from prometheus_client import write_to_textfile

            write_to_textfile(str(self.path), self.registry)


def python_models(repo: Path, only: tuple[str, ...] | None = None) -> list[str]:
    """The repository's Python-backend models (each instance runs in a stub), those in `only` if given."""
    found = []
    for config in sorted(Path(repo).glob("*/config.pbtxt")):
        model = config.parent.name
        if (only is None or model in only) and re.search(r'\bbackend\s*:\s*"python"', config.read_text()):
            found.append(model)
    return found


def is_decoupled(repo: Path, model: str) -> bool:
    """The model's config says `model_transaction_policy { decoupled: true }`."""
    try:
        text = (Path(repo) / model / "config.pbtxt").read_text()
    except OSError:
        return False
    return re.search(r"\bdecoupled\s*:\s*true\b", text) is not None


class Supervisor:
    def __init__(
        self,
        options: ServerOptions,
        install: TritonInstall,
        log_path: Path,
        settings: SupervisorSettings | None = None,
        metrics_path: Path | None = None,
        log: Callable[[str], None] = lambda message: None,
    ):
        self.handle = ServerHandle(options, install, log_path=log_path)
        self.settings = settings or SupervisorSettings()
        self.metrics = SupervisorMetrics(metrics_path)
        self.log = log
        self.events: list[dict[str, Any]] = []  # what happened, in order (also logged)
        self._stop = threading.Event()
        self._interruptible = False  # while True, a signal raises StopRequested in the main thread
        self._expected: dict[str, str] = {}  # instance name -> model, the stubs that must be alive
        self._python_models = python_models(options.repo, options.models)
        self._restarts: list[float] = []
        self._canary_failed = 0
        self._serving = False  # the server is up and has been ready since its last start
        self._follow_new_log()
        self._stub_died: set[str] = set()  # models whose stub died since this server started: an old instance may
        # linger (supervisor._lingering_only), whether or not its reload was done when the stop came

    @classmethod
    def for_repo(
        cls,
        options: ServerOptions,
        install: TritonInstall,
        settings: SupervisorSettings | None = None,
        log: Callable[[str], None] = lambda message: None,
    ) -> Supervisor:
        """The log and metrics files beside the repository: .<repo>.tritonserver.log, .<repo>.supervisor.prom."""
        repo = Path(options.repo).resolve()
        return cls(
            options,
            install,
            repo.parent / f".{repo.name}.tritonserver.log",
            settings,
            repo.parent / f".{repo.name}.supervisor.prom",
            log,
        )

    # ---- the whole run ---------------------------------------------------------------------------
    def serve(
        self,
        on_ready: Callable[[dict[str, str]], None],
        once: bool = False,
        canary_models: bool = True,
        timeout: float | None = None,
        until: Callable[[], bool] | None = None,
    ) -> dict[str, Any]:
        """Start, canary, call on_ready(canary answers), watch until SIGINT/SIGTERM (or, with `once`, return at
        once, or as soon as until() holds, watching until then: work on_ready started in a thread is supervised
        like any other client's), then stop. A signal while serving drains first (specbuild.triton.drain): the running
        requests finish, new ones are refused, within the server's exit timeout; a second signal stops at
        once. Raises ServeError when starting failed, the drain cut requests, or the stop was not clean."""
        outcome: dict[str, Any] = {"stopped_by": "once" if once else "signal", "ready": False}
        previous = self._install_signals()
        failure: BaseException | None = None
        drained: DrainResult | None = None
        try:
            self._interruptible = True  # from here a signal raises StopRequested, except in _uninterrupted()
            self._start(timeout or self.settings.start_timeout_s)
            answers = canary(self.handle) if canary_models else {}
            outcome["ready"] = True
            on_ready(answers)
            if not once or until is not None:
                if self.settings.enabled:
                    self.watch(until if once else None)
                else:
                    self._wait_unsupervised(until if once else None)
        except StopRequested:
            outcome["stopped_by"] = "signal"
            if self._answering():
                drained = self.drain()
            elif not self._serving:  # stopped before it answered ready: nothing to drain or wait for
                self.handle.stop(graceful=False)
        except BaseException as err:  # re-raised below, after the server is stopped
            failure = err
        finally:
            self._interruptible = False
            self._stub_died.update(self._models_with_dead_stubs())  # died since the last look: not recovered
            result = self.handle.stop(
                graceful=drained is None or not drained.cut_short,
                abandon=self._lingering_only() if self._stub_died else None,
            )
            self._serving = False
            self.metrics.set("specbuild_supervisor_serving", 0)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        outcome["restarts"] = len(self._restarts)
        outcome["events"] = self.events
        if drained is not None:
            outcome["drain"] = drained.to_dict()
        if result is not None:
            outcome["stop"] = {
                "exit_code": result.code,
                "seconds": round(result.seconds, 2),
                "killed": result.killed,
                "removed_shm_regions": len(result.removed_regions),
                "abandoned": result.abandoned,
            }
            if result.abandoned:
                self._event(f"tritonserver {result.describe()}", kind="stop")
        if failure is not None:
            if result is not None and not result.clean:
                self.log(f"tritonserver {result.describe()} while stopping after the failure.")
            raise failure
        if drained is not None and drained.cut_short and drained.cut != 0:
            raise ServeError(
                f"{drained.describe()}; tritonserver was then killed. Clients of the cut requests got "
                f"an error (their stream ended). See the server log: {self.handle.log_path}"
            )
        if result is not None and not result.clean and (drained is None or not drained.cut_short):
            why = self.handle.stop_diagnosis() or (drained.describe() if drained and drained.error else "")
            raise ServeError(
                f"tritonserver did not stop cleanly: it {result.describe()} "
                f"(--exit-timeout-secs={self.handle.opts.exit_timeout_s}). "
                + (f"{why}. " if why else "")
                + f"See the server log: {self.handle.log_path}"
            )
        return outcome

    def _answering(self) -> bool:
        """Whether clients may hold requests on the server now, so that a stop must drain them: it serves, or it
        already answers ready while serve's own start-up checks (the rest of the start, the canary) have not
        ended: a load balancer or a readiness probe routes to it from its first ready answer."""
        process = self.handle.process
        if process is None or process.poll() is not None:
            return False
        return self._serving or self.handle.ready()

    def drain(self) -> DrainResult:
        """Close the serving gate, unload the entry models and wait for their requests (specbuild.triton.drain),
        within the server's exit timeout; a second signal ends the wait. Logs and records the result."""
        loaded = lambda model: self.handle.opts.models is None or model in self.handle.opts.models  # noqa: E731
        models = [m for m in entry_models(self.handle.opts.repo) if loaded(m)]
        gate = gate_model(self.handle.opts.repo)
        gate = gate if gate and loaded(gate) else None
        self._interruptible = True  # a second signal raises StopRequested inside the drain
        try:
            result = drain.drain(
                self.handle,
                models,
                self.handle.opts.exit_timeout_s,
                self.log,
                server_alive=lambda: self.handle.process is not None and self.handle.process.poll() is None,
                gate=gate,
            )
        finally:
            self._interruptible = False
        self._event(result.describe(), kind="drain", **{k: v for k, v in result.to_dict().items() if k != "models"})
        return result

    def _wait_unsupervised(self, until: Callable[[], bool] | None = None) -> None:
        """Until a signal (or until() holds), or until the server exits (nobody restarts it without the supervisor)."""
        while not self._stop.wait(self.settings.poll_s) and not (until is not None and until()):
            process = self.handle.process
            if process is None or process.poll() is not None:
                raise ServeError(f"{self._exit_message(process)}\n(--no-supervise: not restarted)")

    def recovered_after(self, mark: int, timeout: float) -> bool | None:
        """After a client's request failed: whether the supervisor saw a failure among its events from index `mark`
        on and the server serves again (True), saw one and it did not recover within `timeout` (False), or saw
        none within a few checks (None: the failure was not the server's, e.g. a refused request)."""
        deadline, quiet = time.monotonic() + timeout, time.monotonic() + 3 * self.settings.poll_s + 1.0
        while time.monotonic() < deadline:
            since = self.events[mark:]
            if any("action" in event for event in since):
                return True
            if not any("kind" in event for event in since) and time.monotonic() >= quiet:
                return None
            time.sleep(0.2)
        return False

    def request_stop(self) -> None:
        self._stop.set()

    def _install_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}  # signals reach only the main thread; a caller elsewhere uses request_stop()

        def on_signal(signum, frame) -> None:
            self._stop.set()
            if self._interruptible:
                self._interruptible = False
                raise StopRequested()

        return {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}

    @contextlib.contextmanager
    def _uninterrupted(self):
        """A signal inside the block only sets the stop flag; it is acted on when the block ends."""
        was, self._interruptible = self._interruptible, False
        try:
            yield
        finally:
            self._interruptible = was
        if was and self._stop.is_set():
            raise StopRequested()

    def _start(self, timeout: float) -> None:
        self.handle.start(timeout=timeout, should_stop=self._stop.is_set)
        self.metrics.add("specbuild_supervisor_server_starts_total")
        self.metrics.set("specbuild_supervisor_serving", 1)
        self._expected = self._live_instances()
        self._serving = True
        self._follow_new_log()
        self._stub_died = set()  # a new server: no old instances linger

    def _follow_new_log(self) -> None:
        """The server log, read from its start (each start writes a new one): for the stubs Triton calls "not
        healthy", and, with a follower of its own, for the crash line (CRASH)."""
        self._unhealthy_log = LogFollower(self.handle.log_path)
        self._crash_log = LogFollower(self.handle.log_path)

    # ---- watching --------------------------------------------------------------------------------
    def watch(self, until: Callable[[], bool] | None = None) -> None:
        """Check the server and its stubs every poll_s, canary every canary_interval_s, until stopped (or until()
        holds). The canary runs in a thread, so a request hanging on a dead BLS never delays the stub checks."""
        interval = self.settings.canary_interval_s
        next_canary = time.monotonic() + interval
        probe: CanaryProbe | None = None
        while not self._stop.wait(self.settings.poll_s) and not (until is not None and until()):
            process = self.handle.process
            if down := self._server_down():  # exited, or its log says it crashed
                self._failed("tritonserver", *down)
                self._restart("tritonserver", time.monotonic())
            elif procfs.stopped(process.pid):
                self._failed(
                    "tritonserver",
                    "server_hung",
                    f"tritonserver (pid {process.pid}) is frozen (stopped, "
                    f"state {procfs.state(process.pid)}): killing it",
                )
                self._restart("tritonserver", time.monotonic())
            elif hung := self.hung_stubs():
                self._recover_hung(hung)
            elif dead := self.dead_models():
                self._recover(dead)
            elif probe is not None and probe.done.is_set():
                self._canary_result(probe)
            elif probe is None and interval > 0 and time.monotonic() >= next_canary:
                probe = CanaryProbe(self.handle.http_url, self._canary_model(), self.settings.canary_timeout_s)
                continue
            else:
                continue
            probe, next_canary = None, time.monotonic() + interval  # a probe of a replaced server is dropped

    def _exit_message(self, process) -> str:
        """ "tritonserver exited with code N" (a signal named), and the last lines of its log: why it went."""
        code = process.returncode if process is not None else None
        text = f"tritonserver exited with code {code}"
        if code is not None and code < 0:
            with contextlib.suppress(ValueError):
                text += f" ({signal.Signals(-code).name})"
        tail = self.handle.log_tail(5).strip()
        return text + (f"; last lines of its log:\n{tail}" if tail else "")

    def hung_stubs(self, unhealthy: set[str] = frozenset()) -> dict[procfs.Stub, str]:
        """Live stubs that cannot answer -> why: frozen (stopped, /proc state T), or named "not healthy" by
        Triton (its health check of the stub failed; python_backend src/python_be.cc) in the server log since
        the last look (the BLS logs its steps' failures there) or in `unhealthy` (the canary's error). A dead
        stub is not hung: dead_models() handles it."""
        process = self.handle.process
        if process is None:
            return {}
        named = set(unhealthy) | self._unhealthy_in_log()
        found = {}
        for stub in procfs.python_stubs(process.pid):
            if procfs.stopped(stub.pid):
                found[stub] = f"is frozen (stopped, state {procfs.state(stub.pid)})"
            elif stub.instance in named and (procfs.age_seconds(stub.pid) or 0.0) >= FRESH_STUB_S:
                found[stub] = 'does not answer: Triton reports it "not healthy"'
        return found

    def _unhealthy_in_log(self) -> set[str]:
        """Instances Triton called "not healthy" in the server log lines written since the last look."""
        return set(UNHEALTHY.findall(self._unhealthy_log.news()))

    def _skip_log(self) -> None:
        """What the log says up to now about unhealthy stubs is about processes already dealt with."""
        self._unhealthy_log.skip()

    def _live_instances(self) -> dict[str, str]:
        process = self.handle.process
        return {s.instance: s.model for s in procfs.python_stubs(process.pid)} if process else {}

    def dead_models(self) -> dict[str, list[str]]:
        """Models with a dead stub: model -> its dead instances. Expected are the instances seen alive so
        far and, for a Python model, at least one (a stub may die before the first look)."""
        live = self._live_instances()
        self._expected.update(live)
        dead: dict[str, list[str]] = {}
        for instance, model in sorted(self._expected.items()):
            if instance not in live:
                dead.setdefault(model, []).append(instance)
        for model in self._python_models:
            if model not in live.values() and model not in dead:
                dead[model] = [f"{model}_0_0"]
        for model in list(dead):
            if not self._model_ready(model):  # unloaded on purpose (model control opened to users)
                self._expected = {i: m for i, m in self._expected.items() if m != model}
                self._python_models = [m for m in self._python_models if m != model]
                del dead[model]
        return dead

    def _model_ready(self, model: str) -> bool:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(
                f"http://{self.handle.http_url}/v2/models/{model}/ready", timeout=READY_TIMEOUT_S
            ) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    # ---- recovering ------------------------------------------------------------------------------
    def _event(self, message: str, **fields: Any) -> None:
        self.events.append({"time": round(time.time(), 3), "message": message, **fields})
        self.log(f"supervisor: {message}")

    def _crash_in_log(self) -> str | None:
        """A message when the server log says, since the last look, that the server crashed (CRASH)."""
        line = CRASH.search(self._crash_log.news())
        if line is None:
            return None
        pid = self.handle.process.pid if self.handle.process is not None else "?"
        return (
            f"tritonserver (pid {pid}) crashed: its log says {line.group(0)!r} (its stack trace follows there): "
            "killing it"
        )

    def _server_down(self) -> tuple[str, str] | None:
        """(failure kind, message) when the server cannot answer any more: it exited, or its log says it crashed."""
        process = self.handle.process
        if process is None or process.poll() is not None:
            return "server_exited", self._exit_message(process)
        crash = self._crash_in_log()
        return ("server_crashed", crash) if crash else None

    def _failed(self, model: str, kind: str, message: str) -> None:
        self.metrics.add("specbuild_supervisor_failures_total", model=model, kind=kind)
        self._event(message, model=model, kind=kind)

    def _recover_hung(self, hung: dict[procfs.Stub, str]) -> None:
        """Kill each hung stub at once (SIGKILL ends a stopped process too), then recover its model as for a
        dead stub: a reload, or a server restart for a decoupled model."""
        detected = time.monotonic()
        dead: dict[str, list[str]] = {}
        for stub, why in hung.items():
            self._failed(
                stub.model,
                "stub_hung",
                f"the Python backend stub of {stub.model} ({stub.instance}, pid {stub.pid}) {why}: killing it",
            )
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(stub.pid, signal.SIGKILL)
            dead.setdefault(stub.model, []).append(stub.instance)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and any(procfs.alive(stub.pid) for stub in hung):
            time.sleep(0.05)
        self._recover(dead, detected, reported=True)
        self._skip_log()

    def _recover(self, dead: dict[str, list[str]], detected: float | None = None, reported: bool = False) -> None:
        detected = time.monotonic() if detected is None else detected
        self._stub_died.update(dead)  # before the reload: a stop may come while it runs
        for model, instances in dead.items():
            if not reported:
                self._failed(model, "stub_died", f"the Python backend stub of {model} ({', '.join(instances)}) died")
        decoupled = [m for m in dead if is_decoupled(self.handle.opts.repo, m)]
        if decoupled:  # its open streams hang until the server goes away
            self._restart(decoupled[0], detected)
            return
        for model, instances in dead.items():
            try:
                how = self._reload(model, instances)
            except ServeError as err:
                self._event(f"reloading {model} did not help ({err})", model=model)
                self._restart(model, detected)
                return
            self._skip_log()  # its requests' failures while it was down are about the old stub
            seconds = time.monotonic() - detected
            self.metrics.add("specbuild_supervisor_recoveries_total", model=model, action="reload")
            self.metrics.set("specbuild_supervisor_recovery_seconds", round(seconds, 3), model=model)
            self._event(
                f"{model} serving again after {how} ({seconds:.1f} s)",
                model=model,
                action="reload",
                seconds=round(seconds, 3),
            )

    def _models_with_dead_stubs(self) -> set[str]:
        """Models with an instance seen alive whose stub is gone now (from /proc alone: no request to the server), but
        those a drain unloads (the entry models and the gate: their stubs leave with them)."""
        process = self.handle.process
        if process is None or process.poll() is not None:
            return set()
        live = self._live_instances()
        drained = set(entry_models(self.handle.opts.repo)) | {gate_model(self.handle.opts.repo)}
        return {model for instance, model in self._expected.items() if instance not in live} - drained

    def _lingering_only(self) -> Callable[[], str | None]:
        """For the stop after a stub died: one that died (or was killed) while it held a request leaves its old
        model instance in tritonserver, which never unloads, so its SIGTERM would wait out --exit-timeout for
        nothing and exit 1 (seen with python_backend r24.10 in nvidia-pytriton 0.7: "Found 1 live models" after
        every model had logged "successfully unloaded"). Once every loaded model has unloaded and the server still
        counts no more live models than had a stub die, the reason to kill it at once; None until then."""
        path = self.handle.log_path
        try:
            before = path.read_bytes()  # read once; each check reads only what came since
        except OSError:
            return lambda: None
        before_text = before.decode(errors="replace")

        def check() -> str | None:
            try:
                with open(path, "rb") as log:
                    log.seek(len(before))
                    since = log.read().decode(errors="replace")
            except OSError:
                return None
            return lingering_only(before_text, since, self._stub_died)

        return check

    def _reload(self, model: str, dead: list[str]) -> str:
        """Unload and load the model: new instances, new stubs. A plain load of a loaded model may only
        update it and keep the dead instance (tritonserver 2.51 did so here when the model's files had not
        changed; core src/model_repository_manager/model_lifecycle.cc, AsyncLoad), and the model fails
        every request already, so the short gap of an unload costs nothing."""
        instances = sorted(set(dead) | {i for i, m in self._expected.items() if m == model})
        self._while_up(f"unloading {model}", lambda: self.handle.model_control("unload", model))
        timeout = self.settings.start_timeout_s  # a load is a start's work for one model
        self._while_up(f"loading {model}", lambda: self.handle.model_control("load", model, timeout=timeout))
        if self._instances_live(instances):
            return "an unload and load"
        raise ServeError(f"no live stub for {', '.join(instances)} after unload and load")

    def _while_up(self, what: str, call: Callable[[], None]) -> None:
        """call() (a model-control request) in a thread, while the server is watched every poll_s: a server that
        exits or crashes meanwhile never answers it, so the wait ends then, the failure counted, with a ServeError
        (the caller restarts the server; the abandoned request ends with the killed server's connection). A call
        that failed because the server went down counts the same way."""
        done, failure = threading.Event(), []

        def run() -> None:
            try:
                call()
            except BaseException as err:  # re-raised in the caller's thread
                failure.append(err)
            finally:
                done.set()

        threading.Thread(target=run, name=f"supervisor {what}", daemon=True).start()
        while not done.wait(max(self.settings.poll_s, 0.05)):
            if down := self._server_down():
                break
        else:
            if not failure:
                return
            down = None if isinstance(failure[0], StopRequested) else self._server_down()
            if down is None:  # refused by a server that still runs
                raise failure[0]
        self._failed("tritonserver", *down)
        raise ServeError(f"{what} was cut short: tritonserver went down")

    def _instances_live(self, instances: list[str], wait_s: float = 3.0) -> bool:
        deadline = time.monotonic() + wait_s
        while True:
            live = self._live_instances()
            if all(i in live for i in instances):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)

    def _restart(self, model: str, detected: float) -> None:
        now = time.monotonic()
        self._restarts = [t for t in self._restarts if now - t < self.settings.restart_window_s] + [now]
        if len(self._restarts) > self.settings.max_restarts:
            raise ServeError(
                f"tritonserver needed {len(self._restarts) - 1} restarts within "
                f"{self.settings.restart_window_s:.0f} s; giving up. See the server log: {self.handle.log_path}"
            )
        self.metrics.set("specbuild_supervisor_serving", 0)
        self._serving = False
        with self._uninterrupted():
            result = self.handle.stop(graceful=False)  # SIGKILL: a graceful stop would wait for hung streams
        removed = len(result.removed_regions) if result else 0
        self._event(f"restarting tritonserver (killed; {removed} shared-memory regions of it removed)", model=model)
        self._start(self.settings.start_timeout_s)
        self._canary_failed = 0
        seconds = time.monotonic() - detected
        self.metrics.add("specbuild_supervisor_recoveries_total", model=model, action="restart")
        self.metrics.set("specbuild_supervisor_recovery_seconds", round(seconds, 3), model=model)
        self._event(
            f"tritonserver restarted, serving again ({seconds:.1f} s after the failure; pid {self.handle.process.pid})",
            model=model,
            action="restart",
            seconds=round(seconds, 3),
        )

    def _canary_model(self) -> str:
        return entry_model(self.handle.opts.repo)

    def _canary_result(self, probe: CanaryProbe) -> None:
        if probe.error is None:
            self._canary_failed = 0
            self.metrics.add("specbuild_supervisor_canary_total", result="ok")
            return
        if QUEUE_FULL in probe.error:
            self.metrics.add("specbuild_supervisor_canary_total", result="busy")
            return
        if hung := self.hung_stubs(set(UNHEALTHY.findall(probe.error))):  # at once, not after canary_failures
            self.metrics.add("specbuild_supervisor_canary_total", result="failed")
            self._recover_hung(hung)
            return
        self._canary_failed += 1
        self.metrics.add("specbuild_supervisor_canary_total", result="failed")
        self._failed(
            probe.model,
            "canary",
            f"canary through {probe.model} failed "
            f"({self._canary_failed}/{self.settings.canary_failures}): {probe.error}",
        )
        if self._canary_failed >= self.settings.canary_failures:
            self._restart(probe.model, time.monotonic())
