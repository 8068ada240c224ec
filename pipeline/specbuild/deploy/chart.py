"""The chart's files: the static templates shipped in `chart/`, and what the spec fills in (Chart.yaml, values.yaml,
values.schema.json, gpu-products.json, prometheus-adapter-values.yaml), written as one folder.

The folder is written through `specbuild.artifacts.stage_output` (stage "deploy"): a folder this command did not
write is never replaced, not even with --force. Its own earlier chart is left alone when the inputs are unchanged,
replaced only with --force when they changed, and never when a file in it was edited since (values.yaml is meant
to be copied and changed, or overridden with `helm install -f`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from specbuild import __version__, backends, paths, yamltext
from specbuild.artifacts import claim_output, combined_hash, read_manifest, resolve_output, stage_output
from specbuild.config import SECTIONS, Spec
from specbuild.deploy import facts, values
from specbuild.errors import ArtifactError, SpecError

STAGE = "deploy"
CHART_ROOT = "chart"  # the static files, inside this package
DEFAULT_PARENT = Path("chart")  # `deploy` writes chart/<spec name> unless told


@dataclass
class ChartPlan:
    out_dir: Path
    name: str
    backend: str
    nodes: int
    files: dict[str, str]  # relative path -> text
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def input_hash(self) -> str:
        return combined_hash(self.files)

    def to_dict(self) -> dict[str, Any]:
        shown = {k: (v.to_dict() if isinstance(v, Spec) else v) for k, v in self.facts.items()}
        return {
            "out_dir": str(self.out_dir),
            "chart": self.name,
            "backend": self.backend,
            "nodes": self.nodes,
            "files": sorted(self.files),
            "facts": shown,
        }


def chart_name(spec_name: str) -> str:
    """Helm's chart names: lower-case letters, digits and dashes."""
    name = re.sub(r"[^a-z0-9-]+", "-", spec_name.lower()).strip("-")
    return name or "specbuild"


def default_out_dir(spec: Spec) -> Path:
    return DEFAULT_PARENT / chart_name(spec.name)


def static_files() -> dict[str, str]:
    """The chart files shipped with specbuild, unchanged by the spec (templates, .helmignore)."""
    root = resources.files("specbuild.deploy") / CHART_ROOT
    found: dict[str, str] = {}

    def walk(node, prefix: str) -> None:
        for child in node.iterdir():
            rel = f"{prefix}{child.name}"
            if child.is_dir():
                walk(child, rel + "/")
            elif child.is_file():
                found[rel] = child.read_text(encoding="utf-8")

    walk(root, "")
    return dict(sorted(found.items()))


def _spec_text(spec: Spec) -> str:
    from specbuild.example.specfile import render_spec

    cspec = facts.container_spec(spec)
    data = cspec.to_dict()
    overrides = {
        "name": data["name"],
        "output_dir": data["output_dir"],
        **{
            # a target-only spec's draft is None: render_spec leaves [draft] out
            section: {k: v for k, v in data[section].items() if v is not None} if data[section] is not None else None
            for section in SECTIONS
        },
    }
    header = (
        f"The spec as the pods read it (written by specbuild deploy from {spec.path.name if spec.path else 'the spec'}): the\n"
        f"checkpoints under {facts.MODELS_DIR}, the engines under {facts.OUTPUT_DIR} (the build key's folder)."
    )
    return render_spec(overrides, header)


def _chart_yaml(name: str, backend: str, nodes: int) -> str:
    data = {
        "apiVersion": "v2",
        "name": name,
        "description": f"specbuild: the {name} draft/target pair served by Triton ({backend} backend"
        + (f", {nodes} nodes per replica)" if nodes > 1 else ")"),
        "type": "application",
        "version": __version__,
        "appVersion": facts.TRITON_TAG,
        "annotations": {
            "specbuild.dev/written-by": "specbuild deploy",
            "specbuild.dev/base-image": facts.TRITON_IMAGE_FULL,
        },
    }
    return yamltext.dump(data, {"apiVersion": "Written by `specbuild deploy`; change values.yaml, not the templates."})


