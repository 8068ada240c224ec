"""Build (or find in the cache) the built-in example pair.

    pair = ensure_example("full")      # ExamplePair(root, target, draft, info)

The pair lives in `<cache>/example-<variant>-<recipe key>/` with `target/`, `draft/` (Hugging Face
Llama checkpoints, safetensors, float32, the same tokenizer files in both), `example.json` (recipe,
measurements, timings) and `manifest.json`. `<cache>` is $SPECBUILD_CACHE_DIR, else the user cache
folder (platformdirs). When the package holds a committed copy built from the current recipe
(`example/packaged.py`), the pair is unpacked from it in seconds; otherwise (or with `train=True`)
it is trained here. Either way it is written into a temporary folder renamed into place under a
lock, so an interruption leaves nothing half-written and two processes never build the same pair.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specbuild import __version__
from specbuild.artifacts import hash_file, hash_tree, read_manifest, stage_output, tool_versions
from specbuild.errors import ArtifactError, SpecbuildError

EXAMPLE_JSON = "example.json"
CACHE_ENV = "SPECBUILD_CACHE_DIR"
LOCK_WAIT_S = 1200.0  # a waiting process gives up after this long (a full build takes minutes)
STAGE = "example"


@dataclass(frozen=True)
class ExamplePair:
    root: Path  # the folder holding target/, draft/, example.json
    target: Path  # Hugging Face checkpoint folder of the target
    draft: Path  # Hugging Face checkpoint folder of the draft
    info: dict[str, Any]  # the contents of example.json


def cache_root() -> Path:
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser().resolve()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("specbuild"))


def _recipe(variant: str):
    from specbuild.example.recipe import VARIANTS

    if variant not in VARIANTS:
        raise SpecbuildError(f"unknown example variant {variant!r}: choose one of {', '.join(VARIANTS)}.")
    return VARIANTS[variant]


def recipe_key(variant: str, train: bool = False) -> str:
    """The key of the pair `ensure_example` uses: the committed copy's when it matches the current
    recipe (its own corpus), else the recipe's on this machine's corpus (`train`: always the latter)."""
    from specbuild import corpus
    from specbuild.example import packaged

    committed = None if train else packaged.find(_recipe(variant).variant)
    return committed.key if committed else _recipe(variant).key(corpus.describe()["fingerprint"])


def example_dir(variant: str = "full", train: bool = False) -> Path:
    """Where the cached pair for `variant` lives (whether or not it has been built yet)."""
    return cache_root() / f"example-{variant}-{recipe_key(variant, train)}"


def _pair_at(root: Path) -> ExamplePair:
    info = json.loads((root / EXAMPLE_JSON).read_text())
    return ExamplePair(root=root, target=root / "target", draft=root / "draft", info=info)


def _complete(root: Path, key: str) -> bool:
    """The pair at root was made from this recipe and is as it was written: every file's sha256 as its manifest
    records it (a file edited, truncated or removed since, or a manifest that records none, means a rebuild)."""
    manifest = root / "manifest.json"
    if not manifest.is_file():
        return False
    try:
        data = json.loads(manifest.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    recorded = data.get("sha256")
    if data.get("input_hash") != key or not isinstance(recorded, dict) or not recorded:
        return False
    return _file_hashes(root) == recorded


def _file_hashes(root: Path) -> dict[str, str]:
    """sha256 of the pair's files (target/, draft/, example.json), by path relative to root."""
    found = {}
    for name in ("target", "draft"):
        if (root / name).is_dir():
            found.update({f"{name}/{rel}": digest for rel, digest in hash_tree(root / name).items()})
    if (root / EXAMPLE_JSON).is_file():
        found[EXAMPLE_JSON] = hash_file(root / EXAMPLE_JSON)
    return found


def cached_example(variant: str = "full", train: bool = False) -> ExamplePair | None:
    """The cached pair if it is already built for the current recipe, else None (never builds)."""
    root = example_dir(variant, train)
    return _pair_at(root) if _complete(root, recipe_key(variant, train)) else None


@contextmanager
def _locked_output(final: Path, force: bool) -> Iterator[Any]:
    """stage_output, but wait (saying so on stderr) while another process holds the lock."""
    with ExitStack() as stack:
        try:
            out = stack.enter_context(stage_output(final, stage=STAGE, force=force))
        except ArtifactError as err:
            if "locked by another" not in str(err):
                raise
            print(f"specbuild: waiting for another process to finish {final} ...", file=sys.stderr)
            out = stack.enter_context(stage_output(final, stage=STAGE, force=force, lock_timeout=LOCK_WAIT_S))
        yield out


def ensure_example(
    variant: str = "full",
    root: str | Path | None = None,
    force: bool = False,
    progress: bool | None = None,
    train: bool = False,
) -> ExamplePair:
    """Return the example pair: from the cache, else unpacked from the committed copy, else trained.

    root: also copy the pair to this folder (e.g. `specbuild example --out DIR`); the cache stays.
    force: redo the cached pair even if it is up to date (and rewrite `root`).
    progress: False = silent; otherwise a progress bar on a terminal, or progress lines in a log.
    train: train the pair on this machine even when the package holds a committed copy.
    """
    from specbuild.example import packaged

    committed = None if train else packaged.find(_recipe(variant).variant)
    key = recipe_key(variant, train)
    cached = example_dir(variant, train)
    if force or not _complete(cached, key):
        with _locked_output(cached, force) as out:
            if not out.up_to_date(key) or not _complete(cached, key):
                if committed is not None:
                    if progress is not False:
                        print(
                            f"example pair ({variant}): unpacking the committed copy into {cached}",
                            file=sys.stderr,
                            flush=True,
                        )
                    info, source = packaged.unpack(committed, out.tmp), "package"
                else:
                    info, source = _build(variant, out.tmp, progress), "trained"
                out.commit(
                    {
                        "stage": STAGE,
                        "input_hash": key,
                        "variant": variant,
                        "source": source,
                        "versions": info["versions"],
                        "sha256": _file_hashes(out.tmp),  # what _complete checks on every later use
                    }
                )
    pair = _pair_at(cached)
    return pair if root is None else _copy(pair, Path(root), key, force)


