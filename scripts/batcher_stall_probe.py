"""Measure Triton's dynamic-batcher stall: a request left waiting 500 ms beside an idle instance.

    python scripts/batcher_stall_probe.py [--pairs 1000] [--configs generated,bounded] [--delays 0,100]
                                          [--callers 2] [--distinct-shapes]

A repository on the real tritonserver (from nvidia-pytriton): `callers`, whose one request makes `--callers`
threads call one model at once, `--pairs` rounds (as the overlapped BLS's early draft meets the loop's next draft,
or concurrent streams meet at one model), and, per configuration and delay, a Python model that holds its one
instance 2 ms per call. Configurations:

- `generated`: the dynamic batcher every model of a generated repository gets, built by
  `specbuild.triton.configs.add_dynamic_batching` (no queue policy, so Triton's batcher prefetches);
- `bounded`: the same plus `default_queue_policy { max_queue_size: 16 }`, the configuration generated before
  (with `--delays 100`, the 100 us floor it had), which does not prefetch.

For each it prints how many calls took over 0.25 s (a 2 ms call that waited the batcher's idle wait of 500 ms:
triton-inference-server/core r24.10 src/dynamic_batch_scheduler.cc, `default_wait_microseconds`), the longest
calls and the median. Why the bounded one stalls and the generated one cannot: specbuild.triton.configs, the
comment above `prefetches`. A measurement, not a test: how often the race shows is the machine's.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

CALLERS = """
import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def call(model, length, times):
    t0 = time.perf_counter()
    x = pb_utils.Tensor("X", np.zeros((1, length), np.float32))
    response = pb_utils.InferenceRequest(model_name=model, inputs=[x], requested_output_names=["Y"]).exec()
    assert not response.has_error(), response.error().message()
    times.append(time.perf_counter() - t0)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            asked = json.loads(request.parameters())
            lengths = [i + 1 if asked["distinct"] else 1 for i in range(asked["callers"])]
            times = []
            for _ in range(asked["n"]):
                workers = [threading.Thread(target=call, args=(asked["model"], n, times)) for n in lengths[1:]]
                for worker in workers:
                    worker.start()
                call(asked["model"], lengths[0], times)
                for worker in workers:
                    worker.join()
            out = np.array(sorted(times, reverse=True), np.float32)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("TIMES", out)]))
        return responses
"""

BUSY = """
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
"""
CONFIGS = ("generated", "bounded")
BOUNDED_QUEUE = 16  # the bound generated before (4 x the example's max_batch_size of 4)
STALL_S = 0.25  # a 2 ms call past this waited the batcher's 500 ms


def busy_config(name: str, kind: str, delay_us: int):
    """The busy model's config: the generated dynamic batcher (configs.add_dynamic_batching), bounded or not."""
    from tritonclient.grpc import model_config_pb2 as pb

    from specbuild.triton import configs

    c = pb.ModelConfig(name=name, backend="python", max_batch_size=4)
    c.input.add(name="X", data_type=pb.TYPE_FP32, dims=[-1])
    c.output.add(name="Y", data_type=pb.TYPE_FP32, dims=[-1])
    c.instance_group.add(count=1, kind=pb.ModelInstanceGroup.KIND_CPU)
    configs.add_dynamic_batching(c, delay_us, preferred_batch_size=4)
    if kind == "bounded":
        c.dynamic_batching.default_queue_policy.max_queue_size = BOUNDED_QUEUE
    return c


def write_repo(repo: Path, cases: list[tuple[str, int]]) -> dict[tuple[str, int], bool]:
    """The repository; returns whether each case's batcher prefetches (configs.prefetches)."""
    from specbuild.contract import pbtxt
    from specbuild.triton import configs

    callers = repo / "callers"
    (callers / "1").mkdir(parents=True)
    (callers / "1" / "model.py").write_text(CALLERS)
    (callers / "config.pbtxt").write_text(
        'name: "callers"\nbackend: "python"\nmax_batch_size: 0\ninput { name: "X" data_type: TYPE_FP32 dims: 1 }\n'
        'output { name: "TIMES" data_type: TYPE_FP32 dims: -1 }\ninstance_group { count: 1 kind: KIND_CPU }\n'
    )
    prefetching = {}
    for kind, delay in cases:
        config = busy_config(f"busy_{kind}_{delay}", kind, delay)
        (repo / config.name / "1").mkdir(parents=True)
        (repo / config.name / "1" / "model.py").write_text(BUSY)
        (repo / config.name / "config.pbtxt").write_text(pbtxt.to_pbtxt(config))
        prefetching[kind, delay] = configs.prefetches(config.dynamic_batching)
    return prefetching


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=200, help="rounds of calls at once, per configuration and delay")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"configurations to measure: {', '.join(CONFIGS)}")
    parser.add_argument("--delays", default="0", help="queue delays to measure, microseconds")
    parser.add_argument("--callers", type=int, default=2, help="threads that call the busy model at once")
    parser.add_argument(
        "--distinct-shapes",
        action="store_true",
        help="each caller sends its own input length, so no two calls can share a batch",
    )
    args = parser.parse_args()
    kinds = [k for k in args.configs.split(",") if k]
    if not set(kinds) <= set(CONFIGS) or args.callers < 1:
        parser.error(f"--configs takes {', '.join(CONFIGS)}; --callers at least 1")
    cases = [(kind, int(d)) for kind in kinds for d in args.delays.split(",")]

    import tritonclient.grpc as grpcclient

    from specbuild.triton.server import ServerHandle, ServerOptions

    with tempfile.TemporaryDirectory(prefix="batcher-stall-") as tmp:
        repo = Path(tmp) / "repo"
        prefetching = write_repo(repo, cases)
        server = ServerHandle(ServerOptions(repo=repo), log_path=Path(tmp) / "server.log").start(timeout=300)
        try:
            with grpcclient.InferenceServerClient(server.grpc_url) as client:
                for kind, delay in cases:
                    x = grpcclient.InferInput("X", [1], "FP32")
                    x.set_data_from_numpy(np.array([0.0], np.float32))
                    asked = {
                        "model": f"busy_{kind}_{delay}",
                        "n": args.pairs,
                        "callers": args.callers,
                        "distinct": args.distinct_shapes,
                    }
                    times = client.infer("callers", [x], parameters=asked, client_timeout=3600).as_numpy("TIMES")
                    stalls = int((times > STALL_S).sum())
                    print(
                        f"{kind:>9} (prefetches: {'yes' if prefetching[kind, delay] else 'no'}), queue delay "
                        f"{delay:>4} us, {args.callers} callers: {stalls} of {len(times)} calls over {STALL_S} s; "
                        f"longest {', '.join(f'{t:.3f}' for t in times[:3])} s; median {np.median(times):.4f} s",
                        flush=True,
                    )
        finally:
            server.stop()


if __name__ == "__main__":
    main()
