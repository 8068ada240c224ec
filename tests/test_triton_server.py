"""A real tritonserver (the nvidia-pytriton binary, CPU) on the tiny example pair's reference repository.

One server for the module (starting one costs ~30 s on 2 cores): ensemble over gRPC and HTTP equals
in-process target-only greedy decoding; the tensorrt_llm model speaks NVIDIA's tensor contract; concurrent
requests batch; bad requests get clear errors while the server stays ready; every non-inference API
is refused without the run's key (HTTP and gRPC); ports in use and other servers' answers are refused;
shutdown leaves no process.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import pytest
from triton_helpers import PYTHON_MODELS, make_deployment, run_concurrently, serving

from specbuild.errors import ClientError, ServeError
from specbuild.triton.client import SpecbuildClient
from specbuild.triton.server import ServerHandle, ServerOptions

pytestmark = [pytest.mark.server, pytest.mark.slow]
PROMPTS = ["# Copyright", "def add(a, b):", '{"name": ']  # the tiny target's greedy text is mostly "....."


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, example_tiny):
    return make_deployment(tmp_path_factory.mktemp("tiny-deploy"), example_tiny)


@pytest.fixture(scope="module")
def server(deployment):
    with serving(deployment.repo, deployment.root / "server.log", clean=True, models=PYTHON_MODELS) as handle:
        yield handle


@pytest.fixture(scope="module")
def local_greedy(deployment):
    """Target-only greedy text, decoded in-process by the same reference engine and tokenizer."""
    from transformers import AutoTokenizer

    from specbuild.reference.loading import load_contract_model, model_source

    source = model_source(deployment.spec, "target")
    model = load_contract_model(source, device="cpu")
    tok = AutoTokenizer.from_pretrained(str(source.path), local_files_only=True)

    def run(prompt: str, max_tokens: int) -> str:
        ids = tok.encode(prompt)
        out = model(
            {
                "input_ids": np.array(ids, np.int32),
                "input_lengths": np.array([len(ids)], np.int32),
                "request_output_len": np.array([max_tokens], np.int32),
                "end_id": np.array([tok.eos_token_id], np.int32),
            }
        )
        return tok.decode(out["output_ids"][0][: int(out["sequence_length"][0])], skip_special_tokens=True)

    return run


def test_server_binds_loopback_and_hides_the_repository_api(server):
    assert server.opts.host == "127.0.0.1" and server.ready()
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"http://{server.http_url}/v2/repository/index", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=10)
    assert err.value.code == 403


# Every restricted API, called as a client without the header would: (category, HTTP method, path, body).
RESTRICTED_HTTP = [
    ("shared-memory", "GET", "/v2/systemsharedmemory/status", None),
    (
        "shared-memory",
        "POST",
        "/v2/systemsharedmemory/region/r/register",
        b'{"key": "/x", "offset": 0, "byte_size": 8}',
    ),
    ("logging", "GET", "/v2/logging", None),
    ("logging", "POST", "/v2/logging", b'{"log_verbose_level": 1}'),
    ("trace", "GET", "/v2/trace/setting", None),
    ("trace", "POST", "/v2/models/preprocessing/trace/setting", b'{"trace_level": ["TIMESTAMPS"]}'),
    ("model-repository", "POST", "/v2/repository/index", b"{}"),
    ("model-repository", "POST", "/v2/repository/models/preprocessing/unload", b"{}"),
    ("statistics", "GET", "/v2/models/stats", None),
    ("statistics", "GET", "/v2/models/preprocessing/stats", None),
]


@pytest.mark.parametrize(
    "api,method,path,body", RESTRICTED_HTTP, ids=[f"{a}-{m}-{p}" for a, m, p, _ in RESTRICTED_HTTP]
)
def test_every_non_inference_http_api_is_refused_without_the_header(server, api, method, path, body):
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"http://{server.http_url}{path}", data=body, method=method)
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=10)
    assert err.value.code == 403
    assert "This API is restricted, expecting header 'specbuild-admin-key'" in err.value.read().decode()


RESTRICTED_GRPC = {
    "shared-memory": [
        lambda c, h: c.get_system_shared_memory_status(headers=h),
        lambda c, h: c.register_system_shared_memory("r", "/x", 8, headers=h),
    ],
    "logging": [
        lambda c, h: c.get_log_settings(headers=h),
        lambda c, h: c.update_log_settings({"log_verbose_level": 1}, headers=h),
    ],
    "trace": [
        lambda c, h: c.get_trace_settings(headers=h),
        lambda c, h: c.update_trace_settings("preprocessing", {"trace_level": ["TIMESTAMPS"]}, headers=h),
    ],
    "model-repository": [
        lambda c, h: c.get_model_repository_index(headers=h),
        lambda c, h: c.unload_model("preprocessing", headers=h),
    ],
    "statistics": [
        lambda c, h: c.get_inference_statistics(headers=h),
        lambda c, h: c.get_inference_statistics("preprocessing", headers=h),
    ],
}


@pytest.mark.parametrize("api", sorted(RESTRICTED_GRPC))
def test_every_non_inference_grpc_api_is_refused_without_the_header(server, api):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        for call in RESTRICTED_GRPC[api]:
            with pytest.raises(InferenceServerException) as err:
                call(client, {})
            assert err.value.status() == "StatusCode.UNAVAILABLE"
            assert (
                "This protocol is restricted, expecting header 'triton-grpc-protocol-specbuild-admin-key'"
                in err.value.message()
            )
            with pytest.raises(InferenceServerException, match="restricted"):  # a wrong key is no better
                call(client, {"triton-grpc-protocol-specbuild-admin-key": "guess"})
    finally:
        client.close()


def test_the_open_apis_and_the_admin_key(server):
    """Health, metadata, model config and inference stay open; this run's key opens the rest."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        for client in (http, grpc):
            assert client.is_server_ready() and client.is_model_ready("preprocessing")
            assert client.get_server_metadata() and client.get_model_metadata("preprocessing")
            assert client.get_model_config("preprocessing")
        assert http.get_log_settings(headers={"specbuild-admin-key": server.admin_key})["log_verbose_level"] == 0
        index = grpc.get_model_repository_index(headers={"triton-grpc-protocol-specbuild-admin-key": server.admin_key})
        assert {m.name for m in index.models} >= set(PYTHON_MODELS)
    finally:
        http.close()
        grpc.close()


