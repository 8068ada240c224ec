"""The CLI's contract: fast --help without heavy imports, exit codes, docs/cli.md in sync."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from specbuild.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "modelopt", "tritonclient")


def test_help_lists_the_pipeline():
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    assert "check -> convert -> build -> repo -> serve" in result.output


def test_every_command_help_works_without_heavy_imports():
    names = main.list_commands(None)
    assert "check" in names
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from specbuild.cli import main\n"
        f"for name in {names!r}:\n"
        "    r = CliRunner().invoke(main, [name, '--help'])\n"
        "    assert r.exit_code == 0, (name, r.output)\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"--help imported heavy modules: {out.stdout.strip()}"


def test_unknown_command_is_a_usage_error():
    result = CliRunner().invoke(main, ["chek"])
    assert result.exit_code == 2
    assert "No such command 'chek'" in result.output


def test_library_errors_become_one_line_click_errors(tmp_path):
    result = CliRunner().invoke(main, ["check", "-c", str(tmp_path / "missing.toml")])
    assert result.exit_code == 1
    assert "Error: spec file" in result.output and "specbuild init" in result.output
    assert "Traceback" not in result.output


JSON_FAILURES = {  # command line -> exit code; each fails before the command has a result to print
    "check": (["check", "-c", "{missing}"], 1),
    "convert": (["convert", "-c", "{missing}"], 1),
    "build": (["build", "-c", "{missing}"], 1),
    "repo": (["repo", "-c", "{missing}"], 1),
    "serve": (["serve", "-c", "{missing}"], 1),
    "generate": (["generate", "-c", "{missing}", "hello"], 1),
    "bench": (["bench", "-c", "{missing}", "--local"], 1),
    "up": (["up", "-c", "{missing}"], 1),
    "init": (["init", "--out", "{existing}"], 1),
    "example": (["example", "--variant", "huge"], 2),
    "generate-usage": (["generate", "--local", "--url", "x:1", "hello"], 2),
}


@pytest.mark.parametrize("name", sorted(JSON_FAILURES))
def test_every_json_command_prints_one_document_also_on_failure(name, tmp_path):
    args, code = JSON_FAILURES[name]
    existing = tmp_path / "existing.toml"
    existing.write_text("")
    argv = [a.format(missing=tmp_path / "missing.toml", existing=existing) for a in args] + ["--json"]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == code, result.output
    doc = json.loads(result.stdout)  # exactly one JSON document: json.loads refuses trailing text
    assert doc["ok"] is False and doc["exit_code"] == code and doc["command"] == argv[0]
    assert doc["error"] and doc["error"] in result.stderr


def test_a_command_that_printed_its_document_prints_no_second_one(tmp_path):
    spec = tmp_path / "specbuild.toml"
    spec.write_text('name = "p"\n[target]\ncheckpoint = "t"\n[draft]\ncheckpoint = "d"\n')
    result = CliRunner().invoke(main, ["up", "-c", str(spec), "--json"])
    assert result.exit_code == 1
    doc = json.loads(result.stdout)  # up's own failed document, not a second one
    assert doc["stages"][0]["status"] == "failed"


def test_without_c_the_demo_spec_is_found_from_the_repository_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    missing = CliRunner().invoke(main, ["check"])
    assert "spec file 'specbuild.toml' not found" in missing.stderr
    (tmp_path / ".demo").mkdir()
    (tmp_path / ".demo" / "specbuild.toml").write_text(
        'name = "demo"\n[target]\ncheckpoint = "t"\n[draft]\ncheckpoint = "d"\n'
    )
    found = CliRunner().invoke(main, ["check"])
    assert "using the demo's spec .demo/specbuild.toml" in found.stderr
    assert "target checkpoint" in found.stderr and str(tmp_path / ".demo" / "t") in found.stderr
    # an explicit -c is never replaced
    explicit = CliRunner().invoke(main, ["check", "-c", "specbuild.toml"])
    assert "spec file 'specbuild.toml' not found" in explicit.stderr and "demo" not in explicit.stderr


def test_registered_modules_match_files():
    pkg = ROOT / "pipeline" / "specbuild" / "cli"
    for name, (module, _) in COMMANDS.items():
        if name in main.list_commands(None):
            assert (pkg / (module.rsplit(".", 1)[1] + ".py")).is_file()


def test_python_dash_m_entry_point():
    out = subprocess.run([sys.executable, "-m", "specbuild", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and "specbuild, version" in out.stdout


def test_cli_reference_page_is_current():
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "cli_reference.py"), "--check"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
