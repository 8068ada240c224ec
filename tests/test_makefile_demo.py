"""README and Makefile agree on what `make demo` does, and the README's next steps name real commands."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from specbuild.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
MAKEFILE = (ROOT / "Makefile").read_text()
README = (ROOT / "README.md").read_text()


def _recipe(target: str) -> list[str]:
    block = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", MAKEFILE, re.M)
    assert block, f"no {target} target"
    return [line.strip() for line in block.group(1).splitlines()]


def test_make_demo_serves_until_ctrl_c_unless_up_flags_say_once():
    assert re.search(r"^UP_FLAGS \?= +#", MAKEFILE, re.M)  # empty by default
    assert _recipe("demo")[-1] == "$(BIN)/specbuild up -c $(DEMO)/specbuild.toml $(UP_FLAGS)"
    assert re.search(r"^DEMO +:= \.demo$", MAKEFILE, re.M)
    flat = " ".join(README.split())
    assert "keeps serving until Ctrl-C**; `make demo UP_FLAGS=--once` stops after the prompts" in flat
    assert "`specbuild up --once`" not in README.split("## The pipeline")[0]


def test_the_readme_next_steps_use_the_demo_spec_and_real_commands():
    section = README.split("### After `make demo`")[1].split("```bash")[1].split("```")[0]
    lines = [shlex.split(line.split("  #")[0]) for line in section.strip().splitlines()]
    assert lines[0] == ["source", ".venv/bin/activate"]
    for argv in lines[1:]:
        assert argv[0] == "specbuild" and argv[1] in COMMANDS and argv[2:4] == ["-c", ".demo/specbuild.toml"], argv


def test_the_readme_is_short_and_shows_both_commands_on_its_first_screen():
    """A newcomer reads it in five minutes: at most 300 lines, and the two commands within its first 30 lines; the
    CLI reference (docs/cli.md) and the changelog (CHANGELOG.md) live beside it and are linked from it."""
    lines = README.splitlines()
    assert len(lines) <= 300, len(lines)
    first_screen = "\n".join(lines[:30])
    assert re.search(r"^make demo\b", first_screen, re.M) and re.search(r"^make test\b", first_screen, re.M)
    for page in ("docs/cli.md", "CHANGELOG.md", "docs/architecture.md"):
        assert f"]({page})" in README and (ROOT / page).is_file(), page


def test_every_relative_link_of_the_docs_resolves():
    """README, CHANGELOG and docs/ link to files of the repository (pages, plots, recorded runs): each exists."""
    pages = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            path = target.split("#")[0]
            if path and not target.startswith(("http://", "https://", "mailto:")) and not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken
