"""docs/mutation.md is made from docs/mutation/results.json (the runs) and docs/mutation/equivalents.toml (the
reasons): the committed report is what the two make, every file scripts/mutation.py mutates has a test list that
exists, and no mutant is listed as equivalent that a run killed or that is gone."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_script():
    spec = importlib.util.spec_from_file_location("mutation_script", ROOT / "scripts" / "mutation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_report_is_what_the_results_and_reasons_make():
    script = load_script()
    results = json.loads(script.RESULTS.read_text())
    made = script.report(results, script.read_equivalents())
    assert made == script.REPORT.read_text(), "run `python scripts/mutation.py --report-only` and commit the report"
    assert "but killed or gone" not in made


def test_every_mutated_file_and_test_list_exists():
    script = load_script()
    for file, tests in script.FILES.items():
        assert (ROOT / "pipeline" / "specbuild" / file).is_file(), file
        paths = [t.split("::")[0] for t in tests if not t.startswith("--")]  # node ids name a file too
        assert paths and all((ROOT / t).is_file() for t in paths), (file, tests)


def test_every_module_of_the_core_is_mutated_or_named_as_having_no_logic():
    script = load_script()
    package = ROOT / "pipeline" / "specbuild"
    core = {
        str(path.relative_to(package))
        for folder in ("speculative", "contract")
        for path in (package / folder).glob("*.py")
        if path.name != "__init__.py"
    }
    assert core == set(script.FILES) & core | set(script.NO_LOGIC)
    assert not set(script.FILES) & set(script.NO_LOGIC)


def test_an_equivalent_that_a_run_killed_is_reported_stale_and_a_survivor_unexplained():
    script = load_script()
    results = {
        "speculative/x.py": {
            "counts": {"killed": 3, "survived": 1},
            "not_killed": {"x_f__mutmut_2": {"status": "survived", "change": "return a - b"}},
        }
    }
    equivalents = {"speculative/x.py": {"x_f__mutmut_1": "no reason"}}
    made = script.report(results, equivalents)
    assert "| `speculative/x.py` |  | 4 | 3 | 0 | 1 | 0 | 0 | 75.0% |" in made
    assert "- `x_f__mutmut_2` (survived): `return a - b`" in made
    assert "- `x_f__mutmut_1`" in made.split("but killed or gone")[1]
    explained = script.report(results, {"speculative/x.py": {"x_f__mutmut_2": "a reason"}})
    assert "| 4 | 3 | 1 | 0 | 0 | 0 | 100.0% |" in explained and "- a reason (`x_f__mutmut_2`)" in explained


def test_a_run_on_an_older_source_says_so():
    script = load_script()
    file = "speculative/overlap.py"
    run = {"counts": {"killed": 2}, "not_killed": {}}
    current = script.source_hash(ROOT / "pipeline" / "specbuild" / file)
    assert "| 100.0% |" in script.report({file: {**run, "source": current}}, {})
    older = script.report({file: {**run, "source": "0" * 16}}, {})
    assert "| 100.0% (on an older source: run it again) |" in older
    assert "| 100.0% |" in script.report({file: run}, {})  # a run that recorded no source: nothing to compare


def test_a_run_that_left_mutants_unchecked_writes_nothing(tmp_path, monkeypatch):
    """mutmut exits 1 both when mutants survived and when the tests failed on the unmutated code before any mutant
    ran: the second must not replace a file's results with every mutant 'not checked'."""
    from types import SimpleNamespace

    import pytest

    script = load_script()
    (tmp_path / "pyproject.toml").write_text("")  # set up already: nothing copied
    copy = tmp_path / "src" / "specbuild" / "speculative" / "loop.py"
    copy.parent.mkdir(parents=True)
    copy.write_text("def f():\n    return 1\n")
    monkeypatch.setattr(script.subprocess, "run", lambda *args, **kwargs: SimpleNamespace(returncode=1))
    counts = {"killed": 3, "survived": 1}
    monkeypatch.setattr(script, "outcome", lambda folder: {"counts": dict(counts), "not_killed": {}})
    written = script.run_in(tmp_path, "speculative/loop.py")  # survivors: the run is written
    assert written["counts"] == counts and written["source"] == script.source_hash(copy)  # the source it ran on
    counts["not checked"] = 4
    with pytest.raises(SystemExit, match="left 4 mutants of speculative/loop.py not checked"):
        script.run_in(tmp_path, "speculative/loop.py")


def test_a_rerun_of_the_survivors_updates_only_them_and_only_on_the_same_source(tmp_path, monkeypatch):
    from types import SimpleNamespace

    import pytest

    script = load_script()
    source = tmp_path / "src" / "specbuild" / "speculative" / "loop.py"  # the copy the rerun mutates
    source.parent.mkdir(parents=True)
    source.write_text("def f():\n    return 1\n")
    entry = {
        "counts": {"killed": 5, "survived": 3, "timeout": 1},
        "not_killed": {
            "x_a__mutmut_1": {"status": "survived", "change": "a"},
            "x_b__mutmut_2": {"status": "survived", "change": "b"},
            "x_c__mutmut_3": {"status": "survived", "change": "c"},
            "x_d__mutmut_4": {"status": "timeout", "change": "d"},
        },
        "source": script.source_hash(source),
    }
    (tmp_path / "pyproject.toml").write_text("")  # set up already: nothing copied
    ran = []
    monkeypatch.setattr(
        script.subprocess, "run", lambda argv, **kwargs: ran.append(argv) or SimpleNamespace(returncode=1)
    )
    now = {  # what mutmut says after the rerun: a killed, b still alive, c timed out; the rest was not run this time
        "x_b__mutmut_2": {"status": "survived", "change": "b"},
        "x_c__mutmut_3": {"status": "timeout", "change": "c"},
        "x_e__mutmut_9": {"status": "not checked", "change": "e"},
    }
    monkeypatch.setattr(script, "outcome", lambda folder: {"counts": {}, "not_killed": now})
    result = script.rerun_in(tmp_path, "speculative/loop.py", entry)
    assert ran[0][-3:] == [f"specbuild.speculative.loop.x_{n}" for n in ("a__mutmut_1", "b__mutmut_2", "c__mutmut_3")]
    assert result["counts"] == {"killed": 6, "survived": 1, "timeout": 2}
    assert result["not_killed"] == {
        "x_b__mutmut_2": {"status": "survived", "change": "b"},
        "x_d__mutmut_4": {"status": "timeout", "change": "d"},
    }
    with pytest.raises(SystemExit, match="not the source its last run mutated"):
        script.rerun_in(tmp_path, "speculative/loop.py", {**entry, "source": "0" * 16})


def test_a_run_recorded_part_way_is_scored_on_the_mutants_it_ran_and_says_so():
    script = load_script()
    results = {
        "speculative/loop.py": {
            "counts": {"killed": 7, "timeout": 1, "survived": 2, "not checked": 10},
            "not_killed": {
                "x_a__mutmut_1": {"status": "survived", "change": "a"},
                "x_b__mutmut_2": {"status": "survived", "change": "b"},
                "x_c__mutmut_3": {"status": "timeout", "change": "c"},
            },
        }
    }
    made = script.report(results, {"speculative/loop.py": {"x_b__mutmut_2": "the same"}})
    row = next(line for line in made.splitlines() if line.startswith("| `speculative/loop.py`"))
    assert row.endswith("| 20 | 8 | 1 | 1 | 0 | 0 | 88.9% of the 10 run so far |")  # 8 / (10 - 1)
    assert "`x_a__mutmut_1` (survived)" in made
