"""One record per backend (specbuild.backends): the spec and every `--backend` option take exactly its names, and
the stages read its facts instead of comparing names."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from specbuild import backends
from specbuild.cli import main
from specbuild.config import BACKENDS
from specbuild.errors import SpecError


def test_every_backend_option_and_the_spec_take_the_registry_names():
    assert BACKENDS == backends.NAMES
    ctx = click.Context(main)
    for name in ("convert", "build", "check", "repo", "serve", "up"):
        command = main.get_command(ctx, name)
        option = next(p for p in command.params if p.name == "backend")
        assert tuple(option.type.choices) == backends.NAMES, name


def test_the_records_say_what_the_stages_ask():
    assert backends.ENGINE_BACKENDS == ("trtllm", "reference")
    assert [b.name for b in backends.BACKENDS.values() if b.path == "llmapi"] == ["llmapi"]
    assert backends.path_of(None) == "engine" and backends.path_of("reference") == "engine"
    assert backends.get("trtllm").builder == "trtllm-build" and backends.get("trtllm").triton_backend == "tensorrtllm"
    assert not backends.get("reference").gpu and backends.get("reference").triton_backend == "python"
    with pytest.raises(SpecError, match="backend 'vllm' is not supported. Choose one of: trtllm, reference, llmapi"):
        backends.get("vllm")


def _backends_chosen(spec_path) -> dict[str, str]:
    """The backend check, build and up each pick for this spec when --backend is not given."""
    import json

    from click.testing import CliRunner

    chosen = {}
    for command in (
        ["check", "--json", "--no-weight-scan"],
        ["build", "--dry-run", "--json"],
        ["up", "--dry-run", "--json"],
    ):
        result = CliRunner().invoke(main, [command[0], "-c", str(spec_path), *command[1:]])
        assert result.exit_code == 0, result.output
        chosen[command[0]] = json.loads(result.stdout)["backend"]
    return chosen


def test_check_build_and_up_default_to_the_same_backend_on_the_same_machine(tiny_spec_path, tmp_path, monkeypatch):
    """`build` once defaulted to trtllm and `up` to reference on one machine: one rule now (backends.default)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))  # no trtllm-build: a machine without TensorRT-LLM
    assert _backends_chosen(tiny_spec_path) == dict.fromkeys(("check", "build", "up"), "reference")
    fake = bin_dir / "trtllm-build"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)  # trtllm-build on PATH: NVIDIA's image
    assert _backends_chosen(tiny_spec_path) == dict.fromkeys(("check", "build", "up"), "trtllm")
    spec_text = tiny_spec_path.read_text()
    assert "\n[build]\n" in spec_text
    tiny_spec_path.write_text(spec_text.replace("\n[build]\n", '\n[build]\nbackend = "reference"\n', 1))
    assert _backends_chosen(tiny_spec_path) == dict.fromkeys(("check", "build", "up"), "reference")


def test_the_default_rule():
    assert backends.default("llmapi") == "llmapi"
    assert backends.default(None, trtllm_build="/opt/trtllm-build") == "trtllm"


def test_up_names_the_llmapi_weights_in_its_generate_local_step(tmp_path):
    """After `up --backend llmapi`, the suggested `generate --local` runs the export the server loads."""
    from specbuild.cli.up_cmd import next_steps
    from specbuild.config import spec_from_dict

    spec = spec_from_dict({"name": "p", "target": {"checkpoint": "t"}, "draft": {"checkpoint": "d"}}, tmp_path)
    local = [line for line in next_steps(spec, "127.0.0.1:1", serving=False, backend="llmapi") if "--local" in line]
    assert any("generate" in line and "--local --backend llmapi" in line for line in local)
    assert not any("--backend" in line for line in next_steps(spec, "127.0.0.1:1", serving=False, backend="reference"))


def test_no_module_forks_on_the_llm_api_path_by_name():
    """What differs between the paths is a method or attribute of the path's object (`specbuild.paths`) or a field of
    the backend's record; only those, and the family rules per path (`families`), may name the LLM API path in a
    comparison. (The fork this replaced, `is_llm_api`, stood in 16 files.)"""
    import re

    root = Path(backends.__file__).parent
    allowed = {root / "backends.py", root / "families.py", root / "drafters.py", *(root / "paths").glob("*.py")}
    fork = re.compile(r'(==|!=)\s*"llmapi"|"llmapi"\s*(==|!=)|"llmapi" if |is_llm_api|\.llm_api\b')
    found = [
        f"{path.relative_to(root)}:{n}: {line.strip()}"
        for path in sorted(root.rglob("*.py"))
        if path not in allowed
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if fork.search(line)
    ]
    assert not found, found
