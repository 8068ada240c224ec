"""`specbuild example`: build (once) and show the built-in example pair."""

from __future__ import annotations

from pathlib import Path

import click

from specbuild.cli.common import emit_json, force_option, json_option, log

SUMMARY_KEYS = (
    "variant",
    "agreement",
    "agreement_by_kind",
    "cost_ratio",
    "target_step_ms",
    "draft_step_ms",
    "params",
    "param_ratio",
    "heldout_loss",
    "vocab_size",
    "dtype",
    "seed",
    "recipe_key",
)


@click.command(name="example")
@click.option(
    "--out",
    "out",
    default=None,
    type=click.Path(file_okay=False, path_type=Path),
    help="Also copy the pair (target/, draft/, example.json) to this folder.",
)
@click.option(
    "--variant",
    type=click.Choice(["full", "tiny"]),
    default="full",
    show_default=True,
    help="full: the demo pair (committed, unpacked in seconds); tiny: trained in seconds, for tests.",
)
@click.option(
    "--train",
    is_flag=True,
    help="Train the pair on this machine even when the package holds a committed copy (full: about "
    "20-30 minutes on one core).",
)
@force_option
@json_option
@click.option("--dry-run", is_flag=True, help="Print where the pair is (or would be built); build nothing.")
def command(out: Path | None, variant: str, train: bool, force: bool, as_json: bool, dry_run: bool) -> None:
    """Create the built-in example pair, or find it in the cache.

    A Llama target and a Llama draft distilled from it, sharing one byte-level BPE tokenizer,
    trained from the Python standard library's sources and generated JSON records (seeded, no
    downloads). The full pair ships with specbuild (float16 weights, unpacked to float32 in
    seconds); the recipe that trained it is in specbuild.example.recipe, and --train runs it here.
    Cached in the user cache folder ($SPECBUILD_CACHE_DIR overrides it); later runs return at once.
    """
    from specbuild.example import cached_example, ensure_example, example_dir, packaged

    if dry_run:
        pair = cached_example(variant, train=train)
        how = "trained" if train or packaged.find(variant) is None else "unpacked from the committed copy"
        document = {
            "root": str(example_dir(variant, train)),
            "built": pair is not None and not force,
            "how": None if pair is not None and not force else how,
            "out": str(out.resolve()) if out else None,
        }
        log(
            f"example pair ({variant}): "
            + ("cached" if document["built"] else f"would be {how}")
            + f" at {document['root']}"
            + (f", then copied to {out}" if out else "")
        )
        if as_json:
            emit_json(document)
        return
    pair = ensure_example(variant, root=out, force=force, train=train)
    info = pair.info
    document = {
        "root": str(pair.root),
        "target": str(pair.target),
        "draft": str(pair.draft),
        **{k: info.get(k) for k in SUMMARY_KEYS},
    }
    if as_json:
        emit_json(document)
        return
    click.echo(f"example pair ({variant}) at {pair.root}")
    click.echo(f"  target: {pair.target}  ({info['params']['target']:,} parameters)")
    click.echo(f"  draft:  {pair.draft}  ({info['params']['draft']:,} parameters)")
    click.echo(
        f"  greedy agreement on held-out prompts: {info['agreement']:.3f} "
        + " ".join(f"{k}={v:.2f}" for k, v in info["agreement_by_kind"].items())
    )
    click.echo(
        f"  cost ratio c = draft step / target step: {info['cost_ratio']:.3f} "
        f"({info['draft_step_ms']:.2f} ms / {info['target_step_ms']:.2f} ms, CPU, batch 1)"
    )
