"""Example pair caching: recipe-keyed folders, cache hits, --force, copies, interrupted builds, determinism."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from specbuild.artifacts import hash_tree
from specbuild.errors import ArtifactError
from specbuild.example import ensure_example, example_dir, recipe_key
from specbuild.example.recipe import VARIANTS


def _weights(folder: Path) -> dict[str, str]:
    """sha256 of every file of one checkpoint folder (weights, config, tokenizer)."""
    return hash_tree(folder)


def test_recipe_key_covers_every_recipe_field():
    recipe = VARIANTS["tiny"]
    assert recipe.key("fp") == recipe.key("fp")
    assert recipe.key("fp") != recipe.key("other corpus")
    assert recipe.key("fp") != dataclasses.replace(recipe, seed=1).key("fp")
    assert recipe.key("fp") != dataclasses.replace(recipe, target_steps=recipe.target_steps + 1).key("fp")
    assert VARIANTS["full"].key("fp") != recipe.key("fp")


def test_cache_folder_follows_env_and_recipe(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECBUILD_CACHE_DIR", str(tmp_path))
    assert example_dir("tiny") == tmp_path / f"example-tiny-{recipe_key('tiny')}"


def test_a_cache_hit_does_not_rebuild(example_tiny, monkeypatch):
    """A hit trains nothing, unpacks nothing and takes no lock (was: it returns within 5 s, a machine's figure)."""
    from specbuild.example import packaged
    from specbuild.example import pair as pair_module

    def forbidden(*args, **kwargs):
        raise AssertionError("a cache hit rebuilt the pair")

    for module, name in ((pair_module, "_build"), (pair_module, "_locked_output"), (packaged, "unpack")):
        monkeypatch.setattr(module, name, forbidden)
    manifest_before = (example_tiny.root / "manifest.json").read_text()
    again = ensure_example("tiny", progress=False)
    assert again.root == example_tiny.root
    assert (again.root / "manifest.json").read_text() == manifest_before


def test_copy_to_out_folder(example_tiny, tmp_path):
    out = tmp_path / "pair"
    pair = ensure_example("tiny", root=out, progress=False)
    assert pair.root == out.resolve() and pair.target == out.resolve() / "target"
    assert pair.info == example_tiny.info
    assert _weights(out / "draft") == _weights(example_tiny.draft)
    created = json.loads((out / "manifest.json").read_text())["created_unix"]
    ensure_example("tiny", root=out, progress=False)  # up to date: not copied again
    assert json.loads((out / "manifest.json").read_text())["created_unix"] == created


def test_out_folder_with_other_files_is_refused(example_tiny, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ArtifactError, match="exists and is not a specbuild example folder"):
        ensure_example("tiny", root=tmp_path, progress=False)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_interrupted_build_leaves_nothing(monkeypatch, tmp_path):
    from specbuild.example import train

    monkeypatch.setenv("SPECBUILD_CACHE_DIR", str(tmp_path))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(train, "train_pair", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ensure_example("tiny", progress=False)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


@pytest.mark.slow
def test_same_recipe_builds_identical_weights_and_force_rebuilds(example_tiny, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECBUILD_CACHE_DIR", str(tmp_path))
    first = ensure_example("tiny", progress=False)
    assert first.root.parent == tmp_path
    first_manifest = json.loads((first.root / "manifest.json").read_text())
    weights = _weights(first.target) | {f"draft/{k}": v for k, v in _weights(first.draft).items()}
    # Rebuilt through the CLI, whose stderr is not a terminal: a log gets progress lines with an ETA.
    from click.testing import CliRunner

    from specbuild.cli import main

    result = CliRunner().invoke(main, ["example", "--variant", "tiny", "--force"])
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert lines[:3] == [
        "example pair (tiny): tokenizer ...",
        "example pair (tiny): data ...",
        "example pair (tiny): training (loss target/draft) ...",
    ]
    total = VARIANTS["tiny"].target_steps + VARIANTS["tiny"].distill_steps
    assert any(
        line.startswith(f"example pair (tiny): training (loss target/draft): {total}/{total} step (100%), ")
        for line in lines
    ), lines
    assert "example pair (tiny): measuring ..." in lines
    forced = ensure_example("tiny", progress=False)
    assert json.loads((forced.root / "manifest.json").read_text())["created_unix"] > first_manifest["created_unix"]
    assert weights == _weights(forced.target) | {f"draft/{k}": v for k, v in _weights(forced.draft).items()}
    # The session's pair (possibly built by an earlier session from the same recipe) matches too;
    # if this fails after a change to the training code, bump recipe.RECIPE_VERSION.
    assert _weights(example_tiny.target) == _weights(first.target)
    assert forced.info["agreement"] == first.info["agreement"]


def test_a_second_builder_waits_for_the_lock(tmp_path, capsys, monkeypatch):
    """The holder keeps the lock until the second builder has started to wait for it, then lets go: the builder
    must get the folder only after that. Events order it, not a sleep and a measured wait (a busy machine can
    delay a thread past a sleep, so the wait measured could be anything)."""
    import threading

    from filelock import FileLock

    from specbuild.example import pair as pair_module

    final = tmp_path / "example-tiny-x"
    held, waiting, released = threading.Event(), threading.Event(), threading.Event()
    real_stage_output = pair_module.stage_output

    def stage_output(*args, **kwargs):
        if "lock_timeout" in kwargs:  # the second try, which waits for the lock
            waiting.set()
        return real_stage_output(*args, **kwargs)

    monkeypatch.setattr(pair_module, "stage_output", stage_output)

    def hold() -> None:
        with FileLock(str(tmp_path / f".{final.name}.lock")):
            held.set()
            waiting.wait(60)  # a deadline: only a builder that does not wait leaves the holder here that long
            released.set()

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(60)
    try:
        with pair_module._locked_output(final, force=False) as out:
            assert released.is_set()  # the folder came after the holder let go
            assert out.tmp.is_dir()
    finally:
        waiting.set()  # lets the holder go if the builder never waited
        holder.join(60)
    assert "waiting for another process" in capsys.readouterr().err


def test_a_cached_pair_whose_files_changed_since_is_rebuilt(example_tiny, monkeypatch, tmp_path):
    """The cache is trusted by the sha256 of every file its manifest records, not by the files being there: a
    truncated weight file (an interrupted copy, a full disk) is found and the pair is made again."""
    import shutil

    from specbuild.example import cached_example

    monkeypatch.setenv("SPECBUILD_CACHE_DIR", str(tmp_path))
    shutil.copytree(example_tiny.root, example_dir("tiny"))  # the session's pair, as a cache of its own
    pair = ensure_example("tiny", progress=False)
    weights = pair.draft / "model.safetensors"
    original = weights.read_bytes()
    assert cached_example("tiny") is not None
    weights.write_bytes(original[:-8])
    assert cached_example("tiny") is None
    again = ensure_example("tiny", progress=False)
    assert (again.draft / "model.safetensors").read_bytes() == original and cached_example("tiny") is not None


# The training code as of RECIPE_VERSION: its sha256 for each version. The cache key holds RECIPE_VERSION, not the
# code, so that a change that leaves the weights alone does not throw away every cached and committed pair; this
# makes the choice explicit: a change to these files fails here until RECIPE_VERSION is bumped (the weights change)
# or the new hash is recorded for the same version (they do not: say why in the commit).
TRAINING_CODE = ("example/train.py", "example/recipe.py", "example/tokenizer.py")  # the corpus: its fingerprint
TRAINING_CODE_SHA256 = {5: "fbcdfbcdf7bfbc997f8f2e047531be00beb69c71545c8e56d4a889784bf30a82"}


def test_the_training_code_changes_only_with_the_recipe_version():
    import hashlib

    import specbuild
    from specbuild.example.recipe import RECIPE_VERSION

    root = Path(specbuild.__file__).parent
    digest = hashlib.sha256()
    for rel in TRAINING_CODE:
        digest.update(rel.encode() + b"\0" + (root / rel).read_bytes())
    assert TRAINING_CODE_SHA256.get(RECIPE_VERSION) == digest.hexdigest(), (
        "the example pair's training code changed: bump RECIPE_VERSION in specbuild/example/recipe.py if the weights "
        f"change, else record {digest.hexdigest()} for version {RECIPE_VERSION} in TRAINING_CODE_SHA256"
    )
