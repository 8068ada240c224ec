"""What the overlapped BLS relies on, checked on the real CPU tritonserver (2.51, python_backend r24.10):
two threads of one BLS request can each run `pb_utils.InferenceRequest(...).exec()` at the same time, and
the two calls run at once in their two model processes (exec releases the GIL while it waits:
triton-inference-server/python_backend r24.10 `src/infer_request.cc`, `InferRequest::Exec`). A BLS
request's parameters reach the model too (`request.parameters()`, a JSON string), over gRPC and over
HTTP's generate endpoint ("parameters" in the body).

Two Python models sleep SLEEP seconds per request and answer when they started and ended (CLOCK_MONOTONIC, one
clock for every process of the machine); a third (`both`) calls them from two threads, then one after the
other, and returns those four intervals and what it read from its request's parameters. "At once" is asserted as
the two intervals overlapping, not as a wall time under a bound: the two threads send their calls a few
milliseconds apart, so the intervals of calls that run at once overlap unless a thread is held up for SLEEP
seconds, and calls run one after the other cannot overlap on any machine.
"""

from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest
from triton_helpers import serving

pytestmark = [pytest.mark.server, pytest.mark.slow]
SLEEP = 1.0

SLOW = f"""
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            start = time.monotonic()
            time.sleep({SLEEP})
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            span = pb_utils.Tensor("SPAN", np.array([start, time.monotonic()], np.float64))
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", x + 1), span]))
        return responses
"""

BOTH = """
import json
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


def call(model, x, out, key):
    response = pb_utils.InferenceRequest(model_name=model, inputs=[pb_utils.Tensor("X", x)],
                                         requested_output_names=["Y", "SPAN"]).exec()
    if response.has_error():
        out[key] = "error: " + response.error().message()
        return
    out[key] = pb_utils.get_output_tensor_by_name(response, "Y").as_numpy()
    out[key + " span"] = pb_utils.get_output_tensor_by_name(response, "SPAN").as_numpy()


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            out = {}
            worker = threading.Thread(target=call, args=("slow_a", x, out, "a"))
            worker.start()
            call("slow_b", x * 10, out, "b")
            worker.join()
            call("slow_a", x, out, "a2")
            call("slow_b", x, out, "b2")
            ok = all(not isinstance(v, str) for v in out.values()) and \\
                float(out["a"][0]) == float(x[0]) + 1 and float(out["b"][0]) == float(x[0]) * 10 + 1
            seen = json.loads(request.parameters() or "{}")
            spans = [out.get(key + " span", np.zeros(2)) for key in ("a", "b", "a2", "b2")]
            tensors = [pb_utils.Tensor("SPANS", np.array(spans, np.float64)),
                       pb_utils.Tensor("OK", np.array([ok])),
                       pb_utils.Tensor("PARAMETERS", np.array([json.dumps(seen).encode()], dtype=object))]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
"""


def _config(name: str, inputs: str, outputs: str) -> str:
    return (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n{inputs}{outputs}'
        "instance_group { count: 1 kind: KIND_CPU }\n"
    )


X = 'input { name: "X" data_type: TYPE_FP32 dims: 1 }\n'
Y_AND_SPAN = 'output { name: "Y" data_type: TYPE_FP32 dims: 1 }\noutput { name: "SPAN" data_type: TYPE_FP64 dims: 2 }\n'


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("bls-threads") / "repo"
    models = {
        "slow_a": (SLOW, X + Y_AND_SPAN),
        "slow_b": (SLOW, X + Y_AND_SPAN),
        "both": (
            BOTH,
            X + 'output { name: "SPANS" data_type: TYPE_FP64 dims: [ 4, 2 ] }\n'
            'output { name: "OK" data_type: TYPE_BOOL dims: 1 }\n'
            'output { name: "PARAMETERS" data_type: TYPE_STRING dims: 1 }\n',
        ),
    }
    for name, (code, io) in models.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(code)
        (repo / name / "config.pbtxt").write_text(_config(name, "", io))
    with serving(repo, repo.parent / "server.log") as handle:
        yield handle


def test_two_threads_of_one_bls_request_run_their_calls_at_once_and_parameters_arrive(server):
    import tritonclient.grpc as grpcclient

    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        x = grpcclient.InferInput("X", [1], "FP32")
        x.set_data_from_numpy(np.array([2.0], np.float32))
        result = client.infer("both", [x], parameters={"overlap": True})
    (a, b, a2, b2) = ((float(start), float(end)) for start, end in result.as_numpy("SPANS"))
    assert bool(result.as_numpy("OK")[0])  # each thread got its own model's answer (and its span)
    print(
        f"\ntwo threads: {max(a[1], b[1]) - min(a[0], b[0]):.2f} s for two {SLEEP} s calls, started "
        f"{abs(a[0] - b[0]) * 1000:.1f} ms apart; one after the other: {b2[1] - a2[0]:.2f} s"
    )
    assert a[0] < b[1] and b[0] < a[1], (a, b)  # at once: each started before the other ended
    assert a2[1] <= b2[0], (a2, b2)  # the control: calls made one after the other do not overlap
    assert json.loads(result.as_numpy("PARAMETERS")[0]) == {"overlap": True}


def test_the_http_generate_body_parameters_reach_the_model(server):
    body = json.dumps({"X": [3.0], "parameters": {"overlap": "auto"}}).encode()
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/both/generate",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        outputs = json.loads(response.read())
    assert json.loads(outputs["PARAMETERS"]) == {"overlap": "auto"}
