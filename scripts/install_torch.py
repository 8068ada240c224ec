"""Install the CPU build of PyTorch into the running Python (used by `make setup`).

    python scripts/install_torch.py "torch==2.13.*"            # install
    python scripts/install_torch.py "torch==2.13.*" --dry-run  # print the pip command and any note

A plain `pip install torch` on Linux gets the CUDA build from PyPI (several GB of CUDA libraries).
PyTorch publishes CPU-only wheels on its own index, https://download.pytorch.org/whl/cpu, for
Linux x86_64 and aarch64 and for Windows x86_64 (the pip command of https://pytorch.org/get-started/locally/
with "CPU" selected); on macOS the PyPI wheels are already CPU builds. So: that index where the
platform has one; the default index (your pip configuration: mirrors, --find-links, cache) when it
has none, or when the CPU index does not answer (offline, firewalled), with a note saying so.
Standard library only: it runs before anything else is installed.
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# (system, machine) pairs the CPU index has wheels for (platform.system(), platform.machine().lower()).
CPU_INDEX_PLATFORMS = {
    ("Linux", "x86_64"),
    ("Linux", "amd64"),
    ("Linux", "aarch64"),
    ("Linux", "arm64"),
    ("Windows", "amd64"),
    ("Windows", "x86_64"),
}
PROBE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Plan:
    argv: list[str]  # the pip command to run
    index: str | None  # the CPU index, or None for the default index
    note: str | None  # said before installing when the default index is used on a platform with a CPU index


def cpu_index_for(system: str, machine: str) -> str | None:
    """PyTorch's CPU wheel index when it has wheels for this platform, else None (use the default index)."""
    return CPU_INDEX if (system, machine.lower()) in CPU_INDEX_PLATFORMS else None


def reachable(index: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """None when the index answers for torch, else why not (one short request, so offline fails fast)."""
    try:
        with urllib.request.urlopen(f"{index}/torch/", timeout=timeout) as response:
            return None if response.status == 200 else f"HTTP {response.status}"
    except urllib.error.HTTPError as err:
        return f"HTTP {err.code}"
    except (urllib.error.URLError, OSError) as err:
        return str(getattr(err, "reason", err))


def plan(
    requirement: str, python: str, system: str, machine: str, probe: Callable[[str], str | None] = reachable
) -> Plan:
    pip = [python, "-m", "pip", "install", "--progress-bar", "off", requirement]
    index = cpu_index_for(system, machine)
    if index is None:
        return Plan(
            pip,
            None,
            None
            if system == "Darwin"
            else f"note: PyTorch has no CPU wheel index for {system} {machine}; installing {requirement} "
            "from the default index.",
        )
    problem = probe(index)
    if problem is None:
        return Plan([*pip, "--index-url", index], index, None)
    return Plan(
        pip,
        None,
        f"note: PyTorch's CPU wheel index {index} does not answer ({problem}); installing "
        f"{requirement} from the default index instead (your pip configuration: mirrors, "
        "--find-links, cache). On Linux that can be the CUDA build, several GB: check the "
        "line printed after the install.",
    )


def describe_installed(python: str) -> str:
    code = "import torch; print(torch.__version__, torch.version.cuda or '')"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True)
    if out.returncode != 0:
        return "torch does not import: " + (out.stderr.strip().splitlines() or ["?"])[-1]
    version, _, cuda = out.stdout.strip().partition(" ")
    if cuda:
        return (
            f"torch {version} is a CUDA {cuda} build: it works on CPU, but its CUDA libraries take several GB. "
            f"For the CPU build: pip install --force-reinstall 'torch=={version.split('+')[0]}' "
            f"--index-url {CPU_INDEX}"
        )
    return f"torch {version}: CPU build"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("requirement", help='e.g. "torch==2.13.*"')
    parser.add_argument("--dry-run", action="store_true", help="print the pip command (and note); install nothing")
    args = parser.parse_args(argv)
    chosen = plan(args.requirement, sys.executable, platform.system(), platform.machine())
    if chosen.note:
        print(chosen.note, flush=True)
    print("setup: python " + " ".join(chosen.argv[1:]), flush=True)
    if args.dry_run:
        return 0
    code = subprocess.run(chosen.argv).returncode
    if code != 0 and chosen.index is not None:
        print(f"note: installing from {chosen.index} failed (exit {code}); trying the default index.", flush=True)
        code = subprocess.run([a for a in chosen.argv if a not in ("--index-url", chosen.index)]).returncode
    if code == 0:
        print("setup: " + describe_installed(sys.executable), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
