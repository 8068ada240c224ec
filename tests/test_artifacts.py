"""Stage outputs: atomic writes, manifests, skip-when-unchanged, locks."""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from specbuild.artifacts import combined_hash, hash_tree, read_manifest, stage_output
from specbuild.errors import ArtifactError

ROOT = Path(__file__).resolve().parents[1]


def test_commit_renames_into_place_with_manifest(tmp_path):
    final = tmp_path / "out"
    with stage_output(final, stage="convert") as out:
        assert not out.up_to_date("h1")
        (out.tmp / "weights.bin").write_bytes(b"abc")
        assert not final.exists()  # nothing visible before commit
        out.commit({"input_hash": "h1", "role": "target"})
    manifest = read_manifest(final)
    assert manifest["input_hash"] == "h1" and manifest["role"] == "target"
    assert (final / "weights.bin").read_bytes() == b"abc"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.tmp")] == []


def test_unchanged_inputs_are_up_to_date_unless_forced(tmp_path):
    final = tmp_path / "out"
    with stage_output(final, stage="convert") as out:
        out.commit({"input_hash": "h1"})
    with stage_output(final, stage="convert") as out:
        assert out.up_to_date("h1")
        assert not out.up_to_date("h2")
    with stage_output(final, stage="convert", force=True) as out:
        assert not out.up_to_date("h1")


def test_failure_leaves_previous_output_and_no_temp(tmp_path):
    final = tmp_path / "out"
    with stage_output(final, stage="convert") as out:
        (out.tmp / "a").write_text("old")
        out.commit({"input_hash": "h1"})
    with pytest.raises(RuntimeError):
        with stage_output(final, stage="convert") as out:
            (out.tmp / "a").write_text("half-written")
            raise RuntimeError("interrupted")
    assert (final / "a").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.lock", "out"]


def test_keyboard_interrupt_cleans_temp(tmp_path):
    final = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        with stage_output(final, stage="convert") as out:
            (out.tmp / "rank0.safetensors").write_bytes(b"x" * 10)
            raise KeyboardInterrupt
    assert not final.exists()
    assert not any(p.name.startswith(".out.tmp") for p in tmp_path.iterdir())


def test_second_writer_is_refused_while_locked(tmp_path):
    final = tmp_path / "out"
    with stage_output(final, stage="convert"):
        with pytest.raises(ArtifactError, match="locked by another specbuild process"):
            with stage_output(final, stage="convert"):
                pass


