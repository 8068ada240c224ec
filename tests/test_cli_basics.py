"""The CLI's contract: fast --help without heavy imports, exit codes, README reference in sync."""

import subprocess
import sys
from pathlib import Path

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


def test_registered_modules_match_files():
    pkg = ROOT / "pipeline" / "specbuild" / "cli"
    for name, (module, _) in COMMANDS.items():
        if name in main.list_commands(None):
            assert (pkg / (module.rsplit(".", 1)[1] + ".py")).is_file()


def test_python_dash_m_entry_point():
    out = subprocess.run([sys.executable, "-m", "specbuild", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and "specbuild, version" in out.stdout


def test_readme_cli_reference_is_current():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "cli_reference.py"), "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
