"""The llmapi repository on a real CPU tritonserver (the stand-in, tiny example pair), beside the engine path.

One spec, both paths: reference engines + the BLS repository, and Hugging Face checkpoints + Triton's llmapi
repository, each on its own tritonserver. Greedy text through the llmapi model (gRPC and HTTP, streaming or not)
equals the BLS's and target-only decoding in-process; NVIDIA's surprises hold on the wire (the prompt in
text_output by default, cumulative streamed text, "None" before the end, metrics as strings); bad input gets
NVIDIA's messages and the server stays ready; eight concurrent streams lose nothing; `generate` and
`bench --url` work against it.
"""

from __future__ import annotations

import json
import queue
import threading
import urllib.request
import uuid

import numpy as np
import pytest
from triton_helpers import make_deployment, serving

from specbuild.errors import ClientError
from specbuild.triton.client import SpecbuildClient

pytestmark = [pytest.mark.server, pytest.mark.slow]
PROMPTS = ["# Copyright", "def add(a, b):", '{"name": ', "class Parser:"]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, example_tiny):
    from specbuild.llmapi import build
    from specbuild.llmapi.checkpoint import convert_pair
    from specbuild.llmapi.repository import write_repository

    d = make_deployment(tmp_path_factory.mktemp("tiny-llmapi"), example_tiny)
    convert_pair(d.spec, ["target", "draft"], log=lambda m: None)
    build.build(d.spec, log=lambda m: None)
    d.llmapi_repo = d.root / "llmapi_repo"
    write_repository(d.spec, d.llmapi_repo, runtime="reference")
    return d


@pytest.fixture(scope="module")
def servers(deployment):
    with (
        serving(deployment.llmapi_repo, deployment.root / "llmapi.log") as llmapi,
        serving(deployment.repo, deployment.root / "bls.log") as engines,
    ):
        yield llmapi, engines


@pytest.fixture(scope="module")
def target_only(deployment):
    """Target-only greedy text in-process on the engine path's reference engines (`generate --local`, K = 0)."""
    from specbuild.decode.generation import Options
    from specbuild.session.local import LocalSession

    local = LocalSession.from_spec(deployment.spec, device="cpu", threads=1)
    cache = {}

    def run(prompt: str, max_tokens: int) -> dict:
        if (prompt, max_tokens) not in cache:
            cache[prompt, max_tokens] = local.generate(
                prompt, Options(max_tokens=max_tokens, num_draft_tokens=0, adaptive=False)
            ).to_dict()
        return cache[prompt, max_tokens]

    return run


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("stream", [True, False])
def test_greedy_text_equals_the_bls_and_target_only(servers, target_only, protocol, stream):
    llmapi, engines = servers
    url = {"grpc": lambda h: h.grpc_url, "http": lambda h: h.http_url}[protocol]
    with (
        SpecbuildClient(url(llmapi), protocol=protocol) as client,
        SpecbuildClient(url(engines), protocol=protocol) as bls,
    ):
        for prompt in PROMPTS:
            expected = target_only(prompt, 20)["text"]
            chunks = list(client.generate(prompt, max_tokens=20, stream=stream))
            assert client.model == "tensorrt_llm" and client.is_llmapi()
            assert "".join(c.text for c in chunks) == expected, prompt
            stats = chunks[-1].stats
            assert chunks[-1].final and stats["finish_reason"] == "length" and stats["total_draft_tokens"] > 0
            assert stats["acceptance_rate"] == pytest.approx(
                stats["total_accepted_draft_tokens"] / stats["total_draft_tokens"], rel=1e-6
            )
            assert bls.complete(prompt, max_tokens=20, stream=stream)[0] == expected, prompt
            if stream and protocol == "grpc":
                assert sum(1 for c in chunks if c.text) >= 2  # text arrived in several pieces


