"""`specbuild serve`: start tritonserver on the model repository."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import click

from specbuild import backends, paths
from specbuild.artifacts import default_repo_dir
from specbuild.cli.common import dry_run_option, emit_json, get_spec, json_option, log, spec_option, timed_option
from specbuild.triton.server import RESTRICTED_APIS, ServerOptions
from specbuild.triton.supervisor import SupervisorSettings

DEFAULTS = SupervisorSettings()  # the library's defaults, shared with `specbuild up`


@click.command("serve")
@spec_option
@click.option(
    "--repo",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The model repository written by `specbuild repo` or `up` (default: triton_repo beside the "
    "spec's output_dir, where they write it).",
)
@click.option("--host", default=None, help="Address to bind (default: the spec's serve.host, loopback).")
@click.option("--http-port", type=click.IntRange(0, 65535), default=None, help="HTTP port (0 = a free one).")
@click.option("--grpc-port", type=click.IntRange(0, 65535), default=None, help="gRPC port (0 = a free one).")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None, help="Metrics port (0 = a free one).")
@click.option(
    "--tritonserver",
    "tritonserver",
    default=None,
    help="The tritonserver binary (default: PATH, /opt/tritonserver, or the nvidia-pytriton wheel's).",
)
@click.option(
    "--allow-model-control",
    is_flag=True,
    help="Open the model-repository API (load/unload) to every client; same as --allow-api model-repository.",
)
@click.option(
    "--allow-api",
    "allow_apis",
    multiple=True,
    type=click.Choice(RESTRICTED_APIS),
    help=f"Open this restricted API to every client (repeatable). Restricted by default: {', '.join(RESTRICTED_APIS)}.",
)
@click.option("--no-canary", is_flag=True, help="Skip the canary request after the server is ready.")
@click.option("--once", is_flag=True, help="Start, answer the canary, print the endpoints, then stop (smoke test).")
@click.option(
    "--timeout", type=float, default=DEFAULTS.start_timeout_s, show_default=True, help="Seconds to wait for readiness."
)
@click.option(
    "--exit-timeout",
    type=click.IntRange(1, 3600),
    default=ServerOptions.exit_timeout_s,
    show_default=True,
    help="On SIGINT/SIGTERM the drain waits this long for running requests to finish (then cuts "
    "them: exit 1); tritonserver then gets as long to stop (its --exit-timeout-secs; killed 5 s "
    "after that). With --server trtllm-serve: killed after this many seconds if given, else after 60.",
)
@click.option("--no-supervise", is_flag=True, help="Do not watch the models or recover them (see docs/triton.md).")
@click.option(
    "--canary-interval",
    type=click.FloatRange(min=0),
    default=DEFAULTS.canary_interval_s,
    show_default=True,
    help="Seconds between the supervisor's canary requests through the BLS (llmapi: tensorrt_llm; 0 = none).",
)
@click.option(
    "--max-restarts",
    type=click.IntRange(min=0),
    default=DEFAULTS.max_restarts,
    show_default=True,
    help="Server restarts the supervisor may make within 10 minutes; one more and serve gives up "
    "(exit 1, the server log named).",
)
@click.option(
    "--backend",
    type=click.Choice(backends.NAMES),
    default=None,
    help="The repository's backend, checked against its manifest (default: the manifest's).",
)
@click.option(
    "--server",
    type=click.Choice(["tritonserver", "trtllm-serve", "openai"]),
    default="tritonserver",
    show_default=True,
    help="trtllm-serve: TensorRT-LLM's OpenAI-compatible server on `build --backend llmapi`'s arguments "
    "(GPU; no repository; --http-port is its port). openai: NVIDIA's OpenAI-compatible Triton frontend on the "
    "engine path's repository (GPU image; /v1 on --openai-port, KServe HTTP and gRPC on --http-port / "
    "--grpc-port; no supervisor, no drain).",
)
@click.option(
    "--trtllm-serve",
    "trtllm_serve",
    default=None,
    help="The trtllm-serve binary (default: PATH); `stand-in`: specbuild's CPU stand-in with the same OpenAI API "
    "(the stand-in LLM; response_format included).",
)
@click.option(
    "--openai-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="--server openai: the OpenAI API's port (default: 9000, the frontend's).",
)
@click.option(
    "--openai-frontend",
    "openai_frontend",
    default=None,
    metavar="MAIN_PY",
    help="--server openai: NVIDIA's frontend main.py (default: $SPECBUILD_OPENAI_FRONTEND, else the Triton "
    "image's /opt/tritonserver/python/openai/openai_frontend/main.py).",
)
@click.option(
    "--nodes",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="trtllm-serve on several nodes: --dry-run prints the trtllm-llmapi-launch command.",
)
@click.option(
    "--launcher",
    type=click.Choice(["srun", "mpirun"]),
    default="srun",
    show_default=True,
    help="Multi-node launcher for --nodes > 1.",
)
@timed_option
@dry_run_option
@json_option
def command(
    spec_path,
    repo,
    host,
    http_port,
    grpc_port,
    metrics_port,
    tritonserver,
    allow_model_control,
    allow_apis,
    no_canary,
    once,
    timeout,
    exit_timeout,
    no_supervise,
    canary_interval,
    max_restarts,
    backend,
    server,
    trtllm_serve,
    openai_port,
    openai_frontend,
    nodes,
    launcher,
    timed,
    dry_run,
    as_json,
):
    """Start tritonserver on the repository, wait until ready, send a canary request, print the
    endpoints, and serve until SIGINT/SIGTERM (then shut down cleanly).

    \b
    Refuses engines that are not built, or whose recorded TensorRT-LLM / TensorRT / CUDA / GPU
    versions differ from this runtime's, and ports that are already in use. Binds loopback unless
    --host says otherwise. Only inference, health, metadata and model config are open to clients;
    the other APIs need --allow-api (or --allow-model-control).
    An llmapi repository (docs/llmapi.md) is served and supervised the same way; --server
    trtllm-serve starts TensorRT-LLM's OpenAI-compatible server on `build --backend llmapi`'s
    arguments instead (GPU), ready when GET /health answers 200; --nodes N --dry-run prints the
    multi-node command.

    \b
    While serving, a supervisor reloads a model whose process died or hung (frozen, or "not
    healthy" to Triton while its process lives: killed first), or restarts tritonserver when a
    reload cannot help (a decoupled model such as the BLS, the server itself dead or frozen,
    failed canaries); each event is logged and counted in .<repo>.supervisor.prom beside the
    repository.

    \b
    SIGINT/SIGTERM drains first: the serving gate closes, so readiness turns false at once and
    new requests are refused at once with UNAVAILABLE (clients retry elsewhere), while every
    running request finishes through the models it calls (both repository kinds); then the
    entry models unload and tritonserver stops. The drain waits up to --exit-timeout, then cuts what is left (exit 1,
    the count said); a second SIGINT/SIGTERM stops at once.

    \b
    Exit codes: 0 stopped by a signal (or --once done), 1 error (a failed stop included), 2 usage error.
    """
    from specbuild.triton import serve_plan
    from specbuild.triton.supervisor import Supervisor

    spec = get_spec(spec_path)
    repo = repo or default_repo_dir(spec.output_dir)
    if server == "trtllm-serve":
        if backend is not None and not paths.for_backend(backend).trtllm_serve:
            raise click.UsageError("--server trtllm-serve serves the LLM API path: use --backend llmapi.")
        _refuse_tritonserver_only_options()
        return serve_trtllm(
            spec,
            host,
            http_port,
            trtllm_serve,
            nodes,
            launcher,
            timeout,
            once,
            dry_run,
            as_json,
            stop_timeout=exit_timeout if _given("exit_timeout") else None,
        )
    if server == "openai":
        if backend is not None and not paths.for_backend(backend).openai_frontend:
            raise click.UsageError("--server openai serves the engine path's repository (its BLS).")
        _refuse_tritonserver_only_options("--server openai (NVIDIA's process)")
        return serve_openai(
            spec,
            repo,
            host,
            (http_port, grpc_port, openai_port),
            openai_frontend,
            timeout,
            once,
            dry_run,
            as_json,
            stop_timeout=exit_timeout if _given("exit_timeout") else None,
        )
    plan = serve_plan.plan_serve(
        spec,
        repo,
        host,
        http_port,
        grpc_port,
        metrics_port,
        tritonserver,
        allow_model_control,
        allow_apis,
        exit_timeout,
    )
    if backend is not None and backend != plan.backend:
        from specbuild.errors import ArtifactError

        raise ArtifactError(
            f"{plan.repo} is a {plan.backend!r} repository, not {backend!r}: write one with "
            f"`specbuild repo --backend {backend} --out-dir <folder>` and pass --repo."
        )
    if timed and backends.get(plan.backend).builder == "trtllm-build":
        raise click.UsageError(
            f"--timed shapes the reference models' timing; {plan.repo} serves TensorRT-LLM engines, which take "
            "their own time. Serve a reference repository (`specbuild repo --backend reference`)."
        )
    if dry_run:
        document = {"stage": "serve", "dry_run": True, **plan.to_dict(), "timed_stand_in": timed}
        if as_json:
            emit_json(document)
        else:
            import shlex

            click.echo(shlex.join(document["argv"]))
        return
    serve_plan.check_engines(plan.backend, plan.engines)
    settings = SupervisorSettings(
        enabled=not no_supervise, canary_interval_s=canary_interval, start_timeout_s=timeout, max_restarts=max_restarts
    )
    supervisor = Supervisor.for_repo(plan.options, plan.install, settings, log=log)
    handle = supervisor.handle
    log(f"starting tritonserver ({plan.install.kind}) on {plan.repo}; log: {handle.log_path}")
    if timed:
        log(f"timed stand-ins: the models wait out {timed!r} per step (SPECBUILD_STANDIN_TIMING)")

    def announce(canary: dict[str, str]) -> None:
        document = {
            "stage": "serve",
            "status": "ready",
            "endpoints": handle.endpoints(),
            "canary": canary,
            "repo": str(plan.repo),
            "backend": plan.backend,
            "timed_stand_in": timed,
            "pid": handle.process.pid,
            "log": str(handle.log_path),
            "supervisor_metrics": str(supervisor.metrics.path),
        }
        if as_json:
            emit_json(document)
        else:
            for name, url in handle.endpoints().items():
                click.echo(f"{name:8s} {url}")
        if not once:
            log("serving; press Ctrl-C (or send SIGTERM) to stop")

    outcome = supervisor.serve(announce, once=once, canary_models=not no_canary)
    took = f" ({outcome['stop']['seconds']} s)" if "stop" in outcome else ""
    log(f"tritonserver stopped{took}: the endpoints above no longer answer")


def _given(name: str) -> bool:
    """The option was on the command line (or in the environment), not left at its default."""
    source = click.get_current_context().get_parameter_source(name)
    return source not in (None, click.core.ParameterSource.DEFAULT)


def _refuse_tritonserver_only_options(server: str = "--server trtllm-serve") -> None:
    """The supervisor and Triton's restricted APIs belong to specbuild's tritonserver; the other servers have neither."""
    flags = {
        "allow_apis": "--allow-api",
        "no_supervise": "--no-supervise",
        "canary_interval": "--canary-interval",
        "max_restarts": "--max-restarts",
    }
    given = [flag for name, flag in flags.items() if _given(name)]
    if given:
        raise click.UsageError(
            f"{', '.join(given)}: for tritonserver (Triton's restricted APIs, the supervisor); {server} has neither."
        )


def serve_trtllm(
    spec,
    host: str | None,
    port: int | None,
    binary: str | None,
    nodes: int,
    launcher: str,
    timeout: float,
    once: bool,
    dry_run: bool,
    as_json: bool,
    stop_timeout: float | None = None,
) -> None:
    """trtllm-serve in the foreground until SIGINT/SIGTERM (or --once: until healthy, then stop). A stop
    kills it after stop_timeout seconds (None: the handle's default)."""
    from specbuild.llmapi import trtllm_serve

    if dry_run:
        program = trtllm_serve.stand_in_command() if binary == trtllm_serve.STAND_IN else binary or "trtllm-serve"
        command = trtllm_serve.plan(spec, program, host, port, nodes, launcher, require_built=False)
        document: dict[str, Any] = {"stage": "serve", "dry_run": True, **command.to_dict()}
        if as_json:
            emit_json(document)
        else:
            click.echo(shlex.join(command.launch or command.argv))
            if command.end_ids_hint():
                log(command.end_ids_hint())
        return
    if nodes > 1:
        raise click.UsageError(
            "--nodes > 1 starts on a cluster: print the command with --dry-run and run it with "
            "your scheduler (srun / mpirun)."
        )
    command = trtllm_serve.plan(spec, trtllm_serve.find_trtllm_serve(binary), host, port)
    handle = trtllm_serve.TrtllmServeHandle(
        command, log_path=spec.pair_dir / ".trtllm-serve.log", stop_timeout=stop_timeout
    )
    what = "specbuild's trtllm-serve stand-in" if binary == trtllm_serve.STAND_IN else "trtllm-serve"
    log(f"starting {what} on {command.options_file.parent}; log: {handle.log_path}")
    handle.start(timeout=timeout)
    document = {
        "stage": "serve",
        "status": "ready",
        "server": "trtllm-serve",
        "endpoints": {"http": command.health_url.removesuffix(trtllm_serve.contract.SERVE_HEALTH)},
        "pid": handle.process.pid if handle.process else None,
        "end_id": command.end_id,
        "stop_token_ids": command.stop_token_ids,
    }
    lines = [f"http     {document['endpoints']['http']}  (OpenAI-compatible)", command.end_ids_hint()]
    _serve_foreground(handle, document, lines, once, as_json)


def serve_openai(
    spec,
    repo,
    host: str | None,
    asked_ports: tuple[int | None, int | None, int | None],
    main_py: str | None,
    timeout: float,
    once: bool,
    dry_run: bool,
    as_json: bool,
    stop_timeout: float | None = None,
) -> None:
    """NVIDIA's OpenAI-compatible frontend on the repository, in the foreground until SIGINT/SIGTERM (--once: until
    ready, then stop). asked_ports: KServe HTTP, KServe gRPC, OpenAI (None: the spec's, the frontend's). A stop
    kills it after stop_timeout seconds (None: the handle's default)."""
    from pathlib import Path

    from specbuild.llmapi.trtllm_serve import TrtllmServeHandle
    from specbuild.triton import openai_frontend

    repo = Path(repo).resolve()
    host = host or spec.serve.host
    http_port, grpc_port, port = asked_ports
    ports = (
        spec.serve.http_port if http_port is None else http_port,
        spec.serve.grpc_port if grpc_port is None else grpc_port,
    )
    if dry_run:
        command = openai_frontend.plan(repo, main_py or openai_frontend.IMAGE_FRONTEND, host, port, *ports)
        if as_json:
            emit_json({"stage": "serve", "dry_run": True, **command.to_dict()})
        else:
            click.echo(shlex.join(command.argv))
        return
    command = openai_frontend.plan(repo, openai_frontend.find_frontend(main_py), host, port, *ports)
    handle = TrtllmServeHandle(
        command,
        log_path=repo.parent / f".{repo.name}.openai.log",
        stop_timeout=stop_timeout,
        name="the OpenAI frontend",
    )
    log(f"starting NVIDIA's OpenAI frontend on {repo}; log: {handle.log_path}")
    handle.start(timeout=timeout)
    document = {
        "stage": "serve",
        "status": "ready",
        "pid": handle.process.pid if handle.process else None,
        **command.to_dict(),
    }
    _serve_foreground(handle, document, [f"openai   {command.base_url}  (model {document['model']})"], once, as_json)


def _serve_foreground(handle, document: dict[str, Any], lines: list[str | None], once: bool, as_json: bool) -> None:
    """A server process that is ready: its document (--json) or lines, then until a signal (--once: stopped at once)."""
    if as_json:
        emit_json(document)
    else:
        for line in lines:
            if line:
                click.echo(line)
    if once:
        handle.stop()
        return
    _until_signal(handle)
    log(f"{handle.name} stopped")


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
                raise ServeError(
                    f"{handle.name} exited unexpectedly (code {code}). Last log lines:\n{handle.log_tail()}"
                )
    finally:
        handle.stop()
        for sig, old in previous.items():
            signal.signal(sig, old)
