"""What `convert`, `build`, `repo` and `serve` do with --backend llmapi: the CLI modules dispatch here
(one line each), so this path's commands read like the engine path's and its code stays in one package."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import click

from specbuild.cli.common import emit_json, log, progress_enabled, report_repo_plan, report_repo_result


def convert(spec, roles: list[str], options, force: bool, verify: bool, dry_run: bool, as_json: bool) -> None:
    from specbuild.llmapi import checkpoint

    plans = checkpoint.plan_roles(spec, roles, options)
    if dry_run:
        document = {"command": "convert", "backend": "llmapi", "dry_run": True, "pair": spec.name,
                    "roles": [checkpoint.describe(p) for p in plans]}
        if as_json:
            emit_json(document)
            return
        for p in plans:
            d = checkpoint.describe(p)
            click.echo(f"{p.role}: {p.hf_dir} -> {p.out_dir} ({d['exporter']})")
            click.echo(f"  quantization {p.quantization} (quant_algo {p.quant_algo}), kv_cache {p.kv_cache}, "
                       f"dtype {p.dtype}" + (f", vocab padded to {p.pad_vocab_to}" if p.pad_vocab_to else ""))
            click.echo("  would write: " + ", ".join(Path(f).name for f in d["would_write"]))
        return
    results = [checkpoint.convert_role(p, options, force=force, verify=verify, log=log, progress=progress_enabled())
               for p in plans]
    if as_json:
        emit_json({"command": "convert", "backend": "llmapi", "pair": spec.name, "roles": results})
        return
    for r in results:
        m = r["manifest"]
        state = "up to date, skipped" if r["status"] == "skipped" else "written"
        click.echo(f"{r['role']}: {r['checkpoint']} ({state}; quant_algo {m.get('quant_algo')}, "
                   f"kv_cache_quant_algo {m.get('kv_cache_quant_algo')}, vocab {m.get('vocab_size')})")
        if r.get("verification"):
            v = r["verification"]
            click.echo(f"  verify: {'passed' if v['passed'] else 'FAILED'}: top-1 {v['top1_agreement']:.1%}, "
                       f"max |logit error| {v['max_abs_logit_error']:.3g} vs {v['reference']}")


def build(spec, force: bool, dry_run: bool, as_json: bool) -> None:
    from specbuild.llmapi import build as build_mod

    if dry_run:
        document = build_mod.dry_run(spec)
        if as_json:
            emit_json(document)
            return
        click.echo(f"# llmapi: {document['out_dir']} (nothing to compile)")
        click.echo(build_mod.render(spec)[build_mod.OPTIONS_FILE].rstrip())
        click.echo("# would write: " + ", ".join(document["would_write"]))
        return
    result = build_mod.build(spec, force=force, log=log)
    if as_json:
        emit_json({"stage": "build", "backend": "llmapi", "pair": spec.name, "status": result["status"],
                   "out_dir": result["out_dir"], "llm_args": result["manifest"].get("llm_args")})
        return
    click.echo(f"llmapi: {result['status']} {result['out_dir']}")


def repo(spec, out_dir: Path, runtime: str, checkpoints_dir, force: bool, dry_run: bool, as_json: bool) -> None:
    from specbuild.llmapi import repository

    if dry_run:
        resolved, _, files, settings, warnings = repository.plan(spec, runtime, checkpoints_dir)
        report_repo_plan(out_dir, f"llmapi, runtime {resolved}", files, warnings, as_json, backend="llmapi",
                         runtime=resolved, settings=settings)
        return
    result = repository.write_repository(spec, out_dir, runtime, checkpoints_dir, force=force)
    report_repo_result(result, as_json, f"backend llmapi, runtime {result.runtime}, models: "
                       f"{', '.join(result.to_dict()['models'])} (serve's drain closes the gate)")


def serve_trtllm(spec, host: str | None, port: int | None, binary: str | None, nodes: int, launcher: str,
                 timeout: float, once: bool, dry_run: bool, as_json: bool, stop_timeout: float | None = None) -> None:
    """trtllm-serve in the foreground until SIGINT/SIGTERM (or --once: until healthy, then stop). A stop
    kills it after stop_timeout seconds (None: the handle's default)."""
    from specbuild.llmapi import trtllm_serve

    if dry_run:
        command = trtllm_serve.plan(spec, binary or "trtllm-serve", host, port, nodes, launcher, require_built=False)
        document: dict[str, Any] = {"stage": "serve", "dry_run": True, **command.to_dict()}
        if as_json:
            emit_json(document)
        else:
            click.echo(shlex.join(command.launch or command.argv))
            if command.end_ids_hint():
                log(command.end_ids_hint())
        return
    if nodes > 1:
        raise click.UsageError("--nodes > 1 starts on a cluster: print the command with --dry-run and run it with "
                               "your scheduler (srun / mpirun).")
    command = trtllm_serve.plan(spec, trtllm_serve.find_trtllm_serve(binary), host, port)
    handle = trtllm_serve.TrtllmServeHandle(command, log_path=spec.pair_dir / ".trtllm-serve.log",
                                            stop_timeout=stop_timeout)
    log(f"starting trtllm-serve on {command.argv[1]}; log: {handle.log_path}")
    handle.start(timeout=timeout)
    document = {"stage": "serve", "status": "ready", "server": "trtllm-serve", "endpoints":
                {"http": command.health_url.removesuffix(trtllm_serve.contract.SERVE_HEALTH)},
                "pid": handle.process.pid if handle.process else None, "end_id": command.end_id,
                "stop_token_ids": command.stop_token_ids}
    if as_json:
        emit_json(document)
    else:
        click.echo(f"http     {document['endpoints']['http']}  (OpenAI-compatible)")
        if command.end_ids_hint():
            click.echo(command.end_ids_hint())
    if once:
        handle.stop()
        return
    _until_signal(handle)
    log("trtllm-serve stopped")


def _until_signal(handle) -> None:
    import signal
    import threading

    from specbuild.errors import ServeError

    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        log("serving; press Ctrl-C (or send SIGTERM) to stop")
        while not stop.wait(1.0):
            if handle.process is None or handle.process.poll() is not None:
                code = handle.process.returncode if handle.process else None
                raise ServeError(f"trtllm-serve exited unexpectedly (code {code}). Last log lines:\n{handle.log_tail()}")
    finally:
        handle.stop()
        for sig, old in previous.items():
            signal.signal(sig, old)
