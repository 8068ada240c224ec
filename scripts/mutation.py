"""Mutation testing of specbuild's core with mutmut: `make mutation` (or `python scripts/mutation.py`).

mutmut 3 finds the code it mutates under ./, src/ or source/, so the run works on a copy of the tracked files in a
temporary folder with `pipeline/` as `src/` (nothing here is changed), mutates the files given (default: CORE), runs
the tests that cover each mutated function, and writes the report (default docs/mutation.md): per file the mutants
killed, survived and not covered, the score (killed / all), and each survivor's change, for a test to kill it or a
reason it is equivalent to be written beside it.

    python scripts/mutation.py                                   # the core, the tests below
    python scripts/mutation.py --files speculative/lookup.py     # one file (paths under pipeline/specbuild)
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MUTMUT = "mutmut==3.8.1"
CORE = ["speculative/acceptance.py", "speculative/draft_len.py", "speculative/lookup.py"]
TESTS = [
    "tests/test_speculative_acceptance.py",
    "tests/test_speculative_loop.py",
    "tests/test_speculative_distribution.py",
    "tests/test_speculative_adaptive.py",
    "tests/test_drafters.py",
    "tests/test_request_rules.py",
]
RESULT = re.compile(r"^\s*(specbuild\.[\w.]+):\s*(.+)$")


def copy_tracked(dest: Path) -> None:
    """The tracked files, pipeline/ renamed src/ (ignored build outputs and caches stay behind)."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in files.decode().split("\0"):
        if not name or not (ROOT / name).is_file():
            continue
        target = dest / ("src" + name[len("pipeline") :] if name.startswith("pipeline/") else name)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)


def configure(folder: Path, files: list[str], tests: list[str]) -> None:
    config = ["", "[tool.mutmut]", 'source_paths = ["src"]']
    config.append("only_mutate = [" + ", ".join(f'"src/specbuild/{f}"' for f in files) + "]")
    config.append("pytest_add_cli_args_test_selection = [" + ", ".join(f'"{t}"' for t in tests) + "]")
    with (folder / "pyproject.toml").open("a") as f:
        f.write("\n".join(config) + "\n")


def module_of(name: str) -> str:
    """specbuild.speculative.acceptance.x_f__mutmut_3 -> speculative/acceptance.py"""
    module = name.split(".x_")[0] if ".x_" in name else name.rsplit(".", 1)[0]
    return module.removeprefix("specbuild.").replace(".", "/") + ".py"


def report(folder: Path, files: list[str], tests: list[str]) -> str:
    mutmut = [sys.executable, "-m", "mutmut"]
    lines = subprocess.run([*mutmut, "results", "--all", "true"], cwd=folder, capture_output=True, text=True).stdout
    results = {m.group(1): m.group(2).strip() for m in map(RESULT.match, lines.splitlines()) if m}
    by_file: dict[str, Counter] = {f: Counter() for f in files}
    survivors: dict[str, list[str]] = {f: [] for f in files}
    for name, status in sorted(results.items()):
        path = module_of(name)
        by_file.setdefault(path, Counter())[status] += 1
        if status != "killed":
            diff = subprocess.run([*mutmut, "show", name], cwd=folder, capture_output=True, text=True).stdout
            changed = [
                line[1:].strip() for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")
            ]
            survivors.setdefault(path, []).append(
                f"`{name.rsplit('.', 1)[-1]}` ({status}): `{' | '.join(changed)[:150]}`"
            )
    out = [
        "# Mutation testing of the core",
        "",
        f"Written by `make mutation` (scripts/mutation.py, {MUTMUT}); tests: {', '.join(tests)}. A mutant is one small",
        "change to the code (an operator, a constant, a call dropped); killed means a test failed on it. The score is",
        "killed / all mutants; a survivor needs a test that kills it, or a reason it is equivalent written beside it.",
        "",
        "| file | mutants | killed | survived | not covered | other | score |",
        "|---|---|---|---|---|---|---|",
    ]
    for path, counts in by_file.items():
        total = sum(counts.values())
        other = total - counts["killed"] - counts["survived"] - counts["no tests"]
        score = f"{counts['killed'] / total:.1%}" if total else "-"
        out.append(
            f"| `{path}` | {total} | {counts['killed']} | {counts['survived']} | {counts['no tests']} | {other} | {score} |"
        )
    for path, names in survivors.items():
        if names:
            out += ["", f"## Not killed in `{path}`", "", *(f"- {n}" for n in names)]
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", nargs="+", default=CORE, help="paths under pipeline/specbuild")
    parser.add_argument("--tests", nargs="+", default=TESTS)
    parser.add_argument("--report", type=Path, default=ROOT / "docs" / "mutation.md")
    args = parser.parse_args()
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", MUTMUT], check=True)
    with tempfile.TemporaryDirectory(prefix="specbuild-mutation-") as tmp:
        folder = Path(tmp)
        copy_tracked(folder)
        configure(folder, args.files, args.tests)
        run = subprocess.run([sys.executable, "-m", "mutmut", "run"], cwd=folder)
        if run.returncode not in (0, 1):  # 1: some mutants survived
            return run.returncode
        args.report.write_text(report(folder, args.files, args.tests))
    print(f"wrote {args.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