def test_a_port_in_use_is_refused_with_its_pid(server, deployment, tmp_path):
    other = ServerHandle(
        ServerOptions(repo=deployment.repo, models=("preprocessing",), http_port=server.opts.http_port),
        log_path=tmp_path / "other.log",
    )
    with pytest.raises(
        ServeError,
        match=rf"HTTP port 127.0.0.1:{server.opts.http_port} is already in use by "
        rf"PID {server.process.pid} \(.*tritonserver --model-repository=",
    ):
        other.start(timeout=120)
    # refused before starting anything: a start opens its log first (and a failed one leaves process None too)
    assert other.process is None and not (tmp_path / "other.log").exists()


def test_readiness_is_checked_against_its_own_server(server, deployment, tmp_path, monkeypatch):
    """If another server takes the port between the check and the bind, its answers are not ours."""
    from specbuild.triton import server as server_module

    monkeypatch.setattr(server_module, "refuse_busy_ports", lambda host, ports: None)
    other = ServerHandle(
        ServerOptions(repo=deployment.repo, models=("preprocessing",), http_port=server.opts.http_port),
        log_path=tmp_path / "other.log",
    )
    with pytest.raises(
        ServeError,
        match=rf"HTTP port 127.0.0.1:{server.opts.http_port} answers, but "
        rf"PID {server.process.pid} \(.*\) holds it, not this server",
    ):
        other.start(timeout=120)
    assert other.process is None and server.ready()


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_ensemble_equals_local_target_greedy(server, local_greedy, protocol):
    url = server.grpc_url if protocol == "grpc" else server.http_url
    with SpecbuildClient(url, protocol=protocol, model="ensemble") as client:
        for prompt in PROMPTS:
            text, _ = client.complete(prompt, max_tokens=12, stream=False)
            assert text == local_greedy(prompt, 12), prompt


