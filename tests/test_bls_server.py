"""The speculative BLS on a real CPU tritonserver (tiny example pair, reference engines).

Greedy text through the BLS (streaming or not, gRPC and HTTP, any K) equals target-only greedy decoding
in-process; the final response says why it ended (finish_reason, stop_reason); seeded sampling is
reproducible; /metrics agrees with the responses; bad requests (token ids outside the vocabulary, prompts too
long by their bytes, stop words that are not UTF-8 included) get INVALID_ARG with nothing in the log, and the
server stays ready; integer inputs are INT32, as NVIDIA's clients send them; 8 concurrent streaming clients lose
nothing; every model's dynamic batcher prefetches, as loaded.
"""

from __future__ import annotations

import json
import re
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest
from triton_helpers import make_deployment, run_concurrently, serving

from specbuild.errors import ClientError
from specbuild.triton.client import SpecbuildClient

pytestmark = [pytest.mark.server, pytest.mark.slow]
PROMPTS = ["# Copyright", "def add(a, b):", '{"name": ', "import os\nimport sys\n", "class Parser:"]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, example_tiny):
    return make_deployment(tmp_path_factory.mktemp("tiny-bls"), example_tiny)


@pytest.fixture(scope="module")
def server(deployment):
    with serving(deployment.repo, deployment.root / "server.log") as handle:
        yield handle


@pytest.fixture(scope="module")
def local(deployment):
    """The same pair in-process (`generate --local`)."""
    from specbuild.session.local import LocalSession

    return LocalSession.from_spec(deployment.spec, device="cpu", threads=1)


@pytest.fixture(scope="module")
def target_only(local):
    """In-process target-only greedy ids through the same reference runtime (K = 0)."""
    from specbuild.decode.generation import Options

    cache = {}

    def run(prompt: str, max_tokens: int) -> list[int]:
        if (prompt, max_tokens) not in cache:
            gen = local.generate(prompt, Options(max_tokens=max_tokens, num_draft_tokens=0, adaptive=False))
            cache[prompt, max_tokens] = gen.output_ids
        return cache[prompt, max_tokens]

    return run


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("stream", [True, False])
def test_greedy_bls_equals_target_only_for_every_k(server, target_only, protocol, stream):
    url = server.grpc_url if protocol == "grpc" else server.http_url
    with SpecbuildClient(url, protocol=protocol) as client:
        for prompt in PROMPTS:
            expected = target_only(prompt, 20)
            for k in (0, 1, 2, 4):
                chunks = list(client.generate(prompt, max_tokens=20, num_draft_tokens=k, stream=stream))
                stats = chunks[-1].stats
                assert stats["output_ids"] == expected, (prompt, k)
                if k == 0:
                    assert stats["total_draft_tokens"] == 0
                if stream and protocol == "grpc":
                    assert sum(1 for c in chunks if c.text) >= 2  # text arrived in several pieces


def test_seeded_sampling_is_reproducible(server):
    with SpecbuildClient(server.grpc_url) as client:

        def sample(seed):
            return client.complete("def add(a, b):", max_tokens=16, num_draft_tokens=3, temperature=1.0, seed=seed)[1][
                "output_ids"
            ]

        runs = {seed: sample(seed) for seed in (1, 2, 3, 4)}
        assert sample(1) == runs[1] and sample(3) == runs[3]
        assert len({tuple(v) for v in runs.values()}) > 1  # the seed matters


def _metrics(server) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{server.metrics_url.removeprefix('http://')}", timeout=10) as r:
        text = r.read().decode()
    values = {}
    for line in text.splitlines():
        match = re.match(r"^(specbuild_\w+)\{([^}]*)\} ([0-9.e+-]+)$", line)
        if match:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2)))
            key = match.group(1) + "".join(f"[{k}={v}]" for k, v in sorted(labels.items()) if k != "model")
            values[key] = float(match.group(3))
    return values


