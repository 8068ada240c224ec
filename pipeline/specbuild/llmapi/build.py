"""`specbuild build --backend llmapi`: nothing to compile. The LLM API builds its runtime from the
checkpoints when `LLM(...)` starts, so this stage validates the LLM arguments against the pinned release
and writes them, once, where `serve` reads them:

    <output_dir>/<name>/llmapi/llm_api_options.yaml   trtllm-serve --extra_llm_api_options (model/backend on argv)
    <output_dir>/<name>/llmapi/model.yaml             the same arguments as Triton's llmapi model.yaml
    <output_dir>/<name>/llmapi/manifest.json          stage "build-llmapi": arguments, checkpoints, memory plan

Both converted checkpoints must exist (`specbuild convert --backend llmapi`); their manifests' input
hashes are part of this stage's input hash, so a new conversion redoes it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from specbuild.artifacts import combined_hash, read_manifest, stage_output, tool_versions
from specbuild.config import Spec
from specbuild.errors import ArtifactError
from specbuild.llmapi import args as llm_args_mod
from specbuild.llmapi.checkpoint import STAGE as CONVERT_STAGE
from specbuild.llmapi.checkpoint import checkpoint_dir

STAGE = "build-llmapi"
FOLDER = "llmapi"
OPTIONS_FILE = "llm_api_options.yaml"
MODEL_YAML = "model.yaml"
HEADER = (
    "Written by `specbuild build --backend llmapi`: TensorRT-LLM {release} LLM arguments "
    "(tensorrt_llm/llmapi/llm_args.py).\n{what}"
)


def config_dir(spec: Spec) -> Path:
    return spec.pair_dir / FOLDER


def locations(spec: Spec) -> llm_args_mod.Locations:
    return llm_args_mod.locations(spec, lambda role: checkpoint_dir(spec, role))


def render(spec: Spec) -> dict[str, str]:
    from specbuild.contract import llmapi as contract

    where = locations(spec)
    return {
        OPTIONS_FILE: llm_args_mod.render_yaml(
            llm_args_mod.serve_options_data(spec, where),
            HEADER.format(
                release=contract.RELEASE,
                what="trtllm-serve <target> --backend pytorch "
                "--extra_llm_api_options <this file> (see `specbuild serve --server trtllm-serve`).",
            ),
        ),
        MODEL_YAML: llm_args_mod.render_yaml(
            llm_args_mod.model_yaml_data(spec, where),
            HEADER.format(release=contract.RELEASE, what="Triton's llmapi model.yaml (tensorrt_llm/1/model.yaml)."),
        ),
    }


def _checkpoint_hashes(spec: Spec) -> dict[str, Any]:
    hashes = {}
    for role in spec.roles:
        folder = checkpoint_dir(spec, role)
        if not (folder / "manifest.json").is_file():
            raise ArtifactError(
                f"the {role} checkpoint {folder} is not converted (no manifest.json). Run "
                "`specbuild convert --backend llmapi` first."
            )
        manifest = read_manifest(folder)
        if manifest.get("stage") != CONVERT_STAGE:
            raise ArtifactError(
                f"{folder} is not a checkpoint for the LLM API (stage {manifest.get('stage')!r}). "
                "Run `specbuild convert --backend llmapi --force`."
            )
        hashes[role] = manifest.get("input_hash")
    return hashes


def dry_run(spec: Spec) -> dict[str, Any]:
    files = render(spec)
    return {
        "stage": "build",
        "backend": "llmapi",
        "dry_run": True,
        "out_dir": str(config_dir(spec)),
        "llm_args": llm_args_mod.llm_args(spec, locations(spec)),
        "would_write": [*files, "manifest.json"],
        "notes": ["nothing to compile: TensorRT-LLM's LLM API loads the Hugging Face checkpoints when it starts"],
    }


def _inputs(spec: Spec) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
    """What the LLM arguments are made from: the arguments, the files, the converted checkpoints' own hashes
    (ArtifactError while a checkpoint is not converted)."""
    return llm_args_mod.llm_args(spec, locations(spec)), render(spec), _checkpoint_hashes(spec)


def input_hash(spec: Spec) -> str:
    return combined_hash(STAGE, *_inputs(spec))


def build(spec: Spec, force: bool = False, log: Callable[[str], None] = print) -> dict[str, Any]:
    from specbuild.contract import llmapi as contract

    args, files, checkpoints = _inputs(spec)
    digest = combined_hash(STAGE, args, files, checkpoints)
    with stage_output(config_dir(spec), stage=STAGE, force=force) as out:
        if out.up_to_date(digest):
            log(f"llmapi: {out.final} is up to date (inputs unchanged).")
            return {"status": "skipped", "out_dir": str(out.final), "manifest": out.existing_manifest() or {}}
        for name, text in files.items():
            (out.tmp / name).write_text(text, encoding="utf-8")
        plan = None
        try:
            from specbuild.check.llmapi_memory import plan_memory

            plan = plan_memory(spec, suggest=False).to_dict()
        except Exception as err:  # noqa: BLE001 - the plan is a record here; `check` reports its problems
            log(f"llmapi: no memory plan recorded ({err})")
        manifest = out.commit(
            {
                "stage": STAGE,
                "backend": "llmapi",
                "pair": spec.name,
                "input_hash": digest,
                "release": contract.RELEASE,
                "llm_args": args,
                "checkpoints": {role: str(checkpoint_dir(spec, role)) for role in spec.roles},
                "checkpoint_hashes": checkpoints,
                "kv_fraction_source": llm_args_mod.kv_fraction(spec)[1],
                "memory_plan": plan,
                "files": list(files),
                "tool_versions": tool_versions(),
            }
        )
        log(f"llmapi: wrote {out.final} ({', '.join(files)})")
        return {"status": "ran", "out_dir": str(out.final), "manifest": manifest}
