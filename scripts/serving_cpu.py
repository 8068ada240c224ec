"""Serving overhead in CPU time, which a busy machine does not distort the way it distorts wall time.

    python scripts/serving_cpu.py -c SPEC --repo REPO [--workload json] [--reps 3] [--max-tokens 64]

Starts tritonserver on REPO (a BLS or an llmapi repository), then sends the workload's prompts one at a
time, interleaved, in-process (`bench.local_transport`, the spec's pair) and through the server (`bench --url`'s
transport), and reports per generated token: the CPU seconds of this process for in-process requests,
and for served ones the CPU of this process (the client) plus tritonserver and its Python stubs (read
from /proc), with wall-clock tokens/s beside. On a machine shared with other work, a server in its own
processes can take a larger share of the CPU than one in-process thread, so the wall ratio can exceed 1;
the CPU ratio (in-process CPU / served CPU per token) is the cost of serving.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / TICK
    return total


def self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--config", required=True)
    parser.add_argument("--repo", required=True)
    parser.add_argument("--workload", default="json")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()

    from specbuild.bench import workloads
    from specbuild.bench.local_transport import from_spec
    from specbuild.bench.remote import RemoteTransport
    from specbuild.bench.runner import Settings
    from specbuild.config import load_spec
    from specbuild.triton.server import ServerHandle, ServerOptions, _children

    spec = load_spec(args.config)
    handle = ServerHandle(ServerOptions(repo=Path(args.repo)), log_path=Path(args.repo).parent / ".serving_cpu.log")
    handle.start(timeout=600)
    try:
        pids = [handle.process.pid, *_children(handle.process.pid)]
        served = RemoteTransport.connect(handle.grpc_url, "grpc", spec=spec)
        k = served.fixed_k or spec.speculative.num_draft_tokens
        local = from_spec(spec, threads=1)
        settings = Settings(num_draft_tokens=(k,), requests=8, max_tokens=args.max_tokens)
        prompts = workloads.load(args.workload, 8).prompts
        for transport in (local, served):
            transport.request(prompts[0], k, 8, settings)
        totals = {"in_process": [0.0, 0.0, 0], "served": [0.0, 0.0, 0]}  # CPU s, wall s, tokens
        parts = {"client": 0.0, "tritonserver": 0.0, "python_stubs": 0.0}
        for _ in range(args.reps):
            for prompt in prompts:
                cpu, wall = self_cpu(), time.perf_counter()
                result = local.request(prompt, k, args.max_tokens, settings)
                totals["in_process"][0] += self_cpu() - cpu
                totals["in_process"][1] += time.perf_counter() - wall
                totals["in_process"][2] += result.output_tokens
                cpu, server, stubs, wall = self_cpu(), tree_cpu(pids[:1]), tree_cpu(pids[1:]), time.perf_counter()
                result = served.request(prompt, k, args.max_tokens, settings)
                parts["client"] += self_cpu() - cpu
                parts["tritonserver"] += tree_cpu(pids[:1]) - server
                parts["python_stubs"] += tree_cpu(pids[1:]) - stubs
                totals["served"][1] += time.perf_counter() - wall
                totals["served"][2] += result.output_tokens
        totals["served"][0] = sum(parts.values())
        report = {
            name: {
                "cpu_ms_per_token": round(1000 * cpu / tokens, 3),
                "tokens_per_s": round(tokens / wall, 1),
                "tokens": tokens,
            }
            for name, (cpu, wall, tokens) in totals.items()
        }
        report["served_cpu_ms_per_token_parts"] = {
            name: round(1000 * v / totals["served"][2], 3) for name, v in parts.items()
        }
        report["cpu_ratio_in_process_over_served"] = round(
            report["in_process"]["cpu_ms_per_token"] / report["served"]["cpu_ms_per_token"], 3
        )
        report["wall_ratio_served_over_in_process"] = round(
            report["served"]["tokens_per_s"] / report["in_process"]["tokens_per_s"], 3
        )
        report.update(
            {
                "num_draft_tokens": k,
                "workload": args.workload,
                "reps": args.reps,
                "load_average": Path("/proc/loadavg").read_text().split()[:3],
            }
        )
        print(json.dumps(report, indent=2))
    finally:
        handle.stop()


if __name__ == "__main__":
    main()
