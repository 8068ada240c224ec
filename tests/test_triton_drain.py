"""SIGTERM/SIGINT drain `specbuild serve` and `specbuild up` on the real tritonserver, for the engine path's
repository (the BLS, whose every step is a new request to the draft and target models) and the llmapi one.

Asserted on each: streams in flight when the signal comes all get their final response, token for token
those of an undisturbed run; readiness is false during the drain; a request that arrives during the drain is
refused at once with UNAVAILABLE, not left hanging: by the BLS and the ensemble, and by the llmapi model (NVIDIA's
class behind the gate's check), as the serving gate is closed; serve's exit code and its log line say what
happened. The bound (--exit-timeout) cuts the rest and says how many; a second signal stops at
once. Durations are printed (pytest -s), never compared with a speed: a stream is long enough to be running
when the signal comes because it is checked to be, not because the machine is assumed slow or fast.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from triton_helpers import make_deployment, make_llmapi_deployment, read_ready_document

from specbuild.contract.serving_gate import REFUSAL
from specbuild.triton import procfs

pytestmark = [pytest.mark.server, pytest.mark.slow]
PROMPT = "def add(a, b):"
STREAMS = 3  # streams in flight at the signal (the tiny pair's max_batch_size is 4)
MANY = 12  # streams for the tests that cut: 4 run, 8 wait for a BLS slot (its queue holds 16)
MAX_TOKENS = 256  # the longest greedy generation the tiny deployment allows: in flight at the signal on any
# machine this runs on, which each test checks rather than assumes
HANG_S = 120.0  # no stream or process may take longer than this: a deadline against hanging, not an aim
UNLOADING = "has no available versions"  # Triton's refusal of a model being unloaded (gRPC NOT_FOUND, HTTP 404)
REFUSED = (REFUSAL, UNLOADING)  # a request that came after the drain began: refused, not cut
# How gRPC ends a stream whose server was killed (seen here: each of them, from run to run)
TRANSPORT_ERRORS = ("Socket closed", "UNAVAILABLE", "Stream removed", "Connection reset")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, example_tiny):
    return make_deployment(tmp_path_factory.mktemp("drain"), example_tiny)


@pytest.fixture(scope="module")
def llmapi_deployment(tmp_path_factory, example_tiny):
    return make_llmapi_deployment(tmp_path_factory.mktemp("drain-llmapi"), example_tiny)


class Serving:
    """`specbuild serve --json` (or any argv that logs the same lines) as a subprocess: its stderr lines as they
    come, its ready document, and every process under it (killed at the end whatever happened)."""

    def __init__(self, argv: list[str], cwd):
        self.process = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in iter(self.process.stderr.readline, ""):
            self.lines.append(line)

    def ready_document(self) -> dict:
        return read_ready_document(self.process, stderr_tail=lambda: "".join(self.lines)[-3000:])

    def wait_line(self, text: str, timeout: float = HANG_S) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [line for line in self.lines if text in line]
            if found:
                return found[0]
            if self.process.poll() is not None and not any(text in line for line in self.lines):
                time.sleep(0.2)  # the reader may still be behind the exit
                if not any(text in line for line in self.lines):
                    raise AssertionError(f"exited ({self.process.returncode}) without {text!r}:\n{self.log()}")
            time.sleep(0.05)
        raise AssertionError(f"no {text!r} within {timeout:.0f} s:\n{self.log()}")

    def log(self) -> str:
        return "".join(self.lines[-30:])

    def close(self) -> None:
        left = [self.process.pid, *procfs.descendants(self.process.pid)]
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)
        for pid in left:
            if procfs.alive(pid):
                os.kill(pid, signal.SIGKILL)


def serve(spec_path, repo, *extra: str) -> tuple[Serving, dict]:
    argv = [
        sys.executable,
        "-m",
        "specbuild",
        "serve",
        "-c",
        str(spec_path),
        "--repo",
        str(repo),
        "--http-port",
        "0",
        "--grpc-port",
        "0",
        "--metrics-port",
        "0",
        "--json",
        "--canary-interval",
        "0",
        *extra,
    ]
    serving = Serving(argv, spec_path.parent)
    try:
        return serving, serving.ready_document()
    except BaseException:
        serving.close()
        raise


class Streams:
    """`count` greedy streams through `model` over gRPC, each in a thread: its text, finish reason and token ids
    (the BLS sends them; the llmapi model sends none), the error it ended with, when it got its first and last
    response."""

    def __init__(self, grpc_url: str, count: int, max_tokens: int, model: str = "tensorrt_llm_bls"):
        self.results: dict[int, dict] = {}
        self.first = [threading.Event() for _ in range(count)]
        self.threads = [
            threading.Thread(target=self._run, args=(grpc_url, i, max_tokens, model), daemon=True) for i in range(count)
        ]
        for thread in self.threads:
            thread.start()

    def _run(self, url: str, i: int, max_tokens: int, model: str) -> None:
        from specbuild.triton.client import SpecbuildClient

        text, stats, result = "", {}, {}
        try:
            # resume_s=0: a stream the drain cuts is what these tests observe; resumed, it would wait for a server
            # that is not coming back (tests/test_triton_faults.py resumes them)
            with SpecbuildClient(url, protocol="grpc", model=model, timeout=HANG_S, resume_s=0) as client:
                for chunk in client.generate(PROMPT, max_tokens=max_tokens, temperature=0.0):
                    self.first[i].set()
                    text += chunk.text
                    stats = chunk.stats or stats
            result = {"text": text, "finish_reason": stats.get("finish_reason"), "output_ids": stats.get("output_ids")}
        except Exception as err:  # noqa: BLE001 - asserted on by the test
            result = {"error": str(err), "text": text}
        finally:
            self.first[i].set()
            result["ended"] = time.monotonic()
            self.results[i] = result

    def started(self, at_least: int | None = None) -> None:
        """Until `at_least` streams (all by default) have their first response; none may have failed."""
        at_least = len(self.first) if at_least is None else at_least
        deadline = time.monotonic() + HANG_S
        while sum(event.is_set() for event in self.first) < at_least:
            assert time.monotonic() < deadline, "streams got no first response"
            time.sleep(0.01)
        failed = {i: result for i, result in self.results.items() if "error" in result}
        assert not failed, f"streams failed before the signal: {failed}"

    def held(self, metrics_url: str) -> None:
        """Until the server holds every stream (queued, waiting in the BLS or running, by its own gauges): a request
        still on its way into Triton is in none of its counts, so a count taken then could not include it."""
        from specbuild.triton.drain import read_metrics, running_requests

        deadline = time.monotonic() + HANG_S
        while (running_requests(read_metrics(metrics_url), ["tensorrt_llm_bls"]) or 0) < len(self.first):
            assert time.monotonic() < deadline, "the server never held every stream"
            time.sleep(0.01)

    def running(self) -> int:
        return sum(thread.is_alive() for thread in self.threads)

    def join(self) -> dict[int, dict]:
        for thread in self.threads:
            thread.join(HANG_S)
        assert not any(thread.is_alive() for thread in self.threads), "a stream still hangs"
        return self.results


def undisturbed(grpc_url: str, max_tokens: int, model: str = "tensorrt_llm_bls") -> dict:
    run = Streams(grpc_url, 1, max_tokens, model).join()[0]
    assert "error" not in run, run
    return run


def ready_status(http_url: str) -> int | str:
    try:
        with urllib.request.urlopen(f"{http_url}/v2/health/ready", timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError as err:
        return f"no answer ({err})"


def new_request_error(grpc_url: str, model: str) -> str:
    """A request sent during the drain: the error it got (it must get one, and at once: no hang)."""
    from specbuild.errors import ClientError
    from specbuild.triton.client import SpecbuildClient

    try:
        with SpecbuildClient(grpc_url, protocol="grpc", model=model, timeout=30) as client:
            text, _ = client.complete(PROMPT, max_tokens=2, stream=False)
    except ClientError as err:
        return str(err)
    raise AssertionError(f"a request during the drain was served: {text!r}")


def http_request(http_url: str, model: str = "ensemble") -> tuple[int | str, str, str]:
    """A request over HTTP during the drain, to the ensemble (/infer) or to the llmapi model (/generate, the
    endpoint Triton's HTTP frontend offers a decoupled model): its status, body and endpoint (it must be answered
    at once)."""
    import json

    if model == "ensemble":
        body = {
            "inputs": [
                {"name": "text_input", "shape": [1, 1], "datatype": "BYTES", "data": [PROMPT]},
                {"name": "max_tokens", "shape": [1, 1], "datatype": "INT32", "data": [2]},
            ]
        }
        endpoint = "infer"
    else:  # the llmapi model's tensors (contract.llmapi.INPUTS), by name
        body, endpoint = {"text_input": PROMPT, "sampling_param_max_tokens": 2}, "generate"
    request = urllib.request.Request(
        f"{http_url}/v2/models/{model}/{endpoint}",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode(errors="replace"), endpoint
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace"), endpoint


def signal_during_streams(
    serving: Serving, document: dict, max_tokens: int, model: str = "tensorrt_llm_bls", count: int = STREAMS
):
    """Open `count` streams, SIGTERM serve once STREAMS of them have their first response (any more wait in the
    model's queue for a slot), check what a client sees during the drain; returns (the streams' results, serve's
    exit code, how many were still running at the signal, what a client saw during the drain)."""
    grpc, http = document["endpoints"]["grpc"], document["endpoints"]["http"]
    streams = Streams(grpc, count, max_tokens, model)
    streams.started(at_least=STREAMS)
    if count > STREAMS:  # the others must be in the BLS's queue at the signal, not still on their way to the server
        streams.held(document["endpoints"]["metrics"])
    serving.process.send_signal(signal.SIGTERM)
    running_at_signal = streams.running()
    serving.wait_line("draining: ")
    running = streams.running()
    during = (
        ready_status(http),
        new_request_error(grpc, model),
        running,
        http_request(http, "ensemble" if model == "tensorrt_llm_bls" else model),
    )
    results = streams.join()
    code = serving.process.wait(HANG_S)
    return results, code, running_at_signal, during


def assert_drained(serving: Serving, results: dict, expected: dict, running_at_signal: int, during) -> None:
    """Both repository kinds have a serving gate (new requests are refused with UNAVAILABLE) and their entry model
    counts its running requests (the BLS's gauges; the llmapi model's, by the gate's wrapper), so the log line says
    how many ran to their end."""
    readiness, refusal, running_during, over_http = during
    print(
        f"\nat the signal {running_at_signal} of {len(results)} streams ran; during the drain: ready {readiness}, "
        f"a new request got {refusal!r}, over HTTP {over_http}\n"
        + "".join(line for line in serving.lines if "drain" in line)
    )
    assert running_at_signal > 0 and running_during > 0, "no stream was in flight during the drain"
    assert readiness == 400, readiness
    assert REFUSAL in refusal, refusal  # gRPC: a stream's error carries its message, not a status code
    status, body, endpoint = over_http
    assert REFUSAL in body, over_http
    # UNAVAILABLE over HTTP: /infer answers 503. /generate (the only HTTP endpoint of a decoupled model) answered 400
    # for the same error on tritonserver 2.51, for the BLS and the ensemble too: it takes the status code from an
    # error it has already deleted (server src/http_server.cc, GenerateRequestClass::InferResponseComplete calls
    # AddErrorJson, which deletes the error, then HttpCodeFromError on it; v2.51.0 and the main branch alike), so
    # only "an error status" can be asserted there
    if endpoint == "infer":
        assert status == 503, over_http
    else:
        assert isinstance(status, int) and status >= 400, over_http
    for i, result in results.items():
        assert "error" not in result, f"stream {i}: {result}\n{serving.log()}"
        assert result["text"] == expected["text"] and result["finish_reason"] == expected["finish_reason"], i
        assert result["output_ids"] == expected["output_ids"], i
    drained = serving.wait_line("supervisor: drained in ").strip()
    assert drained.endswith(f"; {running_at_signal} requests ran to their end"), drained


def long_enough(grpc_url: str, model: str = "tensorrt_llm_bls") -> tuple[int, dict]:
    """MAX_TOKENS and an undisturbed run of that length, the reference for the drained streams."""
    return MAX_TOKENS, undisturbed(grpc_url, MAX_TOKENS, model)


def test_sigterm_drains_the_bls_streams_in_flight(deployment):
    """STREAMS + 3 streams: the BLS runs 4 at once (the tiny pair's max_batch_size), so at the signal some wait in
    its queue for a slot; those were accepted before the drain, and finish too."""
    serving, document = serve(deployment.spec_path, deployment.repo)
    try:
        max_tokens, expected = long_enough(document["endpoints"]["grpc"])
        results, code, running, during = signal_during_streams(serving, document, max_tokens, count=STREAMS + 3)
        assert len(results) == STREAMS + 3
        assert code == 0, serving.log()
        assert_drained(serving, results, expected, running, during)
        assert serving.wait_line("tritonserver stopped").strip().endswith("the endpoints above no longer answer")
    finally:
        serving.close()


def test_sigterm_drains_the_llmapi_model_streams_in_flight(llmapi_deployment):
    serving, document = serve(llmapi_deployment.spec_path, llmapi_deployment.repo)
    try:
        max_tokens, expected = long_enough(document["endpoints"]["grpc"], "tensorrt_llm")
        results, code, running, during = signal_during_streams(serving, document, max_tokens, "tensorrt_llm")
        assert code == 0, serving.log()
        assert "new requests are refused (UNAVAILABLE)" in serving.wait_line("draining: ")
        assert_drained(serving, results, expected, running, during)
    finally:
        serving.close()


def test_sigterm_as_soon_as_triton_answers_ready_drains_too(deployment):
    """Triton answers ready before serve's own start-up checks have ended (the rest of its start, the canary), and a
    load balancer or a Kubernetes readiness probe routes to it from that first answer. A stream started then, and a
    SIGTERM at once: drained like any other (seen before the fix: no drain, the stream cut). Where the signal lands
    (before serve logs "serving" or after) is printed; the outcome is asserted either way."""
    from specbuild.triton.server import free_ports

    http_port, grpc_port, metrics_port = free_ports("127.0.0.1", 3)
    argv = [
        sys.executable,
        "-m",
        "specbuild",
        "serve",
        "-c",
        str(deployment.spec_path),
        "--repo",
        str(deployment.repo),
        "--http-port",
        str(http_port),
        "--grpc-port",
        str(grpc_port),
        "--metrics-port",
        str(metrics_port),
        "--canary-interval",
        "0",
    ]
    serving = Serving(argv, deployment.spec_path.parent)
    try:
        deadline = time.monotonic() + HANG_S * 3
        while ready_status(f"http://127.0.0.1:{http_port}") != 200:
            assert time.monotonic() < deadline and serving.process.poll() is None, serving.log()
            time.sleep(0.01)
        streams = Streams(f"127.0.0.1:{grpc_port}", 1, MAX_TOKENS)
        streams.started()
        early = not any("serving; press" in line for line in serving.lines)
        serving.process.send_signal(signal.SIGTERM)
        result = streams.join()[0]
        code = serving.process.wait(HANG_S)
        print(f"\nSIGTERM {'before' if early else 'after'} serve was serving; exit {code}\n" + serving.log())
        assert "error" not in result and result["finish_reason"] == "length", result
        assert len(result["output_ids"]) == MAX_TOKENS, result
        assert code == 0 and serving.wait_line("supervisor: drained in ")
    finally:
        serving.close()


def test_the_drain_gives_up_after_exit_timeout_and_says_how_many_it_cut(deployment, monkeypatch):
    """--exit-timeout 1 against MANY streams (4 running, the rest waiting for a BLS slot), served by timed stand-ins
    (each model step takes at least 50 ms, waiting): a stream of MAX_TOKENS then takes seconds on any machine, so
    some are cut; the test holds what serve says to what clients saw."""
    from specbuild.reference.timing import TIMING_ENV

    monkeypatch.setenv(TIMING_ENV, "50ms")
    serving, document = serve(deployment.spec_path, deployment.repo, "--exit-timeout", "1")
    try:
        streams = Streams(document["endpoints"]["grpc"], MANY, MAX_TOKENS)
        streams.started(at_least=STREAMS)
        streams.held(document["endpoints"]["metrics"])  # serve's count can then see them all
        serving.process.send_signal(signal.SIGTERM)
        code = serving.process.wait(HANG_S)
        results = streams.join()
        # (the bound starts at the signal; closing the gate starts a Python process, so it may end a little later)
        assert_cut_as_said(serving, results, code, "supervisor: the drain gave up after ")
        assert "(--exit-timeout)" in serving.wait_line("supervisor: the drain gave up after ")
    finally:
        serving.close()


def assert_cut_as_said(serving: Serving, results: dict, code: int, verdict: str) -> None:
    """The streams that ended with an error are the cut ones: serve's verdict counts them (it counts just before
    the kill, so a stream that ends in between counts as cut too) and its exit code is 1 when any was cut."""
    errors = {i: result["error"] for i, result in results.items() if "error" in result}
    refused = [i for i, error in errors.items() if any(text in error for text in REFUSED)]  # sent after the drain began
    cut = [i for i in errors if i not in refused]
    line = serving.wait_line(verdict)
    said = int(re.search(r"cut (\d+) requests", line).group(1))
    print(f"\n{line.strip()}; {len(cut)} of {len(results)} streams cut, {len(refused)} refused")
    assert len(cut) <= said <= len(results) - len(refused), (line, results)
    assert code == (1 if said else 0), serving.log()
    assert cut, "no stream was cut: the streams did not outlast the bound, so it was not tested"
    for i in cut:  # the server went away under the stream: gRPC says so in one of its words
        assert any(text in results[i]["error"] for text in TRANSPORT_ERRORS), results[i]


def test_a_second_signal_stops_at_once(deployment):
    serving, document = serve(deployment.spec_path, deployment.repo, "--exit-timeout", "300")
    try:
        streams = Streams(document["endpoints"]["grpc"], MANY, MAX_TOKENS)
        streams.started(at_least=STREAMS)
        streams.held(document["endpoints"]["metrics"])  # serve's count can then see them all
        serving.process.send_signal(signal.SIGINT)
        serving.wait_line("draining: ")
        serving.process.send_signal(signal.SIGINT)
        sent = time.monotonic()
        code = serving.process.wait(HANG_S)
        seconds = time.monotonic() - sent
        results = streams.join()
        print(f"\nsecond SIGINT: serve exited {code} after {seconds:.1f} s")
        assert_cut_as_said(serving, results, code, "supervisor: the drain was stopped by a second signal")
        assert seconds < 300  # far from the drain's own bound: it did not wait for the streams
    finally:
        serving.close()


def test_up_drains_its_server_on_sigterm(deployment, tmp_path):
    """`up` (no --once) serves under the same supervisor: SIGTERM while streams run drains them too."""
    import json

    argv = [
        sys.executable,
        "-m",
        "specbuild",
        "up",
        "-c",
        str(deployment.spec_path),
        "--repo",
        str(deployment.repo),
        "--json",
    ]
    serving = Serving(argv, deployment.root)
    try:
        serving.wait_line("serving; press Ctrl-C", timeout=600)
        pids = [serving.process.pid, *procfs.descendants(serving.process.pid)]  # up, tritonserver, its stubs
        grpc = serving.wait_line("grpc     ").split()[-1]  # up logs each endpoint as "<name padded to 8> <url>"
        http = serving.wait_line("http     ").split()[-1]
        metrics = serving.wait_line("metrics  ").split()[-1]
        document = {"endpoints": {"grpc": grpc, "http": http, "metrics": metrics}}
        max_tokens, expected = long_enough(grpc)
        results, code, running, during = signal_during_streams(serving, document, max_tokens, count=STREAMS + 3)
        out = serving.process.stdout.read()
        assert code == 0, serving.log()
        assert_drained(serving, results, expected, running, during)
        stage = json.loads(out)["stages"][-1]
        assert stage["status"] == "ran" and stage["stopped"] and stage["restarts"] == 0, stage
        assert stage["stopped_by"] == "signal" and stage["drain"]["complete"], stage
        assert stage["drain"]["refused_with"] == "UNAVAILABLE", stage  # the serving gate closed
        left = [pid for pid in pids if procfs.alive(pid)]
        assert not left, f"processes of up left after its stop: {left}"
    finally:
        serving.close()
