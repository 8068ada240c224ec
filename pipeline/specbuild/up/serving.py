"""The serve stage of `specbuild up`, for either path: start tritonserver on the repository under the supervisor,
stream a few prompts through the speculative BLS (or, on the LLM API path, Triton's llmapi model) over gRPC with
`session.served`, hand the text to ctx.echo as it is accepted and log each request's acceptance figures, then
either stop (`--once`) or keep serving until Ctrl-C / SIGTERM (the drain). The prompts stream from a thread while
the supervisor watches the server, so a fault during them is recovered like any other, and the prompt it cut is
sent once more after recovery."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from specbuild.artifacts import default_repo_dir
from specbuild.errors import ServeError
from specbuild.example.demo import DEMO_MAX_TOKENS, DEMO_PROMPTS, MAX_TOP_TOKEN_SHARE


def demo_prompts() -> list[tuple[str, str]]:
    """(kind, prompt) for code, JSON and prose: fixed text the example pair never trained on."""
    return list(DEMO_PROMPTS)


def run_serve_stage(ctx) -> dict[str, Any]:
    from specbuild.triton import serve_plan

    repo = Path(ctx.results.get("repo", {}).get("repo") or ctx.repo or default_repo_dir(ctx.spec.output_dir))
    if ctx.dry_run:
        return {"status": "planned", "detail": f"tritonserver on {repo}, then {len(demo_prompts())} demo prompts"}
    from specbuild.triton.supervisor import Supervisor

    plan = serve_plan.plan_serve(ctx.spec, repo)
    serve_plan.check_engines(plan.backend, plan.engines)
    supervisor = Supervisor.for_repo(plan.options, plan.install, log=ctx.log)
    handle = supervisor.handle
    ctx.log(f"starting tritonserver ({plan.install.kind}) on {plan.repo} ({plan.backend}); log: {handle.log_path}")
    started = time.monotonic()
    document: dict[str, Any] = {"status": "ran"}
    demo_done = threading.Event()

    def run_demo() -> None:  # beside the supervisor, which watches the server while the prompts stream
        try:
            document["demo"] = _demo(ctx, handle, supervisor)
        except Exception as err:  # noqa: BLE001 - said, and with --once it fails the stage below
            document["demo_error"] = f"{type(err).__name__}: {err}"
            ctx.log(f"--- the demo stopped: {document['demo_error']}")
        finally:
            demo_done.set()
        if not ctx.once:
            for name, url in handle.endpoints().items():
                ctx.log(f"{name:8s} {url}")
            for line in ctx.next_steps(handle.grpc_url, True) if ctx.next_steps else ():
                ctx.log(line)
            ctx.log("serving; press Ctrl-C (or send SIGTERM) to stop")

    def on_ready(canary: dict[str, str]) -> None:
        document.update(endpoints=handle.endpoints(), ready_seconds=round(time.monotonic() - started, 1))
        threading.Thread(target=run_demo, name="up-demo", daemon=True).start()

    outcome = supervisor.serve(on_ready, once=ctx.once, until=demo_done.is_set)
    ctx.log("tritonserver stopped: the endpoints above no longer answer")
    document.update(stopped=True, stopped_by=outcome["stopped_by"], restarts=outcome["restarts"])
    if "drain" in outcome:
        document["drain"] = outcome["drain"]
    if ctx.once and "demo_error" in document:
        raise ServeError(f"the demo stopped: {document['demo_error']}")
    failed = [row["kind"] for row in document.get("demo", []) if "error" in row]
    if ctx.once and failed:
        raise ServeError(
            f"the demo's {', '.join(failed)} prompt failed, retried after recovery or not: "
            f"{next(row['error'] for row in document['demo'] if 'error' in row)}"
        )
    if ctx.once and "demo" in document:
        for line in ctx.next_steps(handle.grpc_url, False) if ctx.next_steps else ():
            ctx.log(line)
    return document


def _demo(ctx, handle, supervisor) -> list[dict[str, Any]]:
    """Stream each demo prompt through the BLS (or the llmapi model); print text as it arrives (stderr under
    --json). A prompt that fails because the server did (a model's process died or hung) is reported, and once the
    supervisor has it serving again, sent once more."""
    from specbuild.errors import ClientError
    from specbuild.session.served import TargetTokenizer

    out = []
    k = ctx.spec.speculative.num_draft_tokens
    build = ctx.spec.build
    max_tokens = min(DEMO_MAX_TOKENS, build.max_seq_len - build.max_input_len)
    count = TargetTokenizer(ctx.spec.target.checkpoint).count
    for kind, prompt in demo_prompts():
        prompt = fitting(prompt, count, build.max_input_len - 1)  # - 1: a BOS the server may add
        if prompt is None:
            ctx.log(f"\n--- {kind} prompt: skipped, no line of it fits max_input_len = {build.max_input_len}")
            continue
        ctx.log(f"\n--- {kind} prompt ({len(prompt)} chars), K = {k}:")
        ctx.log(prompt.rstrip()[-160:])
        ctx.log("--- streamed continuation:")
        mark = len(supervisor.events)
        try:
            row = _stream(ctx, handle, kind, prompt, max_tokens, k)
        except ClientError as err:
            ctx.log(f"\n--- the {kind} prompt failed: {err}")
            recovered = supervisor.recovered_after(mark, supervisor.settings.start_timeout_s)
            if not recovered:
                why = "the server did not fail" if recovered is None else "the server did not recover"
                out.append({"kind": kind, "error": str(err), "retried": False, "why_not_retried": why})
                continue
            ctx.log(f"--- the server serves again: the {kind} prompt once more")
            try:
                row = {**_stream(ctx, handle, kind, prompt, max_tokens, k), "failed_first": str(err)}
            except ClientError as again:
                out.append({"kind": kind, "error": str(again), "retried": True, "failed_first": str(err)})
                continue
        out.append(row)
    return out


def _stream(ctx, handle, kind: str, prompt: str, max_tokens: int, k: int) -> dict[str, Any]:
    """One demo prompt streamed (a session on the server's address now: a restart may have moved it)."""
    from specbuild.bench.stats import top_token_share
    from specbuild.decode.generation import Options
    from specbuild.session.served import ServedSession

    echo = ctx.echo  # the streamed text (the CLI's stdout, unless --json)
    with ServedSession.for_spec(ctx.spec, "grpc", handle.grpc_url) as session:
        gen = session.generate(prompt, Options(max_tokens=max_tokens, num_draft_tokens=k), on_text=echo)
    if echo is not None:
        echo("\n")
    share = top_token_share(gen.output_ids)
    row = {
        "kind": kind,
        "text": gen.text,
        "num_output_tokens": gen.output_tokens,
        "num_output_tokens_estimated": gen.count_estimated,
        "finish_reason": gen.finish_reason,
        "acceptance_rate": round(gen.stats.acceptance_rate, 4),
        "mean_accepted_len": round(gen.stats.mean_accepted_len, 4),
        "total_draft_tokens": gen.stats.drafted,
        "total_accepted_draft_tokens": gen.stats.accepted,
        "time_to_first_token_s": round(gen.ttft_seconds or gen.seconds, 4),
        "tokens_per_s": round(gen.tokens_per_s, 2) if gen.seconds > 0 else None,
        "top_token_share": None if share is None else round(share, 4),
    }
    ctx.log(
        f"--- {gen.count_text()}, acceptance_rate {row['acceptance_rate']:.2f}, "
        f"mean_accepted_len {row['mean_accepted_len']:.2f}, {row['tokens_per_s']} tokens/s"
    )
    if share is not None and share >= MAX_TOP_TOKEN_SHARE:
        ctx.log(
            f"--- note: one token is {share:.0%} of this output (repetitive text): acceptance on "
            "repeated tokens says little about real text"
        )
    return row


def fitting(prompt: str, count, limit: int) -> str | None:
    """The prompt, or its last lines that fit `limit` tokens (a deployment built with small limits must still
    answer the demo rather than refuse it); None when not even its last line fits."""
    lines = prompt.splitlines(keepends=True)
    for start in range(len(lines)):
        tail = "".join(lines[start:])
        if count(tail) <= limit:
            return tail
    return None
