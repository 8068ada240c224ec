"""What the chart takes from the rest of specbuild, read where each fact already lives (one fact, one place).

Inside the pods (the paths the templates mount; docs/kubernetes.md draws them):
    /etc/specbuild/specbuild.toml   the spec, from values.yaml's `spec` (a ConfigMap)
    /models                         the Hugging Face checkpoints (an existing claim, read-only)
    /work                           the engines claim's folder for this build key (sub-path <key>): output_dir is
                                    /work/engines, as in docker/compose.yaml where the repository root is /work
    /engines                        the same claim's <key>/engines, where a trtllm repository names its engines
                                    (`specbuild repo`'s default --engines-dir for the GPU image)
    /run/specbuild                  an emptyDir per pod: the model repository `specbuild repo` writes at pod start,
                                    the server log and the supervisor's metrics file beside it
"""

from __future__ import annotations

import dataclasses
from pathlib import Path, PurePosixPath
from typing import Any

from specbuild import paths
from specbuild.config import GPUS, Spec
from specbuild.contract.images import TRITON_IMAGE
from specbuild.triton import openai_frontend
from specbuild.triton.server import ServerOptions
from specbuild.triton.supervisor import SupervisorSettings

SPEC_DIR = PurePosixPath("/etc/specbuild")
SPEC_FILE = SPEC_DIR / "specbuild.toml"
MODELS_DIR = PurePosixPath("/models")
WORK_DIR = PurePosixPath("/work")
OUTPUT_DIR = WORK_DIR / "engines"
ENGINES_DIR = PurePosixPath("/engines")
RUN_DIR = PurePosixPath("/run/specbuild")
REPO_DIR = RUN_DIR / "triton_repo"
HOSTFILE = RUN_DIR / "hostfile"
RSH_AGENT = PurePosixPath("/etc/specbuild/mpi/kubessh")  # the chart's ConfigMap: mpirun's way to a worker pod
# A worker pod idles until the group ends: its ranks are started in it by the leader's mpirun, through RSH_AGENT.
WORKER_COMMAND = ["/bin/sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"]

# ServerHandle.stop (specbuild.triton.server): SIGTERM, then SIGKILL exit_timeout_s + 5 s later.
SERVER_KILL_AFTER_S = 5
# serve on SIGTERM: the drain waits up to --exit-timeout, then tritonserver gets as long again to stop (its
# --exit-timeout-secs), then SIGKILL after SERVER_KILL_AFTER_S. The pod's grace period covers all of it, plus this.
GRACE_MARGIN_S = 5

DEFAULT_EXIT_TIMEOUT_S = ServerOptions.exit_timeout_s
OPENAI_PORT = openai_frontend.DEFAULT_PORT  # `serve --server openai`: NVIDIA's frontend's /v1, /metrics, /health/ready
SUPERVISOR = SupervisorSettings()

# The `nvidia.com/gpu.product` label NVIDIA's GPU Feature Discovery puts on a node is the NVML product name with
# spaces as dashes (NVIDIA/k8s-device-plugin, GPU Feature Discovery). One spec GPU name can be several products
# (SXM and PCIe boards): each is listed; values.yaml's gpu.productLabels replaces the list for a cluster whose
# labels differ (`kubectl get nodes -L nvidia.com/gpu.product` shows them).
GPU_PRODUCT_LABELS: dict[str, tuple[str, ...]] = {
    "H100-80GB": ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe"),
    "H100-94GB": ("NVIDIA-H100-NVL",),
    "H200": ("NVIDIA-H200", "NVIDIA-H200-NVL"),
    "H20": ("NVIDIA-H20",),
    "GH200": ("NVIDIA-GH200-480GB",),
    "B200": ("NVIDIA-B200",),
    "A100-80GB": ("NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe"),
    "A100-40GB": ("NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB"),
    "A10G": ("NVIDIA-A10G",),
    "L4": ("NVIDIA-L4",),
    "L40S": ("NVIDIA-L40S",),
    "RTX-4090": ("NVIDIA-GeForce-RTX-4090",),
    "RTX-6000-ADA": ("NVIDIA-RTX-6000-Ada-Generation",),
}
assert set(GPU_PRODUCT_LABELS) == set(GPUS), "every GPU of specbuild.config.GPUS needs its product labels"

# The images docker/ builds (docker/compose.yaml's names), on NVIDIA's Triton image (contract.images) for the GPU
# paths; push them to a registry the cluster reads and set image.repository / image.tag.
IMAGES = {"trtllm": "specbuild-gpu", "llmapi": "specbuild-llmapi", "reference": "specbuild-cpu"}
TRITON_IMAGE_FULL = TRITON_IMAGE
TRITON_TAG = TRITON_IMAGE.rpartition(":")[2]


