"""`specbuild up --once`: every stage through a real CPU tritonserver, the demo prompts streamed through
the speculative BLS, the server stopped, nothing left running; a second run skips the build stages. Without
--once it serves until SIGTERM and then drains and stops: tests/test_triton_drain.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from triton_helpers import alive

pytestmark = [pytest.mark.server, pytest.mark.slow]


def _free_ports(spec_path):
    text = spec_path.read_text()
    for key in ("http_port", "grpc_port", "metrics_port"):
        text = text.replace(f"{key} = ", f"{key} = 0 # was ", 1)
    spec_path.write_text(text)


def _up(spec_path, *extra):
    argv = [sys.executable, "-m", "specbuild", "up", "-c", str(spec_path), "--once", *extra]
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=spec_path.parent,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def _tritonservers_under(folder) -> list[int]:
    out = subprocess.run(["pgrep", "-f", f"tritonserver --model-repository={folder}"], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split() if alive(int(p))]


def test_up_once_serves_the_pair_streams_prompts_and_stops(tiny_spec_path):
    _free_ports(tiny_spec_path)
    first = _up(tiny_spec_path, "--json")
    assert first.returncode == 0, first.stderr[-3000:]
    doc = json.loads(first.stdout)
    assert doc["ok"] and [s["stage"] for s in doc["stages"]] == ["check", "convert", "build", "repo", "serve"]
    serve = doc["stages"][-1]
    assert serve["stopped"] and serve["endpoints"]["grpc"].startswith("127.0.0.1:")
    assert [row["kind"] for row in serve["demo"]] == ["code", "json", "prose"]
    for row in serve["demo"]:
        assert row["num_output_tokens"] > 0 and row["text"]
        assert row["total_draft_tokens"] > 0  # speculation ran
        assert 0.0 <= row["acceptance_rate"] <= 1.0
        assert row["total_accepted_draft_tokens"] <= row["total_draft_tokens"]
    repo = tiny_spec_path.parent / "triton_repo"
    assert (repo / "tensorrt_llm_bls" / "config.pbtxt").is_file()
    assert _tritonservers_under(repo) == []

    # Human mode: the streamed text is on stdout; the earlier stages are up to date.
    second = _up(tiny_spec_path)
    assert second.returncode == 0, second.stderr[-3000:]
    for row in serve["demo"]:
        assert row["text"] in second.stdout  # greedy: the same text again, printed as it streamed
    statuses = {
        line.split()[0]: line.split()[1]
        for line in second.stdout.splitlines()
        if line.split() and line.split()[0] in ("check", "convert", "build", "repo", "serve")
    }
    assert statuses == {"check": "skipped", "convert": "skipped", "build": "skipped", "repo": "skipped", "serve": "ran"}
    # What now: the commands to run next, for this spec, after the demo.
    assert "next (from this folder):" in second.stderr
    assert "specbuild generate -c specbuild.toml --local " in second.stderr
    assert _tritonservers_under(repo) == []

    # Without --once `up` serves until SIGTERM: tests/test_triton_drain.py::test_up_drains_its_server_on_sigterm.


def test_your_own_pair_from_init_to_up(tmp_path):
    """The README's "Your own pair": `init --target --draft` on two Hugging Face folders of another family (Qwen3,
    small limits: 256 positions), then `up --once`: every stage runs, and the demo prompts are cut to fit the
    deployment's max_input_len instead of being refused."""
    from family_models import make_family

    target = make_family(tmp_path / "Qwen3-target", "qwen3")
    draft = make_family(tmp_path / "Qwen3-draft", "qwen3", hidden=32, layers=1, seed=1)
    spec_path = tmp_path / "specbuild.toml"
    init = subprocess.run(
        [
            sys.executable,
            "-m",
            "specbuild",
            "init",
            "--target",
            str(target),
            "--draft",
            str(draft),
            "--out",
            str(spec_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert init.returncode == 0, init.stderr
    _free_ports(spec_path)
    up = _up(spec_path, "--json")
    assert up.returncode == 0, up.stderr[-3000:]
    serve = json.loads(up.stdout)["stages"][-1]
    assert serve["stopped"] and [row["kind"] for row in serve["demo"]] == ["code", "json", "prose"]
    assert all(row["num_output_tokens"] > 0 for row in serve["demo"])


def test_a_demo_prompt_is_cut_to_its_last_lines_that_fit():
    from specbuild.up.serving import fitting

    words = len  # one token per character, for the test
    assert fitting("ab\ncd\n", words, 10) == "ab\ncd\n"
    assert fitting("abcdef\ncd\n", words, 4) == "cd\n"
    assert fitting("abcdef\n", words, 4) is None


@pytest.mark.fault
def test_a_model_frozen_during_the_demo_costs_no_prompt_is_recovered_and_up_keeps_serving(tiny_spec_path):
    """`up` is supervised from the moment the server is ready: the draft model's process frozen while the demo
    prompts stream costs them nothing (their steps run on the target alone, speculative.fallback: every prompt gets
    its text, none fails), the supervisor kills and reloads it, and `up` keeps serving (it stopped serving and exited
    1 before supervision, and cut the prompt before the fallback). The stop afterwards is clean: exit 0."""
    import threading

    from specbuild.triton import procfs

    _free_ports(tiny_spec_path)
    argv = [sys.executable, "-m", "specbuild", "up", "-c", str(tiny_spec_path)]
    process = subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tiny_spec_path.parent,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    lines: list[str] = []
    frozen: list[int] = []
    serving = threading.Event()
    repo = tiny_spec_path.parent / "triton_repo"

    def read_stderr() -> None:
        for line in process.stderr:
            lines.append(line)
            if not frozen and line.startswith("--- streamed continuation:"):  # the first demo prompt streams
                server = _tritonservers_under(repo)[0]
                stub = next(s for s in procfs.python_stubs(server) if s.model == "tensorrt_llm_draft")
                os.kill(stub.pid, signal.SIGSTOP)
                frozen.append(stub.pid)
            if line.startswith("serving; press Ctrl-C"):
                serving.set()

    threading.Thread(target=read_stderr, daemon=True).start()
    try:
        assert serving.wait(600), "".join(lines)[-3000:]
        log = "".join(lines)
        assert frozen and process.poll() is None, log[-3000:]  # still serving after the demo
        assert "prompt failed" not in log and log.count("--- 48 tokens") == 3, log[-3000:]  # every prompt, whole
        deadline = time.monotonic() + 120  # a deadline: the reload may end after the demo's last prompt
        while "tensorrt_llm_draft serving again" not in "".join(lines) and time.monotonic() < deadline:
            time.sleep(0.2)
        log = "".join(lines)
        assert "is frozen" in log and "tensorrt_llm_draft serving again" in log, log[-3000:]
        process.send_signal(signal.SIGTERM)
        # exit 0 (it was 1, after waiting out the exit timeout, before the supervisor stopped waiting early)
        assert process.wait(timeout=120) == 0, "".join(lines)[-3000:]
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
        for pid in frozen:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        for pid in _tritonservers_under(repo):
            os.kill(pid, signal.SIGKILL)
