"""The committed `triton_repo/` is exactly what `specbuild repo` writes for the example pair today.

It is regenerated from the spec recorded in its own manifest (the reference flavour embeds no
machine-specific path, so the checkpoints are not needed) beside an `engines/` folder, as in the
checkout, and every file is compared.
"""

from __future__ import annotations

import json
from pathlib import Path

from specbuild.config import spec_from_dict
from specbuild.triton.repository import write_repository

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "triton_repo"


def files_of(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): p.read_text()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != "manifest.json" and "__pycache__" not in p.parts
    }


def test_committed_repository_regenerates_identically(tmp_path):
    manifest = json.loads((COMMITTED / "manifest.json").read_text())
    raw = json.loads(json.dumps(manifest["spec"]))
    for role in ("target", "draft"):
        raw[role]["checkpoint"] = str(tmp_path / "checkpoints" / role)  # not read by the reference flavour
    raw["output_dir"] = str(tmp_path / "engines")
    spec = spec_from_dict(raw, base_dir=tmp_path)
    result = write_repository(spec, manifest["backend"], tmp_path / "triton_repo")
    regenerated, committed = files_of(tmp_path / "triton_repo"), files_of(COMMITTED)
    assert sorted(regenerated) == sorted(committed)
    for rel, text in regenerated.items():
        assert text == committed[rel], f"{rel} differs from the committed triton_repo: regenerate it (docs/triton.md)"
    assert json.loads(json.dumps(result.to_dict()["settings"])) == manifest["settings"]


def test_committed_repository_is_portable():
    manifest = json.loads((COMMITTED / "manifest.json").read_text())
    assert manifest["backend"] == "reference" and manifest["pair"] == "example"
    assert manifest["settings"]["target"]["engine_dir"] == "../engines/example/target/engine"
    for rel, text in {**files_of(COMMITTED), "manifest.json": (COMMITTED / "manifest.json").read_text()}.items():
        assert "${" not in text, rel
        assert "/root/" not in text and "/home/" not in text and "/tmp/" not in text, rel
