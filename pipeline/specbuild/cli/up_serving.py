"""The serving half of `specbuild up`: the repo stage and the serve stage (start, canary, demo prompts).

The serve stage starts tritonserver on the repository, streams a few prompts through the speculative
BLS (gRPC), prints the text as it is accepted and each request's acceptance figures, then either stops
(`--once`) or keeps serving until Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

DEMO_MAX_TOKENS = 48


def default_repo_dir(spec) -> Path:
    """The repository sits beside the engines folder, so its relative engine paths resolve."""
    return Path(spec.output_dir).parent / "triton_repo"


def demo_prompts(n_per_kind: int = 1) -> list[tuple[str, str]]:
    """Held-out prompts (never trained on) of each workload kind: code, JSON, prose."""
    from specbuild.example import corpus

    prompts = []
    for kind in ("code", "json", "prose"):
        for text in corpus.heldout_prompts(kind, n_per_kind, chars=160):
            prompts.append((kind, text))
    return prompts


def run_repo_stage(ctx) -> dict[str, Any]:
    repo = ctx.repo or default_repo_dir(ctx.spec)
    if ctx.dry_run:
        return {"status": "planned", "detail": f"write the {ctx.backend} model repository to {repo}"}
    from specbuild.triton.repository import write_repository

    result = write_repository(ctx.spec, ctx.backend, repo, force=ctx.force)
    for warning in result.warnings:
        ctx.log(f"repo warning: {warning}")
    ctx.log(f"repo: {result.out_dir}" + (" (up to date)" if result.skipped else ""))
    return {"status": "skipped" if result.skipped else "ran", "repo": str(result.out_dir), "backend": ctx.backend}


def run_serve_stage(ctx) -> dict[str, Any]:
    from specbuild.triton import deploy

    repo = Path(ctx.results.get("repo", {}).get("repo") or ctx.repo or default_repo_dir(ctx.spec))
    if ctx.dry_run:
        return {"status": "planned", "detail": f"tritonserver on {repo}, then {len(demo_prompts())} demo prompts"}
    from specbuild.triton.supervisor import Supervisor

    plan = deploy.plan_serve(ctx.spec, repo)
    deploy.check_engines(plan.backend, plan.engines)
    supervisor = Supervisor.for_repo(plan.options, plan.install, log=ctx.log)
    handle = supervisor.handle
    ctx.log(f"starting tritonserver ({plan.install.kind}) on {plan.repo}; log: {handle.log_path}")
    started = time.monotonic()
    document: dict[str, Any] = {"status": "ran"}

    def on_ready(canary: dict[str, str]) -> None:
        document.update(endpoints=handle.endpoints(), ready_seconds=round(time.monotonic() - started, 1))
        document["demo"] = _demo(ctx, handle)
        if not ctx.once:
            for name, url in handle.endpoints().items():
                ctx.log(f"{name:8s} {url}")
            ctx.log("serving; press Ctrl-C (or send SIGTERM) to stop")

    outcome = supervisor.serve(on_ready, once=ctx.once)
    ctx.log("tritonserver stopped")
    document.update(stopped=True, stopped_by=outcome["stopped_by"], restarts=outcome["restarts"])
    return document


def _demo(ctx, handle) -> list[dict[str, Any]]:
    """Stream each demo prompt through the BLS; print text as it arrives (stderr under --json)."""
    from specbuild.triton.client import SpecbuildClient

    out = []
    k = ctx.spec.speculative.num_draft_tokens
    with SpecbuildClient(handle.grpc_url, protocol="grpc") as client:
        for kind, prompt in demo_prompts():
            ctx.log(f"\n--- {kind} prompt ({len(prompt)} chars), K = {k}:")
            ctx.log(prompt.rstrip()[-120:])
            ctx.log("--- streamed continuation:")
            t0 = time.perf_counter()
            first = None
            parts, stats = [], {}
            for chunk in client.generate(prompt, max_tokens=DEMO_MAX_TOKENS, num_draft_tokens=k, stream=True):
                if chunk.text:
                    first = first if first is not None else time.perf_counter() - t0
                    parts.append(chunk.text)
                    if not ctx.as_json:  # stdout carries the streamed text; --json keeps stdout for the document
                        click.echo(chunk.text, nl=False)
                if chunk.stats:
                    stats = chunk.stats
            seconds = time.perf_counter() - t0
            if not ctx.as_json:
                click.echo("")
            tokens = int(stats.get("num_output_tokens", 0))
            row = {
                "kind": kind,
                "text": "".join(parts),
                "num_output_tokens": tokens,
                "acceptance_rate": round(float(stats.get("acceptance_rate", 0.0)), 4),
                "mean_accepted_len": round(float(stats.get("mean_accepted_len", 0.0)), 4),
                "total_draft_tokens": int(stats.get("total_draft_tokens", 0)),
                "total_accepted_draft_tokens": int(stats.get("total_accepted_draft_tokens", 0)),
                "time_to_first_token_s": round(first or seconds, 4),
                "tokens_per_s": round(tokens / seconds, 2) if seconds > 0 else None,
            }
            ctx.log(f"--- {tokens} tokens, acceptance_rate {row['acceptance_rate']:.2f}, "
                    f"mean_accepted_len {row['mean_accepted_len']:.2f}, {row['tokens_per_s']} tokens/s")
            out.append(row)
    return out
