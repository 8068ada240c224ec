"""Mutation testing of specbuild's core with mutmut: `make mutation` (or `python scripts/mutation.py`).

mutmut 3 finds the code it mutates under ./, src/ or source/, so each file is run in a copy of the tracked files in a
temporary folder with `pipeline/` as `src/` (nothing here is changed): mutmut mutates the file and runs the tests
listed for it in FILES that cover each mutated function. Three files hold the outcome:

- docs/mutation/results.json: per file, the mutant counts and each mutant not killed with its change, written by
  the runs (a run of some files replaces only their entries);
- docs/mutation/equivalents.toml: the survivors that change nothing a caller can observe, each group with its
  reason, written by hand;
- docs/mutation.md: the report, made from the two (`--report-only` remakes it without running mutmut;
  tests/test_mutation_report.py checks that the committed report is what they make).

The score is killed / (mutants - equivalent): a survivor needs a test that kills it, or its reason in the
equivalents file.

    python scripts/mutation.py                                   # every file in FILES
    python scripts/mutation.py --files speculative/lookup.py     # one file (paths under pipeline/specbuild)
    python scripts/mutation.py --report-only                     # the report again from the two files
    python scripts/mutation.py --files speculative/loop.py --keep /tmp/m-loop   # resumable: run it again to go on
    python scripts/mutation.py --files speculative/loop.py --survivors  # after new tests: the last run's survivors
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
MUTMUT = "mutmut==3.8.1"
RESULTS = ROOT / "docs" / "mutation" / "results.json"
EQUIVALENTS = ROOT / "docs" / "mutation" / "equivalents.toml"
REPORT = ROOT / "docs" / "mutation.md"

_SPECULATIVE_TESTS = [
    "tests/test_speculative_acceptance.py",
    "tests/test_speculative_loop.py",
    "tests/test_speculative_distribution.py",
    "tests/test_speculative_adaptive.py",
    "tests/test_request_rules.py",
    "tests/test_drafters.py",
]
_OVERLAP_TESTS = [
    "tests/test_speculative_overlap.py",
    "--deselect",
    "tests/test_speculative_overlap.py::test_overlapped_output_matches_the_target_distribution_and_a_seed_bug_is_caught",
]
# file under pipeline/specbuild -> the tests that may kill its mutants (fast ones: a mutant runs those covering it),
# as pytest arguments (a --deselect among them leaves out one slow test)
FILES = {
    "speculative/acceptance.py": _SPECULATIVE_TESTS,
    "speculative/draft_len.py": ["tests/test_draft_len.py", *_SPECULATIVE_TESTS],
    "speculative/lookup.py": ["tests/test_lookup_units.py", *_SPECULATIVE_TESTS],
    "speculative/fallback.py": ["tests/test_draft_fallback.py", *_SPECULATIVE_TESTS],
    "speculative/guide.py": ["tests/test_guide_units.py", *_SPECULATIVE_TESTS],
    "speculative/stats.py": ["tests/test_speculative_stats.py", *_SPECULATIVE_TESTS],
    "speculative/sampling.py": ["tests/test_speculative_sampling.py", *_SPECULATIVE_TESTS],
    "speculative/adaptive.py": [*_SPECULATIVE_TESTS, *_OVERLAP_TESTS],  # the overlap bound and the hit rate
    # the loop drafts ahead through overlap.DraftAhead: the overlap tests (not their 115 s distribution test) too
    # the loop also runs guided steps and falls back to the target alone when the drafter fails
    "speculative/loop.py": [
        *_SPECULATIVE_TESTS,
        *_OVERLAP_TESTS,
        "tests/test_guide_units.py",
        "tests/test_draft_fallback.py",
    ],
    "speculative/overlap.py": ["tests/test_overlap_units.py", *_SPECULATIVE_TESTS, *_OVERLAP_TESTS],
    "triton/models/target_retry.py": ["tests/test_target_retry.py"],
    "triton/models/bls_request.py": ["tests/test_bls_request.py", "tests/test_request_rules.py"],
    "triton/supervisor.py": ["tests/test_supervisor_decisions.py", "tests/test_triton_lifecycle_units.py"],
    "triton/drain.py": ["tests/test_drain_decisions.py", "tests/test_triton_lifecycle_units.py"],
    "contract/sampling.py": ["tests/test_contract_units.py", "tests/test_runtime_contract.py"],
    "contract/words.py": [
        "tests/test_contract_units.py",
        "tests/test_runtime_contract.py",
        "tests/test_request_rules.py",
    ],
    "contract/logits.py": [
        "tests/test_contract_units.py",
        "tests/test_runtime_contract.py",
        "tests/test_triton_configs.py",
    ],
    "contract/build_rules.py": [
        "tests/test_build_rules_units.py",
        "tests/test_check_builder_rules.py",
        "tests/test_build_argv.py",
        "tests/test_check_memory.py",
        "tests/test_quantization_registry.py",
    ],
    "speculative/shared_pool.py": ["tests/test_shared_pool.py", "tests/test_lookup_units.py"],
    "contract/bls_params.py": ["tests/test_contract_units.py", "tests/test_triton_configs.py", "tests/test_session.py"],
    "contract/backend_params.py": ["tests/test_triton_models.py", "tests/test_triton_configs.py"],
    "contract/pbtxt.py": ["tests/test_triton_configs.py", "tests/test_contract_units.py"],
    "contract/serving_gate.py": [
        "tests/test_serving_gate_units.py",
        "tests/test_triton_lifecycle_units.py",
        "tests/test_drain_decisions.py",
        "tests/test_llmapi_contract.py",
        "tests/test_llmapi_answered.py",
        "tests/test_triton_configs.py",
    ],
    "contract/executor.py": [
        "tests/test_executor_rules_units.py",
        "tests/test_runtime_contract.py",
        "tests/test_contract_units.py",
    ],
    "contract/llmapi.py": [
        "tests/test_llmapi_contract.py",
        "tests/test_llmapi_protocol.py",
        "tests/test_llmapi_probe.py",
        "tests/test_llmapi_answered.py",
        "tests/test_llmapi_convert.py",
        "tests/test_llmapi_trtllm_serve.py",
        "tests/test_quantization_registry.py",
        "tests/test_session.py",
    ],
    "contract/watched_request.py": [
        "tests/test_serving_gate_units.py",
        "tests/test_llmapi_answered.py",
        "tests/test_triton_lifecycle_units.py",
    ],
    "contract/adapters.py": [  # the adapters over fake calls (the example pair's runs take a minute a mutant)
        "tests/test_adapters_units.py",
        "tests/test_bls_request.py",
        "tests/test_guide_units.py",
        "tests/test_llmapi_protocol.py",
    ],
    "contract/tensors.py": ["tests/test_triton_configs.py", "tests/test_contract_units.py"],
}
# the modules of speculative/ and contract/ not in FILES, and why: no logic for a mutant to change
NO_LOGIC = {
    "contract/images.py": "one constant, the GPU image",
    "contract/models.py": "model names and a log pattern",
    "speculative/interfaces.py": "protocols and record types",
}
RESULT = re.compile(r"^\s*(specbuild\.[\w.]+):\s*(.+)$")


def copy_tracked(dest: Path) -> None:
    """The tracked files and the untracked ones git does not ignore, pipeline/ renamed src/."""
    listed = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    files = subprocess.run(listed, cwd=ROOT, capture_output=True, check=True).stdout
    for name in files.decode().split("\0"):
        if not name or not (ROOT / name).is_file():
            continue
        target = dest / ("src" + name[len("pipeline") :] if name.startswith("pipeline/") else name)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)


def configure(folder: Path, file: str, tests: list[str]) -> None:
    config = ["", "[tool.mutmut]", 'source_paths = ["src"]', f'only_mutate = ["src/specbuild/{file}"]']
    # A mutant that hangs the tests is stopped after 2 x 4 x (its tests' time + 1 s) of CPU instead of mutmut's 2 x 15 x:
    # the loop's mutants run 75 s of tests, and each hung one held a worker for 40 minutes.
    config.append("timeout_multiplier = 4.0")
    config.append("pytest_add_cli_args_test_selection = [" + ", ".join(f'"{t}"' for t in tests) + "]")
    with (folder / "pyproject.toml").open("a") as f:
        f.write("\n".join(config) + "\n")


def outcome(folder: Path) -> dict:
    """The counts and the mutants run and not killed (name -> {status, change}) of the run in folder."""
    mutmut = [sys.executable, "-m", "mutmut"]
    lines = subprocess.run([*mutmut, "results", "--all", "true"], cwd=folder, capture_output=True, text=True).stdout
    statuses = {m.group(1).rsplit(".", 1)[-1]: m.group(2).strip() for m in map(RESULT.match, lines.splitlines()) if m}
    full = {m.group(1).rsplit(".", 1)[-1]: m.group(1) for m in map(RESULT.match, lines.splitlines()) if m}

    def change(name: str) -> str:
        diff = subprocess.run([*mutmut, "show", full[name]], cwd=folder, capture_output=True, text=True).stdout
        added = [line[1:].strip() for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
        return " | ".join(added)[:150]

    names = sorted(name for name, status in statuses.items() if status not in ("killed", "not checked"))
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:  # one `mutmut show` process each
        changes = dict(zip(names, pool.map(change, names)))
    not_killed = {name: {"status": statuses[name], "change": changes[name]} for name in names}
    return {"counts": dict(Counter(statuses.values())), "not_killed": not_killed}


def source_hash(path: Path) -> str:
    """A mutated file's content hash: mutmut numbers a function's mutants in its source order, so a run's names hold
    only for the source it ran on."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def set_up(folder: Path, file: str) -> None:
    """The copy mutmut runs in, unless folder already holds one."""
    if not (folder / "pyproject.toml").exists():
        copy_tracked(folder)
        configure(folder, file, FILES[file])


