"""`specbuild serve`: start tritonserver on the model repository."""

from __future__ import annotations

from pathlib import Path

import click

from specbuild.cli.common import dry_run_option, emit_json, get_spec, json_option, log, spec_option


@click.command("serve")
@spec_option
@click.option("--repo", type=click.Path(file_okay=False, path_type=Path), default=Path("triton_repo"),
              show_default=True, help="The model repository written by `specbuild repo`.")
@click.option("--host", default=None, help="Address to bind (default: the spec's serve.host, loopback).")
@click.option("--http-port", type=click.IntRange(0, 65535), default=None, help="HTTP port (0 = a free one).")
@click.option("--grpc-port", type=click.IntRange(0, 65535), default=None, help="gRPC port (0 = a free one).")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None, help="Metrics port (0 = a free one).")
@click.option("--tritonserver", "tritonserver", default=None,
              help="The tritonserver binary (default: PATH, /opt/tritonserver, or the nvidia-pytriton wheel's).")
@click.option("--allow-model-control", is_flag=True,
              help="Enable the model-control and repository APIs (off by default).")
@click.option("--no-canary", is_flag=True, help="Skip the canary request after the server is ready.")
@click.option("--once", is_flag=True, help="Start, answer the canary, print the endpoints, then stop (smoke test).")
@click.option("--timeout", type=float, default=600.0, show_default=True, help="Seconds to wait for readiness.")
@click.option("--backend", type=click.Choice(["trtllm", "reference", "llmapi"]), default=None,
              help="The repository's backend, checked against its manifest (default: the manifest's).")
@click.option("--server", type=click.Choice(["tritonserver", "trtllm-serve"]), default="tritonserver", show_default=True,
              help="trtllm-serve: TensorRT-LLM's OpenAI-compatible server on `build --backend llmapi`'s arguments "
                   "(GPU; no repository; --http-port is its port).")
@click.option("--trtllm-serve", "trtllm_serve", default=None, help="The trtllm-serve binary (default: PATH).")
@click.option("--nodes", type=click.IntRange(min=1), default=1, show_default=True,
              help="trtllm-serve on several nodes: --dry-run prints the trtllm-llmapi-launch command.")
@click.option("--launcher", type=click.Choice(["srun", "mpirun"]), default="srun", show_default=True,
              help="Multi-node launcher for --nodes > 1.")
@dry_run_option
@json_option
def command(spec_path, repo, host, http_port, grpc_port, metrics_port, tritonserver, allow_model_control, no_canary,
            once, timeout, backend, server, trtllm_serve, nodes, launcher, dry_run, as_json):
    """Start tritonserver on the repository, wait until ready, send a canary request, print the
    endpoints, and serve until SIGINT/SIGTERM (then shut down cleanly).

    \b
    Refuses engines that are not built, or whose recorded TensorRT-LLM / TensorRT / CUDA / GPU
    versions differ from this runtime's. Binds loopback unless --host says otherwise; the
    model-control and repository APIs are disabled unless --allow-model-control.
    An llmapi repository (docs/llmapi.md) is served the same way; --server trtllm-serve starts
    TensorRT-LLM's OpenAI-compatible server on `build --backend llmapi`'s arguments instead (GPU),
    ready when GET /health answers 200; --nodes N --dry-run prints the multi-node command.

    \b
    Exit codes: 0 stopped by a signal (or --once done), 1 error, 2 usage error.
    """
    from specbuild.triton import deploy
    from specbuild.triton.server import ServerHandle

    spec = get_spec(spec_path)
    if server == "trtllm-serve":
        if (backend or "llmapi") != "llmapi":
            raise click.UsageError("--server trtllm-serve serves the LLM API path: use --backend llmapi.")
        from specbuild.llmapi.cli import serve_trtllm

        return serve_trtllm(spec, host, http_port, trtllm_serve, nodes, launcher, timeout, once, dry_run, as_json)
    plan = deploy.plan_serve(spec, repo, host, http_port, grpc_port, metrics_port, tritonserver, allow_model_control)
    if backend is not None and backend != plan.backend:
        from specbuild.errors import ArtifactError

        raise ArtifactError(f"{plan.repo} is a {plan.backend!r} repository, not {backend!r}: write one with "
                            f"`specbuild repo --backend {backend} --out-dir <folder>` and pass --repo.")
    if dry_run:
        document = {"stage": "serve", "dry_run": True, **plan.to_dict()}
        if as_json:
            emit_json(document)
        else:
            import shlex

            click.echo(shlex.join(document["argv"]))
        return
    deploy.check_engines(plan.backend, plan.engines)
    handle = ServerHandle(plan.options, plan.install, log_path=plan.repo.parent / f".{plan.repo.name}.tritonserver.log")
    log(f"starting tritonserver ({plan.install.kind}) on {plan.repo}; log: {handle.log_path}")
    handle.start(timeout=timeout)
    try:
        canary = {} if no_canary else deploy.canary(handle)
    except BaseException:
        handle.stop()
        raise

    def announce() -> None:
        document = {"stage": "serve", "status": "ready", "endpoints": handle.endpoints(), "canary": canary,
                    "repo": str(plan.repo), "backend": plan.backend, "pid": handle.process.pid}
        if as_json:
            emit_json(document)
        else:
            for name, url in handle.endpoints().items():
                click.echo(f"{name:8s} {url}")
        if not once:
            log("serving; press Ctrl-C (or send SIGTERM) to stop")

    if once:
        announce()
        handle.stop()
        return
    deploy.serve_until_signal(handle, announce)
    log("tritonserver stopped")
