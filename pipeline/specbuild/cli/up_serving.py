"""The serving half of `specbuild up`: the repo stage and the serve stage (start, canary, demo prompts).

The serve stage starts tritonserver on the repository under the supervisor, streams a few prompts through
the speculative BLS (or, on the LLM API path, Triton's llmapi model) over gRPC with `session.served`, prints
the text as it is accepted and each request's acceptance figures, then either stops (`--once`) or keeps
serving until Ctrl-C / SIGTERM. `up --backend llmapi` runs this same stage (`cli.up_llmapi`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from specbuild.artifacts import default_repo_dir
from specbuild.example.demo import DEMO_MAX_TOKENS, DEMO_PROMPTS, MAX_TOP_TOKEN_SHARE


def demo_prompts() -> list[tuple[str, str]]:
    """(kind, prompt) for code, JSON and prose: fixed text the example pair never trained on."""
    return list(DEMO_PROMPTS)


def run_repo_stage(ctx) -> dict[str, Any]:
    repo = ctx.repo or default_repo_dir(ctx.spec.output_dir)
    if ctx.dry_run:
        from dataclasses import asdict

        from specbuild.artifacts import UP_TO_DATE, combined_hash, recorded_hash
        from specbuild.triton.repository import plan_settings, render

        settings, _ = plan_settings(ctx.spec, ctx.backend, repo, None, None)
        # The input hash write_repository records: the settings and every rendered file.
        if not ctx.force and recorded_hash(repo) == combined_hash(asdict(settings), render(settings)):
            return {"status": "skipped", "detail": UP_TO_DATE, "repo": str(repo)}
        return {"status": "planned", "detail": f"write the {ctx.backend} model repository to {repo}"}
    from specbuild.triton.repository import write_repository

    result = write_repository(ctx.spec, ctx.backend, repo, force=ctx.force)
    for warning in result.warnings:
        ctx.log(f"repo warning: {warning}")
    ctx.log(f"repo: {result.out_dir}" + (" (up to date)" if result.skipped else ""))
    return {"status": "skipped" if result.skipped else "ran", "repo": str(result.out_dir), "backend": ctx.backend}


def run_serve_stage(ctx) -> dict[str, Any]:
    from specbuild.triton import deploy

    repo = Path(ctx.results.get("repo", {}).get("repo") or ctx.repo or default_repo_dir(ctx.spec.output_dir))
    if ctx.dry_run:
        return {"status": "planned", "detail": f"tritonserver on {repo}, then {len(demo_prompts())} demo prompts"}
    from specbuild.triton.supervisor import Supervisor

    plan = deploy.plan_serve(ctx.spec, repo)
    deploy.check_engines(plan.backend, plan.engines)
    supervisor = Supervisor.for_repo(plan.options, plan.install, log=ctx.log)
    handle = supervisor.handle
    ctx.log(f"starting tritonserver ({plan.install.kind}) on {plan.repo} ({plan.backend}); log: {handle.log_path}")
    started = time.monotonic()
    document: dict[str, Any] = {"status": "ran"}

    def on_ready(canary: dict[str, str]) -> None:
        document.update(endpoints=handle.endpoints(), ready_seconds=round(time.monotonic() - started, 1))
        document["demo"] = _demo(ctx, handle)
        if not ctx.once:
            for name, url in handle.endpoints().items():
                ctx.log(f"{name:8s} {url}")
            for line in next_steps(ctx.spec, handle.grpc_url, serving=True):
                ctx.log(line)
            ctx.log("serving; press Ctrl-C (or send SIGTERM) to stop")

    outcome = supervisor.serve(on_ready, once=ctx.once)
    ctx.log("tritonserver stopped: the endpoints above no longer answer")
    document.update(stopped=True, stopped_by=outcome["stopped_by"], restarts=outcome["restarts"])
    if "drain" in outcome:
        document["drain"] = outcome["drain"]
    if ctx.once and "demo" in document:
        for line in next_steps(ctx.spec, handle.grpc_url, serving=False):
            ctx.log(line)
    return document


NEXT_PROMPT = '"def parse_args(argv):"'


def program() -> tuple[str, str | None]:
    """How to run specbuild again from this folder, and the venv's activate script when that makes plain
    `specbuild` work: (".venv/bin/specbuild", ".venv/bin/activate") under `make demo`."""
    import shutil
    import sys

    from specbuild.cli.common import shown_path

    exe = Path(sys.argv[0])
    if exe.name != "specbuild":
        return "specbuild", None  # python -m specbuild, or embedded
    on_path = shutil.which("specbuild")
    if on_path and Path(on_path).resolve() == exe.resolve():
        return "specbuild", None
    activate = exe.parent / "activate"
    return shown_path(exe), (shown_path(activate) if activate.is_file() else None)


def next_steps(spec, grpc_url: str, serving: bool) -> list[str]:
    """What to run after `specbuild up`: exact commands for this spec, from the current folder."""
    from specbuild.cli.common import shown_path
    from specbuild.session.served import server_url

    cmd, activate = program()
    c = f" -c {shown_path(spec.path)}" if spec.path else ""
    url = "" if grpc_url == server_url(spec, "grpc") else f" --url {grpc_url}"
    rows: list[tuple[str, str]] = []
    if activate:
        rows.append((f"source {activate}", f"then plain `specbuild ...` works (or type {cmd} as below)"))
    if serving:
        rows += [(f"{cmd} generate{c}{url} {NEXT_PROMPT}", "through this server"),
                 (f"{cmd} bench{c} --url {grpc_url} --protocol grpc", "speed with and without speculation")]
    else:
        rows += [(f"{cmd} generate{c} --local {NEXT_PROMPT}", "in-process, no server"),
                 (f"{cmd} serve{c}", "serve again (Ctrl-C stops it) ..."),
                 (f"{cmd} generate{c} {NEXT_PROMPT}", "... and ask it, from another terminal"),
                 (f"{cmd} bench{c} --local", "speed with and without speculation")]
    rows.append((f"{cmd} check{c}", f"the pair report; every command: {cmd} --help"))
    width = max(len(command) for command, _ in rows)
    where = "in another terminal while this one serves" if serving else "from this folder"
    return ["", f"next ({where}):"] + [f"  {command:<{width}}  # {why}" for command, why in rows]


def _demo(ctx, handle) -> list[dict[str, Any]]:
    """Stream each demo prompt through the BLS (or the llmapi model); print text as it arrives (stderr under
    --json)."""
    from specbuild.bench.stats import top_token_share
    from specbuild.session.generation import Options
    from specbuild.session.served import ServedSession

    out = []
    k = ctx.spec.speculative.num_draft_tokens
    echo = None if ctx.as_json else (lambda text: click.echo(text, nl=False))  # stdout: the streamed text
    with ServedSession.for_spec(ctx.spec, "grpc", handle.grpc_url) as session:
        for kind, prompt in demo_prompts():
            ctx.log(f"\n--- {kind} prompt ({len(prompt)} chars), K = {k}:")
            ctx.log(prompt.rstrip()[-160:])
            ctx.log("--- streamed continuation:")
            gen = session.generate(prompt, Options(max_tokens=DEMO_MAX_TOKENS, num_draft_tokens=k), on_text=echo)
            if not ctx.as_json:
                click.echo("")
            share = top_token_share(gen.output_ids)
            row = {
                "kind": kind,
                "text": gen.text,
                "num_output_tokens": gen.output_tokens,
                "finish_reason": gen.finish_reason,
                "acceptance_rate": round(gen.stats.acceptance_rate, 4),
                "mean_accepted_len": round(gen.stats.mean_accepted_len, 4),
                "total_draft_tokens": gen.stats.drafted,
                "total_accepted_draft_tokens": gen.stats.accepted,
                "time_to_first_token_s": round(gen.ttft_seconds or gen.seconds, 4),
                "tokens_per_s": round(gen.tokens_per_s, 2) if gen.seconds > 0 else None,
                "top_token_share": None if share is None else round(share, 4),
            }
            ctx.log(f"--- {gen.output_tokens} tokens, acceptance_rate {row['acceptance_rate']:.2f}, "
                    f"mean_accepted_len {row['mean_accepted_len']:.2f}, {row['tokens_per_s']} tokens/s")
            if share is not None and share >= MAX_TOP_TOKEN_SHARE:
                ctx.log(f"--- note: one token is {share:.0%} of this output (repetitive text): acceptance on "
                        "repeated tokens says little about real text")
            out.append(row)
    return out