def mutmut_run(folder: Path, file: str, names: tuple[str, ...] | list[str] = ()) -> None:
    """`mutmut run` in folder (set up there first unless it already is): every mutant of file, or those named."""
    set_up(folder, file)
    module = "specbuild." + file.removesuffix(".py").replace("/", ".")
    run = subprocess.run([sys.executable, "-m", "mutmut", "run", *(f"{module}.{n}" for n in names)], cwd=folder)
    if run.returncode not in (0, 1):  # 1: some mutants survived, or the tests failed before any mutant ran
        raise SystemExit(f"mutmut failed on {file} (exit {run.returncode})")


def copy_hash(folder: Path, file: str) -> str:
    """The hash of the source the run in folder mutates (its own copy)."""
    return source_hash(folder / "src" / "specbuild" / file)


def run_in(folder: Path, file: str) -> dict:
    """Run mutmut on file in folder (a run stopped part way resumes: mutmut keeps each mutant's outcome under
    folder/mutants)."""
    mutmut_run(folder, file)
    result = outcome(folder)
    unchecked = result["counts"].get("not checked", 0)
    if unchecked:  # the tests failed unmutated (mutmut exits 1 then too), or the run was stopped: nothing is written
        raise SystemExit(
            f"mutmut left {unchecked} mutants of {file} not checked (see its output above: the tests must pass on the "
            "unmutated code); run it again (with --keep, a run goes on where it stopped)"
        )
    return {**result, "source": copy_hash(folder, file)}


