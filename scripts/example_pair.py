"""Rebuild the committed example pair from its recipe, and compare it with (or write it over) the committed copy.

    python scripts/example_pair.py                      # train the full pair here, compare with the committed copy
    python scripts/example_pair.py --write              # ... and write it to pipeline/specbuild/example/pairs/full/
    python scripts/example_pair.py --from DIR --write   # pack a pair already built at DIR (no training)

Training takes about 20-30 minutes on one CPU core (recipe in pipeline/specbuild/example/recipe.py)
and runs in a temporary cache, never the user's. The same recipe on the same kind of CPU gives
byte-identical files; another CPU may differ in the last bits, which the comparison reports.
Exit status: 0 when the rebuilt files equal the committed ones (or were written), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "pipeline"))

from specbuild.example import packaged  # noqa: E402
from specbuild.example.pair import CACHE_ENV  # noqa: E402


def build(variant: str, work: Path) -> Path:
    import os

    os.environ[CACHE_ENV] = str(work / "cache")
    from specbuild.example import ensure_example

    return ensure_example(variant, train=True).root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="full", choices=["full", "tiny"])
    parser.add_argument(
        "--from",
        dest="built",
        type=Path,
        default=None,
        help="a built pair folder (target/, draft/, example.json) to pack instead of training",
    )
    parser.add_argument("--write", action="store_true", help="write the pack over pairs/<variant>/")
    parser.add_argument("--pairs-dir", type=Path, default=packaged.PAIRS_DIR, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    committed = args.pairs_dir / args.variant
    with tempfile.TemporaryDirectory(prefix="specbuild-example-") as tmp:
        work = Path(tmp)
        built = args.built.resolve() if args.built else build(args.variant, work)
        fresh = work / "pack"
        files = packaged.pack(built, fresh)
        if args.write:
            if committed.exists():
                if not (committed / packaged.FILES_JSON).is_file():
                    print(f"{committed} exists and is not a packed example pair; not replacing it.", file=sys.stderr)
                    return 1
                shutil.rmtree(committed)
            shutil.copytree(fresh, committed)
            print(
                f"wrote {committed} ({sum(f['bytes'] for f in files['files'].values()) / 1e6:.1f} MB, "
                f"recipe key {files['recipe_key']})"
            )
            return 0
        if not (committed / packaged.FILES_JSON).is_file():
            print(f"no committed pair at {committed}; pass --write to create it.", file=sys.stderr)
            return 1
        old = json.loads((committed / packaged.FILES_JSON).read_text())
        differ = sorted(
            rel
            for rel in set(old["files"]) | set(files["files"])
            if rel != packaged.EXAMPLE_JSON and old["files"].get(rel) != files["files"].get(rel)
        )
        # example.json holds timings and the cost ratio measured on the building machine: compare the rest.
        info_old = json.loads((committed / packaged.EXAMPLE_JSON).read_text())
        info_new = json.loads((fresh / packaged.EXAMPLE_JSON).read_text())
        for key in ("recipe_key", "agreement", "agreement_by_kind", "heldout_loss", "params", "samples"):
            if info_old.get(key) != info_new.get(key):
                differ.append(f"example.json:{key}")
        for rel in differ:
            print(f"differs: {rel}")
        print("rebuilt pair equals the committed one" if not differ else f"{len(differ)} differences")
        return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
