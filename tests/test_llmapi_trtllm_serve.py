"""`serve --server trtllm-serve`: the argv, the multi-node command, and process handling with a FAKE trtllm-serve
(tests/fakes/trtllm-serve: no model, no text; only options, /health, signals). trtllm-serve cannot run here."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from fakes.build_fixtures import make_spec
from triton_helpers import alive

from specbuild.cli import main
from specbuild.contract import llmapi as contract
from specbuild.errors import ArtifactError, ServeError, ToolNotFoundError
from specbuild.llmapi import trtllm_serve
from specbuild.triton.server import free_port

FAKE = Path(__file__).resolve().parent / "fakes" / "trtllm-serve"


@pytest.fixture
def spec(tmp_path, monkeypatch):
    for name in ("FAKE_TRTLLM_SERVE_MODE", "FAKE_TRTLLM_SERVE_LOAD_S", "FAKE_TRTLLM_SERVE_ARGV"):
        monkeypatch.delenv(name, raising=False)
    return make_spec(
        tmp_path,
        build={"tp_size": 4, "max_seq_len": 2048},
        gpu={"count": 4},
        speculative={"max_draft_len": 4, "num_draft_tokens": 3},
    )


def test_argv_is_a_list_of_serve_options_with_the_target_first(spec):
    command = trtllm_serve.plan(spec, "/bin/trtllm-serve", "127.0.0.1", 9000, require_built=False)
    argv = command.argv
    assert argv[:2] == ["/bin/trtllm-serve", str(spec.pair_dir / "target" / "hf_checkpoint")]
    flags = argv[2::2]
    assert set(flags) <= set(contract.SERVE_OPTIONS)
    values = dict(zip(argv[2::2], argv[3::2]))
    assert values == {
        "--host": "127.0.0.1",
        "--port": "9000",
        "--backend": "pytorch",
        "--tp_size": "4",
        "--pp_size": "1",
        "--max_batch_size": "4",
        "--max_num_tokens": "8192",
        "--max_seq_len": "2048",
        "--kv_cache_free_gpu_memory_fraction": "0.9",
        "--extra_llm_api_options": str(spec.pair_dir / "llmapi" / "llm_api_options.yaml"),
        "--log_level": "info",
    }
    assert command.health_url == "http://127.0.0.1:9000/health"


def test_serving_needs_the_build_stage(spec):
    with pytest.raises(ArtifactError, match="run `specbuild build --backend llmapi` first"):
        trtllm_serve.plan(spec)


@pytest.mark.parametrize(
    "launcher, head",
    [
        ("srun", ["srun", "-N", "2", "--ntasks", "4", "--ntasks-per-node=2", "--mpi=pmix", "--gres=gpu:2"]),
        ("mpirun", ["mpirun", "--allow-run-as-root", "-np", "4", "--npernode", "2", "--hostfile", "<hostfile>"]),
    ],
)
def test_multi_node_runs_trtllm_llmapi_launch_on_every_rank(spec, launcher, head):
    command = trtllm_serve.plan(spec, "trtllm-serve", nodes=2, launcher=launcher, require_built=False)
    assert command.launch[: len(head)] == head
    assert command.launch[len(head)] == "trtllm-llmapi-launch"
    assert command.launch[len(head) + 1 :] == command.argv


def test_multi_node_refuses_an_uneven_split(spec):
    with pytest.raises(ServeError, match="do not split over 3 nodes"):
        trtllm_serve.plan(spec, nodes=3, require_built=False)


def test_dry_run_prints_the_multi_node_command(spec, tmp_path):
    spec_path = tmp_path / "specbuild.toml"
    spec_path.write_text(
        f'name = "pair"\noutput_dir = "{tmp_path / "engines"}"\n[target]\ncheckpoint = "t"\n'
        '[draft]\ncheckpoint = "d"\n[build]\ntp_size = 4\n[gpu]\ncount = 4\n'
    )
    result = CliRunner().invoke(
        main, ["serve", "-c", str(spec_path), "--server", "trtllm-serve", "--nodes", "2", "--dry-run"]
    )
    assert result.exit_code == 0, result.output
    argv = shlex.split(result.output.strip())
    assert argv[:3] == ["srun", "-N", "2"] and "trtllm-llmapi-launch" in argv and "trtllm-serve" in argv
    result = CliRunner().invoke(
        main, ["serve", "-c", str(spec_path), "--server", "trtllm-serve", "--dry-run", "--json"]
    )
    document = json.loads(result.output)
    assert document["server"] == "trtllm-serve" and document["multi_node"] is None
    assert document["argv"][0] == "trtllm-serve"
    result = CliRunner().invoke(
        main, ["serve", "-c", str(spec_path), "--server", "trtllm-serve", "--backend", "reference", "--dry-run"]
    )
    assert result.exit_code == 2 and "use --backend llmapi" in result.output


def test_missing_binary_names_the_gpu_image(spec, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ToolNotFoundError, match="docker/Dockerfile.llmapi"):
        trtllm_serve.find_trtllm_serve()


def _handle(spec, tmp_path, port):
    command = trtllm_serve.plan(spec, FAKE, "127.0.0.1", port, require_built=False)
    return trtllm_serve.TrtllmServeHandle(command, log_path=tmp_path / "serve.log")


def test_fake_server_becomes_healthy_and_stops_on_sigterm(spec, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_TRTLLM_SERVE_ARGV", str(tmp_path / "argv.json"))
    monkeypatch.setenv("FAKE_TRTLLM_SERVE_LOAD_S", "1.0")
    handle = _handle(spec, tmp_path, free_port())
    handle.start(timeout=30)
    try:
        assert handle.healthy()
        pid = handle.process.pid
        assert json.loads((tmp_path / "argv.json").read_text()) == handle.command.argv
    finally:
        code = handle.stop()
    assert code == 0 and not alive(pid)


def test_a_server_that_dies_while_loading_is_reported_with_its_log(spec, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_TRTLLM_SERVE_MODE", "exit-early")
    handle = _handle(spec, tmp_path, free_port())
    with pytest.raises(ServeError, match=r"exited with code 1 before it was healthy(.|\n)*failed to load"):
        handle.start(timeout=30)
    assert handle.process is None


def test_a_server_that_never_gets_healthy_times_out_and_is_stopped(spec, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_TRTLLM_SERVE_MODE", "never-healthy")
    handle = _handle(spec, tmp_path, free_port())
    with pytest.raises(ServeError, match="was not healthy"):
        handle.start(timeout=2)
    assert handle.process is None


def test_cli_once_starts_the_fake_waits_for_health_and_stops(spec, tmp_path, monkeypatch):
    spec_path = tmp_path / "specbuild.toml"
    spec_path.write_text(
        f'name = "pair"\noutput_dir = "{tmp_path / "engines"}"\n[target]\ncheckpoint = "t"\n[draft]\ncheckpoint = "d"\n'
    )
    folder = tmp_path / "engines" / "pair" / "llmapi"  # what `build --backend llmapi` records
    folder.mkdir(parents=True)
    from specbuild.config import load_spec
    from specbuild.llmapi.args import llm_args
    from specbuild.llmapi.build import locations

    args = llm_args(load_spec(spec_path), locations(load_spec(spec_path)))
    (folder / "manifest.json").write_text(
        json.dumps({"manifest_version": 1, "stage": "build-llmapi", "llm_args": args})
    )
    port = free_port()
    result = CliRunner().invoke(
        main,
        [
            "serve",
            "-c",
            str(spec_path),
            "--server",
            "trtllm-serve",
            "--trtllm-serve",
            str(FAKE),
            "--http-port",
            str(port),
            "--once",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["status"] == "ready" and document["endpoints"]["http"] == f"http://127.0.0.1:{port}"
    assert not alive(document["pid"])

    import time

    monkeypatch.setenv("FAKE_TRTLLM_SERVE_MODE", "ignore-sigterm")  # --exit-timeout bounds the stop
    started = time.monotonic()
    result = CliRunner().invoke(
        main,
        [
            "serve",
            "-c",
            str(spec_path),
            "--server",
            "trtllm-serve",
            "--trtllm-serve",
            str(FAKE),
            "--http-port",
            str(free_port()),
            "--once",
            "--json",
            "--exit-timeout",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    # --exit-timeout 1 reached the handle: with the default the stop alone would take STOP_TIMEOUT_S (60 s). The
    # whole run (the fake starts in about 1 s, then 1 s and a SIGKILL) took under 3 s; 5 times that is far below.
    assert time.monotonic() - started < trtllm_serve.TrtllmServeHandle.STOP_TIMEOUT_S
    assert not alive(json.loads(result.stdout)["pid"])


def test_serve_names_the_end_ids_a_client_must_send_as_stop_token_ids(tmp_path):
    """trtllm-serve's LLM ends at its tokenizer's eos only: a checkpoint listing more end ids (Llama 3.x instruct lists
    three) gets them printed, and in the JSON documents, for clients to send as stop_token_ids."""
    from convert_helpers import make_tokenizer

    from specbuild.config import load_spec
    from specbuild.llmapi.args import llm_args
    from specbuild.llmapi.build import locations

    spec_path = tmp_path / "specbuild.toml"
    spec_path.write_text(
        f'name = "pair"\noutput_dir = "{tmp_path / "engines"}"\n[target]\ncheckpoint = "t"\n[draft]\ncheckpoint = "d"\n'
    )
    folder = tmp_path / "engines" / "pair" / "llmapi"
    folder.mkdir(parents=True)
    args = llm_args(load_spec(spec_path), locations(load_spec(spec_path)))
    (folder / "manifest.json").write_text(
        json.dumps({"manifest_version": 1, "stage": "build-llmapi", "llm_args": args})
    )
    checkpoint = Path(args["model"])  # the target's Hugging Face export: its tokenizer's eos is 2
    checkpoint.mkdir(parents=True)
    make_tokenizer(checkpoint, 64)
    (checkpoint / "generation_config.json").write_text(json.dumps({"eos_token_id": [9, 2, 7]}))
    serve = ["serve", "-c", str(spec_path), "--server", "trtllm-serve", "--trtllm-serve", str(FAKE)]

    result = CliRunner().invoke(main, [*serve, "--http-port", str(free_port()), "--once"])
    assert result.exit_code == 0, result.output
    assert (
        'end ids: trtllm-serve ends at the tokenizer\'s eos 2 only; send "stop_token_ids": [9, 7] with each request'
    ) in result.stdout
    result = CliRunner().invoke(main, [*serve, "--http-port", str(free_port()), "--once", "--json"])
    document = json.loads(result.stdout)
    assert (document["end_id"], document["stop_token_ids"]) == (2, [9, 7])
    planned = json.loads(CliRunner().invoke(main, [*serve, "--dry-run", "--json"]).stdout)
    assert (planned["end_id"], planned["stop_token_ids"]) == (2, [9, 7])


def test_a_stop_that_hangs_is_killed_after_the_stop_timeout(spec, tmp_path, monkeypatch):
    """`serve --server trtllm-serve --exit-timeout N` gives the server N seconds after SIGTERM, then SIGKILL."""
    import time

    monkeypatch.setenv("FAKE_TRTLLM_SERVE_MODE", "ignore-sigterm")
    command = trtllm_serve.plan(spec, FAKE, "127.0.0.1", free_port(), require_built=False)
    handle = trtllm_serve.TrtllmServeHandle(command, log_path=tmp_path / "serve.log", stop_timeout=1.0)
    handle.start(timeout=30)
    pid = handle.process.pid
    started = time.monotonic()
    code = handle.stop()
    seconds = time.monotonic() - started
    # SIGKILLed (-9: the fake ignores SIGTERM) after its 1 s, not at once: a lower bound no slowness can break. The
    # upper one is a deadline far below the default STOP_TIMEOUT_S (60 s): the stop is a 1 s wait and a kill.
    assert code == -9 and 1.0 <= seconds < 30 and not alive(pid)


@pytest.mark.parametrize(
    "option", [["--allow-api", "logging"], ["--no-supervise"], ["--canary-interval", "5"], ["--max-restarts", "3"]]
)
def test_tritonserver_only_options_are_refused_with_trtllm_serve(tmp_path, option):
    spec_path = tmp_path / "specbuild.toml"
    spec_path.write_text(
        f'name = "pair"\noutput_dir = "{tmp_path / "engines"}"\n[target]\ncheckpoint = "t"\n[draft]\ncheckpoint = "d"\n'
    )
    result = CliRunner().invoke(main, ["serve", "-c", str(spec_path), "--server", "trtllm-serve", *option, "--dry-run"])
    assert result.exit_code == 2
    assert f"{option[0]}: for tritonserver (Triton's restricted APIs, the supervisor)" in result.output
    result = CliRunner().invoke(
        main, ["serve", "-c", str(spec_path), "--server", "trtllm-serve", "--exit-timeout", "5", "--dry-run"]
    )
    assert result.exit_code == 0, result.output


def test_fake_refuses_unknown_options(tmp_path):
    import subprocess

    out = subprocess.run(
        [sys.executable, str(FAKE), "/m", "--speculative_config", "x"],
        capture_output=True,
        text=True,
        env={**os.environ},
    )
    assert out.returncode == 2 and "No such option" in out.stderr
