"""The `specbuild` command line. Subcommands live in one small module each and load lazily,
so `specbuild --help` and `--dry-run` never import torch, transformers or tritonclient.

The library raises `SpecbuildError`s; they become `click.ClickException`s here, once.
"""

from __future__ import annotations

import importlib
import importlib.util

import click

from specbuild import __version__
from specbuild.errors import SpecbuildError

# name -> (module, one-line help). Order is the pipeline order shown in --help.
COMMANDS: dict[str, tuple[str, str]] = {
    "init": ("specbuild.cli.init_cmd", "Write a commented spec file (specbuild.toml)."),
    "example": ("specbuild.cli.example_cmd", "Create (or find in the cache) the built-in example pair."),
    "check": ("specbuild.cli.check_cmd", "Check that the pair can work and fits the GPU, before any GPU work."),
    "convert": ("specbuild.cli.convert_cmd", "Convert (and quantize) both checkpoints to TensorRT-LLM checkpoints."),
    "build": ("specbuild.cli.build_cmd", "Build engines: trtllm-build (GPU) or reference engines (CPU)."),
    "repo": ("specbuild.cli.repo_cmd", "Write the Triton model repository for the pair."),
    "serve": ("specbuild.cli.serve_cmd", "Start tritonserver on the model repository."),
    "generate": ("specbuild.cli.generate_cmd", "Generate text with speculative decoding (server or --local)."),
    "bench": ("specbuild.cli.bench_cmd", "Measure speed and acceptance, with speculation on and off."),
    "up": ("specbuild.cli.up_cmd", "Run every stage for the spec, skipping what is up to date."),
    "deploy": ("specbuild.cli.deploy_cmd", "Write a Helm chart that runs the pair on Kubernetes."),
    "selftest": ("specbuild.cli.selftest_cmd", "Prove the GPU path on this machine: one command, one report."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name, (module, _) in COMMANDS.items() if importlib.util.find_spec(module)]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module_name, short_help = COMMANDS[name]
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name == module_name:
                return None
            raise
        command = module.command
        command.short_help = command.short_help or short_help
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Short help straight from COMMANDS: listing commands must not import their modules.
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands (pipeline order)"):
                formatter.write_dl(rows)

    def invoke(self, ctx: click.Context):
        # With --json, stdout carries exactly one document, also when the command fails before printing
        # its own (bad spec, missing checkpoint, usage error): then a failure document, and the error on stderr.
        head = getattr(ctx, "_protected_args", None) or vars(ctx).get("protected_args", [])  # click 8.2 / 8.1
        argv = [*head, *ctx.args]
        wants_json = "--json" in argv[1 : argv.index("--") if "--" in argv else None]
        try:
            try:
                return super().invoke(ctx)
            except SpecbuildError as err:
                raise click.ClickException(str(err)) from None
        except click.ClickException as err:
            from specbuild.cli.common import JSON_EMITTED, emit_json, failure_document

            if wants_json and not ctx.meta.get(JSON_EMITTED):
                cause = err.__context__ if isinstance(err.__context__, SpecbuildError) else err
                emit_json(
                    failure_document(
                        argv[0] if argv else None, err.format_message(), type(cause).__name__, err.exit_code
                    )
                )
            raise


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="specbuild")
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    help="Details for tuning and debugging on stderr: the row block the "
    "exactness probe chose, libraries' own output (also: SPECBUILD_VERBOSE=1).",
)
def main(verbose: bool) -> None:
    """specbuild: speculative decoding with TensorRT-LLM, from one spec file.

    A small draft model proposes K tokens, the large target model verifies them in one
    forward pass; the output is exactly what the target alone would produce, only faster.

    \b
    Pipeline (one command per stage; `specbuild up` chains them):
      spec -> check -> convert -> build -> repo -> serve -> generate / bench

    \b
    Start here:
      specbuild init --example      # spec for the built-in example pair
      specbuild check               # can this pair work, and does it fit the GPU?
      specbuild up                  # every stage, then a running Triton server

    Results go to stdout (one JSON document with --json); logs and progress to stderr.
    Exit codes: 0 ok, 1 error or unusable pair, 2 usage error.
    """
    if verbose:  # in the environment, so the processes specbuild starts (the draft's, tritonserver's) see it
        import os

        from specbuild.progress import VERBOSE_ENV

        os.environ[VERBOSE_ENV] = "1"