def _adapter_values(metric: str) -> str:
    """prometheus-community/prometheus-adapter chart values: the rule that serves `metric` per pod through the custom
    metrics API, which the HPA reads (helm install prometheus-adapter ... -f prometheus-adapter-values.yaml)."""
    rule = {
        "seriesQuery": f'{metric}{{namespace!="",pod!=""}}',
        "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
        "name": {"as": metric},
        "metricsQuery": "sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)",
    }
    return yamltext.dump(
        {"rules": {"default": False, "custom": [rule]}},
        {
            "rules": "Values for the prometheus-adapter chart (prometheus-community/helm-charts):\n"
            f"serves {metric} per pod to the HPA of this chart."
        },
    )


def plan_chart(spec: Spec, out_dir: Path | None = None, backend: str | None = None, nodes: int = 1) -> ChartPlan:
    backend = backend or spec.build.backend or "trtllm"
    if backend not in backends.NAMES:
        raise SpecError(f"backend {backend!r}: choose one of {', '.join(backends.NAMES)}.")
    if nodes > 1 and not paths.for_backend(backend).multi_node:
        raise SpecError(
            f"--nodes {nodes}: only the LLM API path (--backend llmapi) spans nodes; the engine path runs "
            "draft and target in one server on one node (orchestrator mode) and scales by replicas."
        )
    name = chart_name(spec.name)
    out_dir = Path(out_dir) if out_dir is not None else default_out_dir(spec)
    spec_text = _spec_text(spec)
    chart_values = values.default_values(spec, backend, nodes, spec_text)
    files = static_files()
    files.update(
        {
            "Chart.yaml": _chart_yaml(name, backend, nodes),
            "values.yaml": yamltext.dump(chart_values, values.COMMENTS),
            "values.schema.json": json.dumps(values.schema(sorted(facts.GPU_PRODUCT_LABELS)), indent=2) + "\n",
            "gpu-products.json": json.dumps({k: list(v) for k, v in facts.GPU_PRODUCT_LABELS.items()}, indent=2) + "\n",
            "prometheus-adapter-values.yaml": _adapter_values(values.QUEUE_METRIC),
        }
    )
    record = facts.facts(spec, backend, nodes)
    return ChartPlan(out_dir, name, backend, nodes, dict(sorted(files.items())), record)


def edited_files(folder: Path) -> list[str]:
    """Files of an earlier chart that differ from what deploy wrote there (its manifest records their hashes)."""
    from specbuild.artifacts import hash_file

    recorded = read_manifest(folder).get("file_hashes") or {}
    return [
        rel
        for rel, digest in sorted(recorded.items())
        if not (folder / rel).is_file() or hash_file(folder / rel) != digest
    ]


def write_chart(plan: ChartPlan, force: bool = False) -> dict[str, Any]:
    """Write the chart folder; returns {"out_dir", "skipped", "files"}. See the module docstring for what is
    replaced."""
    final = resolve_output(plan.out_dir, STAGE)
    if claim_output(final, STAGE) == "own":
        edited = edited_files(final)
        if edited:
            raise ArtifactError(
                f"{final} is a chart specbuild deploy wrote, but {', '.join(edited[:3])} changed since: "
                "deploy will not replace your edits, not even with --force. Keep your changes in a "
                "values file of your own (helm install -f my-values.yaml), move the folder away, or "
                "choose another --out-dir."
            )
        if read_manifest(final).get("input_hash") != plan.input_hash and not force:
            raise ArtifactError(
                f"{final} holds a chart specbuild deploy wrote from other inputs: pass --force to "
                "replace it, or choose another --out-dir."
            )
    with stage_output(final, stage=STAGE, force=force) as out:
        if out.up_to_date(plan.input_hash):
            return {"out_dir": str(final), "skipped": True, "files": sorted(plan.files)}
        from specbuild.artifacts import hash_file

        for rel, text in plan.files.items():
            path = out.tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        out.commit(
            {
                "input_hash": plan.input_hash,
                "backend": plan.backend,
                "nodes": plan.nodes,
                "chart": plan.name,
                "file_hashes": {rel: hash_file(out.tmp / rel) for rel in plan.files},
            }
        )
    return {"out_dir": str(final), "skipped": False, "files": sorted(plan.files)}
