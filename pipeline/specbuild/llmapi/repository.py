"""`specbuild repo --backend llmapi`: Triton's `llmapi` model repository for the pair.

    <out>/tensorrt_llm/config.pbtxt      NVIDIA's tensors (contract.INPUTS / OUTPUTS), Python backend
    <out>/tensorrt_llm/1/model.yaml      the LLM arguments (`args.model_yaml_data`) + triton_config
    <out>/tensorrt_llm/1/model.py        a shim: NVIDIA's model.py in the GPU image, or the CPU stand-in,
                                         behind the serving gate's check
    <out>/serving_gate/                  READY while the deployment takes new requests (closed by serve's drain)
    <out>/manifest.json

One model that serves, no pre/postprocessing, no BLS: the LLM API tokenizes, drafts and verifies inside it.

config.pbtxt is NVIDIA's (CONFIG @c8c6df08) with two additions: the parameter `serving_gate`, which names the
gate the model checks before each batch of new requests (specbuild.contract.serving_gate: while serve drains, new
requests are refused with UNAVAILABLE, the code clients retry on another replica), and
`model_transaction_policy { decoupled }` as model.yaml's triton_config says. NVIDIA's file leaves the policy to
model.py's auto_complete_config, which reads model.yaml; but specbuild's tritonserver runs with
--disable-auto-complete-config, as NVIDIA's launch_triton_server.py does, and then Triton never calls
auto_complete_config (python_backend's model template docstring), so streaming would be refused. NVIDIA's
model.yaml says values set in config.pbtxt win over model.py, and both say the same here.

Runtimes (`--runtime`): "tensorrt_llm" loads NVIDIA's own model.py from the Triton TensorRT-LLM image
(/app/all_models/llmapi/tensorrt_llm/1, or $SPECBUILD_LLMAPI_MODEL_DIR); "reference" loads specbuild's
CPU stand-in (`specbuild.llmapi.standin`), which serves the same contract with the reference runtime.
"auto" picks tensorrt_llm when the `tensorrt_llm` package is importable here.
Checkpoint paths in model.yaml are absolute, as the server sees them: for tensorrt_llm under
/engines/<pair>/<role>/hf_checkpoint (the GPU image's mount) unless --checkpoints-dir; for reference
the spec's output_dir.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbuild.artifacts import combined_hash, read_manifest, stage_output, tool_versions
from specbuild.config import Spec
from specbuild.contract import llmapi as contract
from specbuild.contract import serving_gate
from specbuild.contract.pbtxt import to_pbtxt
from specbuild.errors import ArtifactError, SpecError
from specbuild.llmapi import args as args_mod
from specbuild.llmapi.checkpoint import FOLDER

GPU_CHECKPOINTS_DIR = "/engines"  # where docker/compose mounts the output folder in the GPU image
RUNTIMES = ("auto", "tensorrt_llm", "reference")
SHIMS = {"reference": "specbuild.llmapi.standin", "tensorrt_llm": "specbuild.llmapi.nvidia_model"}


@dataclass
class LlmApiRepoResult:
    out_dir: Path
    runtime: str
    skipped: bool
    files: list[str]
    warnings: list[str]
    settings: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "out_dir": str(self.out_dir),
            "backend": "llmapi",
            "runtime": self.runtime,
            "skipped": self.skipped,
            "models": [contract.MODEL_NAME, serving_gate.MODEL_NAME],
            "files": self.files,
            "settings": self.settings,
            "warnings": self.warnings,
        }


def resolve_runtime(runtime: str) -> str:
    if runtime not in RUNTIMES:
        raise SpecError(f"--runtime {runtime!r}: choose one of {', '.join(RUNTIMES)}.")
    if runtime != "auto":
        return runtime
    return "tensorrt_llm" if importlib.util.find_spec("tensorrt_llm") is not None else "reference"


def locations(spec: Spec, runtime: str, checkpoints_dir: str | Path | None) -> args_mod.Locations:
    if checkpoints_dir is not None:
        root = str(checkpoints_dir).rstrip("/")
    elif runtime == "tensorrt_llm":
        root = GPU_CHECKPOINTS_DIR
    else:
        root = str(Path(spec.output_dir).resolve())
    return args_mod.locations(spec, lambda role: f"{root}/{spec.name}/{role}/{FOLDER}")


def config_pbtxt(decoupled: bool) -> str:
    from specbuild.contract.pbtxt import config_proto

    pb = config_proto()
    config = pb.ModelConfig(name=contract.MODEL_NAME, backend="python")
    config.model_transaction_policy.decoupled = decoupled
    config.parameters[serving_gate.GATE_PARAMETER].string_value = serving_gate.MODEL_NAME
    config.instance_group.add(count=1, kind=pb.ModelInstanceGroup.KIND_CPU)
    for table, repeated in ((contract.INPUTS, config.input), (contract.OUTPUTS, config.output)):
        for t in table:
            entry = repeated.add(name=t.name, data_type=pb.DataType.Value(t.data_type), dims=list(t.dims))
            if t.optional:
                entry.optional = True
    return to_pbtxt(config)


def shim_source(module: str) -> str:
    return (
        '"""Generated by `specbuild repo --backend llmapi`: the model\'s code is in the installed specbuild package."""\n\n'
        f"from {module} import TritonPythonModel  # noqa: F401\n"
    )