def test_metrics_agree_with_the_responses(server):
    before = _metrics(server)
    with SpecbuildClient(server.grpc_url) as client:
        _, on = client.complete("import os\nimport sys\n", max_tokens=24, num_draft_tokens=4)
        _, off = client.complete("class Parser:", max_tokens=10, num_draft_tokens=0)
    after = _metrics(server)

    def delta(key):
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta("specbuild_requests_total[speculation=on]") == 1
    assert delta("specbuild_requests_total[speculation=off]") == 1
    assert delta("specbuild_drafted_tokens_total") == on["total_draft_tokens"]
    assert delta("specbuild_accepted_tokens_total") == on["total_accepted_draft_tokens"]
    assert delta("specbuild_generated_tokens_total") == on["num_output_tokens"] + off["num_output_tokens"]
    steps = on["speculation_stats"]["steps"] + off["speculation_stats"]["steps"]
    assert delta("specbuild_verify_steps_total") == steps
    per_position = on["speculation_stats"]["per_position_accepted"]
    assert delta("specbuild_position_accepted_total[position=0]") == per_position[0]
    assert 0.0 <= after["specbuild_acceptance_rate"] <= 1.0
    assert after["specbuild_acceptance_disagreements_total"] == 0  # exported; the reference target's figure agrees


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"prompt": "", "max_tokens": 4}, "'text_input' is required"),
        ({"prompt": "hi", "max_tokens": 10**6}, "'max_tokens' = 1000000: must be in 1..256"),
        ({"prompt": "hi", "max_tokens": 4, "num_draft_tokens": -1}, "num_draft_tokens = -1 is invalid"),
        ({"prompt": "hi", "max_tokens": 4, "top_p": 1.5}, "top_p = 1.5 is invalid"),
        ({"prompt": "hi", "max_tokens": 4, "end_id": -5}, "end_id = -5 is invalid"),
        ({"prompt": "x = 1\n" * 400, "max_tokens": 4}, "above this deployment's max_input_len = 256"),
        # the size first: max_input_len 256 x at most 20 bytes per token of the example's tokenizer = 5120 bytes
        (
            {"prompt": "x" * 5121, "max_tokens": 4},
            "input 'text_input' is 5121 bytes, above the 5120 bytes that can fit",
        ),
        ({"prompt": "hi", "max_tokens": 4, "pad_id": 768}, "pad_id = 768 is invalid"),
    ],
)
def test_bad_requests_get_invalid_arg_and_the_server_stays_ready(server, target_only, kwargs, message):
    with SpecbuildClient(server.grpc_url) as client:
        with pytest.raises(ClientError, match=re.escape(message)) as info:
            client.complete(kwargs.pop("prompt"), **kwargs)
        assert "Traceback" not in str(info.value)
        assert client.is_ready()
        assert client.complete(PROMPTS[0], max_tokens=6)[1]["output_ids"] == target_only(PROMPTS[0], 6)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("stream", [True, False])
def test_the_final_response_says_why_it_ended(server, target_only, local, protocol, stream):
    url = server.grpc_url if protocol == "grpc" else server.http_url
    prompt = PROMPTS[3]
    expected = target_only(prompt, 12)
    with SpecbuildClient(url, protocol=protocol) as client:
        final = list(client.generate(prompt, max_tokens=12, num_draft_tokens=2, stream=stream))[-1].stats
        assert final["output_ids"] == expected
        assert (final["finish_reason"], "stop_reason" in final) == (
            ("length", False) if len(expected) == 12 else ("stop", False)
        )  # end_id: "stop", no stop_reason
        # a stop word from the greedy text: "stop", the word as stop_reason, the output ends with it
        tokenizer = local.tokenizer

        def round_trips(ids):
            return (
                bool(tokenizer.decode(ids)) and tokenizer.encode(tokenizer.decode(ids), add_special_tokens=False) == ids
            )

        seq = next(
            expected[i : i + n]
            for n in (2, 1)
            for i in range(1, len(expected) - n + 1)
            if round_trips(expected[i : i + n])
        )
        word = tokenizer.decode(seq)
        ends = next(j for j in range(len(seq), len(expected) + 1) if expected[j - len(seq) : j] == seq)
        final = list(client.generate(prompt, max_tokens=12, num_draft_tokens=2, stream=stream, stop_words=[word]))[
            -1
        ].stats
    assert (final["finish_reason"], final["stop_reason"]) == ("stop", word)
    assert final["output_ids"] == expected[:ends]