def rerun_in(folder: Path, file: str, entry: dict) -> dict:
    """The file's last run (`entry`) with its survivors run again against the tests as they are now: those killed
    leave the list. The source must be the one that run mutated (the names follow it)."""
    set_up(folder, file)
    if entry.get("source") != copy_hash(folder, file):  # the copy this rerun mutates, fresh or kept
        raise SystemExit(f"{file} is not the source its last run mutated (mutant names follow it): run it whole")
    names = [name for name, mutant in entry["not_killed"].items() if mutant["status"] != "timeout"]
    mutmut_run(folder, file, names)
    now = outcome(folder)["not_killed"]
    if any(now.get(name, {}).get("status") == "not checked" for name in names):
        raise SystemExit(f"mutmut left survivors of {file} not checked (see its output above)")
    counts, not_killed = Counter(entry["counts"]), dict(entry["not_killed"])
    for name in names:
        status = now[name]["status"] if name in now else "killed"
        counts[not_killed[name]["status"]] -= 1
        counts[status] += 1
        if status in ("killed", "timeout"):
            del not_killed[name]
        else:
            not_killed[name] = {**not_killed[name], "status": status}
    return {**entry, "counts": {k: v for k, v in counts.items() if v}, "not_killed": not_killed}


def record_partial(folder: Path, file: str) -> dict:
    """A run stopped part way in folder, as far as it went: the mutants not yet run are counted as "not checked"
    (the report scores the ones run and says how many)."""
    return {**outcome(folder), "source": copy_hash(folder, file)}