def test_temp_folder_of_a_killed_run_is_removed_at_the_next_run(tmp_path):
    final = tmp_path / "out"
    script = (
        "import os, signal, sys\n"
        "from specbuild.artifacts import stage_output\n"
        "with stage_output(sys.argv[1], stage='convert') as out:\n"
        "    (out.tmp / 'rank0.safetensors').write_bytes(b'half')\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    killed = subprocess.run([sys.executable, "-c", script, str(final)], capture_output=True)
    assert killed.returncode == -signal.SIGKILL
    [left] = [p for p in tmp_path.iterdir() if p.name.startswith(".out.tmp-")]
    assert (left / "rank0.safetensors").exists() and not final.exists()
    with stage_output(final, stage="convert") as out:
        out.commit({"input_hash": "h"})
    assert not left.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.lock", "out"]


def test_unmarked_folder_under_a_temp_name_is_left_alone(tmp_path):
    theirs = tmp_path / ".out.tmp-1"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    with stage_output(tmp_path / "out", stage="convert") as out:
        out.commit({"input_hash": "h"})
    assert (theirs / "notes.txt").read_text() == "mine"


def user_folder(path):
    """A folder someone filled by hand: a checkpoint copy and a notes file."""
    (path / "checkpoint").mkdir(parents=True)
    (path / "checkpoint" / "model.safetensors").write_bytes(b"weights")
    (path / "notes.txt").write_text("my notes")
    return path


def contents(path):
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("force", [False, True])
def test_a_folder_specbuild_did_not_write_is_refused_and_kept(tmp_path, force):
    final = user_folder(tmp_path / "out")
    before = contents(final)
    with pytest.raises(ArtifactError) as err:
        with stage_output(final, stage="repo", force=force):
            pass
    assert str(err.value) == (
        f"{final} exists and was not written by specbuild (it has no specbuild manifest.json): repo will not "
        "replace it or delete anything in it, not even with --force. Choose another folder (a new or empty one), "
        "or move its contents away."
    )
    assert contents(final) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no lock file or temp folder beside it


def test_a_manifest_json_that_is_not_specbuilds_does_not_make_a_folder_ours(tmp_path):
    final = tmp_path / "out"
    final.mkdir()
    (final / "manifest.json").write_text(json.dumps({"stage": "repo", "files": []}))  # no manifest_version
    with pytest.raises(ArtifactError, match="was not written by specbuild"):
        with stage_output(final, stage="repo"):
            pass
    assert json.loads((final / "manifest.json").read_text()) == {"stage": "repo", "files": []}


def test_an_empty_folder_is_used(tmp_path):
    final = tmp_path / "out"
    final.mkdir()
    with stage_output(final, stage="repo") as out:
        (out.tmp / "a").write_text("new")
        out.commit({"input_hash": "h"})
    assert (final / "a").read_text() == "new" and read_manifest(final)["stage"] == "repo"


def test_files_added_while_the_stage_runs_stop_the_commit(tmp_path):
    final = tmp_path / "out"
    final.mkdir()
    with pytest.raises(ArtifactError, match="was not written by specbuild"):
        with stage_output(final, stage="repo") as out:
            (final / "notes.txt").write_text("written meanwhile")
            out.commit({"input_hash": "h"})
    assert contents(final) == {"notes.txt": b"written meanwhile"}
    assert not any(p.name.startswith(".out.tmp") for p in tmp_path.iterdir())


@pytest.mark.parametrize("force", [False, True])
def test_specbuilds_own_output_of_another_stage_is_refused(tmp_path, force):
    engine = tmp_path / "engine"
    with stage_output(engine, stage="build") as out:
        (out.tmp / "rank0.engine").write_bytes(b"engine")
        out.commit({"input_hash": "h"})
    with pytest.raises(ArtifactError) as err:
        with stage_output(engine, stage="repo", force=force):
            pass
    assert str(err.value) == (
        f"{engine} holds specbuild's engine (build), not a Triton model repository (repo): it will not be "
        "replaced, not even with --force. Choose another folder, or delete that one yourself if you no longer "
        "need it."
    )
    assert (engine / "rank0.engine").read_bytes() == b"engine"


def test_own_output_of_the_same_stage_is_replaced(tmp_path):
    final = tmp_path / "out"
    for text in ("old", "new"):
        with stage_output(final, stage="repo", force=True) as out:
            (out.tmp / text).write_text(text)
            out.commit({"input_hash": "h"})
    assert contents(final).keys() == {"new", "manifest.json"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.lock", "out"]  # no .old-* left


def test_files_someone_added_to_specbuilds_own_output_stop_a_replacement(tmp_path):
    final = tmp_path / "out"
    with stage_output(final, stage="repo") as out:
        (out.tmp / "model").mkdir()
        (out.tmp / "model" / "config.pbtxt").write_text("x")
        out.commit({"input_hash": "h1"})
    assert read_manifest(final)["contents"] == ["model/config.pbtxt"]
    (final / "model" / "__pycache__").mkdir()  # what tritonserver's Python leaves: specbuild's own
    (final / "model" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"pyc")
    with stage_output(final, stage="repo") as out:
        assert not out.up_to_date("h2")
        out.commit({"input_hash": "h2"})
    (final / "notes.txt").write_text("mine")
    with stage_output(final, stage="repo") as out:
        assert out.up_to_date("h2")  # nothing to redo: the folder and the notes stay as they are
    for force, digest in ((True, "h2"), (False, "h3")):
        with pytest.raises(ArtifactError) as err:
            with stage_output(final, stage="repo", force=force) as out:
                out.up_to_date(digest)
        assert str(err.value) == (
            f"{final} is specbuild's Triton model repository (repo), but holds files specbuild did not write "
            "(notes.txt): repo will not replace it, not even with --force. Move those files out of it, or choose "
            "another folder."
        )
    assert (final / "notes.txt").read_text() == "mine" and read_manifest(final)["input_hash"] == "h2"


def test_a_file_where_the_folder_goes_is_refused(tmp_path):
    final = tmp_path / "out"
    final.write_text("a file")
    with pytest.raises(ArtifactError, match=r"is a file, not a folder: convert writes a folder there"):
        with stage_output(final, stage="convert", force=True):
            pass
    assert final.read_text() == "a file"


def test_symbolic_links(tmp_path):
    ours, theirs = tmp_path / "ours", user_folder(tmp_path / "theirs")
    with stage_output(ours, stage="repo") as out:
        out.commit({"input_hash": "h1"})
    link = tmp_path / "link"
    link.symlink_to(ours)
    with stage_output(link, stage="repo") as out:  # through a link to its own output: replaced, the link kept
        (out.tmp / "b").write_text("new")
        out.commit({"input_hash": "h2"})
    assert link.is_symlink() and (ours / "b").read_text() == "new" and read_manifest(ours)["input_hash"] == "h2"
    other = tmp_path / "other"
    other.symlink_to(theirs)
    before = contents(theirs)
    with pytest.raises(ArtifactError, match=f"{theirs} exists and was not written by specbuild"):
        with stage_output(other, stage="repo", force=True):
            pass
    assert contents(theirs) == before and other.is_symlink()
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere" / "repo")
    with pytest.raises(ArtifactError, match="is a symbolic link to .*nowhere/repo, which does not exist"):
        with stage_output(dangling, stage="repo"):
            pass
    assert not (tmp_path / "nowhere").exists()


def test_the_committed_repository_and_engines_folder(tmp_path):
    shutil.copytree(ROOT / "triton_repo", tmp_path / "triton_repo")
    shutil.copytree(ROOT / "engines", tmp_path / "engines")
    with stage_output(tmp_path / "triton_repo", stage="repo", force=True) as out:  # specbuild's own: regenerable
        out.commit({"input_hash": "h"})
    with pytest.raises(ArtifactError, match="was not written by specbuild"):  # README.md, .gitignore
        with stage_output(tmp_path / "engines", stage="repo", force=True):
            pass
    with stage_output(tmp_path / "engines" / "pair" / "target" / "engine", stage="build") as out:
        out.commit({"input_hash": "h"})  # the stages write below it and leave its files alone
    assert contents(tmp_path / "engines").keys() >= {"README.md", ".gitignore"}
    assert (tmp_path / "engines" / "README.md").read_bytes() == (ROOT / "engines" / "README.md").read_bytes()


def test_missing_or_corrupt_manifest_is_a_clear_error(tmp_path):
    with pytest.raises(ArtifactError, match="has no manifest.json"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ArtifactError, match="unreadable"):
        read_manifest(tmp_path)


def test_hashes_are_content_based_and_order_stable(tmp_path):
    (tmp_path / "b").write_text("2")
    (tmp_path / "a").write_text("1")
    (tmp_path / "manifest.json").write_text("{}")
    hashes = hash_tree(tmp_path)
    assert list(hashes) == ["a", "b"]  # manifest ignored, sorted
    before = combined_hash({"x": 1, "y": [1, 2]}, hashes)
    assert before == combined_hash({"y": [1, 2], "x": 1}, hash_tree(tmp_path))
    (tmp_path / "a").write_text("changed")
    assert combined_hash({"x": 1, "y": [1, 2]}, hash_tree(tmp_path)) != before
    os.utime(tmp_path / "b", (0, 0))  # mtime alone changes nothing
    assert json.dumps(hash_tree(tmp_path)) == json.dumps(hash_tree(tmp_path))
