"""How long small streams take through the BLS while clients send it prompts far too big to serve: a measurement.

    python scripts/bls_load_probe.py --repo REPO [--rounds 3] [--clients 3] [--per-client 4] [--big-clients 4]

Starts tritonserver on REPO (a BLS repository, e.g. the tiny example's: `specbuild init --example --variant tiny
--out probe/specbuild.toml`, then `specbuild up -c probe/specbuild.toml --until repo`). Each round sends
`--clients` threads of `--per-client` small streamed requests alone, then the same again while `--big-clients`
threads send `--big-mib` MiB prompts (4 of 4 MiB: what once held every BLS slot for about 14 s each, before the
BLS refused prompts by their size). It prints one JSON document: per phase the small requests' median, p90 and
longest seconds, the ratio of the loaded median to the median alone, how the big prompts were answered (HTTP
code, median seconds) and how many BLS slots were taken (`specbuild_bls_started_requests_total`), with the load
average. The aim (docs/triton.md, "Failure behaviour"): the loaded median stays within 3x of the median alone.
A measurement, not a test: on a shared machine the ratio is the machine's as much as the server's, so
tests/test_bls_load.py asserts the slots the big prompts took (none), not this ratio.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

PROMPTS = ["# Copyright", "def add(a, b):", '{"name": ', "import os\nimport sys\n"]


def post(url: str, body: bytes, timeout: float = 120) -> int:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
            return response.status
    except urllib.error.HTTPError as err:
        err.read()
        return err.code


def slots_taken(metrics_url: str) -> float:
    with urllib.request.urlopen(metrics_url, timeout=30) as response:
        text = response.read().decode()
    match = re.search(
        r'^specbuild_bls_started_requests_total\{[^}]*model="tensorrt_llm_bls"[^}]*\} ([0-9.e+-]+)$', text, re.MULTILINE
    )
    return float(match.group(1)) if match else 0.0


def small_streams(grpc_url: str, clients: int, per_client: int) -> list[float]:
    from specbuild.triton.client import SpecbuildClient

    seconds, errors, lock = [], [], threading.Lock()

    def run(i: int) -> None:
        try:
            with SpecbuildClient(grpc_url, timeout=300) as client:
                for j in range(per_client):
                    started = time.monotonic()
                    client.complete(PROMPTS[(i + j) % len(PROMPTS)], max_tokens=16, num_draft_tokens=2)
                    with lock:
                        seconds.append(time.monotonic() - started)
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"a small request failed: {errors[0]}")
    return seconds


def figures(seconds: list[float]) -> dict:
    ordered = sorted(seconds)
    return {
        "requests": len(ordered),
        "median_s": round(statistics.median(ordered), 4),
        "p90_s": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 4),
        "max_s": round(ordered[-1], 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--per-client", type=int, default=4)
    parser.add_argument("--big-clients", type=int, default=4)
    parser.add_argument("--big-per-client", type=int, default=4)
    parser.add_argument("--big-mib", type=float, default=4.0)
    args = parser.parse_args()

    from specbuild.triton.server import ServerHandle, ServerOptions

    repo = Path(args.repo).resolve()
    handle = ServerHandle(ServerOptions(repo=repo), log_path=repo.parent / ".bls_load_probe.log")
    handle.start(timeout=600)
    try:
        url = f"http://{handle.http_url}/v2/models/tensorrt_llm_bls/generate"
        body = json.dumps({"text_input": "x = 1\n" * int(args.big_mib * 2**20 // 6), "max_tokens": 16}).encode()
        small_streams(handle.grpc_url, 1, 2)  # warm-up, not counted
        rounds = []
        for _ in range(args.rounds):
            alone = small_streams(handle.grpc_url, args.clients, args.per_client)
            answers, lock = [], threading.Lock()

            def big_client() -> None:
                for _ in range(args.big_per_client):
                    started = time.monotonic()
                    code = post(url, body)
                    with lock:  # noqa: B023 (called within this iteration)
                        answers.append((code, time.monotonic() - started))  # noqa: B023 (called within this iteration)

            before = slots_taken(handle.metrics_url)
            bigs = [threading.Thread(target=big_client) for _ in range(args.big_clients)]
            for t in bigs:
                t.start()
            time.sleep(0.2)  # the big prompts are on their way first
            loaded = small_streams(handle.grpc_url, args.clients, args.per_client)
            for t in bigs:
                t.join()
            taken = slots_taken(handle.metrics_url) - before
            rounds.append(
                {
                    "alone": figures(alone),
                    "beside_big_prompts": figures(loaded),
                    "median_ratio": round(statistics.median(loaded) / statistics.median(alone), 2),
                    "big_prompts": {
                        "sent": len(answers),
                        "http_codes": sorted({code for code, _ in answers}),
                        "median_s": round(statistics.median(s for _, s in answers), 4),
                    },
                    "slots_taken": {"small": len(loaded), "all": int(taken)},
                }
            )
        print(
            json.dumps(
                {
                    "repo": str(repo),
                    "big_prompt_mib": args.big_mib,
                    "rounds": rounds,
                    "worst_median_ratio": max(r["median_ratio"] for r in rounds),
                    "load_average": Path("/proc/loadavg").read_text().split()[:3],
                },
                indent=2,
            )
        )
    finally:
        handle.stop()


if __name__ == "__main__":
    main()