def _grpc_stream(
    url, inputs: dict, request_id: str | None = None, timeout: float = 120, first: threading.Event | None = None
) -> list[dict]:
    """Plain tritonclient: one streamed request; every response's outputs (as numpy) and its final flag."""
    import tritonclient.grpc as grpcclient

    tensors = []
    for name, (value, datatype) in inputs.items():
        tensor = grpcclient.InferInput(name, list(value.shape), datatype)
        tensor.set_data_from_numpy(value)
        tensors.append(tensor)
    results: queue.Queue = queue.Queue()
    out = []
    with grpcclient.InferenceServerClient(url) as client:
        client.start_stream(callback=lambda result=None, error=None: results.put((result, error)))
        client.async_stream_infer(
            "tensorrt_llm", tensors, request_id=request_id or uuid.uuid4().hex, enable_empty_final_response=True
        )
        try:
            while True:
                result, error = results.get(timeout=timeout)
                if error is not None:
                    out.append({"error": error.message(), "final": True})
                    break
                response = result.get_response()
                final = response.parameters["triton_final_response"].bool_param
                out.append({"outputs": {o.name: result.as_numpy(o.name) for o in response.outputs}, "final": final})
                if first is not None:
                    first.set()
                if final:
                    break
        except queue.Empty:  # no answer within the deadline: the request is cancelled, else closing would wait on it
            client.stop_stream(cancel_requests=True)
            raise
        client.stop_stream()
    return out


def _text(value) -> str:
    return np.asarray(value).reshape(-1)[0].decode()


def test_plain_tritonclient_stream_is_cumulative_with_data_on_the_final_response(servers, target_only):
    llmapi, _ = servers
    prompt = "def add(a, b):"
    responses = _grpc_stream(
        llmapi.grpc_url,
        {
            "text_input": (np.array([prompt.encode()], dtype=object), "BYTES"),
            "sampling_param_max_tokens": (np.array([16], np.int32), "INT32"),
            "streaming": (np.array([True]), "BOOL"),
            "return_finish_reason": (np.array([True]), "BOOL"),
            "sampling_param_return_perf_metrics": (np.array([True]), "BOOL"),
        },
    )
    texts = [_text(r["outputs"]["text_output"]) for r in responses]
    assert len(responses) >= 3 and responses[-1]["final"] and not any(r["final"] for r in responses[:-1])
    assert all(a and b.startswith(a) for a, b in zip(texts, texts[1:]))  # cumulative, never a delta
    assert texts[-1] == prompt + target_only(prompt, 16)["text"]  # exclude_input_from_output defaults to False
    reasons = [_text(r["outputs"]["finish_reason"]) for r in responses]
    assert reasons[:-1] == ["None"] * (len(reasons) - 1) and reasons[-1] == "length"
    metrics = responses[-1]["outputs"]
    for name in ("acceptance_rate", "total_draft_tokens", "arrival_time_ns", "kv_cache_alloc_total_blocks"):
        assert metrics[name].dtype == object and isinstance(metrics[name].reshape(-1)[0], bytes), name
    drafted = int(_text(metrics["total_draft_tokens"]))
    accepted = int(_text(metrics["total_accepted_draft_tokens"]))
    assert drafted > 0 and float(_text(metrics["acceptance_rate"])) == pytest.approx(accepted / drafted, rel=1e-6)
    times = [
        int(_text(metrics[n]))
        for n in ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns")
    ]
    assert times == sorted(times) and times[0] > 0


