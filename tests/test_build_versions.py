"""Recorded tool versions and the check `serve` makes against the runtime's."""

from __future__ import annotations

import sys

from specbuild.engines.stage import runtime_versions, versions_mismatch
from specbuild.engines.versions import interpreter_for, probe_versions

BUILT = {
    "tensorrt_llm": "1.2.1",
    "tensorrt": "10.13.3.9",
    "cuda": "13.0.2.006",
    "gpu_name": "NVIDIA H100 80GB HBM3",
    "gpu_sm": 90,
    "torch": "2.9.0",
}


def test_same_versions_are_compatible():
    assert versions_mismatch({"backend": "trtllm", "tool_versions": BUILT}, dict(BUILT)) == []


def test_each_differing_version_is_reported():
    runtime = {**BUILT, "tensorrt_llm": "1.1.0", "gpu_sm": 89, "torch": "2.10.0"}
    problems = versions_mismatch({"backend": "trtllm", "tool_versions": BUILT}, runtime)
    assert len(problems) == 2  # torch is not an engine constraint
    assert problems[0].startswith("tensorrt_llm: the engine was built with 1.2.1, the runtime has 1.1.0")
    assert "gpu_sm: the engine was built with 90, the runtime has 89" in problems[1]


def test_cuda_compares_major_minor_and_unknowns_are_not_mismatches():
    manifest = {"backend": "trtllm", "tool_versions": {**BUILT, "tensorrt": None}}
    runtime = {**BUILT, "cuda": "13.0.1", "tensorrt": "10.99"}
    assert versions_mismatch(manifest, runtime) == []
    assert versions_mismatch(manifest, {**runtime, "cuda": "12.9"})[0].startswith("cuda:")


def test_reference_engines_check_their_format_only():
    manifest = {"backend": "reference", "tool_versions": {"reference_format": "1", "torch": "2.13.0"}}
    assert versions_mismatch(manifest, {"reference_format": "1", "torch": "2.4.0", "tensorrt_llm": "1.2.1"}) == []
    assert versions_mismatch(manifest, {"reference_format": "2"})[0].startswith("reference_format:")


def test_probe_reads_this_environment_without_inventing_values():
    found = probe_versions(sys.executable)
    assert found["tensorrt_llm"] is None  # not installable here
    assert found["torch"] is not None
    assert set(runtime_versions()) >= {"tensorrt_llm", "tensorrt", "cuda", "gpu_name", "gpu_sm", "reference_format"}
    assert probe_versions("/nonexistent/python")["torch"] is None


def test_interpreter_comes_from_the_shebang(tmp_path):
    script = tmp_path / "tool"
    script.write_text(f"#!{sys.executable}\nprint(1)\n")
    assert interpreter_for(str(script)) == sys.executable
    env_script = tmp_path / "tool2"
    env_script.write_text("#!/usr/bin/env python3\n")
    assert "python3" in interpreter_for(str(env_script))
    assert interpreter_for(str(tmp_path / "missing")) == sys.executable
