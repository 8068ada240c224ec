"""`specbuild init`: write a commented spec file, optionally for the built-in example pair."""

from __future__ import annotations

from pathlib import Path

import click

from specbuild.cli.common import DEFAULT_SPEC, dry_run_option, emit_json, json_option, log

VARIANT_CHOICE = click.Choice(["full", "tiny"])


@click.command(name="init")
@click.option(
    "--out",
    "out",
    default=DEFAULT_SPEC,
    show_default=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the spec file.",
)
@click.option("--force", is_flag=True, help="Overwrite the file if it exists.")
@click.option(
    "--example",
    is_flag=True,
    help="Write a spec for the built-in example pair (unpacked from the committed copy on first use).",
)
@click.option(
    "--variant",
    type=VARIANT_CHOICE,
    default="full",
    show_default=True,
    help="Which example pair --example uses (tiny: trained in seconds, for tests).",
)
@click.option(
    "--target",
    "target",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="Your target model's Hugging Face folder: the spec is filled from the checkpoints (dtype, limits that fit "
    "their positions, the backend their family needs). Without --draft: a target-only spec drafting by prompt lookup.",
)
@click.option(
    "--draft",
    "draft",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="Your draft model's Hugging Face folder (with --target; leave it out for a target-only spec).",
)
@click.option(
    "--from-check",
    "from_check",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A `specbuild check --measure --json` report: take its recommended max_draft_len / K "
    "(and its checkpoint paths unless --example).",
)
@json_option
@dry_run_option
def command(
    out: Path,
    force: bool,
    example: bool,
    variant: str,
    target: Path | None,
    draft: Path | None,
    from_check: Path | None,
    as_json: bool,
    dry_run: bool,
) -> None:
    """Write a commented spec file listing every key with its default and why.

    With --target and --draft the spec is for your pair: its checkpoints read (nothing is loaded or downloaded)
    for the dtype, limits that fit the models and the backend their family needs; `specbuild check` then says
    whether the pair is usable. With --target alone the spec has no [draft] and drafts by prompt lookup
    (speculative.drafter = "lookup": no draft model, proposals from the text already in the prompt and answer).
    With --example it is the built-in example pair (see `specbuild example`).
    With neither, the checkpoints are placeholders (models/target, models/draft) to replace.

    \b
    Your own pair:
      specbuild init --target ~/models/Qwen2.5-7B-Instruct --draft ~/models/Qwen2.5-0.5B-Instruct
      specbuild check && specbuild up

    \b
    A target alone (prompt lookup, no draft model):
      specbuild init --target ~/models/Qwen2.5-7B-Instruct

    \b
    Measure first, then write a spec with the K that pays:
      specbuild check -c specbuild.toml --measure --json > check.json
      specbuild init --from-check check.json --out tuned.toml
    """
    from specbuild.errors import SpecError
    from specbuild.example import specfile

    if draft is not None and target is None:
        raise click.UsageError("--draft needs --target (a draft model alone has nothing to draft for).")
    if target is not None and example:
        raise click.UsageError("pass either --example or --target/--draft, not both.")
    if (out.exists() or out.is_symlink()) and not force:
        raise SpecError(
            f"{out} already exists; not overwriting it. Pass --force to replace it, or --out to write elsewhere."
        )
    measured: tuple[dict, str] | None = _read_check(from_check) if from_check is not None else None
    pair = None
    if example:
        from specbuild.example import cached_example, ensure_example, example_dir

        if dry_run:
            pair = cached_example(variant)
            if pair is None:
                log(f"would build the example pair ({variant}) into {example_dir(variant)}")
        else:
            pair = ensure_example(variant)
    if example and pair is not None:
        overrides = specfile.example_overrides(pair, variant)
        header = (
            f"specbuild spec for the built-in example pair ({variant}), written by `specbuild init --example`.\n"
            f"Measured when the pair was built: agreement {pair.info.get('agreement')}, "
            f"cost ratio c {pair.info.get('cost_ratio')} (CPU; `specbuild check --measure` measures here)."
        )
    elif example:
        overrides, header = {}, "specbuild spec for the example pair (dry run: pair not built yet)"
    elif target is not None:
        overrides = specfile.pair_overrides(target, draft)
        header = (
            f"specbuild spec for {overrides['name']}, written by `specbuild init --target --draft` from the two "
            "checkpoints.\nNext: `specbuild check` says whether the pair is usable, and why."
            if draft is not None
            else f"specbuild spec for {overrides['name']} alone (prompt lookup, no draft model), written by "
            "`specbuild init --target` from its checkpoint.\nNext: `specbuild check` says whether it is usable."
        )
    else:
        overrides = {}
        header = "specbuild spec file, written by `specbuild init`.\nReplace the two checkpoint paths with your models."
    if measured is not None:
        extra, line = measured
        if example:  # the example's own name and checkpoints win over the report's
            extra = {key: value for key, value in extra.items() if key not in ("name", "target", "draft")}
        elif "target" in extra:
            header = "specbuild spec file, written by `specbuild init --from-check`."
        overrides = specfile.merge_overrides(overrides, extra)
        header += "\n" + line
    text = specfile.render_spec(overrides, header=header)
    if dry_run:
        log(f"would write {out}")
        if as_json:
            emit_json({"path": str(out.resolve()), "written": False, "spec": text})
        else:
            click.echo(text, nl=False)
        return
    path = specfile.write_spec(out, text, force=force)
    if as_json:
        document = {"path": str(path.resolve()), "written": True}
        if pair is not None:
            document.update({"example": str(pair.root), "target": str(pair.target), "draft": str(pair.draft)})
        emit_json(document)
    else:
        click.echo(f"wrote {path}")
        log("next: specbuild check -c " + str(path))


def _read_check(path: Path) -> tuple[dict, str]:
    import json

    from specbuild.errors import SpecError
    from specbuild.example import specfile

    try:
        report = json.loads(path.read_text())
    except OSError as err:
        raise SpecError(f"cannot read the check report {path}: {err.strerror or err}") from None
    except ValueError as err:
        raise SpecError(
            f"{path} is not a JSON check report ({err}); write one with `specbuild check --measure --json > {path}`."
        ) from None
    return specfile.overrides_from_check(report, str(path))
