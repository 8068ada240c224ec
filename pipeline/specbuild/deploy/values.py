"""values.yaml (every value a user changes, the spec's figures as defaults) and values.schema.json (what Helm
refuses before rendering: Helm validates the values against the schema on lint, template, install and upgrade)."""

from __future__ import annotations

from typing import Any

from specbuild import backends, paths
from specbuild.config import Spec
from specbuild.deploy import facts as f
from specbuild.triton.models.bls_metrics import QUEUE_GAUGES

# The autoscaling signal: requests the BLS has received and not yet started (a gauge, per pod). Triton's own queue
# metrics do not track this repository's load: the BLS is decoupled and takes every request at once, so
# nv_inference_queue_duration_us stays near zero while requests wait inside it (specbuild.triton.models.bls_metrics).
QUEUE_METRIC = "specbuild_bls_queue_depth"
assert QUEUE_METRIC in QUEUE_GAUGES

# A Kubernetes quantity (k8s.io/apimachinery pkg/api/resource/quantity.go: <number><suffix>, binary or decimal
# suffixes, or an exponent).
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE][-+]?[0-9]+)?$"


def default_values(spec: Spec, backend: str, nodes: int, spec_text: str) -> dict[str, Any]:
    record = f.facts(spec, backend, nodes)
    gpu = backends.get(backend).gpu
    per_pod = max(1, record["world_size"] // nodes) if nodes > 1 else spec.gpu.count
    s = spec.serve
    queue_target = max(1, spec.build.max_batch_size * s.bls_instance_count)  # one batch waiting per pod
    values: dict[str, Any] = {
        "backend": backend,
        "image": {"repository": f.IMAGES[backend], "tag": "latest", "pullPolicy": "IfNotPresent"},
        "imagePullSecrets": [],
        "replicas": 1,
        "nodes": nodes,
        "gpu": {
            "enabled": gpu,
            "name": spec.gpu.name if spec.gpu.name in f.GPU_PRODUCT_LABELS else "",
            "count": per_pod,
            "resource": "nvidia.com/gpu",
            "productLabels": [],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
        "models": {"existingClaim": "", "subPath": ""},
        "storage": {
            "existingClaim": "",
            "storageClassName": "",
            "size": "200Gi" if gpu else "5Gi",
            "accessModes": ["ReadWriteMany"],
        },
        "build": {
            "enabled": True,
            "backoffLimit": 1,
            "activeDeadlineSeconds": 21600,
            "command": record["build_command"],
            "waitFor": record["build_outputs"],
        },
        "ports": {"http": s.http_port, "grpc": s.grpc_port, "metrics": s.metrics_port},
        "openai": {"enabled": False, "port": f.OPENAI_PORT},
        "serve": {
            "exitTimeoutSeconds": f.DEFAULT_EXIT_TIMEOUT_S,
            "startTimeoutSeconds": int(f.SUPERVISOR.start_timeout_s),
            "maxRestarts": f.SUPERVISOR.max_restarts,
            "canaryIntervalSeconds": int(f.SUPERVISOR.canary_interval_s),
            "repoCommand": record["repo_command"],
            "command": record["serve_command"],
            "supervisorMetricsFile": record["supervisor_metrics_file"],
        },
        "shmSize": "4Gi" if gpu else "1Gi",
        "resources": {
            "requests": {"cpu": "4" if gpu else "1", "memory": "32Gi" if gpu else "4Gi"},
            "limits": {"memory": "64Gi" if gpu else "8Gi"},
        },
        "probes": {
            "periodSeconds": 10,
            "startupFailureThreshold": 180,
            "readinessFailureThreshold": 3,
            "livenessFailureThreshold": 3,
        },
        "service": {"type": "ClusterIP"},
        "podDisruptionBudget": {"enabled": True, "maxUnavailable": 1},
        "monitoring": {"kind": "ServiceMonitor", "interval": "15s", "labels": {}},
        "autoscaling": {
            "engine": "hpa" if paths.for_backend(backend).queue_metric else "none",
            "minReplicas": 1,
            "maxReplicas": 4,
            "metric": QUEUE_METRIC,
            "targetAverageValue": str(queue_target),
            "keda": {"serverAddress": "http://prometheus-operated.monitoring.svc:9090", "threshold": str(queue_target)},
        },
        "multiNode": {"launch": record.get("launch", []), "workerCommand": list(f.WORKER_COMMAND), "waitSeconds": 1800},
        "spec": spec_text,
    }
    return values


COMMENTS = {
    "backend": "trtllm: engines in one Triton server (orchestrator mode, single node; scale by replicas).\n"
    "llmapi: TensorRT-LLM's LLM API; nodes > 1 runs trtllm-serve across nodes (LeaderWorkerSet).\n"
    "reference: the CPU path (no GPU).",
    "image": "The image docker/ builds for this backend, pushed where the cluster can pull it.",
    "imagePullSecrets": "Secrets for a private registry: [{name: my-registry}].",
    "replicas": "Serving replicas (each a whole server). With autoscaling it is the HPA's starting point.",
    "nodes": "Nodes per replica: 1 = a Deployment; more = a LeaderWorkerSet of that size (llmapi only).",
    "gpu": "GPUs per pod (nodes = 1: tp x pp, plus the draft's own; nodes > 1: tp x pp / nodes).",
    "gpu.name": "The spec's [gpu] name: the nodes are chosen by their nvidia.com/gpu.product label.",
    "gpu.productLabels": "nvidia.com/gpu.product values to accept instead of those known for gpu.name.",
    "models": "An existing claim holding the Hugging Face checkpoints, mounted read-only at /models\n"
    "(the spec below names them /models/<folder>).",
    "storage": "The engines claim (one folder per build key: spec, image and GPU). ReadWriteMany lets\n"
    "replicas on several nodes read it; existingClaim uses yours instead of creating one.",
    "build": "The Job that converts and builds (specbuild up --until build); serving pods wait for waitFor.",
    "ports": "Triton's ports inside the pod and on the Service (spec [serve]).",
    "openai": "enabled: serve with NVIDIA's OpenAI-compatible Triton frontend (`serve --server openai`, engine path,\n"
    "one node): /v1 and /metrics on port, KServe on ports.http / ports.grpc; NVIDIA's process has no drain,\n"
    "supervisor or canary (probes read its /health/ready). The image must hold the frontend (docs/kubernetes.md).",
    "serve": "specbuild serve's options: the drain on SIGTERM waits exitTimeoutSeconds (the pod's grace\n"
    "period is 2 x that + 10 s); the supervisor gives up after maxRestarts restarts in 10 minutes.",
    "shmSize": "/dev/shm (memory): the Python backend's shared-memory regions.",
    "resources": "CPU and memory of the serving container (GPUs come from gpu.count).",
    "probes": "Startup waits up to periodSeconds x startupFailureThreshold for Triton's /v2/health/ready.",
    "podDisruptionBudget": "Voluntary disruptions (node drains) take at most this many replicas at once.",
    "monitoring": "ServiceMonitor, PodMonitor (prometheus-operator) or none, for the metrics port.",
    "autoscaling": "hpa: autoscaling/v2 on the metric prometheus-adapter serves (prometheus-adapter-values.yaml);\n"
    "keda: a KEDA ScaledObject querying Prometheus; none.",
    "multiNode": "nodes > 1: the leader waits up to waitSeconds for its workers' pods to run, then runs launch\n"
    "(`specbuild serve --server trtllm-serve --nodes N --launcher mpirun --dry-run`), whose mpirun\n"
    "starts the workers' ranks with kubectl exec (the chart's Role allows it); workers idle meanwhile.",
    "spec": "The spec as the pods read it. The build key hashes it: change it and a new build runs.",
}


def schema(spec_gpus: list[str]) -> dict[str, Any]:
    """values.schema.json: types, bounds and names, each refused by Helm with the value's path in the message."""
    integer = lambda minimum: {"type": "integer", "minimum": minimum}  # noqa: E731
    quantity = {"type": "string", "pattern": QUANTITY_PATTERN}
    argv = {"type": "array", "items": {"type": "string"}}
    port = {"type": "integer", "minimum": 1, "maximum": 65535}
    obj = lambda props, required=None: {  # noqa: E731
        "type": "object",
        "additionalProperties": False,
        "properties": props,
        "required": required or list(props),
    }
    return {
        "$schema": "https://json-schema.org/draft-07/schema#",
        "title": "specbuild chart values",
        **obj(
            {
                "backend": {"enum": list(backends.NAMES)},
                "image": obj(
                    {
                        "repository": {"type": "string", "minLength": 1},
                        "tag": {"type": "string", "minLength": 1},
                        "pullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]},
                    }
                ),
                "imagePullSecrets": {"type": "array", "items": obj({"name": {"type": "string"}})},
                "replicas": integer(1),
                "nodes": integer(1),
                "gpu": obj(
                    {
                        "enabled": {"type": "boolean"},
                        "name": {"enum": ["", *spec_gpus]},
                        "count": integer(0),
                        "resource": {"type": "string"},
                        "productLabels": {"type": "array", "items": {"type": "string"}},
                        "tolerations": {"type": "array", "items": {"type": "object"}},
                    }
                ),
                "models": obj({"existingClaim": {"type": "string"}, "subPath": {"type": "string"}}),
                "storage": obj(
                    {
                        "existingClaim": {"type": "string"},
                        "storageClassName": {"type": "string"},
                        "size": quantity,
                        "accessModes": {
                            "type": "array",
                            "minItems": 1,
                            "items": {"enum": ["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"]},
                        },
                    }
                ),
                "build": obj(
                    {
                        "enabled": {"type": "boolean"},
                        "backoffLimit": integer(0),
                        "activeDeadlineSeconds": integer(1),
                        "command": argv,
                        "waitFor": argv,
                    }
                ),
                "ports": obj({"http": port, "grpc": port, "metrics": port}),
                "openai": obj({"enabled": {"type": "boolean"}, "port": port}),
                "serve": obj(
                    {
                        "exitTimeoutSeconds": {"type": "integer", "minimum": 1, "maximum": 3600},
                        "startTimeoutSeconds": integer(1),
                        "maxRestarts": integer(0),
                        "canaryIntervalSeconds": integer(0),
                        "repoCommand": argv,
                        "command": argv,
                        "supervisorMetricsFile": {"type": "string"},
                    }
                ),
                "shmSize": quantity,
                "resources": {"type": "object"},
                "probes": obj(
                    {
                        "periodSeconds": integer(1),
                        "startupFailureThreshold": integer(1),
                        "readinessFailureThreshold": integer(1),
                        "livenessFailureThreshold": integer(1),
                    }
                ),
                "service": obj({"type": {"enum": ["ClusterIP", "NodePort", "LoadBalancer"]}}),
                "podDisruptionBudget": obj({"enabled": {"type": "boolean"}, "maxUnavailable": integer(1)}),
                "monitoring": obj(
                    {
                        "kind": {"enum": ["ServiceMonitor", "PodMonitor", "none"]},
                        "interval": {"type": "string", "pattern": r"^[0-9]+(ms|s|m|h)$"},
                        "labels": {"type": "object"},
                    }
                ),
                "autoscaling": obj(
                    {
                        "engine": {"enum": ["hpa", "keda", "none"]},
                        "minReplicas": integer(1),
                        "maxReplicas": integer(1),
                        "metric": {"type": "string", "minLength": 1},
                        "targetAverageValue": quantity,
                        "keda": obj({"serverAddress": {"type": "string"}, "threshold": quantity}),
                    }
                ),
                "multiNode": obj({"launch": argv, "workerCommand": argv, "waitSeconds": integer(1)}),
                "spec": {"type": "string", "minLength": 1},
            }
        ),
    }