def _generate(server, body: dict) -> tuple[int, str]:
    request = urllib.request.Request(
        f"http://{server.http_url.removeprefix('http://')}/v2/models/tensorrt_llm_bls/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@pytest.mark.parametrize(
    "field, value", [("end_id", 10**6), ("end_id", -5), ("pad_id", 10**6), ("pad_id", -5), ("pad_id", 2**31 - 1)]
)
def test_token_ids_outside_the_vocabulary_are_invalid_arg_not_an_internal_error(server, field, value):
    log_before = server.log_path.read_text(errors="replace").count("Traceback")
    code, text = _generate(server, {"text_input": "def add(a, b):", "max_tokens": 4, field: value})
    assert code == 400, text  # Triton's HTTP status for INVALID_ARG (INTERNAL is 500)
    assert f"{field} = {value} is invalid: use " in text and "[0, 768)" in text, text  # the BLS's own check, first
    assert "internal error" not in text and "Traceback" not in text
    assert server.log_path.read_text(errors="replace").count("Traceback") == log_before  # nothing in the log either
    assert server.ready()


def _stream_error(server, inputs: dict) -> str | None:
    """One request over the gRPC stream, inputs {name: (array, Triton datatype)}: the first error, or None."""
    import queue

    import tritonclient.grpc as grpcclient

    answers: queue.Queue = queue.Queue()
    raw = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        raw.start_stream(callback=lambda result=None, error=None: answers.put(error))
        tensors = []
        for name, (value, datatype) in inputs.items():
            tensors.append(grpcclient.InferInput(name, list(value.shape), datatype))
            tensors[-1].set_data_from_numpy(value)
        raw.async_stream_infer("tensorrt_llm_bls", tensors)
        error = answers.get(timeout=60)
        return None if error is None else error.message()
    finally:
        raw.stop_stream()
        raw.close()


def _bytes(value: bytes) -> tuple[np.ndarray, str]:
    return np.array([[value]], dtype=object), "BYTES"


def test_stop_words_that_are_not_utf8_are_refused_like_the_prompt(server):
    four = (np.array([[4]], np.int32), "INT32")
    assert (
        _stream_error(server, {"text_input": _bytes(b"\xff\xfe"), "max_tokens": four})
        == "input 'text_input' is not valid UTF-8."
    )
    assert (
        _stream_error(
            server, {"text_input": _bytes(b"def add(a, b):"), "max_tokens": four, "stop_words": _bytes(b"\xff\xfe")}
        )
        == "input 'stop_words' is not valid UTF-8."
    )
    assert (
        _stream_error(
            server, {"text_input": _bytes(b"def add(a, b):"), "max_tokens": four, "stop_words": _bytes("é".encode())}
        )
        is None
    )


def test_integer_inputs_are_int32_and_json_integers_past_32_bits_wrap_in_triton(server, target_only):
    """Why the BLS's integer inputs stay INT32 and clients must send values in range: Triton refuses a tensor of
    another integer type (so declaring INT64 would refuse NVIDIA's clients, which send INT32), and over HTTP
    generate it casts a JSON integer to INT32 before any model sees it (server src/http_server.cc)."""
    code, text = _generate(server, {"text_input": PROMPTS[1], "max_tokens": 2**32 + 5, "exclude_input_in_output": True})
    assert code == 200 and json.loads(text)["output_ids"] == target_only(PROMPTS[1], 5)  # 2^32 + 5 arrived as 5
    code, text = _generate(server, {"text_input": PROMPTS[1], "max_tokens": 2**31 + 5})
    assert code == 400 and "'max_tokens' = -2147483643: must be in 1..256" in text  # wrapped negative: refused
    code, text = _generate(server, {"text_input": PROMPTS[1], "max_tokens": 2**63})
    assert code == 500 and "attempt to access JSON non-signed-integer as signed-integer" in text
    error = _stream_error(
        server, {"text_input": _bytes(PROMPTS[1].encode()), "max_tokens": (np.array([[4]], np.int64), "INT64")}
    )
    assert "inference input 'max_tokens' data-type is 'INT64', but model 'tensorrt_llm_bls' expects 'INT32'" in error
    with SpecbuildClient(server.http_url, protocol="http") as client:  # the client never sends such a number
        with pytest.raises(ClientError, match="outside the range of its input type INT32"):
            client.complete(PROMPTS[1], max_tokens=2**32 + 5)


