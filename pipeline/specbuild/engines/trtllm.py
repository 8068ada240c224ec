"""The TensorRT-LLM backend: run `trtllm-build` per role and check what it built.

`trtllm-build` runs as an argv list with its output in a temporary folder beside the engine
folder; its log goes to `build.log` and to a progress display on stderr. On failure the
temporary folder is removed (the log is kept as `<role>/engine.failed.log`) and the exit code
and the log's last lines are reported. A finished engine is accepted only when its
`config.json` agrees with what was asked.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from specbuild.artifacts import hash_tree, stage_output, tool_versions
from specbuild.contract import build_rules as rules
from specbuild.engines.flags import TRTLLM_VERSION_CHECKED, argv_text, trtllm_argv, trtllm_version_note
from specbuild.engines.plan import RolePlan
from specbuild.engines.versions import interpreter_for, probe_versions
from specbuild.errors import BuildError, ToolNotFoundError

GPU_IMAGE = "docker/Dockerfile.gpu"
LOG_TAIL_LINES = 25

# trtllm-build writes SpeculativeDecodingMode (an IntFlag) as its integer value.
_SPEC_MODES = {1: "none", 2: "draft_tokens_external", 4: "medusa", 8: "lookahead_decoding",
               16: "explicit_draft_tokens", 32: "eagle"}


def find_trtllm_build(explicit: str | Path | None = None) -> str:
    if explicit is not None:
        path = Path(explicit)
        if not path.is_file() or not os.access(path, os.X_OK):
            raise ToolNotFoundError(
                f"--trtllm-build {str(explicit)!r} is not an executable file. Pass the path of TensorRT-LLM's "
                f"trtllm-build, or run this step in the GPU image ({GPU_IMAGE})."
            )
        return str(path.resolve())
    found = shutil.which("trtllm-build")
    if found is None:
        raise ToolNotFoundError(
            "trtllm-build not found on PATH. Run this step in the GPU image "
            f"({GPU_IMAGE}, TensorRT-LLM {TRTLLM_VERSION_CHECKED}; see docs/build.md), or pass --trtllm-build PATH. "
            "Without a GPU, use `--backend reference`."
        )
    return found


def _spec_mode(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "none"
    if isinstance(value, int):
        return _SPEC_MODES.get(value, f"unknown({value})")
    return str(value).rsplit(".", 1)[-1].lower()


def verify_engine(plan: RolePlan, engine_dir: Path, gpu_sm: int | None = None) -> dict[str, Any]:
    """Check the built engine against the plan; return the build_config fields that were checked.

    `gpu_sm` is the build machine's GPU (from the version probe), used to explain a lost paged context FMHA.
    """
    config_path = engine_dir / "config.json"
    try:
        config = json.loads(config_path.read_text())
        build_config = config["build_config"]
        plugin = build_config.get("plugin_config") or {}
        pretrained = config.get("pretrained_config") or {}
    except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
        raise BuildError(
            f"trtllm-build exited 0 but {config_path} is missing or has no build_config ({err}). "
            "The engine is not marked built; check build.log."
        ) from None
    expected = plan.expected_build_config()
    found = {key: build_config.get(key) for key in expected}
    found["speculative_decoding_mode"] = _spec_mode(build_config.get("speculative_decoding_mode"))
    found["gather_context_logits"] = bool(build_config.get("gather_context_logits"))
    if "gather_generation_logits" in expected:
        found["gather_generation_logits"] = bool(build_config.get("gather_generation_logits"))
    problems = [f"{key} = {found[key]!r} (asked {want!r})" for key, want in expected.items() if found[key] != want]
    for key in ("use_paged_context_fmha", "remove_input_padding"):
        if plugin.get(key) is not True:
            problems.append(f"plugin_config.{key} = {plugin.get(key)!r} (asked True)")
    if plugin.get("use_paged_context_fmha") is not True:
        quant = pretrained.get("quantization") or {}
        why = rules.paged_context_fmha_loss(quant.get("quant_algo"), quant.get("kv_cache_quant_algo"), gpu_sm)
        if why is None and gpu_sm is None and rules.norm_algo(quant.get("kv_cache_quant_algo")) == "FP8":
            why = (f"an FP8 KV cache keeps paged context FMHA only on SM{rules.FP8_MIN_SM}+ GPUs, and the build GPU's "
                   "SM is unknown: was it built on an older GPU?")
        problems.append(
            f"trtllm-build turned paged context FMHA off ({why or 'reason not known: check build.log'}), and without "
            "it the target cannot take external draft tokens (no KV-cache reuse). "
            + rules.paged_context_fmha_fix(plan.role, gpu_sm))
    kv_type = build_config.get("kv_cache_type")
    if kv_type is not None and str(kv_type).rsplit(".", 1)[-1].upper() != "PAGED":
        problems.append(f"kv_cache_type = {kv_type!r} (asked 'PAGED')")
    if plan.checkpoint_manifest is not None:
        built_algo = rules.norm_algo((pretrained.get("quantization") or {}).get("quant_algo"))
        if built_algo != plan.quant_algo:
            problems.append(f"pretrained_config.quantization.quant_algo = {built_algo!r} (checkpoint {plan.quant_algo!r})")
    missing = [f"rank{r}.engine" for r in range(plan.world_size) if not (engine_dir / f"rank{r}.engine").is_file()]
    if missing:
        problems.append(f"missing {', '.join(missing)}")
    if problems:
        raise BuildError(
            f"the {plan.role} engine trtllm-build wrote disagrees with what was asked: {'; '.join(problems)}. "
            "It was not marked built. Check build.log and the TensorRT-LLM version "
            f"(specbuild targets {TRTLLM_VERSION_CHECKED})."
        )
    found["version"] = config.get("version")
    found["quant_algo"] = plan.quant_algo
    return found


def run_logged(argv: list[str], log_path: Path, cwd: Path, label: str, echo: bool = True) -> tuple[int, list[str]]:
    """Run argv, tee its output to log_path and a progress display on stderr; return (exit code, last lines)."""
    from tqdm import tqdm

    tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
    show_bar = sys.stderr.isatty()
    with open(log_path, "w", encoding="utf-8") as log, tqdm(
        desc=label, unit=" lines", file=sys.stderr, disable=not show_bar, leave=False
    ) as bar:
        log.write(f"$ {argv_text(argv)}\n")
        log.flush()
        proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, text=True, errors="replace", bufsize=1)
        try:
            assert proc.stdout is not None  # set by PIPE above
            for line in proc.stdout:
                log.write(line)
                log.flush()
                tail.append(line.rstrip("\n"))
                if show_bar:
                    bar.update(1)
                    bar.set_postfix_str(line.strip()[-60:], refresh=False)
                elif echo:
                    print(f"[{label}] {line}", end="", file=sys.stderr, flush=True)
            code = proc.wait()
        finally:
            if proc.poll() is None:  # interrupted: do not leave trtllm-build running
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        log.write(f"# exit code {code}\n")
    return code, list(tail)


def engine_input_hash(plan: RolePlan, backend: str, extra: dict[str, Any]) -> tuple[str, dict[str, str]]:
    from specbuild.artifacts import combined_hash

    files = hash_tree(plan.checkpoint_dir)
    ckpt_hash = (plan.checkpoint_manifest or {}).get("input_hash")
    return combined_hash(backend, plan.settings(), ckpt_hash, files, extra), files


def trtllm_input_hash(plan: RolePlan, executable: str) -> tuple[str, dict[str, str], dict[str, Any]]:
    """(input hash, checkpoint file hashes, tool versions of the build environment)."""
    versions = {**tool_versions(), **probe_versions(interpreter_for(executable))}
    key_versions = {k: versions.get(k) for k in ("tensorrt_llm", "tensorrt", "cuda", "gpu_name", "gpu_sm")}
    input_hash, files = engine_input_hash(plan, "trtllm", {"versions": key_versions})
    return input_hash, files, versions


def build_trtllm_role(plan: RolePlan, pair: str, executable: str, force: bool = False,
                      log: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """Build one engine with trtllm-build; returns the stage summary (status ran|skipped, manifest)."""
    started = time.monotonic()
    input_hash, files, versions = trtllm_input_hash(plan, executable)
    with stage_output(plan.engine_dir, stage="build", force=force) as out:
        if out.up_to_date(input_hash):
            log(f"{plan.role}: engine up to date ({plan.engine_dir}), skipped. Use --force to rebuild.")
            return {"role": plan.role, "status": "skipped", "engine_dir": str(plan.engine_dir),
                    "manifest": out.existing_manifest()}
        argv = trtllm_argv(plan, executable, str(out.tmp))
        version_note = trtllm_version_note(versions.get("tensorrt_llm"))
        if version_note:
            log(f"warning: {version_note}")
        for note in plan.notes:
            log(f"note: {note}")
        log(f"{plan.role}: {argv_text(argv)}")
        code, tail = run_logged(argv, out.tmp / "build.log", cwd=out.tmp, label=f"trtllm-build {plan.role}")
        if code != 0:
            kept = plan.engine_dir.parent / "engine.failed.log"
            shutil.copyfile(out.tmp / "build.log", kept)
            raise BuildError(
                f"trtllm-build for the {plan.role} exited with code {code}; no engine was written. Last lines:\n"
                + "\n".join(f"  {line}" for line in tail[-12:])
                + f"\nFull log: {kept}"
            )
        try:
            checked = verify_engine(plan, out.tmp, versions.get("gpu_sm"))
        except BuildError:
            shutil.copyfile(out.tmp / "build.log", plan.engine_dir.parent / "engine.failed.log")
            raise
        manifest = out.commit({
            "stage": "build",
            "backend": "trtllm",
            "pair": pair,
            "role": plan.role,
            "input_hash": input_hash,
            "checkpoint_input_hash": (plan.checkpoint_manifest or {}).get("input_hash"),
            "inputs": {"checkpoint_dir": str(plan.checkpoint_dir), "files": files},
            "argv": argv,  # exactly as run: --output_dir is the temporary folder renamed to engine_dir
            "argv_text": argv_text(argv),
            "engine_dir": str(plan.engine_dir),
            "built_in": str(out.tmp),
            "tool_versions": versions,
            "settings": plan.settings(),
            "build_config": plan.expected_build_config(),
            "engine_build_config": checked,
            "files": {p.name: p.stat().st_size for p in sorted(out.tmp.iterdir()) if p.is_file()},
            "seconds": round(time.monotonic() - started, 3),
        })
    (plan.engine_dir.parent / "engine.failed.log").unlink(missing_ok=True)
    log(f"{plan.role}: engine written to {plan.engine_dir}")
    return {"role": plan.role, "status": "ran", "engine_dir": str(plan.engine_dir), "manifest": manifest}
