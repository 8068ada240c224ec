"""Which metric tracks load: the autoscaling signal measured against offered load on a running server.

    python -m specbuild.deploy.signal --url 127.0.0.1:8001 --metrics-url http://127.0.0.1:8002/metrics \
        --streams 1,2,4,8,16 --seconds 20

At each level, `streams` closed-loop clients (each sends its next request when the last ends) run for `seconds`;
the server's /metrics is read every `--every` seconds. Per level it prints the mean and the largest
`specbuild_bls_queue_depth` (the HPA's metric: requests the BLS holds and has not started), the BLS's own wait per
started request (`specbuild_bls_queue_seconds_total` / `specbuild_bls_started_requests_total`), and Triton's queue
time per request of the BLS (`nv_inference_queue_duration_us` / `nv_inference_request_success`), which a decoupled
BLS does not feed (it takes every request at once): the figures show which moves. A benchmark that prints figures,
bounded in count and time; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Any

from specbuild.contract import models
from specbuild.triton.drain import parse_metrics, read_metrics

BLS = models.BLS
PROMPT = '{"name": '


def _value(text: str, name: str, model: str | None = None) -> float:
    """The sum of a metric's samples (of one model, when named) in a /metrics text; 0 when absent."""
    return sum(
        value
        for (metric, of), value in parse_metrics(text).items()
        if metric == name and (model is None or of == model)
    )


def measure_level(
    url: str, metrics_url: str, streams: int, seconds: float, every: float, max_tokens: int
) -> dict[str, Any]:
    from specbuild.triton.client import SpecbuildClient

    stop = threading.Event()
    done = [0] * streams
    errors: list[str] = []

    def client_loop(index: int) -> None:
        with SpecbuildClient(url) as client:
            while not stop.is_set():
                try:
                    client.complete(PROMPT, max_tokens=max_tokens)
                    done[index] += 1
                except Exception as err:  # noqa: BLE001 - counted and shown, the level goes on
                    errors.append(f"{type(err).__name__}: {err}"[:200])

    before = read_metrics(metrics_url)
    threads = [threading.Thread(target=client_loop, args=(i,), daemon=True) for i in range(streams)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    depths = []
    while time.monotonic() - started < seconds:
        depths.append(_value(read_metrics(metrics_url), "specbuild_bls_queue_depth"))
        time.sleep(every)
    stop.set()
    for thread in threads:
        thread.join(timeout=120)
    wall = time.monotonic() - started
    after = read_metrics(metrics_url)

    def delta(name: str, model: str | None = None) -> float:
        return _value(after, name, model) - _value(before, name, model)

    started_requests = delta("specbuild_bls_started_requests_total")
    successes = delta("nv_inference_request_success", BLS)
    return {
        "streams": streams,
        "requests": sum(done),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "requests_per_s": round(sum(done) / wall, 3),
        "bls_queue_depth_mean": round(sum(depths) / len(depths), 3) if depths else None,
        "bls_queue_depth_max": max(depths) if depths else None,
        "bls_wait_s_per_request": round(delta("specbuild_bls_queue_seconds_total") / started_requests, 4)
        if started_requests
        else None,
        "triton_queue_us_per_request": round(delta("nv_inference_queue_duration_us", BLS) / successes, 1)
        if successes
        else None,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="the server's gRPC address, host:port")
    parser.add_argument("--metrics-url", required=True, help="its metrics, http://host:port/metrics")
    parser.add_argument("--streams", default="1,2,4,8,16", help="offered load: concurrent closed-loop streams")
    parser.add_argument("--seconds", type=float, default=20.0, help="per level")
    parser.add_argument("--every", type=float, default=0.25, help="seconds between reads of /metrics")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = parser.parse_args(argv)
    levels = [
        measure_level(args.url, args.metrics_url, int(n), args.seconds, args.every, args.max_tokens)
        for n in args.streams.split(",")
    ]
    if args.json:
        print(json.dumps({"levels": levels}, indent=2))
        return
    print(
        f"{'streams':>7} {'req/s':>7} {'BLS queue mean':>14} {'max':>5} {'BLS wait s/req':>14} "
        f"{'Triton queue us/req':>19} {'errors':>6}"
    )
    for row in levels:
        print(
            f"{row['streams']:>7} {row['requests_per_s']:>7} {row['bls_queue_depth_mean']!s:>14} "
            f"{row['bls_queue_depth_max']!s:>5} {row['bls_wait_s_per_request']!s:>14} "
            f"{row['triton_queue_us_per_request']!s:>19} {row['errors']:>6}"
        )


if __name__ == "__main__":
    main()