def container_spec(spec: Spec) -> Spec:
    """The spec as the pods see it: checkpoints under /models (by folder name, `<role>-<name>` when both share
    one), output_dir /work/engines, the server bound on every interface of the pod."""
    names = {role: spec.role(role).checkpoint.name for role in spec.roles}
    if len(set(names.values())) < len(names):
        names = {role: f"{role}-{name}" for role, name in names.items()}
    models = {
        role: dataclasses.replace(spec.role(role), checkpoint=Path(str(MODELS_DIR / names[role])))
        for role in spec.roles
    }
    return dataclasses.replace(
        spec,
        output_dir=Path(str(OUTPUT_DIR)),
        path=Path(str(SPEC_FILE)),
        serve=dataclasses.replace(spec.serve, host="0.0.0.0"),
        **models,
    )


def build_outputs(cspec: Spec, backend: str) -> list[str]:
    """The manifest.json files the serving pods wait for: each is written last, when its stage's folder is complete
    and renamed into place (specbuild.artifacts), so their presence means the build finished."""
    folders = paths.for_backend(backend).build_outputs(cspec)
    return [str(PurePosixPath(str(folder)) / "manifest.json") for folder in folders]


def build_command(backend: str) -> list[str]:
    """The build Job's argv: every stage up to the engines (check, convert, build), skipping what is up to date."""
    return ["specbuild", "up", "-c", str(SPEC_FILE), "--backend", backend, "--until", "build", "--json"]


def repo_command(backend: str) -> list[str]:
    """The serving pod's init step: the model repository in the pod's own emptyDir, on the built engines."""
    argv = ["specbuild", "repo", "-c", str(SPEC_FILE), "--backend", backend, "--out-dir", str(REPO_DIR)]
    return argv + paths.for_backend(backend).repo_argv_extra(backend, Path(str(ENGINES_DIR)))


def serve_command(backend: str) -> list[str]:
    """`specbuild serve` in the pod, the fixed part; ports and timeouts follow from values.yaml in the template."""
    return [
        "specbuild",
        "serve",
        "-c",
        str(SPEC_FILE),
        "--repo",
        str(REPO_DIR),
        "--backend",
        backend,
        "--host",
        "0.0.0.0",
    ]


def supervisor_metrics_file() -> str:
    """Where serve's supervisor writes its metrics file for the repository at REPO_DIR (Supervisor.for_repo)."""
    return str(RUN_DIR / f".{REPO_DIR.name}.supervisor.prom")


def multi_node_launch(cspec: Spec, nodes: int, port: int) -> list[str]:
    """The leader's command for the LLM API path on `nodes` nodes: what `specbuild serve --server trtllm-serve
    --nodes N --launcher mpirun --dry-run` prints, its hostfile the one the leader writes from LeaderWorkerSet's
    addresses."""
    from specbuild.llmapi import trtllm_serve

    command = trtllm_serve.plan(
        cspec, "trtllm-serve", "0.0.0.0", port, nodes=nodes, launcher="mpirun", require_built=False
    )
    launch = [str(HOSTFILE) if arg == "<hostfile>" else arg for arg in command.launch]
    # mpirun starts the workers' ranks with `kubectl exec` (Open MPI's plm_rsh_agent), as NVIDIA's multi-node
    # Triton example in LWS (docs/examples/tensorrt-llm, server.py: `-mca plm_rsh_agent kubessh`): no sshd.
    return launch[:1] + ["-mca", "plm_rsh_agent", str(RSH_AGENT)] + launch[1:]


def grace_seconds(exit_timeout_s: int) -> int:
    """terminationGracePeriodSeconds for serve's --exit-timeout (the template computes the same, from values)."""
    return 2 * exit_timeout_s + SERVER_KILL_AFTER_S + GRACE_MARGIN_S


def facts(spec: Spec, backend: str, nodes: int) -> dict[str, Any]:
    """Everything the chart's defaults take from specbuild, in one record (what --dry-run --json shows)."""
    cspec = container_spec(spec)
    record: dict[str, Any] = {
        "backend": backend,
        "nodes": nodes,
        "container_spec": cspec,
        "build_command": build_command(backend),
        "build_outputs": build_outputs(cspec, backend),
        "repo_command": repo_command(backend),
        "serve_command": serve_command(backend),
        "supervisor_metrics_file": supervisor_metrics_file(),
        "world_size": spec.build.tp_size * spec.build.pp_size,
    }
    if nodes > 1:
        record["launch"] = multi_node_launch(cspec, nodes, spec.serve.http_port)
    return record