def render(spec: Spec, runtime: str, where: args_mod.Locations) -> dict[str, str]:
    model_yaml = args_mod.render_yaml(
        args_mod.model_yaml_data(spec, where),
        header=f"Written by `specbuild repo --backend llmapi`: TensorRT-LLM {contract.RELEASE} LLM arguments "
        "(every key but\ntriton_config goes to LLM(...); triton_config is read by model.py).",
    )
    return {
        f"{contract.MODEL_NAME}/config.pbtxt": config_pbtxt(spec.serve.decoupled),
        f"{contract.MODEL_NAME}/1/model.yaml": model_yaml,
        f"{contract.MODEL_NAME}/1/model.py": shim_source(SHIMS[runtime]),
        f"{serving_gate.MODEL_NAME}/config.pbtxt": to_pbtxt(serving_gate.model_config()),
        f"{serving_gate.MODEL_NAME}/1/model.py": shim_source(serving_gate.MODEL_MODULE),
    }


def _warnings(spec: Spec, runtime: str, where: args_mod.Locations) -> list[str]:
    found = []
    for role, path in (("target", where.target), ("draft", where.draft)):
        if path is None:
            continue
        if runtime == "reference" and not (Path(path) / "manifest.json").is_file():
            found.append(
                f"the {role} checkpoint {path} is not converted yet: run `specbuild convert --backend "
                "llmapi` before `specbuild serve`."
            )
    if runtime == "tensorrt_llm":
        found.append(
            f"model.yaml names the checkpoints as {Path(where.target).parent.parent} inside the server; "
            "pass --checkpoints-dir if they are elsewhere there."
        )
    return found


def plan(spec: Spec, runtime: str = "auto", checkpoints_dir: str | Path | None = None):
    runtime = resolve_runtime(runtime)
    where = locations(spec, runtime, checkpoints_dir)
    settings = {
        "runtime": runtime,
        "target": where.target,
        "draft": where.draft,
        "llm_args": args_mod.llm_args(spec, where),
        "decoupled": spec.serve.decoupled,
    }
    return runtime, where, render(spec, runtime, where), settings, _warnings(spec, runtime, where)


def input_hash(settings: dict[str, Any], files: dict[str, str]) -> str:
    """What the repository is made from: plan()'s settings and files."""
    return combined_hash("llmapi", settings, files)


def write_repository(
    spec: Spec, out_dir: Path, runtime: str = "auto", checkpoints_dir: str | Path | None = None, force: bool = False
) -> LlmApiRepoResult:
    runtime, where, files, settings, warnings = plan(spec, runtime, checkpoints_dir)
    digest = input_hash(settings, files)
    with stage_output(Path(out_dir), stage="repo", force=force) as out:
        if out.up_to_date(digest):
            return LlmApiRepoResult(out.final, runtime, True, list(files), warnings, settings)
        for rel, text in files.items():
            path = out.tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        out.commit(
            {
                "stage": "repo",
                "pair": spec.name,
                "backend": "llmapi",
                "runtime": runtime,
                "input_hash": digest,
                "release": contract.RELEASE,
                "settings": settings,
                "files": list(files),
                "tool_versions": tool_versions("tritonclient", "protobuf"),
            }
        )
        return LlmApiRepoResult(out.final, runtime, False, list(files), warnings, settings)


def checkpoint_dirs(repo: Path, manifest: dict[str, Any]) -> dict[str, Path]:
    """role -> checkpoint folder named by an llmapi repository's manifest."""
    settings = manifest.get("settings") or {}
    found = {}
    for role in ("target", "draft"):
        if role == "draft" and role in settings and settings[role] is None:
            continue  # a target-only deployment
        if not settings.get(role):
            raise ArtifactError(
                f"{repo}/manifest.json names no {role} checkpoint: regenerate it with "
                "`specbuild repo --backend llmapi`."
            )
        found[role] = Path(settings[role])
    return found


def check_checkpoint_dirs(folders: dict[str, Path]) -> None:
    """Before serving: both checkpoints converted for the LLM API, where model.yaml names them."""
    from specbuild.llmapi.checkpoint import STAGE

    for role, folder in folders.items():
        if not (folder / "manifest.json").is_file():
            raise ArtifactError(
                f"the {role} checkpoint {folder} is not converted (no manifest.json). Run "
                "`specbuild convert --backend llmapi` first, or regenerate the repository with "
                "--checkpoints-dir."
            )
        stage = read_manifest(folder).get("stage")
        if stage != STAGE:
            raise ArtifactError(
                f"{folder} is not a checkpoint for the LLM API (stage {stage!r}). Run "
                "`specbuild convert --backend llmapi`."
            )
