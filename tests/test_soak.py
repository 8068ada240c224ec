"""The chaos soak, short (scripts/soak.py; `make soak` runs the 30-minute one): two streams of specbuild's client,
greedy and seeded, through `specbuild serve` while a fault comes every few seconds: every model's process killed,
the draft's and the target's frozen, a burst of malformed requests, a client gone mid-stream, SIGTERM to serve and a
new serve. Asserted: no request failed at specbuild's client, every greedy output equals the same request's before
any fault (a seeded one may differ where a fault changed its steps: counted, not asserted), serve stopped cleanly each time and left no process. The resources and the longest pause are printed (-s): the
aims on them are for the 30-minute run (docs/triton.md, "The chaos soak"), not for a test on a shared machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from triton_helpers import make_deployment

pytestmark = [pytest.mark.fault, pytest.mark.server, pytest.mark.slow]
SOAK = Path(__file__).resolve().parent.parent / "scripts" / "soak.py"


def soak_script():
    """scripts/soak.py as a module (its FAULTS)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("soak", SOAK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_short_soak_loses_nothing(tmp_path, example_tiny):
    deployment = make_deployment(tmp_path, example_tiny)
    argv = [sys.executable, str(SOAK), "-c", str(deployment.spec_path), "--repo", str(deployment.repo)]
    argv += ["--minutes", "1.5", "--streams", "2", "--fault-every", "8", "--max-tokens", "96", "--json"]
    run = subprocess.run(argv, capture_output=True, text=True, cwd=deployment.root, timeout=1800)
    report = json.loads(run.stdout)
    print("\n" + json.dumps({k: v for k, v in report.items() if k not in ("faults",)}, indent=1))
    rotation = [f["fault"] for f in report["faults"]][: len(soak_script().FAULTS)]
    assert rotation == list(soak_script().FAULTS), run.stderr[-3000:]  # every fault came once
    assert report["failed"] == 0, report["failures"]
    assert report["greedy_differing"] == 0, report["differing"]
    assert report["requests"] > 0 and report["serve_exit"] == 0 and report["processes_left"] == []
    assert run.returncode == 0
