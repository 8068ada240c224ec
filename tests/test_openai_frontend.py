"""`serve --server openai`: NVIDIA's OpenAI-compatible Triton frontend in front of the engine path's repository.

It needs NVIDIA's frontend and the tritonserver Python bindings (the GPU image), which cannot be installed here, so
what is tested is what specbuild decides: the argv (main.py's options, the BLS's own tokenizer for chat templates,
the KServe endpoints on the spec's ports), the dry run, and the refusals. The requests the frontend sends are served
by the BLS on a real tritonserver in tests/test_bls_server.py (its exact tensors, counts and tool-call guides)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from specbuild.cli import main
from specbuild.errors import ArtifactError, ToolNotFoundError
from specbuild.triton import openai_frontend

ROOT = Path(__file__).resolve().parents[1]
REPO = ROOT / "triton_repo"  # the committed engine-path repository


def test_the_argv_is_main_pys_options_with_the_bls_tokenizer_and_the_kserve_ports():
    command = openai_frontend.plan(REPO, "/opt/x/main.py", "0.0.0.0", None, 8100, 8101, python="/usr/bin/python3")
    assert command.argv == [
        "/usr/bin/python3",
        "/opt/x/main.py",
        "--model-repository",
        str(REPO),
        "--tokenizer",
        str((REPO / "../engines/example/target/engine").resolve()),  # the BLS's tokenizer_dir, as it resolves it
        "--backend",
        "tensorrtllm",
        "--host",
        "0.0.0.0",
        "--openai-port",
        "9000",
        "--enable-kserve-frontends",
        "--kserve-http-port",
        "8100",
        "--kserve-grpc-port",
        "8101",
    ]
    assert command.health_url == "http://127.0.0.1:9000/health/ready"
    assert (
        command.to_dict()["openai"] == "http://127.0.0.1:9000/v1" and command.to_dict()["model"] == "tensorrt_llm_bls"
    )


def test_a_repository_without_the_bls_is_refused(tmp_path):
    with pytest.raises(ArtifactError, match="has no tensorrt_llm_bls: --server openai serves the engine path's"):
        openai_frontend.plan(tmp_path, "/opt/x/main.py", "127.0.0.1", 9000, 8000, 8001)


def test_a_missing_frontend_or_missing_bindings_say_where_they_come_from(tmp_path, monkeypatch):
    monkeypatch.delenv(openai_frontend.FRONTEND_ENV, raising=False)
    with pytest.raises(ToolNotFoundError, match="ships in NVIDIA's Triton images"):
        openai_frontend.find_frontend(tmp_path / "main.py")
    main_py = tmp_path / "main.py"
    main_py.write_text("")
    monkeypatch.setenv(openai_frontend.FRONTEND_ENV, str(main_py))
    # this interpreter has no tritonserver bindings (PyPI has none): the real import fails, and says so
    with pytest.raises(ToolNotFoundError, match="needs the tritonserver Python bindings"):
        openai_frontend.find_frontend(python=sys.executable)


def _spec(tmp_path) -> Path:
    spec_path = tmp_path / "specbuild.toml"
    spec_path.write_text(
        f'name = "pair"\noutput_dir = "{tmp_path / "engines"}"\n[target]\ncheckpoint = "t"\n[draft]\ncheckpoint = "d"\n'
    )
    return spec_path


def test_the_dry_run_prints_the_command_and_the_real_run_names_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.delenv(openai_frontend.FRONTEND_ENV, raising=False)
    spec_path = _spec(tmp_path)
    args = ["serve", "-c", str(spec_path), "--server", "openai", "--repo", str(REPO), "--openai-port", "9100"]
    result = CliRunner().invoke(main, [*args, "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["server"] == "openai" and document["openai"] == "http://127.0.0.1:9100/v1"
    assert document["argv"][1] == str(openai_frontend.IMAGE_FRONTEND)
    assert document["kserve"] == {"http_port": 8000, "grpc_port": 8001}  # the spec's [serve] ports
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1 and "cannot run on this CPU machine" in result.output


@pytest.mark.parametrize("option", [["--no-supervise"], ["--canary-interval", "5"], ["--max-restarts", "3"]])
def test_specbuilds_supervisor_options_are_refused_with_nvidias_process(tmp_path, option):
    args = ["serve", "-c", str(_spec(tmp_path)), "--server", "openai", "--repo", str(REPO), *option, "--dry-run"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "--server openai (NVIDIA's process) has neither" in result.output


def test_the_llmapi_repository_is_not_the_frontends(tmp_path):
    args = ["serve", "-c", str(_spec(tmp_path)), "--server", "openai", "--backend", "llmapi", "--dry-run"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "serves the engine path's repository" in result.output
