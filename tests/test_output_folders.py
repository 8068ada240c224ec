"""No command deletes or replaces a folder it did not create: `repo`, `up`, `convert`, `build`, `init`.

Each output folder is specbuild's own when its manifest.json says which stage wrote it
(specbuild.artifacts). Anything else found where an output goes is refused with the path and what
to do, and left exactly as it was; --force only replaces specbuild's own output of the same stage.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from fakes.build_fixtures import FAKE_TRTLLM_BUILD, fake_checkpoint

from specbuild.cli import main

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def user_folder(path: Path) -> Path:
    """What the issue found replaced: a folder holding a checkpoint copy and a notes file."""
    (path / "checkpoint").mkdir(parents=True)
    (path / "checkpoint" / "config.json").write_text('{"model_type": "llama"}')
    (path / "checkpoint" / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    (path / "notes.txt").write_text("which run this was, and why")
    return path


def contents(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def repo_spec(tmp_path: Path) -> Path:
    path = tmp_path / "specbuild.toml"
    path.write_text(
        'name = "pair-x"\n[target]\ncheckpoint = "t"\n[draft]\ncheckpoint = "d"\n'
        "[speculative]\nmax_draft_len = 4\nnum_draft_tokens = 2\n"
    )
    return path


def not_ours(path: Path, stage: str) -> str:
    return (
        f"Error: {path} exists and was not written by specbuild (it has no specbuild manifest.json): {stage} "
        "will not replace it or delete anything in it, not even with --force. Choose another folder (a new or "
        "empty one), or move its contents away.\n"
    )


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_repo_refuses_a_folder_it_did_not_write(tmp_path, force):
    out = user_folder(tmp_path / "mine")
    before = contents(out)
    result = run("repo", "-c", str(repo_spec(tmp_path)), "--backend", "reference", "--out-dir", str(out), *force)
    assert result.exit_code == 1
    assert result.output == not_ours(out, "repo")
    assert contents(out) == before


def test_repo_uses_an_empty_folder_and_replaces_its_own(tmp_path):
    spec, out = repo_spec(tmp_path), tmp_path / "repo"
    out.mkdir()
    assert run("repo", "-c", str(spec), "--backend", "reference", "--out-dir", str(out)).exit_code == 0
    assert json.loads((out / "manifest.json").read_text())["stage"] == "repo"
    forced = run("repo", "-c", str(spec), "--backend", "trtllm", "--out-dir", str(out), "--force")
    assert forced.exit_code == 0, forced.output
    assert json.loads((out / "manifest.json").read_text())["backend"] == "trtllm"


def test_repo_refuses_a_checkpoint_folder_even_with_force(tmp_path):
    spec = repo_spec(tmp_path)
    engine = fake_checkpoint_folder(tmp_path)
    before = contents(engine)
    result = run("repo", "-c", str(spec), "--backend", "reference", "--out-dir", str(engine), "--force")
    assert result.exit_code == 1
    assert result.output.startswith(
        f"Error: {engine} holds specbuild's TensorRT-LLM checkpoint (convert), not a "
        "Triton model repository (repo): it will not be replaced, not even with --force."
    )
    assert contents(engine) == before


def fake_checkpoint_folder(tmp_path: Path) -> Path:
    """A checkpoint folder as `convert` commits it (its manifest carries manifest_version and stage)."""
    from specbuild.artifacts import stage_output

    folder = tmp_path / "engines" / "pair-x" / "target" / "checkpoint"
    with stage_output(folder, stage="convert") as out:
        (out.tmp / "rank0.safetensors").write_bytes(b"weights")
        out.commit({"input_hash": "h"})
    return folder


def test_repo_refuses_a_file_where_the_folder_goes(tmp_path):
    out = tmp_path / "triton_repo"
    out.write_text("not a folder")
    result = run("repo", "-c", str(repo_spec(tmp_path)), "--backend", "reference", "--out-dir", str(out), "--force")
    assert result.exit_code == 2 and "is a file" in result.output  # click's own check of the option
    assert out.read_text() == "not a folder"


def test_the_committed_triton_repo_stays_regenerable_and_engines_stays_put(tmp_path):
    shutil.copytree(ROOT / "triton_repo", tmp_path / "triton_repo")
    shutil.copytree(ROOT / "engines", tmp_path / "engines")
    spec = repo_spec(tmp_path)
    regenerated = run("repo", "-c", str(spec), "--backend", "reference", "--out-dir", str(tmp_path / "triton_repo"))
    assert regenerated.exit_code == 0, regenerated.output
    assert json.loads((tmp_path / "triton_repo" / "manifest.json").read_text())["pair"] == "pair-x"
    before = contents(tmp_path / "engines")
    refused = run("repo", "-c", str(spec), "--backend", "reference", "--out-dir", str(tmp_path / "engines"), "--force")
    assert refused.exit_code == 1 and refused.output == not_ours(tmp_path / "engines", "repo")
    assert contents(tmp_path / "engines") == before


def test_repo_keeps_files_added_to_its_own_folder(tmp_path):
    spec, out = repo_spec(tmp_path), tmp_path / "triton_repo"
    assert run("repo", "-c", str(spec), "--backend", "reference", "--out-dir", str(out)).exit_code == 0
    (out / "tensorrt_llm_bls" / "NOTES.md").write_text("tuning notes")
    again = run("repo", "-c", str(spec), "--backend", "reference", "--out-dir", str(out))
    assert again.exit_code == 0 and "up to date" in again.output
    forced = run("repo", "-c", str(spec), "--backend", "reference", "--out-dir", str(out), "--force")
    assert forced.exit_code == 1
    assert forced.output == (
        f"Error: {out} is specbuild's Triton model repository (repo), but holds files specbuild "
        "did not write (tensorrt_llm_bls/NOTES.md): repo will not replace it, not even with "
        "--force. Move those files out of it, or choose another folder.\n"
    )
    assert (out / "tensorrt_llm_bls" / "NOTES.md").read_text() == "tuning notes"


def test_a_served_copy_of_the_committed_triton_repo_is_regenerable(tmp_path):
    out, spec = tmp_path / "triton_repo", repo_spec(tmp_path)
    shutil.copytree(ROOT / "triton_repo", out)
    (out / "tensorrt_llm_bls" / "1" / "__pycache__").mkdir()  # written when tritonserver imported model.py
    (out / "tensorrt_llm_bls" / "1" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"pyc")
    (out / "notes.txt").write_text("mine")  # the committed manifest's own file list tells it apart
    refused = run("repo", "-c", str(spec), "--backend", "reference", "--out-dir", str(out), "--force")
    assert refused.exit_code == 1 and "holds files specbuild did not write (notes.txt): " in refused.output
    (out / "notes.txt").unlink()
    result = run("repo", "-c", str(spec), "--backend", "reference", "--out-dir", str(out), "--force")
    assert result.exit_code == 0, result.output
    assert json.loads((out / "manifest.json").read_text())["pair"] == "pair-x"


def test_up_refuses_the_repo_folder_before_converting(tiny_spec_path):
    out = user_folder(tiny_spec_path.parent / "mine")
    before = contents(out)
    result = run("up", "-c", str(tiny_spec_path), "--until", "repo", "--repo", str(out), "--json")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert [(s["stage"], s["status"]) for s in doc["stages"]] == [("check", "failed")]
    assert doc["stages"][0]["error"] == not_ours(out, "repo")[len("Error: ") : -1]
    assert contents(out) == before
    assert not (tiny_spec_path.parent / "engines").exists()  # nothing converted first


def test_up_until_check_does_not_look_at_the_repo_folder(tiny_spec_path):
    user_folder(tiny_spec_path.parent / "mine")
    result = run("up", "-c", str(tiny_spec_path), "--until", "check", "--repo", str(tiny_spec_path.parent / "mine"))
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_convert_refuses_a_checkpoint_folder_it_did_not_write(tmp_path, force):
    pytest.importorskip("torch")
    from convert_helpers import make_llama, write_spec

    target = make_llama(tmp_path / "target")
    spec = write_spec(tmp_path / "s.toml", target, target, tmp_path / "out")
    folder = user_folder(tmp_path / "out" / "pair" / "target" / "checkpoint")
    before = contents(folder)
    result = run("convert", "-c", str(spec), "--role", "target", *force)
    assert result.exit_code == 1
    assert result.output.endswith(not_ours(folder, "convert"))
    assert contents(folder) == before


def build_spec(tmp_path: Path) -> Path:
    path = tmp_path / "specbuild.toml"
    path.write_text(
        'name = "pair"\noutput_dir = "engines"\n[target]\ncheckpoint = "hf-target"\n'
        '[draft]\ncheckpoint = "hf-draft"\n[speculative]\nmax_draft_len = 5\nnum_draft_tokens = 4\n'
        "[build]\nmax_batch_size = 2\nmax_input_len = 512\nmax_seq_len = 1024\nmax_num_tokens = 2048\n"
    )
    return path


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_build_refuses_an_engine_folder_it_did_not_write(tmp_path, monkeypatch, force):
    from specbuild.config import load_spec

    monkeypatch.delenv("FAKE_TRTLLM_MODE", raising=False)
    spec_path = build_spec(tmp_path)
    fake_checkpoint(load_spec(spec_path), "target")
    engine = user_folder(tmp_path / "engines" / "pair" / "target" / "engine")
    before = contents(engine)
    result = run("build", "-c", str(spec_path), "--role", "target", "--trtllm-build", str(FAKE_TRTLLM_BUILD), *force)
    assert result.exit_code == 1
    assert result.output.endswith(not_ours(engine, "build"))
    assert contents(engine) == before
    (engine / "notes.txt").unlink()
    shutil.rmtree(engine / "checkpoint")  # emptied by its owner: now the build may use it
    again = run("build", "-c", str(spec_path), "--role", "target", "--trtllm-build", str(FAKE_TRTLLM_BUILD))
    assert again.exit_code == 0, again.output
    assert json.loads((engine / "manifest.json").read_text())["stage"] == "build"


def test_init_refuses_to_overwrite_a_file_or_a_folder(tmp_path):
    spec = tmp_path / "specbuild.toml"
    spec.write_text("# mine\n")
    refused = run("init", "--out", str(spec))
    assert refused.exit_code == 1 and "already exists; not overwriting it" in refused.output
    assert spec.read_text() == "# mine\n"
    folder = user_folder(tmp_path / "folder")
    result = run("init", "--out", str(folder), "--force")
    assert result.exit_code == 2 and "is a directory" in result.output
    assert (folder / "notes.txt").is_file()
    from specbuild.errors import SpecError
    from specbuild.example.specfile import write_spec

    with pytest.raises(SpecError, match="is a folder; a spec file is not written over a folder"):
        write_spec(folder, "name = 'x'\n", force=True)
    assert (folder / "notes.txt").is_file()
    leftover = tmp_path / ".specbuild.toml.tmp"  # the old fixed temporary name: someone else's file now
    leftover.write_text("theirs")
    write_spec(spec, "name = 'x'\n", force=True)
    assert leftover.read_text() == "theirs" and spec.read_text() == "name = 'x'\n"
