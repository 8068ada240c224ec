"""scripts/kernel_matrix.py (make test-kernels): its selections reach the child, and its fingerprint's
probe agrees with decoding on this machine's own kernels for every block of 1 to 16 rows and for the wide calls."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from runtime_models import single_thread  # noqa: F401 (autouse fixture)


@pytest.fixture(scope="module")
def kernel_matrix():
    path = Path(__file__).resolve().parent.parent / "scripts" / "kernel_matrix.py"
    spec = importlib.util.spec_from_file_location("kernel_matrix", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_selection_replaces_the_controls_of_the_calling_environment(kernel_matrix, monkeypatch):
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    env = kernel_matrix.child_env({"MKL_ENABLE_INSTRUCTIONS": "AVX2"})
    assert env["MKL_ENABLE_INSTRUCTIONS"] == "AVX2" and "MKL_CBWR" not in env and "ATEN_CPU_CAPABILITY" not in env
    assert env["PATH"]  # the rest is inherited
    assert all(set(selection) <= set(kernel_matrix.CONTROLS) for _, selection in kernel_matrix.SELECTIONS)


def test_ranges(kernel_matrix):
    assert kernel_matrix._ranges([]) == "none"
    assert kernel_matrix._ranges([2, 3, 4, 5, 6, 7, 9, 10, 11, 13]) == "2-7,9-11,13"
    assert kernel_matrix._ranges([8]) == "8"


def test_the_probe_never_accepts_a_block_that_decoding_shows_is_not_exact(kernel_matrix):
    info = kernel_matrix.fingerprint(two_threads=False)  # 2 threads: make test-kernels
    assert info["accepted_but_not_exact"] == [] and info["wide_accepted_but_not_exact"] == []
    assert info["chosen_row_block"] not in info["rejected_1_thread"]
    assert 1 not in info["rejected_1_thread"]  # one row per call: exact by construction on a deterministic machine
