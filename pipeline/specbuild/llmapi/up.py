"""`specbuild up --backend llmapi`: the same five stages as the engine path, for the LLM API.

    check    the pair checks with this path's memory plan (`run_check(backend="llmapi")`)
    convert  Hugging Face checkpoints per role (`checkpoint`)
    build    the LLM arguments, validated and written (`build`)
    repo     Triton's llmapi repository (`repository`; the CPU stand-in unless tensorrt_llm is importable)
    serve    tritonserver on it under the supervisor (specbuild.triton.supervisor), the canary, the demo prompts
             streamed through the client, then stop (--once) or serve until SIGINT/SIGTERM
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from specbuild.errors import PairError


def _claim(ctx) -> None:
    """Refuse now, not after convert, a folder a later stage may not replace (specbuild.artifacts)."""
    from specbuild.artifacts import claim_output, resolve_output
    from specbuild.cli.up_serving import default_repo_dir
    from specbuild.llmapi.build import STAGE as BUILD_STAGE
    from specbuild.llmapi.build import config_dir
    from specbuild.llmapi.checkpoint import STAGE as CONVERT_STAGE
    from specbuild.llmapi.checkpoint import checkpoint_dir

    folders = [(checkpoint_dir(ctx.spec, role), CONVERT_STAGE, "convert") for role in ("target", "draft")]
    folders += [(config_dir(ctx.spec), BUILD_STAGE, "build"), (ctx.repo or default_repo_dir(ctx.spec), "repo", "repo")]
    for path, stage, step in folders:
        if step in ctx.stages:
            claim_output(resolve_output(path, stage), stage)


def run_check_stage(ctx) -> dict[str, Any]:
    from specbuild.artifacts import write_json
    from specbuild.cli.up_cmd import CHECK_RECORD, check_inputs_hash

    _claim(ctx)
    if ctx.dry_run:
        return {"status": "planned", "detail": "read both checkpoints' configs and tokenizers; LLM API memory plan"}
    record = ctx.spec.pair_dir / CHECK_RECORD
    key = check_inputs_hash(ctx.spec) + ":llmapi"
    if not ctx.force and record.is_file():
        import json

        try:
            if json.loads(record.read_text()).get("input_hash") == key:
                ctx.log(f"check: inputs unchanged since the last passing check ({record}), skipped.")
                return {"status": "skipped"}
        except (OSError, ValueError):
            pass
    from specbuild.check import run_check
    from specbuild.cli.common import progress_enabled

    report = run_check(ctx.spec, progress=progress_enabled(), backend="llmapi")
    for warning in report.warnings:
        ctx.log(f"check warning: {warning.message}")
    if not report.ok:
        record.unlink(missing_ok=True)
        first = report.problems[0]
        raise PairError(f"check failed: {first.message} {first.fix}".strip())
    record.parent.mkdir(parents=True, exist_ok=True)
    write_json(record, {"input_hash": key, "ok": True, "warnings": [w.to_dict() for w in report.warnings]})
    return {"status": "ran", "warnings": len(report.warnings)}


def run_convert_stage(ctx) -> dict[str, Any]:
    from specbuild.cli.common import progress_enabled
    from specbuild.convert.plan import ConvertOptions
    from specbuild.llmapi import checkpoint

    options = ConvertOptions()
    plans = checkpoint.plan_roles(ctx.spec, ["target", "draft"], options)
    if ctx.dry_run:
        return {"status": "planned", "detail": [checkpoint.describe(plan) for plan in plans]}
    results = [checkpoint.convert_role(plan, options, force=ctx.force, log=ctx.log, progress=progress_enabled())
               for plan in plans]
    states = {r["status"] for r in results}
    return {"status": "skipped" if states == {"skipped"} else "ran", "roles": {r["role"]: r["status"] for r in results}}


def run_build_stage(ctx) -> dict[str, Any]:
    from specbuild.llmapi import build

    if ctx.dry_run:
        return {"status": "planned", "detail": build.dry_run(ctx.spec)}
    result = build.build(ctx.spec, force=ctx.force, log=ctx.log)
    return {"status": result["status"], "backend": "llmapi", "out_dir": result["out_dir"]}


def run_repo_stage(ctx) -> dict[str, Any]:
    from specbuild.cli.up_serving import default_repo_dir

    repo = ctx.repo or default_repo_dir(ctx.spec)
    if ctx.dry_run:
        return {"status": "planned", "detail": f"write the llmapi model repository to {repo}"}
    from specbuild.llmapi.repository import write_repository

    result = write_repository(ctx.spec, repo, force=ctx.force)
    for warning in result.warnings:
        ctx.log(f"repo warning: {warning}")
    return {"status": "skipped" if result.skipped else "ran", "repo": str(result.out_dir), "backend": "llmapi",
            "runtime": result.runtime}


def run_serve_stage(ctx) -> dict[str, Any]:
    from specbuild.cli.up_serving import default_repo_dir, demo_prompts
    from specbuild.triton import deploy

    repo = Path(ctx.results.get("repo", {}).get("repo") or ctx.repo or default_repo_dir(ctx.spec))
    if ctx.dry_run:
        return {"status": "planned", "detail": f"tritonserver on {repo}, then {len(demo_prompts())} demo prompts"}
    from specbuild.triton.supervisor import Supervisor

    plan = deploy.plan_serve(ctx.spec, repo)
    deploy.check_engines(plan.backend, plan.engines)
    supervisor = Supervisor.for_repo(plan.options, plan.install, log=ctx.log)
    handle = supervisor.handle
    ctx.log(f"starting tritonserver ({plan.install.kind}) on {plan.repo} (llmapi); log: {handle.log_path}")
    started = time.monotonic()
    document: dict[str, Any] = {"status": "ran"}

    def on_ready(canary: dict[str, str]) -> None:
        document.update(endpoints=handle.endpoints(), ready_seconds=round(time.monotonic() - started, 1))
        document["demo"] = demo(ctx, handle, plan.engines["target"])
        if not ctx.once:
            for name, url in handle.endpoints().items():
                ctx.log(f"{name:8s} {url}")
            ctx.log("serving; press Ctrl-C (or send SIGTERM) to stop")

    outcome = supervisor.serve(on_ready, once=ctx.once)
    ctx.log("tritonserver stopped")
    document.update(stopped=True, stopped_by=outcome["stopped_by"], restarts=outcome["restarts"])
    return document


def token_counter(tokenizer_dir: Path):
    """text -> tokens, with the target's tokenizer (the llmapi responses carry text only)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else 0


