"""Stage outputs: atomic writes, manifests, skip-when-unchanged, locks."""

import json
import os

import pytest

from specbuild.artifacts import combined_hash, hash_tree, read_manifest, stage_output
from specbuild.errors import ArtifactError


def test_commit_renames_into_place_with_manifest(tmp_path):
    final = tmp_path / "out"
    with stage_output(final) as out:
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
    with stage_output(final) as out:
        out.commit({"input_hash": "h1"})
    with stage_output(final) as out:
        assert out.up_to_date("h1")
        assert not out.up_to_date("h2")
    with stage_output(final, force=True) as out:
        assert not out.up_to_date("h1")


def test_failure_leaves_previous_output_and_no_temp(tmp_path):
    final = tmp_path / "out"
    with stage_output(final) as out:
        (out.tmp / "a").write_text("old")
        out.commit({"input_hash": "h1"})
    with pytest.raises(RuntimeError):
        with stage_output(final) as out:
            (out.tmp / "a").write_text("half-written")
            raise RuntimeError("interrupted")
    assert (final / "a").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.lock", "out"]


def test_keyboard_interrupt_cleans_temp(tmp_path):
    final = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        with stage_output(final) as out:
            (out.tmp / "rank0.safetensors").write_bytes(b"x" * 10)
            raise KeyboardInterrupt
    assert not final.exists()
    assert not any(p.name.startswith(".out.tmp") for p in tmp_path.iterdir())


def test_second_writer_is_refused_while_locked(tmp_path):
    final = tmp_path / "out"
    with stage_output(final):
        with pytest.raises(ArtifactError, match="locked by another specbuild process"):
            with stage_output(final):
                pass


def test_stale_temp_from_a_killed_run_is_removed(tmp_path):
    stale = tmp_path / ".out.tmp-99999"
    stale.mkdir()
    (stale / "junk").write_text("x")
    with stage_output(tmp_path / "out") as out:
        out.commit({"input_hash": "h"})
    assert not stale.exists()


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
