"""`specbuild selftest`: on CPU its steps run on the reference backend and pass, its GPU-only steps say "not run
(no GPU)" (never passed), and one JSON report says it all; a failing step is reported with its evidence and fix, and
the steps that need it are skipped."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from specbuild.up import selftest as selftest_module
from specbuild.up.selftest import Step, StepFailed, selftest


@pytest.mark.slow
@pytest.mark.server
def test_selftest_on_cpu_passes_its_cpu_steps_and_does_not_claim_the_gpu_ones(tmp_path, example_tiny):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "specbuild",
            "selftest",
            "--variant",
            "tiny",
            "--workdir",
            str(tmp_path / "work"),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout)
    statuses = {row["step"]: row["status"] for row in doc["steps"]}
    assert (
        statuses.pop("fp8 convert on the GPU")
        == statuses.pop("fp8 engine build")
        == statuses.pop("LLM API probe")
        == "not run (no GPU)"
    )
    assert set(statuses.values()) == {"passed"}, statuses
    assert doc["ok"] and doc["backend"] == "reference" and doc["gpu"] is None
    assert json.loads((tmp_path / "work" / "selftest.json").read_text())["steps"] == doc["steps"]
    greedy = next(row for row in doc["steps"] if row["step"] == "greedy K = 3 equals K = 0")
    assert "equal at K = 3 and K = 0" in greedy["evidence"]
    rows = {row["step"]: row for row in doc["steps"]}
    assert "the ensemble, the BLS at K = 5 and client-side speculation" in rows["NVIDIA's client requests"]["evidence"]
    assert "from the CPU stand-in for the llmapi model" in rows["one LLM API request"]["evidence"]


def test_a_failed_step_says_why_and_the_fix_and_what_needs_it_is_skipped(tmp_path, monkeypatch):
    def broken(run):
        raise StepFailed("K = 3 gave [1], K = 0 gave [2]", "check the build flags")

    monkeypatch.setattr(
        selftest_module,
        "STEPS",
        (
            Step("first", lambda run: "fine"),
            Step("broken", broken, needs=("first",)),
            Step("after", lambda run: "never", needs=("broken",)),
            Step("gpu", lambda run: "never", requires="gpu"),
            Step("crash", lambda run: 1 / 0),
        ),
    )
    report = selftest(tmp_path, log=lambda message: None)
    rows = {row["step"]: row for row in report["steps"]}
    assert not report["ok"] and rows["first"]["status"] == "passed"
    assert (rows["broken"]["status"], rows["broken"]["fix"]) == ("failed", "check the build flags")
    assert rows["after"]["status"] == "skipped (broken did not pass)" and rows["gpu"]["status"] == "not run (no GPU)"
    assert rows["crash"]["status"] == "failed" and "ZeroDivisionError" in rows["crash"]["evidence"]


def test_a_gpu_without_tensorrt_llm_runs_the_gpu_steps_it_can_and_says_why_not_the_others(tmp_path, monkeypatch):
    """Seen on an H200 with torch but no TensorRT-LLM: the GPU steps said "not run (no GPU)". The fp8 calibration
    needs only the GPU; the engine build and the LLM API probe need TensorRT-LLM, and say so."""
    ran = []
    monkeypatch.setattr(
        selftest_module,
        "STEPS",
        (
            Step("calibrate", lambda run: ran.append("calibrate") or "ok", requires="gpu"),
            Step("engine", lambda run: ran.append("engine") or "ok", requires="tensorrt_llm"),
            Step("anywhere", lambda run: ran.append("anywhere") or "ok"),
        ),
    )
    h200 = {"name": "NVIDIA H200", "sm": 90, "memory_gib": 139.8, "tensorrt_llm": None}  # detect_gpu on one
    report = selftest(tmp_path, log=lambda message: None, gpu=h200)
    rows = {row["step"]: row["status"] for row in report["steps"]}
    assert ran == ["calibrate", "anywhere"] and report["backend"] == "reference" and report["ok"]
    assert rows["engine"].startswith("not run (no TensorRT-LLM: NVIDIA H200 seen")
    report = selftest(tmp_path, log=lambda message: None, gpu={**h200, "tensorrt_llm": "1.2.0"})
    assert report["backend"] == "trtllm" and ran[2:] == ["calibrate", "engine", "anywhere"]


@pytest.mark.parametrize(
    ("memory_gib", "sm", "expected"),
    [
        (139.8, 90, "H200"),  # torch's total_memory on an H200, as seen on one (143771 MiB by nvidia-smi)
        (79.6, 90, "H100-80GB"),
        (93.6, 90, "H100-94GB"),
        (44.5, 89, "L40S"),
        (79.3, 80, "A100-80GB"),
        (140.4, 80, None),  # the memory of one, the SM of another
        (31.4, 120, None),  # a GPU the table does not know
    ],
)
def test_the_spec_knows_a_gpu_seen_by_its_memory_and_sm_not_by_the_drivers_spelling(memory_gib, sm, expected):
    from specbuild.config import known_gpu

    assert known_gpu(memory_gib, sm) == expected


def test_nvidia_client_requests_fail_the_step_when_the_three_texts_differ(tmp_path, monkeypatch):
    """The check NVIDIA's speculative_decoding_test.py makes: ensemble, BLS and client-side speculation agree."""
    from types import SimpleNamespace

    import specbuild.triton.nvidia_requests as nvidia_requests

    asked = []

    def texts(client, prompt, k):
        asked.append(k)
        return {"ensemble": "a b", "bls": "a b", "client-side": "a b" if len(asked) < 2 else "a c"}

    monkeypatch.setattr(nvidia_requests, "speculative_decoding_check", texts)
    run = selftest_module.Run(tmp_path, "tiny", lambda message: None)
    run.spec = SimpleNamespace(speculative=SimpleNamespace(max_draft_len=4))
    run.server = SimpleNamespace(grpc_url="127.0.0.1:1")  # never reached: the check is replaced
    with pytest.raises(StepFailed) as failed:
        selftest_module._nvidia_clients(run)
    assert asked == [4, 4]  # K = 5 as NVIDIA's test sends it, within the deployment's max_draft_len
    assert '"client-side": "a c"' in failed.value.evidence and "draft_input_ids" in failed.value.fix