def test_tensorrt_llm_verifies_drafts_like_the_contract(server, deployment):
    """Verification over Triton equals the in-process contract; the acceptance outputs come only with
    return_perf_metrics, as from the C++ backend."""
    import tritonclient.http as httpclient

    from specbuild.reference.loading import load_contract_model, model_source

    local = load_contract_model(model_source(deployment.spec, "target"), device="cpu")
    ids, draft = [5, 6, 7, 8], [9, 10, 11]
    request = {
        "input_ids": np.array([ids], np.int32),
        "input_lengths": np.array([[4]], np.int32),
        "request_output_len": np.array([[4]], np.int32),
        "draft_input_ids": np.array([draft], np.int32),
    }
    client = httpclient.InferenceServerClient(server.http_url)

    def infer(**extra):
        inputs = []
        for name, value in {**request, **extra}.items():
            tensor = httpclient.InferInput(name, list(value.shape), "BOOL" if value.dtype == bool else "INT32")
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)
        return client.infer("tensorrt_llm", inputs)

    try:
        plain, result = infer(), infer(return_perf_metrics=np.array([[True]]))
    finally:
        client.close()
    assert plain.as_numpy("total_draft_tokens") is None and plain.as_numpy("acceptance_rate") is None
    expected = local({**{k: v[0] for k, v in request.items()}, "return_perf_metrics": np.array([True])})
    length = int(result.as_numpy("sequence_length")[0, 0])
    assert result.as_numpy("output_ids")[0, 0, :length].tolist() == expected["output_ids"][0].tolist()
    assert result.as_numpy("total_draft_tokens")[0, 0] == 3
    assert result.as_numpy("total_accepted_draft_tokens")[0, 0] == expected["total_accepted_draft_tokens"][0]


def test_concurrent_requests_all_succeed_with_the_sequential_answers(server, local_greedy):
    """Six clients at once get the sequential answers, and Triton's dynamic batcher handed the reference model
    several requests in one execute(). The clients connect first and send together (a barrier), so a slow or busy
    machine staggers their requests less than one model call; a round whose requests still arrived one by one is
    sent again (at most ROUNDS), since when they arrive is the machine's, not the server's."""
    import json
    import urllib.request

    rounds, batched = 3, 0
    for _ in range(rounds):
        answers: dict[int, str] = {}
        clients = [SpecbuildClient(server.grpc_url, model="ensemble") for _ in range(6)]
        barrier = threading.Barrier(len(clients))

        def ask(i: int, clients=clients, barrier=barrier, answers=answers) -> None:
            barrier.wait(timeout=60)
            answers[i] = clients[i].complete(PROMPTS[i % len(PROMPTS)], max_tokens=8, stream=False)[0]

        try:
            errors = run_concurrently(ask, len(clients), timeout=120)
        finally:
            for client in clients:
                client.close()
        assert not errors
        assert all(answers[i] == local_greedy(PROMPTS[i % len(PROMPTS)], 8) for i in range(6))
        request = urllib.request.Request(
            f"http://{server.http_url}/v2/models/tensorrt_llm/stats", headers={"specbuild-admin-key": server.admin_key}
        )  # statistics are restricted
        with urllib.request.urlopen(request, timeout=10) as r:
            stats = json.loads(r.read())["model_stats"][0]["batch_stats"]
        batched = max(int(b["batch_size"]) for b in stats)
        if batched >= 2:
            break
    assert batched >= 2, stats


