"""Measure Triton's dynamic-batcher stall that the generated Python models' queue-delay floor is for.

    python scripts/batcher_stall_probe.py [--pairs 200] [--delays 0,100]

A repository of three Python models on the real tritonserver (from nvidia-pytriton): `pairs`, whose one request
makes two threads call one model `--pairs` times at once (as the overlapped BLS's early draft meets the loop's
next draft, or two streams meet at one model), and a model that holds its one instance 2 ms per call, with a
bounded queue (default_queue_policy.max_queue_size 16) and each queue delay of `--delays`. For each delay it prints
the longest calls and how many took over 0.25 s. With a bounded queue and no delay, Triton's batcher can leave the
second request waiting for its idle wait of 500 ms (triton-inference-server/core src/dynamic_batch_scheduler.cc,
`default_wait_microseconds`); on tritonserver 2.51 here 5-19 of 400 calls did so with delay 0, 0-1 of 300 with
100 us (specbuild.triton.configs.PYTHON_MODEL_MIN_QUEUE_DELAY_US). A measurement, not a test: how often the race
shows is the machine's.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

PAIRS = '''
import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def call(model, times):
    t0 = time.perf_counter()
    x = pb_utils.Tensor("X", np.zeros((1, 1), np.float32))
    response = pb_utils.InferenceRequest(model_name=model, inputs=[x], requested_output_names=["Y"]).exec()
    assert not response.has_error(), response.error().message()
    times.append(time.perf_counter() - t0)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            asked = json.loads(request.parameters())
            times = []
            for _ in range(asked["n"]):
                worker = threading.Thread(target=call, args=(asked["model"], times))
                worker.start()
                call(asked["model"], times)
                worker.join()
            out = np.array(sorted(times, reverse=True), np.float32)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("TIMES", out)]))
        return responses
'''

BUSY = '''
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            time.sleep(0.002)
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", x + 1)]))
        return responses
'''


def write_repo(repo: Path, delays: list[int]) -> None:
    models = {"pairs": (PAIRS, 'max_batch_size: 0\ninput { name: "X" data_type: TYPE_FP32 dims: 1 }\n'
                                'output { name: "TIMES" data_type: TYPE_FP32 dims: -1 }\n')}
    for delay in delays:
        models[f"busy_{delay}"] = (BUSY, 'max_batch_size: 4\ninput { name: "X" data_type: TYPE_FP32 dims: -1 }\n'
                                         'output { name: "Y" data_type: TYPE_FP32 dims: -1 }\n'
                                         f'dynamic_batching {{ max_queue_delay_microseconds: {delay} '
                                         'default_queue_policy { max_queue_size: 16 } }\n')
    for name, (code, io) in models.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(code)
        (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n{io}'
                                                  'instance_group { count: 1 kind: KIND_CPU }\n')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=200, help="calls per thread and delay")
    parser.add_argument("--delays", default="0,100", help="queue delays to measure, microseconds")
    args = parser.parse_args()
    delays = [int(d) for d in args.delays.split(",")]

    import tritonclient.grpc as grpcclient

    from specbuild.triton.server import ServerHandle, ServerOptions

    with tempfile.TemporaryDirectory(prefix="batcher-stall-") as tmp:
        repo = Path(tmp) / "repo"
        write_repo(repo, delays)
        server = ServerHandle(ServerOptions(repo=repo), log_path=Path(tmp) / "server.log").start(timeout=300)
        try:
            with grpcclient.InferenceServerClient(server.grpc_url) as client:
                for delay in delays:
                    x = grpcclient.InferInput("X", [1], "FP32")
                    x.set_data_from_numpy(np.array([0.0], np.float32))
                    times = client.infer("pairs", [x], parameters={"model": f"busy_{delay}", "n": args.pairs},
                                         client_timeout=600).as_numpy("TIMES")
                    print(f"queue delay {delay:>6} us: longest calls {', '.join(f'{t:.3f}' for t in times[:3])} s; "
                          f"{int((times > 0.25).sum())} of {len(times)} over 0.25 s; median {np.median(times):.4f} s")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
