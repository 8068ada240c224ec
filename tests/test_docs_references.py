"""The tests the docs name exist: a reference `test_file.py::test_name` (or `::test_name` after one in the same line,
or a `{a,b}` set of names) in docs/ or the README must name a test function defined in tests/. A test moved or renamed
without its docs fails here, not in a reader's search."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]  # CHANGELOG.md is history: it keeps old names
REFERENCE = re.compile(r"(test_\w+\.py)?::(test_[\w{},]+)")


def expand(name: str) -> list[str]:
    """test_a_{b,c}_d -> test_a_b_d, test_a_c_d."""
    match = re.search(r"\{([^}]*)\}", name)
    if match is None:
        return [name]
    return [n for part in match.group(1).split(",") for n in expand(name[: match.start()] + part + name[match.end() :])]


def references(text: str) -> list[tuple[str, str]]:
    """(test file, test function) for each reference, a bare `::name` taking the line's file before it."""
    found = []
    for line in text.splitlines():
        current = None
        for match in REFERENCE.finditer(line):
            current = match.group(1) or current
            if current is not None:
                found += [(current, name) for name in expand(match.group(2))]
    return found


def test_references_are_read_with_their_files_and_name_sets():
    line = "`test_a.py::test_x[float16]`, `::test_y_{http,grpc}_z`; `test_b.py::test_w`, ::test_v and ::test_orphan"
    assert references(line) == [
        ("test_a.py", "test_x"),
        ("test_a.py", "test_y_http_z"),
        ("test_a.py", "test_y_grpc_z"),
        ("test_b.py", "test_w"),
        ("test_b.py", "test_v"),
        ("test_b.py", "test_orphan"),
    ]
    assert references("`::test_alone` with no file before it") == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_test_a_doc_names_exists(doc: Path):
    missing = []
    for file, name in references(doc.read_text()):
        path = ROOT / "tests" / file
        if not path.exists() or not re.search(rf"^\s*(async )?def {name}\(", path.read_text(), re.MULTILINE):
            missing.append(f"{file}::{name}")
    assert not missing, f"{doc.name} names tests that do not exist: {missing}"
