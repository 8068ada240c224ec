"""`specbuild init`: write a commented spec file, optionally for the built-in example pair."""

from __future__ import annotations

from pathlib import Path

import click

from specbuild.cli.common import DEFAULT_SPEC, dry_run_option, emit_json, json_option, log

VARIANT_CHOICE = click.Choice(["full", "tiny"])


@click.command(name="init")
@click.option("--out", "out", default=DEFAULT_SPEC, show_default=True,
              type=click.Path(dir_okay=False, path_type=Path), help="Where to write the spec file.")
@click.option("--force", is_flag=True, help="Overwrite the file if it exists.")
@click.option("--example", is_flag=True,
              help="Write a spec for the built-in example pair (built first if not cached; takes minutes once).")
@click.option("--variant", type=VARIANT_CHOICE, default="full", show_default=True,
              help="Which example pair --example uses (tiny: seconds, for tests).")
@json_option
@dry_run_option
def command(out: Path, force: bool, example: bool, variant: str, as_json: bool, dry_run: bool) -> None:
    """Write a commented spec file listing every key with its default and why.

    Without --example the checkpoints are placeholders (models/target, models/draft) to replace.
    With --example they point at the built-in example pair (see `specbuild example`).
    """
    from specbuild.example import specfile
    from specbuild.errors import SpecError

    if out.exists() and not force:
        raise SpecError(f"{out} already exists; not overwriting it. Pass --force to replace it, "
                        "or --out to write elsewhere.")
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
        header = (f"specbuild spec for the built-in example pair ({variant}), written by `specbuild init --example`.\n"
                  f"Measured on this machine: agreement {pair.info.get('agreement')}, "
                  f"cost ratio c {pair.info.get('cost_ratio')}.")
    elif example:
        overrides, header = {}, "specbuild spec for the example pair (dry run: pair not built yet)"
    else:
        overrides = {}
        header = "specbuild spec file, written by `specbuild init`.\nReplace the two checkpoint paths with your models."
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
