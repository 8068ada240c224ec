"""Shared by tests/test_deploy_*.py: write a chart with `specbuild deploy`, render it with real Helm (helm-python-sdk,
Helm's Go SDK), and validate what it renders strictly: Kubernetes objects against the OpenAPI schemas
kubernetes-validate carries, custom resources against the CRD schemas vendored in tests/crds (README there)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from click.testing import CliRunner

from specbuild.cli import main

CRDS = Path(__file__).resolve().parent / "crds"
KUBERNETES_VERSIONS = ("1.32.0", "1.37.0")  # two minor versions kubernetes-validate 1.37.0 carries


def write_spec(folder: Path, **sections: dict[str, Any]) -> Path:
    """A spec for a pair whose checkpoints need not exist (deploy reads none)."""
    lines = [
        'name = "pair-7b"',
        "",
        "[target]",
        'checkpoint = "models/target-7b"',
        "",
        "[draft]",
        'checkpoint = "models/draft-1b"',
    ]
    for section, values in sections.items():
        lines += ["", f"[{section}]"] + [f"{key} = {json.dumps(value)}" for key, value in values.items()]
    path = folder / "specbuild.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def deploy(*args: str) -> Any:
    return CliRunner().invoke(main, ["deploy", *args], catch_exceptions=False)


def render(
    chart: Path, values: dict[str, Any] | None = None, name: str = "demo", namespace: str = "serving"
) -> list[dict[str, Any]]:
    """Every object `helm template` renders for the chart (real Helm: the Go SDK through helm-python-sdk)."""
    import helm_python as helm

    manifests = helm.Chart.load(str(chart)).render(values or {}, name=name, namespace=namespace, is_install=True)
    objects = []
    for text in manifests.values():
        objects += [doc for doc in yaml.safe_load_all(text) if doc]
    return objects


def lint(chart: Path, values: dict[str, Any] | None = None) -> dict[str, Any]:
    import helm_python as helm

    return helm.lint(str(chart), values, strict=True)


def by_kind(objects: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    kinds: dict[str, list[dict[str, Any]]] = {}
    for obj in objects:
        kinds.setdefault(obj["kind"], []).append(obj)
    return kinds


def _closed(schema: Any) -> Any:
    """A CRD's structural schema with unknown fields refused, as the API server's strict field validation does:
    every object that lists its properties and does not preserve unknown fields gets additionalProperties false."""
    if isinstance(schema, list):
        return [_closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {key: _closed(value) for key, value in schema.items()}
    if (
        "properties" in closed
        and "additionalProperties" not in closed
        and not closed.get("x-kubernetes-preserve-unknown-fields")
    ):
        closed["additionalProperties"] = False
    return closed


def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    found = {}
    for path in sorted(CRDS.glob("*.json")):
        record = json.loads(path.read_text())
        found[(record["apiVersion"], record["kind"])] = _closed(record["openAPIV3Schema"])
    return found


def validate_all(objects: list[dict[str, Any]]) -> list[str]:
    """Validate every object strictly; returns what each was checked against. Raises on the first invalid one."""
    import kubernetes_validate

    crds = crd_schemas()
    checked = []
    for obj in objects:
        key = (obj["apiVersion"], obj["kind"])
        if key in crds:
            jsonschema.Draft7Validator(crds[key]).validate(obj)
            checked.append(f"{obj['kind']}: CRD schema")
            continue
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)
        checked.append(f"{obj['kind']}: Kubernetes {', '.join(KUBERNETES_VERSIONS)}")
    return checked
