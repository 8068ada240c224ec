"""The committed example pair: its files match their recorded hashes and the current recipe; it unpacks
(no training) to exactly the weights that were measured; pack/unpack round-trips on the tiny pair."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from specbuild.errors import ArtifactError
from specbuild.example import ensure_example, packaged, recipe_key
from specbuild.example.recipe import VARIANTS

MAX_COMMITTED_BYTES = 20 * 1000 * 1000  # the budget for committed weights


def test_the_committed_full_pair_matches_its_hashes_and_the_current_recipe():
    pair = packaged.find("full")
    assert pair is not None, (
        "no committed full pair built from the current recipe: rebuild it with "
        "`python scripts/example_pair.py --variant full --write`"
    )
    assert packaged.damaged_files(pair) == []
    listed = {p.relative_to(pair.folder).as_posix() for p in pair.folder.rglob("*") if p.is_file()}
    assert listed - {packaged.FILES_JSON} == set(pair.files["files"])  # nothing unlisted, nothing missing
    fingerprint = pair.info["corpus"]["fingerprint"]
    assert pair.files["recipe_key"] == pair.info["recipe_key"] == VARIANTS["full"].key(fingerprint)
    assert pair.info["recipe"] == json.loads(json.dumps(dataclasses.asdict(VARIANTS["full"])))
    assert pair.files["storage_dtype"] == VARIANTS["full"].storage_dtype == "float16"
    assert sum(f["bytes"] for f in pair.files["files"].values()) <= MAX_COMMITTED_BYTES


def test_a_changed_recipe_does_not_use_the_committed_pair(monkeypatch):
    changed = dataclasses.replace(VARIANTS["full"], target_steps=VARIANTS["full"].target_steps + 1)
    monkeypatch.setitem(VARIANTS, "full", changed)
    assert packaged.find("full") is None


def test_the_full_pair_is_unpacked_not_trained(monkeypatch, tmp_path):
    from specbuild.example import train

    def no_training(*args, **kwargs):
        raise AssertionError("the full pair was trained although a committed copy exists")

    monkeypatch.setattr(train, "train_pair", no_training)
    monkeypatch.setenv("SPECBUILD_CACHE_DIR", str(tmp_path))
    pair = ensure_example("full", progress=False)  # no_training above fails it if it trains; no timing asserted
    committed = packaged.find("full")
    assert pair.root == tmp_path / f"example-full-{committed.key}" and recipe_key("full") == committed.key
    assert json.loads((pair.root / "manifest.json").read_text())["source"] == "package"
    assert pair.info == committed.info
    for role in ("target", "draft"):
        packed = load_file(str(committed.folder / role / "model.float16.safetensors"))
        unpacked = load_file(str(pair.root / role / "model.safetensors"))
        assert set(unpacked) == set(packed)
        for name, tensor in unpacked.items():
            assert tensor.dtype == torch.float32 and torch.equal(tensor, packed[name].float()), name


def _packed_tiny(example_tiny, tmp_path):
    pairs = tmp_path / "pairs"
    files = packaged.pack(example_tiny.root, pairs / "tiny")
    return pairs, files


def test_pack_then_unpack_gives_back_the_built_tiny_pair(example_tiny, tmp_path):
    pairs, files = _packed_tiny(example_tiny, tmp_path)
    assert files["recipe_key"] == example_tiny.info["recipe_key"] and files["storage_dtype"] == "float16"
    found = packaged.find("tiny", pairs_dir=pairs)
    assert found is not None and packaged.damaged_files(found) == []
    out = tmp_path / "unpacked"
    assert packaged.unpack(found, out) == example_tiny.info
    for role in ("target", "draft"):
        built, back = example_tiny.root / role, out / role
        assert sorted(p.name for p in back.iterdir()) == sorted(p.name for p in built.iterdir())
        for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
            assert (back / name).read_bytes() == (built / name).read_bytes()
        a, b = load_file(str(built / "model.safetensors")), load_file(str(back / "model.safetensors"))
        assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_a_damaged_committed_file_is_refused_with_the_fix(example_tiny, tmp_path):
    pairs, _ = _packed_tiny(example_tiny, tmp_path)
    weights = pairs / "tiny" / "draft" / "model.float16.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    found = packaged.find("tiny", pairs_dir=pairs)
    assert packaged.damaged_files(found) == ["draft/model.float16.safetensors"]
    with pytest.raises(
        ArtifactError, match="is damaged: draft/model.float16.safetensors differ from files.json. Restore it"
    ):
        packaged.unpack(found, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_weights_not_rounded_to_the_storage_dtype_are_refused(example_tiny, tmp_path):
    from safetensors.torch import save_file

    copy = tmp_path / "built"
    shutil.copytree(example_tiny.root, copy)
    path = copy / "draft" / "model.safetensors"
    tensors = load_file(str(path))
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 1e-7  # no longer a float16 value
    save_file(tensors, str(path), metadata={"format": "pt"})
    with pytest.raises(ArtifactError, match="not exact in float16"):
        packaged.pack(copy, tmp_path / "pack")