def test_wrong_dtype_is_rejected_by_the_server(server, target_only):
    import queue

    import tritonclient.grpc as grpcclient

    answers: queue.Queue = queue.Queue()
    raw = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        raw.start_stream(callback=lambda result=None, error=None: answers.put(error))
        text = grpcclient.InferInput("text_input", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([[b"hello"]], dtype=object))
        wrong = grpcclient.InferInput("max_tokens", [1, 1], "FP32")
        wrong.set_data_from_numpy(np.array([[4.0]], np.float32))
        raw.async_stream_infer("tensorrt_llm_bls", [text, wrong])
        error = answers.get(timeout=60)
        assert error is not None and re.search("(?i)data.?type|FP32", str(error)), error
    finally:
        raw.stop_stream()
        raw.close()
    assert server.ready()
    with SpecbuildClient(server.grpc_url) as client:
        assert client.complete(PROMPTS[1], max_tokens=6)[1]["output_ids"] == target_only(PROMPTS[1], 6)


def test_eight_concurrent_streaming_clients_lose_nothing(server, target_only):
    expected = {p: target_only(p, 8) for p in PROMPTS}
    results: list[tuple[str, list[int], str]] = []
    lock = threading.Lock()

    def client_loop(i: int) -> None:
        with SpecbuildClient(server.grpc_url) as client:
            for j in range(10):
                prompt = PROMPTS[(i + j) % len(PROMPTS)]
                chunks = list(client.generate(prompt, max_tokens=8, num_draft_tokens=1 + (i + j) % 4))
                assert chunks[-1].final
                with lock:
                    results.append((prompt, chunks[-1].stats["output_ids"], "".join(c.text for c in chunks)))

    errors = run_concurrently(client_loop, 8, timeout=600)
    assert not errors, errors[:3]
    assert len(results) == 80
    for prompt, ids, text in results:
        assert ids == expected[prompt]
        assert text  # streamed text arrived


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_generate_cli_through_the_server(server, deployment, target_only, protocol):
    import json

    from click.testing import CliRunner

    from specbuild.cli import main

    url = server.grpc_url if protocol == "grpc" else server.http_url.removeprefix("http://")
    base = ["generate", "-c", str(deployment.spec_path), "--url", url, "--protocol", protocol, "--max-tokens", "12"]
    result = CliRunner().invoke(main, [*base, "--json", "--num-draft-tokens", "3", "def add(a, b):"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["output_ids"] == target_only("def add(a, b):", 12)
    assert doc["num_draft_tokens"] == 3 and doc["drafted"] > 0 and 0 <= doc["acceptance_rate"] <= 1
    assert doc["server"] == {"url": url, "protocol": protocol}
    streamed = CliRunner().invoke(main, [*base, "def add(a, b):"])
    assert streamed.exit_code == 0 and streamed.stdout.rstrip("\n") == doc["text"].rstrip("\n")
    assert "acceptance" in streamed.stderr
    down = CliRunner().invoke(main, [*base[:4], "127.0.0.1:1", "--protocol", protocol, "hi"])
    assert down.exit_code == 1 and "Error:" in down.output and "Traceback" not in down.output


def test_a_cancelled_stream_stops_generating(deployment, server, target_only):
    """The BLS sees the cancel and stops the request before its end: it counts it as cancelled (the evidence: a
    request that ran to its end, as with cancellation broken, counts as completed instead), whatever the machine's
    speed; the request asks for the most tokens the deployment allows, so its end is far off."""
    import queue
    import time

    import tritonclient.grpc as grpcclient

    most = deployment.spec.build.max_seq_len - deployment.spec.build.max_input_len
    before = _metrics(server)
    chunks: queue.Queue = queue.Queue()
    raw = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        raw.start_stream(callback=lambda result=None, error=None: chunks.put((result, error)))
        inputs = []
        for name, value, dtype in (
            ("text_input", np.array([[b"# Copyright"]], dtype=object), "BYTES"),
            ("max_tokens", np.array([[most]], np.int32), "INT32"),
            ("num_draft_tokens", np.array([[1]], np.int32), "INT32"),
            ("stream", np.array([[True]]), "BOOL"),
        ):
            tensor = grpcclient.InferInput(name, [1, 1], dtype)
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)
        raw.async_stream_infer("tensorrt_llm_bls", inputs)
        result, error = chunks.get(timeout=60)  # the first streamed piece: generation is under way
        assert error is None
    finally:
        raw.stop_stream(cancel_requests=True)
        raw.close()
    key = "specbuild_cancelled_requests_total"
    deadline = time.monotonic() + 120  # a deadline only: the count is the event waited for
    after = _metrics(server)
    while after.get(key, 0.0) - before.get(key, 0.0) < 1 and time.monotonic() < deadline:
        time.sleep(0.1)
        after = _metrics(server)
    assert after.get(key, 0.0) - before.get(key, 0.0) == 1, "the BLS never saw the cancel"
    done = sum(after.get(k, 0) - before.get(k, 0) for k in after if k.startswith("specbuild_requests_total"))
    assert done == 0  # stopped, not completed
    assert server.ready()
    with SpecbuildClient(server.grpc_url) as client:
        assert client.complete(PROMPTS[0], max_tokens=6)[1]["output_ids"] == target_only(PROMPTS[0], 6)


# ---- the overlapped schedule: early drafts from a second thread of the request, the same text ----------------
@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("stream", [True, False])
def test_greedy_with_overlap_on_or_off_equals_target_only(server, target_only, protocol, stream):
    url = server.grpc_url if protocol == "grpc" else server.http_url
    early = hits = 0
    with SpecbuildClient(url, protocol=protocol) as client:
        for prompt in PROMPTS[:3]:
            expected = target_only(prompt, 24)
            for k in (2, 4):
                for overlap in (True, False):
                    stats = list(
                        client.generate(prompt, max_tokens=24, num_draft_tokens=k, stream=stream, overlap=overlap)
                    )[-1].stats
                    assert stats["output_ids"] == expected, (prompt, k, overlap)
                    figures = stats["speculation_stats"]
                    assert figures["overlap"] is overlap  # the schedule the BLS ran, as asked
                    if overlap:
                        early, hits = early + figures["early_drafts"], hits + figures["early_draft_hits"]
                        assert 0 <= figures["hidden_seconds"] <= figures["draft_seconds"]
                    else:
                        assert figures["early_drafts"] == figures["early_draft_hits"] == 0
    assert early > 0 and 0 < hits <= early  # early drafts were made and used


@pytest.mark.parametrize("use_draft_logits", [False, True])
def test_seeded_sampling_gives_the_same_text_with_overlap_on_or_off(server, use_draft_logits):
    early = 0
    with SpecbuildClient(server.grpc_url) as client:

        def sample(seed, overlap):
            return client.complete(
                "def add(a, b):",
                max_tokens=16,
                num_draft_tokens=3,
                temperature=1.0,
                seed=seed,
                overlap=overlap,
                use_draft_logits=use_draft_logits,
            )[1]

        texts = set()
        for seed in (1, 2, 3):
            off, on = sample(seed, False), sample(seed, True)
            assert on["output_ids"] == off["output_ids"] == sample(seed, True)["output_ids"], seed
            early += on["speculation_stats"]["early_drafts"]
            texts.add(tuple(off["output_ids"]))
    assert early > 0 and len(texts) > 1  # early drafts were made; the seed matters


def test_the_deployments_schedule_and_a_bad_overlap_parameter(server, target_only):
    import os

    from specbuild.triton.models.bls import AUTO_CORES

    configured = "auto" if len(os.sched_getaffinity(0)) >= AUTO_CORES else False  # the spec's "auto", by the BLS
    with SpecbuildClient(server.grpc_url) as client:
        stats = client.complete(PROMPTS[0], max_tokens=12, num_draft_tokens=2)[1]
        assert stats["speculation_stats"]["overlap"] == configured and stats["output_ids"] == target_only(
            PROMPTS[0], 12
        )
        with pytest.raises(ClientError, match=re.escape("request parameter 'overlap' = 'sometimes' is invalid")):
            client.complete(PROMPTS[0], max_tokens=4, overlap="sometimes")
        assert client.is_ready()


@pytest.mark.parametrize("overlap", [True, "auto"])
def test_eight_concurrent_overlapped_streams_give_the_target_only_text(deployment, server, target_only, overlap):
    expected = {p: target_only(p, 12) for p in PROMPTS}
    results, lock = [], threading.Lock()

    def client_loop(i: int) -> None:
        with SpecbuildClient(server.grpc_url) as client:
            for j in range(3):
                prompt = PROMPTS[(i + j) % len(PROMPTS)]
                stats = list(client.generate(prompt, max_tokens=12, num_draft_tokens=3, overlap=overlap))[-1].stats
                with lock:
                    results.append((prompt, stats["output_ids"], stats["speculation_stats"]["overlap"]))

    errors = run_concurrently(client_loop, 8, timeout=600)
    assert not errors, errors[:3]
    assert len(results) == 24 and all(ids == expected[prompt] for prompt, ids, _ in results)
    schedules = {schedule for _, _, schedule in results}
    # True is kept under load; "auto" stops drafting ahead while more requests are in flight than cores / 2. The BLS
    # runs at most max_batch_size at once (the rest wait for a slot), and reads the cores its process may use, so
    # whether "auto" gives way depends on this machine: with 2 x max_batch_size <= cores it never has to
    from specbuild.speculative.overlap import available_cores

    most_in_flight = min(8, deployment.spec.build.max_batch_size)
    if overlap is True:
        assert schedules == {True}
    elif 2 * most_in_flight > available_cores():
        assert False in schedules, schedules
    else:
        assert schedules == {"auto"}, schedules


def test_every_served_model_keeps_the_batcher_on_its_prefetching_path(server):
    """As the server loaded them (its defaults filled in), no model has a queue policy that takes Triton's dynamic
    batcher off prefetching, the only path on which a request cannot wait 500 ms beside a freed instance
    (specbuild.triton.configs, from core r24.10's source). A check of structure, not of timing."""
    import tritonclient.grpc as grpcclient

    from specbuild.triton import configs

    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        for model in ("tensorrt_llm_bls", "tensorrt_llm", "tensorrt_llm_draft", "preprocessing", "postprocessing"):
            config = client.get_model_config(model).config
            assert config.HasField("dynamic_batching"), model
            assert configs.prefetches(config.dynamic_batching), (model, config.dynamic_batching)


# ---- drafters: prompt lookup's proposals reach the target as draft_input_ids, the text is the target's -----------
@pytest.mark.parametrize("drafter", ["lookup", "hybrid"])
def test_greedy_with_lookup_or_the_hybrid_equals_target_only(server, target_only, drafter):
    with SpecbuildClient(server.grpc_url) as client:  # the hybrid drafts ahead as the draft model does; lookup never
        model_schedule = list(client.generate(PROMPTS[0], max_tokens=4, num_draft_tokens=2))[-1].stats
    schedule = model_schedule["speculation_stats"]["overlap"] if drafter == "hybrid" else False
    before = _metrics(server)
    proposed = {}
    with SpecbuildClient(server.grpc_url) as client:
        for prompt in [*PROMPTS[:3], "x = [1, 2, 3]\ny = [1, 2, 3]\nz = [1, 2,"]:
            expected = target_only(prompt, 24)
            for k in (2, 4):
                stats = list(client.generate(prompt, max_tokens=24, num_draft_tokens=k, drafter=drafter))[-1].stats
                assert stats["output_ids"] == expected, (prompt, k, drafter)
                figures = stats["speculation_stats"]
                assert figures["drafter"] == drafter and figures["overlap"] == schedule
                for name, counts in figures["by_drafter"].items():
                    proposed[name] = proposed.get(name, 0) + counts["proposals"]
        with pytest.raises(ClientError, match=re.escape("drafter = 'ngram' is unknown. Use one of: model, lookup")):
            client.complete(PROMPTS[0], max_tokens=4, drafter="ngram")
        assert client.is_ready()
    assert proposed.get("lookup", 0) > 0  # the lookup proposed
    assert (proposed.get("model", 0) > 0) == (drafter == "hybrid")  # the draft model only where the hybrid asked it
    after = _metrics(server)
    for name, count in proposed.items():  # the metrics count each drafter's proposals as the responses do
        key = f"specbuild_drafter_proposals_total[drafter={name}]"
        assert after[key] - before.get(key, 0.0) == count, name


def _frontend_request(server, prompt: str, stream: bool, max_tokens: int, guide: str | None = None) -> list[dict]:
    """The tensors Triton's OpenAI-compatible frontend sends a TensorRT-LLM model (triton-inference-server/server,
    python/openai/openai_frontend/engine/utils/triton.py, `_create_trtllm_generate_request`: always text_input, stream,
    max_tokens, return_num_input_tokens and return_num_output_tokens; echo=False as exclude_input_in_output), on a
    gRPC stream: each response's text and token counts. `guide`: a tool call's JSON schema, which the frontend sends
    as guided_decoding_guide_type = json_schema and guided_decoding_guide."""
    import queue

    import tritonclient.grpc as grpcclient

    tensors = {
        "text_input": (np.array([[prompt.encode()]], dtype=object), "BYTES"),
        "stream": (np.array([[stream]]), "BOOL"),
        "max_tokens": (np.array([[max_tokens]], np.int32), "INT32"),
        "exclude_input_in_output": (np.array([[True]]), "BOOL"),
        "return_num_input_tokens": (np.array([[True]]), "BOOL"),
        "return_num_output_tokens": (np.array([[True]]), "BOOL"),
    }
    if guide is not None:
        tensors["guided_decoding_guide_type"] = (np.array([[b"json_schema"]], dtype=object), "BYTES")
        tensors["guided_decoding_guide"] = (np.array([[guide.encode()]], dtype=object), "BYTES")
    inputs = []
    for name, (value, datatype) in tensors.items():
        inputs.append(grpcclient.InferInput(name, list(value.shape), datatype))
        inputs[-1].set_data_from_numpy(value)
    answers: queue.Queue = queue.Queue()
    raw = grpcclient.InferenceServerClient(server.grpc_url)
    responses = []
    try:
        raw.start_stream(callback=lambda result=None, error=None: answers.put((result, error)))
        raw.async_stream_infer("tensorrt_llm_bls", inputs, enable_empty_final_response=True)
        while True:
            result, error = answers.get(timeout=120)
            assert error is None, error
            response = result.get_response()
            names = {output.name for output in response.outputs}
            responses.append(
                {
                    name: result.as_numpy(name).reshape(-1)[0]
                    for name in ("num_input_tokens", "num_output_tokens")
                    if name in names
                }
                | {"text": result.as_numpy("text_output").reshape(-1)[0].decode() if "text_output" in names else ""}
            )
            final = response.parameters.get("triton_final_response")
            if final is None or final.bool_param:
                return responses
    finally:
        raw.stop_stream()
        raw.close()


def _frontend_usage(responses: list[dict]) -> tuple[int | None, int]:
    """Usage as the frontend counts it (`_StreamingUsageAccumulator`): prompt tokens from the first response that has
    both counts, completion tokens summed over every such response."""
    counted = [r for r in responses if "num_input_tokens" in r and "num_output_tokens" in r]
    return (int(counted[0]["num_input_tokens"]) if counted else None), sum(int(r["num_output_tokens"]) for r in counted)


@pytest.mark.parametrize("stream", [True, False])
def test_the_openai_frontends_tensors_are_served_and_its_usage_counts_every_token(server, stream):
    """NVIDIA's OpenAI frontend always asks for both counts: the BLS serves it (it refused before), and the usage the
    frontend adds up equals the request's own counts, over streamed responses that carry several tokens each."""
    prompt = '{"name": '
    with SpecbuildClient(server.grpc_url) as client:
        text, stats = client.complete(prompt, max_tokens=32)
    responses = _frontend_request(server, prompt, stream, 32)
    assert "".join(r["text"] for r in responses) == text
    assert (
        _frontend_usage(responses)
        == (stats["num_input_tokens"], stats["num_output_tokens"])
        == (
            stats["num_input_tokens"],
            len(stats["output_ids"]),
        )
    )
    if stream:
        per_response = [int(r["num_output_tokens"]) for r in responses[:-1]]
        assert all(r["num_input_tokens"] == stats["num_input_tokens"] for r in responses)
        assert max(per_response) > 1  # a verify step that kept draft tokens streams them in one response
    else:
        assert len(responses) == 1


GUIDES = [
    ("json_schema", json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})),
    ("regex", r"(yes|no), [a-z]{2,10}\."),
    ("json_schema", json.dumps({"enum": ["red", "green", "blue"]})),
]


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("stream", [True, False])
def test_guided_greedy_through_the_bls_equals_the_local_constrained_greedy(server, local, protocol, stream):
    """Structured output through the served BLS: NVIDIA's guided inputs, any K, token for token the in-process
    constrained greedy at K = 0 (itself equal to the target's constrained argmax: tests/test_guided.py)."""
    from specbuild.decode.generation import Options

    url = server.grpc_url if protocol == "grpc" else server.http_url
    constrained = 0
    with SpecbuildClient(url, protocol=protocol) as client:
        for guide_type, guide in GUIDES:
            for prompt in PROMPTS[:2]:
                options = Options(max_tokens=24, num_draft_tokens=0, guide_type=guide_type, guide=guide)
                expected = local.generate(prompt, options)
                for k in (0, 4):
                    chunks = list(
                        client.generate(
                            prompt, max_tokens=24, num_draft_tokens=k, stream=stream, guide_type=guide_type, guide=guide
                        )
                    )
                    stats = chunks[-1].stats
                    assert stats["output_ids"] == expected.output_ids, (guide, prompt, k)
                    assert "".join(c.text for c in chunks) == expected.text
                    constrained += stats["speculation_stats"]["constrained_steps"]
    assert constrained > 0  # the served BLS made constrained steps (bad_words_list to the real server's target)
    assert _metrics(server)["specbuild_constrained_steps_total"] >= constrained  # and counted by the metrics