def _generate_http(url, body, endpoint="generate"):
    request = urllib.request.Request(
        f"http://{url}/v2/models/tensorrt_llm/{endpoint}", data=json.dumps(body).encode(), method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_http_generate_as_nvidia_documents_it(servers, target_only):
    llmapi, _ = servers
    status, body = _generate_http(
        llmapi.http_url,
        {"text_input": "# Copyright", "sampling_param_max_tokens": 12, "sampling_param_return_perf_metrics": True},
    )
    assert status == 200
    doc = json.loads(body)
    assert doc["text_output"] == "# Copyright" + target_only("# Copyright", 12)["text"]
    assert "finish_reason" not in doc  # only with return_finish_reason
    assert isinstance(doc["acceptance_rate"], str) and isinstance(doc["total_draft_tokens"], str)  # NVIDIA's sample


@pytest.mark.parametrize(
    "body, message",
    [
        ({"sampling_param_max_tokens": 0}, "Error generating request: max_tokens (0) must be greater than 0"),
        ({"sampling_param_best_of": 2}, "Error generating request: best_of = 2"),
        ({"stop": True}, "A request id must be provided for request cancellation"),
        ({"sampling_param_top_p": 1.5}, "Error generating request: top_p (1.5)"),
    ],
)
def test_bad_requests_get_nvidias_messages_and_the_server_stays_ready(servers, body, message):
    llmapi, _ = servers
    status, text = _generate_http(llmapi.http_url, {"text_input": "hello", **body})
    assert status == 400 and message in json.loads(text)["error"]
    with SpecbuildClient(llmapi.grpc_url) as client:
        assert client.is_ready() and client.complete("hello", max_tokens=2)[1]["finish_reason"] == "length"


def test_wrong_types_and_shapes_are_refused_by_triton(servers):
    llmapi, _ = servers
    responses = _grpc_stream(
        llmapi.grpc_url,
        {
            "text_input": (np.array([b"hi"], dtype=object), "BYTES"),
            "sampling_param_max_tokens": (np.array([4.0], np.float32), "FP32"),
        },
    )
    assert "error" in responses[-1] and "sampling_param_max_tokens" in responses[-1]["error"]
    responses = _grpc_stream(llmapi.grpc_url, {"text_input": (np.array([[b"hi"]], dtype=object), "BYTES")})
    assert "error" in responses[-1]


def test_stop_strings_end_the_text_and_are_left_out(servers, deployment, target_only):
    from transformers import AutoTokenizer

    llmapi, _ = servers
    tokenizer = AutoTokenizer.from_pretrained(str(deployment.spec.pair_dir / "target" / "hf_checkpoint"))
    prompt = "class Parser:"
    ids = target_only(prompt, 20)["output_ids"]
    index = next(
        i
        for i in range(2, len(ids))
        if ids[i] not in ids[:i]
        and tokenizer(tokenizer.decode([ids[i]]), add_special_tokens=False)["input_ids"] == [ids[i]]
    )
    stop = tokenizer.decode([ids[index]])
    with SpecbuildClient(llmapi.http_url, protocol="http") as client:
        text, stats = client.complete(prompt, max_tokens=20, stop_words=[stop])
    assert stats["finish_reason"] == "stop" and stats["stop_reason"] == stop
    assert text == tokenizer.decode(ids[:index], skip_special_tokens=True)


def test_a_stop_request_cancels_the_request_with_that_id(servers):
    llmapi, _ = servers
    found: dict = {}
    started = threading.Event()

    def long_stream():
        found["responses"] = _grpc_stream(
            llmapi.grpc_url,
            {
                "text_input": (np.array([b"def add(a, b):"], dtype=object), "BYTES"),
                "sampling_param_max_tokens": (np.array([500], np.int32), "INT32"),
                "streaming": (np.array([True]), "BOOL"),
                "return_finish_reason": (np.array([True]), "BOOL"),
            },
            request_id="stop-me",
            first=started,
        )

    worker = threading.Thread(target=long_stream)
    worker.start()
    assert started.wait(60)
    stopped = _grpc_stream(
        llmapi.grpc_url,
        {"text_input": (np.array([b""], dtype=object), "BYTES"), "stop": (np.array([True]), "BOOL")},
        request_id="stop-me",
    )
    worker.join(60)
    assert "Request cancelled by client" in stopped[-1]["error"]
    last = found["responses"][-1]
    assert last["final"] and _text(last["outputs"]["finish_reason"]) == "cancelled"
    with SpecbuildClient(llmapi.grpc_url) as client:  # the server keeps serving
        assert client.complete("hello", max_tokens=2)[1]["finish_reason"] == "length"


def test_a_stop_request_ends_a_non_streaming_request_with_cancelled(servers):
    """NVIDIA's model sends nothing more to a non-streaming request a `stop` request aborted (the stand-in does the
    same); the repository's wrapper (specbuild.llmapi.answered) answers it CANCELLED, so its client gets an answer
    and the running-requests gauge the drain waits on returns to zero. Without the wrapper the request waits for
    its answer until the deadline below."""
    import time

    from specbuild.contract.serving_gate import RUNNING_GAUGE
    from specbuild.triton.drain import parse_metrics, read_metrics

    llmapi, _ = servers
    for attempt in range(3):  # the stop must find the request running: one done before any stop came is run again
        request_id, found = f"quiet-{attempt}", {}

        def long_request():
            try:
                found["responses"] = _grpc_stream(  # noqa: B023 (called within this iteration)
                    llmapi.grpc_url,
                    {
                        "text_input": (np.array([b"def add(a, b):"], dtype=object), "BYTES"),
                        "sampling_param_max_tokens": (np.array([500], np.int32), "INT32"),
                        "streaming": (np.array([False]), "BOOL"),
                        "return_finish_reason": (np.array([True]), "BOOL"),
                    },
                    request_id=request_id,  # noqa: B023 (called within this iteration)
                    timeout=60,
                )
            except Exception as err:  # noqa: BLE001 - no answer within the deadline
                found["error"] = err  # noqa: B023 (called within this iteration)

        worker = threading.Thread(target=long_request)
        worker.start()
        while worker.is_alive():  # each stop is answered at once, whether it found the request or not
            stopped = _grpc_stream(
                llmapi.grpc_url,
                {"text_input": (np.array([b""], dtype=object), "BYTES"), "stop": (np.array([True]), "BOOL")},
                request_id=request_id,
            )
            assert "Request cancelled by client" in stopped[-1]["error"]
            worker.join(0.05)
        assert "error" not in found, f"the stopped request got no answer: {found['error']!r}"
        if "error" in found["responses"][-1]:
            break
    assert found["responses"] == [{"error": "Request cancelled by client", "final": True}]
    line = f"[specbuild] request '{request_id}' ended without a response"
    deadline = time.monotonic() + 60  # a deadline: the wrapper logs just after the send the client saw
    while line not in llmapi.log_path.read_text(errors="replace") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert line in llmapi.log_path.read_text(errors="replace")
    running = lambda: parse_metrics(read_metrics(llmapi.metrics_url))[(RUNNING_GAUGE, "tensorrt_llm")]  # noqa: E731
    deadline = time.monotonic() + 60  # a deadline: the gauge drops just after the send the client saw
    while running() != 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert running() == 0
    with SpecbuildClient(llmapi.grpc_url) as client:  # the server keeps serving
        assert client.complete("hello", max_tokens=2)[1]["finish_reason"] == "length"


def test_eight_concurrent_streams_lose_nothing(servers, target_only):
    llmapi, _ = servers
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(8)]
    expected = {p: target_only(p, 16)["text"] for p in set(prompts)}
    results: list = [None] * 8

    def run(i):
        with SpecbuildClient(llmapi.grpc_url) as client:
            results[i] = client.complete(prompts[i], max_tokens=16, stream=True)[0]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == [expected[p] for p in prompts]