def demo(ctx, handle, tokenizer_dir: Path) -> list[dict[str, Any]]:
    """Stream each demo prompt through the llmapi model; print text as it arrives (stderr under --json)."""
    from specbuild.cli.up_serving import DEMO_MAX_TOKENS, demo_prompts
    from specbuild.triton.client import SpecbuildClient

    out = []
    with SpecbuildClient(handle.grpc_url, protocol="grpc", count_tokens=token_counter(tokenizer_dir)) as client:
        for kind, prompt in demo_prompts():
            ctx.log(f"\n--- {kind} prompt ({len(prompt)} chars), K = {ctx.spec.speculative.num_draft_tokens} (llmapi):")
            ctx.log(prompt.rstrip()[-120:])
            ctx.log("--- streamed continuation:")
            t0, first, parts, stats = time.perf_counter(), None, [], {}
            for chunk in client.generate(prompt, max_tokens=DEMO_MAX_TOKENS, stream=True):
                if chunk.text:
                    first = first if first is not None else time.perf_counter() - t0
                    parts.append(chunk.text)
                    if not ctx.as_json:
                        click.echo(chunk.text, nl=False)
                if chunk.stats:
                    stats = chunk.stats
            seconds = time.perf_counter() - t0
            if not ctx.as_json:
                click.echo("")
            tokens = int(stats.get("num_output_tokens", 0))
            row = {"kind": kind, "text": "".join(parts), "num_output_tokens": tokens,
                   "finish_reason": stats.get("finish_reason"),
                   "acceptance_rate": round(float(stats.get("acceptance_rate") or 0.0), 4),
                   "total_draft_tokens": int(stats.get("total_draft_tokens") or 0),
                   "total_accepted_draft_tokens": int(stats.get("total_accepted_draft_tokens") or 0),
                   "time_to_first_token_s": round(first or seconds, 4),
                   "tokens_per_s": round(tokens / seconds, 2) if seconds > 0 else None}
            ctx.log(f"--- {tokens} tokens, finish {row['finish_reason']}, acceptance_rate {row['acceptance_rate']:.2f}, "
                    f"{row['tokens_per_s']} tokens/s")
            out.append(row)
    return out


def stages():
    from specbuild.cli.up_cmd import Stage

    return [Stage("check", run_check_stage), Stage("convert", run_convert_stage), Stage("build", run_build_stage),
            Stage("repo", run_repo_stage), Stage("serve", run_serve_stage)]
