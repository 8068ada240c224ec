"""`specbuild bench --url` against a real tritonserver (CPU) serving the tiny example pair's BLS."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from triton_helpers import make_deployment, serving

from specbuild.cli import main

pytestmark = [pytest.mark.server, pytest.mark.slow]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, example_tiny):
    return make_deployment(tmp_path_factory.mktemp("bench-deploy"), example_tiny)


@pytest.fixture(scope="module")
def server(deployment):
    with serving(deployment.repo, deployment.root / "server.log") as handle:
        yield handle


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_bench_url_reports_the_local_fields_plus_serving_overhead(server, deployment, protocol):
    url = server.grpc_url if protocol == "grpc" else server.http_url
    r = CliRunner().invoke(
        main,
        [
            "bench",
            "-c",
            str(deployment.spec_path),
            "--url",
            url,
            "--protocol",
            protocol,
            "--json",
            "--num-draft-tokens",
            "0,2,16",
            "--concurrency",
            "1,2",
            "--max-tokens",
            "8",
            "--requests",
            "2",
            "--threads",
            "1",
        ],
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["mode"] == "triton" and doc["settings"]["url"] == url
    cells = {(row["concurrency"], row["num_draft_tokens"]): row for row in doc["runs"]}
    # 16 > the BLS's max_draft_len 6: measured as 6, the one K rule
    assert set(cells) == {(c, k) for c in (1, 2) for k in (0, 2, 6)}
    assert "K = 16 measured as K = 6: above the deployment's max_draft_len = 6" in doc["notes"]
    base, spec = cells[(1, 0)], cells[(1, 2)]
    assert base["drafted"] == 0 and spec["drafted"] > 0 and spec["steps"] > 0
    assert base["output_tokens"] == spec["output_tokens"]  # greedy through the BLS: same tokens either way
    assert doc["greedy_equal"] is True and spec["same_tokens_as_k0"] is True
    for key in ("speedup", "alpha", "cost_ratio", "bound", "efficiency"):
        assert doc[key] is not None
    assert 0 <= doc["alpha"] <= 1
    overhead = doc["serving_overhead"]
    rows = {row["num_draft_tokens"]: row for row in overhead["runs"]}
    assert set(rows) == {0, 2, 6}
    assert rows[2]["triton_over_local"] == pytest.approx(
        rows[2]["triton_tokens_per_s"] / rows[2]["local_tokens_per_s"], rel=1e-2
    )
    # Triton's floor, measured after the runs with the best K's shape: its draft length, in-process call as the work
    best = overhead["num_draft_tokens"]
    assert overhead["floor"]["draft_len"] == best and overhead["floor"]["work_s"] == rows[best]["local_s_per_call"] > 0
    assert 0 < overhead["ceiling"] == rows[best]["ceiling"] < 1
    assert [row["concurrency"] for row in doc["concurrency"]] == [1, 2]


def test_a_sweep_the_deployment_cannot_run_fails_before_the_floor_and_the_local_runtime(server, deployment):
    r = CliRunner().invoke(
        main,
        [
            "bench",
            "-c",
            str(deployment.spec_path),
            "--url",
            server.grpc_url,
            "--protocol",
            "grpc",
            "--num-draft-tokens",
            "0",
            "--requests",
            "1",
        ],
    )
    assert r.exit_code == 1
    assert "Error: the K sweep [0] leaves no K > 0 for this deployment (max_draft_len = 6)" in r.output
    assert "floor" not in r.output and "local runtime" not in r.output  # nothing slow ran first


def test_bench_url_without_a_server_is_a_clear_error(deployment):
    from specbuild.triton.server import free_port

    url = f"127.0.0.1:{free_port()}"
    r = CliRunner().invoke(main, ["bench", "-c", str(deployment.spec_path), "--url", url, "--requests", "1"])
    assert r.exit_code == 1
    assert f"Error: no Triton server answers at {url} (http). Start one with `specbuild serve -c" in r.output
    assert "--local" in r.output


def test_bench_url_compares_the_servers_two_schedules_with_in_process_sequential(server, deployment):
    r = CliRunner().invoke(
        main,
        [
            "bench",
            "-c",
            str(deployment.spec_path),
            "--url",
            server.grpc_url,
            "--protocol",
            "grpc",
            "--json",
            "--num-draft-tokens",
            "0,3",
            "--max-tokens",
            "16",
            "--requests",
            "2",
            "--threads",
            "1",
            "--overlap",
            "compare",
        ],
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["settings"]["overlap"] == "compare" and doc["greedy_equal"] is True
    assert all(row["early_drafts"] == 0 for row in doc["runs"])  # the main transport asked for sequential
    section = doc["overlap"]
    run = section["runs"][0]
    assert run["num_draft_tokens"] == 3 and run["early_drafts"] > 0 and 0 < run["early_draft_hit_rate"] <= 1
    assert run["overlapped_over_sequential"] == pytest.approx(
        run["overlapped_tokens_per_s"] / run["sequential_tokens_per_s"], rel=1e-2
    )
    overlapped = doc["serving_overhead"]["overlapped"]
    assert overlapped["num_draft_tokens"] in (0, 3) and overlapped["triton_over_local"] > 0
