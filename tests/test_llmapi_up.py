"""`specbuild up --backend llmapi` as a user runs it: every stage through a real CPU tritonserver (the stand-in),
the demo prompts streamed, the server stopped; a second run skips what is up to date; `specbuild serve` on the
llmapi repository answers its canary and stops cleanly on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from triton_helpers import alive, read_ready_document

from specbuild.triton import procfs
from specbuild.triton.client import SpecbuildClient

pytestmark = [pytest.mark.server, pytest.mark.slow]
STAGES = ["check", "convert", "build", "repo", "serve"]


def _free_ports(spec_path):
    text = spec_path.read_text()
    for key in ("http_port", "grpc_port", "metrics_port"):
        text = text.replace(f"{key} = ", f"{key} = 0 # was ", 1)
    spec_path.write_text(text)


def _run(spec_path, *argv, timeout=900):
    return subprocess.run(
        [sys.executable, "-m", "specbuild", *argv, "-c", str(spec_path)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=spec_path.parent,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def test_up_llmapi_once_then_serve_and_sigterm(tiny_spec_path):
    _free_ports(tiny_spec_path)
    planned = _run(tiny_spec_path, "up", "--backend", "llmapi", "--dry-run", "--json")
    assert planned.returncode == 0, planned.stderr[-2000:]
    assert [s["status"] for s in json.loads(planned.stdout)["stages"]] == ["planned"] * 5
    assert not (tiny_spec_path.parent / "engines").exists()

    first = _run(tiny_spec_path, "up", "--backend", "llmapi", "--once", "--json")
    assert first.returncode == 0, first.stderr[-3000:]
    doc = json.loads(first.stdout)
    assert doc["ok"] and doc["backend"] == "llmapi" and [s["stage"] for s in doc["stages"]] == STAGES
    serve = doc["stages"][-1]
    assert serve["stopped"] and [row["kind"] for row in serve["demo"]] == ["code", "json", "prose"]
    for row in serve["demo"]:
        assert row["text"] and row["num_output_tokens"] > 0 and row["finish_reason"] in ("length", "stop")
        assert row["total_draft_tokens"] > 0 and row["total_accepted_draft_tokens"] <= row["total_draft_tokens"]
    pair = tiny_spec_path.parent / "engines" / "example-tiny"
    assert (pair / "target" / "hf_checkpoint" / "manifest.json").is_file()
    assert (pair / "llmapi" / "llm_api_options.yaml").is_file()
    repo = tiny_spec_path.parent / "triton_repo"
    assert sorted(p.name for p in repo.iterdir()) == ["manifest.json", "serving_gate", "tensorrt_llm"]
    assert json.loads((repo / "manifest.json").read_text())["runtime"] == "reference"

    second = _run(tiny_spec_path, "up", "--backend", "llmapi", "--once", "--until", "repo", "--json")
    assert second.returncode == 0, second.stderr[-3000:]
    assert [s["status"] for s in json.loads(second.stdout)["stages"]] == ["skipped"] * 4
    # a dry run knows what is up to date on this path too (the check stage is one function for both paths)
    again = _run(tiny_spec_path, "up", "--backend", "llmapi", "--dry-run", "--json")
    assert again.returncode == 0, again.stderr[-2000:]
    assert [s["status"] for s in json.loads(again.stdout)["stages"]] == ["skipped"] * 4 + ["planned"], again.stdout

    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "specbuild",
            "serve",
            "-c",
            str(tiny_spec_path),
            "--repo",
            str(repo),
            "--backend",
            "llmapi",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tiny_spec_path.parent,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        document = read_ready_document(process)
        assert document["status"] == "ready" and document["backend"] == "llmapi"
        assert set(document["canary"]) == {"tensorrt_llm (grpc)", "tensorrt_llm (http)"}
        with SpecbuildClient(document["endpoints"]["grpc"]) as client:
            text, stats = client.complete("def add(a, b):", max_tokens=8)
            assert stats["finish_reason"] == "length" and text
        pids = [document["pid"], *procfs.descendants(document["pid"])]
        process.send_signal(signal.SIGTERM)
        assert process.wait(90) == 0
    finally:
        if process.poll() is None:
            process.kill()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.2)
    assert not [p for p in pids if alive(p)]
    wrong = _run(tiny_spec_path, "serve", "--repo", str(repo), "--backend", "reference", "--once")
    assert wrong.returncode == 1 and "is a 'llmapi' repository, not 'reference'" in wrong.stderr


def test_up_writes_the_llm_api_repository_on_the_checkpoints_it_converted_where_tensorrt_llm_runs(
    tiny_spec_path, monkeypatch
):
    """Where tensorrt_llm is importable (a GPU image; faked importable here) the repository's runtime is NVIDIA's
    model, and `up` (so `selftest`'s LLM API step) must name the checkpoints its own convert stage wrote, not the
    compose mount /engines/<pair> that `specbuild repo` defaults to there: NVIDIA's model.py calls LLM() on them."""
    import importlib.machinery
    import importlib.util

    import yaml

    from specbuild.config import load_spec
    from specbuild.up.stages import UpContext, run_up

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: importlib.machinery.ModuleSpec(name, None) if name == "tensorrt_llm" else find_spec(name, *a),
    )
    spec = load_spec(tiny_spec_path)
    repo = tiny_spec_path.parent / "llmapi_repo"
    ctx = UpContext(spec=spec, backend="llmapi", force=False, dry_run=False, once=True, repo=repo, log=lambda m: None)
    doc, error = run_up(ctx, until="repo")
    assert error is None, error
    assert json.loads((repo / "manifest.json").read_text())["runtime"] == "tensorrt_llm"
    args = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())
    target = args["model"]
    draft = next(value for key, value in args["speculative_config"].items() if key.startswith("speculative_model"))
    for path in (target, draft):
        assert path.startswith(str((tiny_spec_path.parent / "engines").resolve())) and not path.startswith("/engines/")
        assert (Path(path) / "config.json").is_file(), path