def _copy(pair: ExamplePair, dest: Path, key: str, force: bool) -> ExamplePair:
    dest = dest.expanduser().resolve()
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        try:
            manifest = read_manifest(dest)
        except ArtifactError:
            manifest = {}
        if manifest.get("stage") != STAGE:
            raise ArtifactError(
                f"{dest} exists and is not a specbuild example folder, so it will not be replaced. "
                "Pass --out with a new or empty folder."
            )
    with _locked_output(dest, force) as out:
        if not out.up_to_date(key):
            for name in ("target", "draft"):
                shutil.copytree(pair.root / name, out.tmp / name)
            shutil.copy2(pair.root / EXAMPLE_JSON, out.tmp / EXAMPLE_JSON)
            manifest = {
                k: v for k, v in read_manifest(pair.root).items() if k not in ("created_unix", "manifest_version")
            }
            out.commit({**manifest, "copied_from": str(pair.root)})
    return _pair_at(dest)


def _build(variant: str, out_dir: Path, progress: bool | None) -> dict[str, Any]:
    """Train tokenizer, target and draft into `out_dir`; write example.json; return its contents."""
    import torch

    from specbuild import corpus
    from specbuild.example import train
    from specbuild.example.tokenizer import TOKENIZER_FILES, save_hf_tokenizer, train_tokenizer
    from specbuild.progress import Progress

    recipe = _recipe(variant)
    total = recipe.target_steps + recipe.distill_steps
    # Wall time depends on what else runs on the machine; CPU time (all threads) much less so.
    timings: dict[str, float] = {}
    start, cpu_start = time.perf_counter(), time.process_time()
    clock = start

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[name] = round(now - clock, 2)
        clock = now

    # Deterministic kernels only (an error, not silent drift, if one is missing); but no NaN-filling
    # of fresh tensors, which that mode also turns on and which costs time without changing results.
    previous = (
        torch.are_deterministic_algorithms_enabled(),
        torch.utils.deterministic.fill_uninitialized_memory,
        torch.get_num_threads(),
    )
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(recipe.torch_threads)
    torch.utils.deterministic.fill_uninitialized_memory = False
    label = f"example pair ({variant})"
    # A bar on a terminal; in a log (CI, nohup, | tee) a line every few seconds with an ETA.
    bar = Progress(total=total, desc=f"{label}: tokenizer", unit="step", mode=None if progress is not False else "off")
    try:
        tok = train_tokenizer(train.training_texts(recipe), recipe.vocab_size)
        tok_dir = out_dir / "tokenizer"
        save_hf_tokenizer(tok, tok_dir, model_max_length=recipe.target.max_position_embeddings)
        lap("tokenizer_s")
        bar.set_description(f"{label}: data")
        stream = train.token_stream(tok, recipe)
        lap("data_s")
        bar.set_description(f"{label}: training (loss target/draft)")
        target, draft, train_stats = train.train_pair(recipe, stream, bar.update)
        lap("train_s")
        bar.set_description(f"{label}: measuring")
        for model in (target, draft):
            train.round_to_storage(model, recipe.storage_dtype)
        quality = train.measure_agreement(target, draft, tok, recipe)
        cost = train.measure_cost_ratio(target, draft)
        lap("measure_s")
        for name, model in (("target", target), ("draft", draft)):
            _save_quietly(model, out_dir / name)
            for file in TOKENIZER_FILES:
                shutil.copy2(tok_dir / file, out_dir / name / file)
        shutil.rmtree(tok_dir)
        lap("save_s")
    finally:
        bar.close()
        torch.use_deterministic_algorithms(previous[0])
        torch.utils.deterministic.fill_uninitialized_memory = previous[1]
        torch.set_num_threads(previous[2])
    params = {"target": train.param_count(target), "draft": train.param_count(draft)}
    info = {
        "variant": variant,
        "recipe": asdict(recipe),
        "recipe_key": recipe.key(corpus.describe()["fingerprint"]),
        "seed": recipe.seed,
        "dtype": "float32",
        "storage_dtype": recipe.storage_dtype,
        "architecture": "LlamaForCausalLM",
        "vocab_size": recipe.vocab_size,
        "params": params,
        "param_ratio": round(params["target"] / params["draft"], 2),
        **quality,
        **cost,
        "train": train_stats,
        "timings": {
            **timings,
            "total_s": round(time.perf_counter() - start, 2),
            "cpu_s": round(time.process_time() - cpu_start, 2),
        },
        "torch_threads": recipe.torch_threads,
        "corpus": corpus.describe(),
        "specbuild_version": __version__,
        "versions": tool_versions("torch", "transformers", "tokenizers"),
    }
    (out_dir / EXAMPLE_JSON).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return info


def _save_quietly(model, folder: Path) -> None:
    """save_pretrained (safetensors) without transformers' own progress bar on stderr."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(folder)
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