def test_bad_requests_get_clear_errors_and_the_server_stays_ready(server, local_greedy):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    with SpecbuildClient(server.grpc_url, model="ensemble") as client:
        with pytest.raises(ClientError, match="request_output_len = 0: ask for at least 1 token"):
            client.complete("hello", max_tokens=0, stream=False)
        with pytest.raises(ClientError, match="Streaming is only supported if model is deployed using decoupled mode"):
            client.complete("hello", max_tokens=2, stream=True)
        raw = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            text = grpcclient.InferInput("text_input", [1, 1], "BYTES")
            text.set_data_from_numpy(np.array([[b"hello"]], dtype=object))
            with pytest.raises(InferenceServerException, match="max_tokens"):
                raw.infer("ensemble", [text])  # a required input missing
            wrong = grpcclient.InferInput("max_tokens", [1, 1], "FP32")
            wrong.set_data_from_numpy(np.array([[4.0]], np.float32))
            with pytest.raises(InferenceServerException, match="(?i)data.?type|FP32"):
                raw.infer("ensemble", [text, wrong])
        finally:
            raw.close()
        assert server.ready()
        assert client.complete(PROMPTS[0], max_tokens=6, stream=False)[0] == local_greedy(PROMPTS[0], 6)


def test_a_model_that_cannot_load_fails_fast_with_the_log(deployment, tmp_path):
    import shutil

    repo = tmp_path / "broken_repo"
    shutil.copytree(deployment.repo / "postprocessing", repo / "postprocessing")
    config = repo / "postprocessing" / "config.pbtxt"
    config.write_text(config.read_text().replace('"../engines/example-tiny/target/engine"', '"../no/such/tokenizer"'))
    handle = ServerHandle(ServerOptions(repo=repo), log_path=tmp_path / "server.log")
    with pytest.raises(ServeError, match="exited with code") as err:
        handle.start(timeout=240)
    assert "no/such/tokenizer" in str(err.value)
    assert handle.process is None


@contextlib.contextmanager
def no_core_files():
    """Core dumps off for what starts inside (the server inherits the limit): a crash leaves no core in the cwd."""
    import resource

    limits = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (0, limits[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_CORE, limits)


@pytest.mark.parametrize("signum", ["SIGABRT", "SIGSEGV", "SIGTERM"])
def test_the_crash_line_the_supervisor_reads_is_what_tritonserver_writes(tmp_path, signum):
    """The supervisor kills and restarts a server whose log says it crashed, before the process is gone
    (supervisor.CRASH): the words must be the real binary's, for the two signals its crash handler takes, and
    SIGTERM's graceful stop must not read as one."""
    import signal

    from specbuild.triton.supervisor import CRASH

    (tmp_path / "repo").mkdir()
    log = tmp_path / "server.log"
    with no_core_files(), serving(tmp_path / "repo", log) as handle:
        handle.process.send_signal(getattr(signal, signum))
        handle.process.wait(60)
        text = log.read_text(errors="replace")
    found = CRASH.findall(text)
    if signum == "SIGTERM":
        assert found == [] and "Signal (15) received." in text, text[-2000:]
    else:
        assert found == [f"Signal ({getattr(signal, signum).value}) received."], text[-2000:]


def test_a_stubs_crash_writes_no_crash_line(tmp_path):
    """A Python backend stub that segfaults is a dead stub (a model reload), not a crashed server: the stub writes
    nothing the supervisor reads as the server's crash line, and the server lives on."""
    import os
    import signal
    import time

    from specbuild.triton import procfs
    from specbuild.triton.supervisor import CRASH

    model = tmp_path / "repo" / "echo"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(
        'name: "echo"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
    )
    (model / "1" / "model.py").write_text(
        "class TritonPythonModel:\n    def execute(self, requests):\n        return []\n"
    )
    log = tmp_path / "server.log"
    with no_core_files(), serving(tmp_path / "repo", log) as handle:
        (stub,) = procfs.python_stubs(handle.process.pid)
        os.kill(stub.pid, signal.SIGSEGV)
        deadline = time.monotonic() + 30
        while procfs.alive(stub.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # anything the stub or the server writes about it
        assert not procfs.alive(stub.pid)
        server_runs = handle.process.poll() is None
        text = log.read_text(errors="replace")
    # Where tritonserver itself goes down with a stub (one CI machine, for stubs killed during a request) a crash
    # line would be the server's own; here, and wherever the server lives on, there must be none.
    assert not server_runs or CRASH.findall(text) == [], text[-2000:]
