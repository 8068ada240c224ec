"""`specbuild deploy`: write a Helm chart that runs the pair on a Kubernetes cluster (docs/kubernetes.md)."""

from __future__ import annotations

from pathlib import Path

import click

from specbuild import backends
from specbuild.cli.common import dry_run_option, emit_json, get_spec, json_option, log, spec_option


@click.command("deploy")
@spec_option
@click.option(
    "--out-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The chart folder to write (default: chart/<spec name>).",
)
@click.option(
    "--backend",
    type=click.Choice(backends.NAMES),
    default=None,
    help="trtllm: engines, two tensorrt_llm models in one Triton server (single node, scaled by replicas). "
    "llmapi: the LLM API path (several nodes with --nodes). reference: the CPU path. Default: the "
    "spec's build.backend, else trtllm (the chart runs on the cluster's GPUs, not on this machine).",
)
@click.option(
    "--nodes",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Nodes per replica (llmapi): more than 1 writes a LeaderWorkerSet running the launcher "
    "`serve --server trtllm-serve --nodes N --dry-run` prints.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Replace a chart this command wrote before from other inputs (never a folder it did not write, "
    "nor one whose files were edited since).",
)
@dry_run_option
@json_option
def command(spec_path, out_dir, backend, nodes, force, dry_run, as_json):
    """Write a Helm chart for the pair: Chart.yaml, values.yaml (every value you change, the spec's
    figures as defaults), values.schema.json and templates/.

    \b
    The chart runs only existing engines: a Job builds the engines into a PersistentVolumeClaim,
    in a folder keyed by the spec, the image and the GPU product (unchanged: nothing is rebuilt);
    a Deployment of `specbuild serve` (the supervisor included) waits for the build's manifests,
    with GPU requests, node affinity on nvidia.com/gpu.product, Triton's health probes and a
    grace period matched to serve's --exit-timeout; a Service, a PodDisruptionBudget, a
    ServiceMonitor or PodMonitor, and an autoscaling/v2 HPA on the BLS's queue through
    prometheus-adapter (or a KEDA ScaledObject). --backend llmapi --nodes N: a LeaderWorkerSet.

    \b
    No command deletes or replaces anything it did not create: an existing folder is replaced
    only when this command wrote it (--force when its inputs changed) and nobody edited it.

    \b
    Exit codes: 0 written or up to date, 1 error (bad spec, a folder it may not replace), 2 usage error.
    """
    from specbuild.deploy import chart

    spec = get_spec(spec_path)
    plan = chart.plan_chart(spec, out_dir, backend, nodes)
    if dry_run:
        if as_json:
            emit_json({"stage": "deploy", "dry_run": True, **plan.to_dict()})
            return
        click.echo(
            f"# would write {plan.out_dir.resolve()} (Helm chart {plan.name}, backend {plan.backend}, "
            f"{plan.nodes} node{'s' if plan.nodes > 1 else ''} per replica):"
        )
        for rel in [*plan.files, "manifest.json"]:
            click.echo(f"  {rel}")
        return
    result = chart.write_chart(plan, force=force)
    if as_json:
        emit_json({"stage": "deploy", **plan.to_dict(), **result})
        return
    state = "up to date (unchanged inputs)" if result["skipped"] else "written"
    click.echo(f"{result['out_dir']}: {state}, Helm chart {plan.name} (backend {plan.backend})")
    if not result["skipped"]:
        log(
            f"next: helm lint {result['out_dir']} && helm install {plan.name} {result['out_dir']} "
            "--set models.existingClaim=<claim with the checkpoints> (docs/kubernetes.md)"
        )