def test_triton_metrics_count_the_llmapi_model(servers):
    llmapi, _ = servers
    with urllib.request.urlopen(llmapi.metrics_url, timeout=10) as response:
        metrics = response.read().decode()
    assert 'nv_inference_request_success{model="tensorrt_llm",version="1"}' in metrics


def test_generate_cli_and_bench_url_work_against_it(servers, deployment, target_only):
    from click.testing import CliRunner

    from specbuild.bench.run import run_bench
    from specbuild.bench.runner import Settings
    from specbuild.cli import main

    llmapi, _ = servers
    result = CliRunner().invoke(
        main,
        [
            "generate",
            "-c",
            str(deployment.spec_path),
            "--url",
            llmapi.grpc_url,
            "--max-tokens",
            "12",
            "--json",
            "def add(a, b):",
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["text"] == target_only("def add(a, b):", 12)["text"] and doc["finish_reason"] == "length"
    k = deployment.spec.speculative.num_draft_tokens
    assert doc["num_output_tokens"] == 12 and doc["num_draft_tokens"] == k and doc["drafted"] > 0  # session.served
    assert doc["stop_reason"] is None
    # the model sends text only: no output ids are made up (the text tokenized again is not the model's ids), the
    # document says so, and a "length" generation's count is exact; the prompt's ids are tokenized as the LLM API does
    local = target_only("def add(a, b):", 12)
    assert doc["output_ids"] is None and doc["token_ids"].startswith("not sent")
    assert doc["num_output_tokens_estimated"] is False and doc["prompt_ids"] == local["prompt_ids"]
    through_bls = CliRunner().invoke(
        main,
        [
            "generate",
            "-c",
            str(deployment.spec_path),
            "--url",
            servers[1].grpc_url,
            "--max-tokens",
            "12",
            "--json",
            "def add(a, b):",
        ],
    )
    bls = json.loads(through_bls.stdout)
    assert (bls["output_ids"], bls["prompt_ids"]) == (
        local["output_ids"],
        local["prompt_ids"],
    ) and "token_ids" not in bls
    bench = run_bench(
        deployment.spec,
        Settings(num_draft_tokens=(0, 1, k), requests=2, max_tokens=12),
        "json",
        url=llmapi.grpc_url,
        protocol="grpc",
        threads=1,
    )
    assert [(r["num_draft_tokens"], r["concurrency"]) for r in bench["runs"]] == [(k, 1)]
    assert bench["runs"][0]["tokens_per_s"] > 0
    assert bench["serving_overhead"]["num_draft_tokens"] == k and bench["serving_overhead"]["triton_over_local"] > 0
    assert any("one K" in note for note in bench["notes"])


def test_the_client_still_finds_the_bls_on_the_engine_path(servers):
    _, engines = servers
    with SpecbuildClient(engines.grpc_url) as client:
        assert not client.is_llmapi() and client.model == "tensorrt_llm_bls"
    with pytest.raises(ClientError, match="no input in Triton's llmapi model"):
        with SpecbuildClient(servers[0].grpc_url) as client:
            client.complete("hi", max_tokens=2, end_id=2)


def test_a_stream_the_client_cancels_stops_generating(servers, target_only):
    import re
    import time

    import tritonclient.grpc as grpcclient

    llmapi, _ = servers
    chunks: queue.Queue = queue.Queue()
    raw = grpcclient.InferenceServerClient(llmapi.grpc_url)
    try:
        raw.start_stream(callback=lambda result=None, error=None: chunks.put((result, error)))
        inputs = []
        for name, value, dtype in (
            ("text_input", np.array([b"# Copyright"], dtype=object), "BYTES"),
            ("sampling_param_max_tokens", np.array([500], np.int32), "INT32"),
            ("streaming", np.array([True]), "BOOL"),
        ):
            tensor = grpcclient.InferInput(name, [1], dtype)
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)
        raw.async_stream_infer("tensorrt_llm", inputs, request_id="cancel-me")
        assert chunks.get(timeout=60)[1] is None  # the first streamed piece: generation is under way
    finally:
        raw.stop_stream(cancel_requests=True)
        raw.close()
    deadline, found = time.monotonic() + 60, None  # a deadline: the cancellation loop looks every 100 ms
    while time.monotonic() < deadline and found is None:
        found = re.search(
            r"request 'cancel-me' cancelled: stopped after (\d+) characters",
            llmapi.log_path.read_text(errors="replace"),
        )
        time.sleep(0.2)
    # found by the cancellation loop (every 100 ms) before the 500 tokens were done
    assert found is not None and int(found.group(1)) < len(target_only("# Copyright", 500)["text"])
    assert llmapi.ready()


def test_a_non_decoupled_target_only_deployment(deployment, target_only):
    """serve.decoupled = false refuses streaming with NVIDIA's message; num_draft_tokens = 0 serves the target alone."""
    import dataclasses

    from specbuild.llmapi.repository import write_repository

    spec = dataclasses.replace(
        deployment.spec,
        serve=dataclasses.replace(deployment.spec.serve, decoupled=False),
        speculative=dataclasses.replace(deployment.spec.speculative, num_draft_tokens=0),
    )
    repo = deployment.root / "llmapi_repo_plain"
    write_repository(spec, repo, runtime="reference")
    with serving(repo, deployment.root / "plain.log") as handle:
        status, body = _generate_http(
            handle.http_url,
            {
                "text_input": "def add(a, b):",
                "sampling_param_max_tokens": 12,
                "sampling_param_exclude_input_from_output": True,
                "sampling_param_return_perf_metrics": True,
            },
        )
        doc = json.loads(body)
        assert status == 200 and doc["text_output"] == target_only("def add(a, b):", 12)["text"]
        assert doc["total_draft_tokens"] == "0" and doc["acceptance_rate"] == "0.0"
        status, body = _generate_http(handle.http_url, {"text_input": "hi", "streaming": True}, "generate_stream")
        assert "Error generating request: Streaming is only supported in decoupled mode." in body


def test_generate_local_on_the_llmapi_path_runs_the_weights_the_server_loads(servers, deployment):
    """`generate --local` once ran the original float32 checkpoint while the llmapi server ran its float16 export;
    with --backend llmapi it runs the export, as the server does, and its ids are the models' own."""
    from click.testing import CliRunner

    from specbuild.cli import main

    llmapi, _ = servers
    args = ["generate", "-c", str(deployment.spec_path), "--max-tokens", "12", "--json", "def add(a, b):"]
    local = json.loads(CliRunner().invoke(main, [*args, "--local", "--backend", "llmapi", "--device", "cpu"]).stdout)
    served = json.loads(CliRunner().invoke(main, [*args, "--url", llmapi.grpc_url]).stdout)
    assert local["engine_source"] == "llmapi-export" and local["text"] == served["text"]
    assert len(local["output_ids"]) == local["num_output_tokens"] == 12 and not local["num_output_tokens_estimated"]
    assert local["drafted"] > 0 and served["output_ids"] is None


def test_the_local_llmapi_session_follows_the_export_not_the_original_checkpoint(deployment, target_only, tmp_path):
    """The export's final norm negated (its logits flip): the local LLM API session follows it exactly as the
    server's model (the stand-in LLM) does, and no longer agrees with the original weights."""
    import dataclasses
    import shutil

    from safetensors.torch import load_file, save_file

    from specbuild import paths
    from specbuild.decode.generation import Options
    from specbuild.llmapi import args as llm_args
    from specbuild.llmapi.checkpoint import checkpoint_dir
    from specbuild.llmapi.llm import Sampling, StandInLLM

    spec = dataclasses.replace(deployment.spec, output_dir=tmp_path)
    for role in ("target", "draft"):
        shutil.copytree(checkpoint_dir(deployment.spec, role), checkpoint_dir(spec, role))
    weights = checkpoint_dir(spec, "target") / "model.safetensors"
    tensors = load_file(str(weights))
    tensors["model.norm.weight"] = -tensors["model.norm.weight"]
    save_file(tensors, str(weights), metadata={"format": "pt"})

    prompt = PROMPTS[1]
    with paths.for_backend("llmapi").local_session(spec) as session:
        here = session.generate(prompt, Options(max_tokens=12))
    where = llm_args.Locations(str(checkpoint_dir(spec, "target")), str(checkpoint_dir(spec, "draft")))
    server_model = StandInLLM(llm_args.llm_args(spec, where))
    out = server_model.generate(prompt, Sampling(12, 0.0, 0, 1.0, None, True, False, [], []), streaming=False)
    assert (here.text, here.output_ids) == (out.outputs[0].text, list(out.outputs[0].token_ids))
    assert here.text != target_only(prompt, 12)["text"]
