"""scripts/install_torch.py: which index `make setup` installs PyTorch from, and the fallback note."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("install_torch", ROOT / "scripts" / "install_torch.py")
install_torch = importlib.util.module_from_spec(SPEC)
sys.modules["install_torch"] = install_torch  # dataclasses look their module up there
SPEC.loader.exec_module(install_torch)

CPU = "https://download.pytorch.org/whl/cpu"


@pytest.mark.parametrize(
    "system, machine, index",
    [
        ("Linux", "x86_64", CPU),
        ("Linux", "aarch64", CPU),
        ("Windows", "AMD64", CPU),
        ("Darwin", "arm64", None),
        ("Darwin", "x86_64", None),
        ("Linux", "ppc64le", None),
    ],
)
def test_the_cpu_index_where_pytorch_publishes_cpu_wheels(system, machine, index):
    assert install_torch.cpu_index_for(system, machine) == index


def test_a_reachable_cpu_index_is_used_explicitly():
    asked = []
    plan = install_torch.plan("torch==2.13.*", "py", "Linux", "x86_64", probe=lambda url: asked.append(url))
    assert asked == [CPU]
    assert plan.argv == ["py", "-m", "pip", "install", "--progress-bar", "off", "torch==2.13.*", "--index-url", CPU]
    assert plan.index == CPU and plan.note is None


def test_an_unreachable_cpu_index_falls_back_to_the_default_index_with_a_note():
    plan = install_torch.plan("torch==2.13.*", "py", "Linux", "x86_64", probe=lambda url: "Name or service not known")
    assert "--index-url" not in plan.argv and plan.index is None
    assert plan.note.startswith(
        f"note: PyTorch's CPU wheel index {CPU} does not answer (Name or service not known); "
        "installing torch==2.13.* from the default index instead"
    )


def test_platforms_without_a_cpu_index_use_the_default_one():
    mac = install_torch.plan("torch", "py", "Darwin", "arm64", probe=lambda url: pytest.fail("probed"))
    assert mac.index is None and mac.note is None  # PyPI's macOS wheels are CPU builds
    other = install_torch.plan("torch", "py", "Linux", "ppc64le", probe=lambda url: pytest.fail("probed"))
    assert (
        other.note == "note: PyTorch has no CPU wheel index for Linux ppc64le; installing torch from the default index."
    )


def test_dry_run_on_this_machine_prints_the_command_it_would_run():
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "install_torch.py"), "torch==2.13.*", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.splitlines()
    command = out[-1]
    assert command.startswith("setup: python -m pip install --progress-bar off torch==2.13.*")
    # Either the CPU index answered here, or the fallback was taken and said so first.
    assert command.endswith(f"--index-url {CPU}") or re.match(
        r"note: (PyTorch's CPU wheel index|PyTorch has no)", out[0]
    )


def test_the_makefile_installs_torch_through_the_script():
    makefile = (ROOT / "Makefile").read_text()
    assert '$(BIN)/python scripts/install_torch.py "torch==' in makefile
    assert not re.search(r"pip install[^\n]*\"torch==", makefile)  # no plain pip install of torch