@pytest.mark.parametrize(
    ("guide_type", "guide", "message"),
    [
        ("json_schema", "{bad", r"guided_decoding_guide \(json_schema\) does not compile: Failed to parse JSON"),
        ("regex", "(", r"guided_decoding_guide \(regex\) does not compile: Regex parsing error"),
        ("yaml", "a: 1", "guided_decoding_guide_type = 'yaml' is unknown"),
        (None, "[0-9]+", "without guided_decoding_guide_type"),
    ],
)
def test_a_malformed_guide_is_invalid_arg_and_the_server_keeps_serving(server, target_only, guide_type, guide, message):
    with SpecbuildClient(server.grpc_url) as client:
        with pytest.raises(ClientError, match=message):
            client.complete("x", max_tokens=4, guide_type=guide_type, guide=guide)
        text, stats = client.complete("def add(a, b):", max_tokens=8)
    assert stats["output_ids"] == target_only("def add(a, b):", 8)


def test_the_openai_frontends_tool_call_guide_is_served(server, local):
    """A tool call through NVIDIA's OpenAI frontend sends its arguments' schema as a json_schema guide with the
    counts it always asks for: the BLS honours it, and the text is what the in-process guided run gives."""
    from specbuild.decode.generation import Options

    schema = GUIDES[0][1]
    expected = local.generate('{"name": ', Options(max_tokens=24, guide_type="json_schema", guide=schema))
    for stream in (True, False):
        responses = _frontend_request(server, '{"name": ', stream, 24, guide=schema)
        assert "".join(r["text"] for r in responses) == expected.text
        assert _frontend_usage(responses)[1] == len(expected.output_ids)