def run_file(file: str, keep: Path | None = None, entry: dict | None = None) -> dict:
    """A whole run of file, or with `entry` (its last run) a rerun of that run's survivors."""
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        return run_in(keep, file) if entry is None else rerun_in(keep, file, entry)
    with tempfile.TemporaryDirectory(prefix="specbuild-mutation-") as tmp:
        return run_in(Path(tmp), file) if entry is None else rerun_in(Path(tmp), file, entry)


def read_equivalents(path: Path = EQUIVALENTS) -> dict[str, dict[str, str]]:
    """file -> mutant -> reason."""
    groups = tomllib.loads(path.read_text())["equivalent"] if path.exists() else []
    found: dict[str, dict[str, str]] = {}
    for group in groups:
        for mutant in group["mutants"]:
            found.setdefault(group["file"], {})[mutant] = group["reason"]
    return found


def _deselected(file: str) -> set[str]:
    """The node ids FILES leaves out with --deselect for file."""
    args = FILES.get(file, [])
    return {args[i + 1] for i, arg in enumerate(args[:-1]) if arg == "--deselect"}


def report(results: dict, equivalents: dict[str, dict[str, str]]) -> str:
    out = [
        "# Mutation testing of the core",
        "",
        f"Written by `make mutation` (scripts/mutation.py, {MUTMUT}) from docs/mutation/results.json (the runs) and",
        "docs/mutation/equivalents.toml (the survivors that change nothing a caller can observe, with the reason). A",
        "mutant is one small change to the code (an operator, a constant, a call dropped); killed means a test failed on",
        "it (or hung on it: mutmut's timeout). The score is killed / (mutants - equivalent); a survivor not listed as",
        "equivalent needs a test that kills it. A run recorded part way (`--partial`) is scored on the mutants it ran;",
        "after new tests, `--survivors` runs a file's last survivors again; a run whose file has changed since says so",
        "(runs recorded before the source was recorded cannot). Every module of `speculative/` and",
        "`contract/` is run but those with no logic: "
        + "; ".join(f"`{file}` ({why})" for file, why in NO_LOGIC.items())
        + ".",
        "",
        "| file | tests | mutants | killed | equivalent | survived | not covered | other | score |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    sections = []
    for file in sorted(results):
        counts, not_killed = Counter(results[file]["counts"]), results[file]["not_killed"]
        reasons = equivalents.get(file, {})
        equivalent = [name for name in not_killed if name in reasons]
        open_ = [name for name in not_killed if name not in reasons and not_killed[name]["status"] != "timeout"]
        stale = sorted(set(reasons) - set(not_killed))
        total = sum(counts.values())
        killed = counts["killed"] + counts["timeout"]  # a mutant the tests hung on was caught too
        unchecked = counts["not checked"]  # a run recorded part way (--partial)
        other = total - killed - counts["survived"] - counts["no tests"] - unchecked
        live = total - unchecked - len(equivalent)
        score = f"{killed / live:.1%}" if live else "-"
        if unchecked:
            score += f" of the {total - unchecked} run so far"
        source = ROOT / "pipeline" / "specbuild" / file
        if results[file].get("source") and source.is_file() and source_hash(source) != results[file]["source"]:
            score += " (on an older source: run it again)"
        survived = sum(1 for name in open_ if not_killed[name]["status"] == "survived")
        uncovered = sum(1 for name in open_ if not_killed[name]["status"] == "no tests")
        deselected = _deselected(file)
        selected = [t for t in FILES.get(file, []) if t.startswith("tests/") and t not in deselected]
        modules = dict.fromkeys(Path(t.split("::")[0]).stem.removeprefix("test_") for t in selected)
        tests = ", ".join(
            f"{m} (some)" if any(t.startswith(f"tests/test_{m}.py::") for t in selected) else m for m in modules
        )
        out.append(
            f"| `{file}` | {tests} | {total} | {killed} | {len(equivalent)} | {survived} | {uncovered} | {other} | {score} |"
        )
        if open_:
            sections += ["", f"## Not killed in `{file}`, not yet explained", ""]
            sections += [f"- `{n}` ({not_killed[n]['status']}): `{not_killed[n]['change']}`" for n in open_]
        if equivalent:
            sections += ["", f"## Equivalent in `{file}`", ""]
            by_reason: dict[str, list[str]] = {}
            for name in equivalent:
                by_reason.setdefault(reasons[name], []).append(name)
            for reason, names in by_reason.items():
                sections.append(f"- {reason} ({', '.join(f'`{n}`' for n in names)})")
        if stale:
            sections += ["", f"## Listed as equivalent in `{file}` but killed or gone (remove from the list)", ""]
            sections += [f"- `{n}`" for n in stale]
    return "\n".join(out + sections) + "\n"


def read_results() -> dict:
    return json.loads(RESULTS.read_text()) if RESULTS.exists() else {}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", nargs="+", default=list(FILES), help="paths under pipeline/specbuild")
    parser.add_argument("--report-only", action="store_true", help="remake docs/mutation.md without running mutmut")
    parser.add_argument(
        "--keep",
        type=Path,
        metavar="FOLDER",
        help="one file: run in FOLDER and keep it (a run stopped part way goes on where it stopped when run again)",
    )
    parser.add_argument(
        "--survivors",
        action="store_true",
        help="run only the mutants the last run of each file left alive, against the tests as they are now",
    )
    parser.add_argument(
        "--partial",
        action="store_true",
        help="with --keep: record the run in FOLDER as far as it went, without running anything (the rest counted "
        "as not checked)",
    )
    args = parser.parse_args()
    unknown = [f for f in args.files if f not in FILES]
    if unknown:
        parser.error(f"no test list for {', '.join(unknown)}: add it to FILES in {Path(__file__).name}")
    if args.keep is not None and len(args.files) != 1:
        parser.error("--keep runs one file: name it with --files")
    if args.partial and args.keep is None:
        parser.error("--partial records the run in a --keep FOLDER")
    if not args.report_only:
        if not args.partial:
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", MUTMUT], check=True)
        for file in args.files:
            entry = read_results().get(file) if args.survivors else None
            if args.survivors and entry is None:
                parser.error(f"no run of {file} on record to take the survivors from: run it whole first")
            outcome = record_partial(args.keep, file) if args.partial else run_file(file, args.keep, entry)
            results = read_results()  # as it is now: another run may have written its files meanwhile
            results[file] = outcome
            RESULTS.parent.mkdir(parents=True, exist_ok=True)
            RESULTS.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    REPORT.write_text(report(read_results(), read_equivalents()))
    print(f"wrote {REPORT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
