"""The LLM API path (backend llmapi): Hugging Face checkpoints, the LLM arguments, Triton's llmapi repository.

    check    the pair checks with the LLM API's memory plan (`check.llmapi_memory`)
    convert  Hugging Face checkpoints per role (`llmapi.checkpoint`)
    build    the LLM arguments, validated and written; nothing is compiled (`llmapi.build`)
    repo     Triton's llmapi repository (`llmapi.repository`; the CPU stand-in unless tensorrt_llm is importable)
It also serves with `trtllm-serve` (`serve --server trtllm-serve`: `llmapi.trtllm_serve`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from specbuild.artifacts import UP_TO_DATE, default_repo_dir, recorded_hash
from specbuild.errors import ArtifactError
from specbuild.paths.context import UpContext, dry_status, earlier_will_run, statuses
from specbuild.paths.engine_path import verification_lines
from specbuild.paths.interface import Outcome, PipelinePath, repo_plan_outcome, repo_result_outcome


def _recorded(folder: Path, digest: Callable[[], str]) -> bool:
    """The folder's manifest records this input hash (a dry run's "up to date"); False when the inputs are not there
    yet to hash."""
    try:
        return recorded_hash(Path(folder)) == digest()
    except ArtifactError:
        return False


class LlmApiPath(PipelinePath):
    name = "llmapi"
    multi_node = True  # NVIDIA's launcher (mpirun / srun) spans nodes: `deploy --nodes N`, `trtllm-serve`
    trtllm_serve = True
    queue_metric = False  # no BLS: Triton's llmapi model reports no queue depth of specbuild's
    local_note = "on the weights the llmapi server loads"

    # ---- up ----
    def claim_outputs(self, ctx: UpContext) -> None:
        from specbuild.artifacts import claim_output, resolve_output
        from specbuild.llmapi.build import STAGE as BUILD_STAGE
        from specbuild.llmapi.build import config_dir
        from specbuild.llmapi.checkpoint import STAGE as CONVERT_STAGE
        from specbuild.llmapi.checkpoint import checkpoint_dir

        folders = [(checkpoint_dir(ctx.spec, role), CONVERT_STAGE, "convert") for role in ctx.spec.roles]
        folders += [
            (config_dir(ctx.spec), BUILD_STAGE, "build"),
            (ctx.repo or default_repo_dir(ctx.spec.output_dir), "repo", "repo"),
        ]
        for path, stage, step in folders:
            if step in ctx.stages:
                claim_output(resolve_output(path, stage), stage)

    def check_stage(self, ctx: UpContext) -> dict[str, Any]:
        from specbuild.check import record

        self.claim_outputs(ctx)
        return record.run_stage(ctx.spec, ctx.backend, ctx.force, ctx.dry_run, ctx.log, ctx.progress)

    def convert_stage(self, ctx: UpContext) -> dict[str, Any]:
        from specbuild.convert.plan import ConvertOptions
        from specbuild.llmapi import checkpoint

        options = ConvertOptions()
        plans = checkpoint.plan_roles(ctx.spec, list(ctx.spec.roles), options)
        if ctx.dry_run:
            from specbuild.artifacts import hash_tree, tool_versions

            versions = tool_versions(*checkpoint.TOOLS)
            roles = {
                plan.role: "skipped"
                if not ctx.force
                and recorded_hash(plan.out_dir) == checkpoint.input_hash(plan, hash_tree(plan.hf_dir), versions)
                else "planned"
                for plan in plans
            }
            return dry_status(roles, [checkpoint.describe(plan) for plan in plans])
        results = [
            checkpoint.convert_role(plan, options, force=ctx.force, log=ctx.log, progress=ctx.progress)
            for plan in plans
        ]
        return {"status": statuses(results), "roles": {r["role"]: r["status"] for r in results}}

    def build_stage(self, ctx: UpContext) -> dict[str, Any]:
        from specbuild.llmapi import build

        if ctx.dry_run:
            fresh = (
                not ctx.force
                and not earlier_will_run(ctx, "convert")
                and _recorded(build.config_dir(ctx.spec), lambda: build.input_hash(ctx.spec))
            )
            return (
                {"status": "skipped", "detail": UP_TO_DATE}
                if fresh
                else {"status": "planned", "detail": build.dry_run(ctx.spec)}
            )
        result = build.build(ctx.spec, force=ctx.force, log=ctx.log)
        return {"status": result["status"], "backend": ctx.backend, "out_dir": result["out_dir"]}

    def repo_stage(self, ctx: UpContext) -> dict[str, Any]:
        from specbuild.llmapi.repository import input_hash, plan, write_repository

        repo = ctx.repo or default_repo_dir(ctx.spec.output_dir)
        # `up` serves here, on the checkpoints its convert stage wrote here: the repository names them where they
        # are, whichever runtime loads them (the /engines default of `repo` is the GPU image's compose mount).
        checkpoints = Path(ctx.spec.output_dir).resolve()
        if ctx.dry_run:

            def planned() -> str:
                _, _, files, settings, _ = plan(ctx.spec, checkpoints_dir=checkpoints)
                return input_hash(settings, files)

            fresh = not ctx.force and not earlier_will_run(ctx, "build") and _recorded(repo, planned)
            return (
                {"status": "skipped", "detail": UP_TO_DATE}
                if fresh
                else {"status": "planned", "detail": f"write the llmapi model repository to {repo}"}
            )
        result = write_repository(ctx.spec, repo, checkpoints_dir=checkpoints, force=ctx.force)
        for warning in result.warnings:
            ctx.log(f"repo warning: {warning}")
        return {
            "status": "skipped" if result.skipped else "ran",
            "repo": str(result.out_dir),
            "backend": ctx.backend,
            "runtime": result.runtime,
        }

    # ---- commands ----
    def convert(
        self, spec, roles, options, *, force=False, verify=False, dry_run=False, log=print, progress=False
    ) -> Outcome:
        from specbuild.llmapi import checkpoint

        plans = checkpoint.plan_roles(spec, roles, options)
        if dry_run:
            lines = []
            for p in plans:
                d = checkpoint.describe(p)
                lines.append(f"{p.role}: {p.hf_dir} -> {p.out_dir} ({d['exporter']})")
                lines.append(
                    f"  quantization {p.quantization} (quant_algo {p.quant_algo}), kv_cache {p.kv_cache}, "
                    f"dtype {p.dtype}" + (f", vocab padded to {p.pad_vocab_to}" if p.pad_vocab_to else "")
                )
                lines.append("  would write: " + ", ".join(Path(f).name for f in d["would_write"]))
            return Outcome(
                {
                    "command": "convert",
                    "backend": "llmapi",
                    "dry_run": True,
                    "pair": spec.name,
                    "roles": [checkpoint.describe(p) for p in plans],
                },
                lines,
            )
        results = [
            checkpoint.convert_role(p, options, force=force, verify=verify, log=log, progress=progress) for p in plans
        ]
        lines = []
        for r in results:
            m = r["manifest"]
            state = "up to date, skipped" if r["status"] == "skipped" else "written"
            lines.append(
                f"{r['role']}: {r['checkpoint']} ({state}; quant_algo {m.get('quant_algo')}, "
                f"kv_cache_quant_algo {m.get('kv_cache_quant_algo')}, vocab {m.get('vocab_size')})"
            )
            lines += verification_lines(r)
        return Outcome({"command": "convert", "backend": "llmapi", "pair": spec.name, "roles": results}, lines)

    def build(self, spec, backend, roles, *, trtllm_build=None, force=False, dry_run=False, log=print) -> Outcome:
        from specbuild.llmapi import build as build_mod

        if dry_run:
            document = build_mod.dry_run(spec)
            lines = [
                f"# llmapi: {document['out_dir']} (nothing to compile)",
                build_mod.render(spec)[build_mod.OPTIONS_FILE].rstrip(),
                "# would write: " + ", ".join(document["would_write"]),
            ]
            return Outcome(document, lines)
        result = build_mod.build(spec, force=force, log=log)
        return Outcome(
            {
                "stage": "build",
                "backend": "llmapi",
                "pair": spec.name,
                "status": result["status"],
                "out_dir": result["out_dir"],
                "llm_args": result["manifest"].get("llm_args"),
            },
            [f"llmapi: {result['status']} {result['out_dir']}"],
        )

    def repo(
        self,
        spec,
        backend,
        out_dir,
        *,
        runtime="auto",
        checkpoints_dir=None,
        engines_dir=None,
        tokenizer_dir=None,
        force=False,
        dry_run=False,
    ) -> Outcome:
        from specbuild.llmapi import repository

        if dry_run:
            resolved, _, files, settings, warnings = repository.plan(spec, runtime, checkpoints_dir)
            return repo_plan_outcome(
                out_dir,
                f"llmapi, runtime {resolved}",
                files,
                warnings,
                backend="llmapi",
                runtime=resolved,
                settings=settings,
            )
        result = repository.write_repository(spec, out_dir, runtime, checkpoints_dir, force=force)
        return repo_result_outcome(
            result,
            f"backend llmapi, runtime {result.runtime}, models: "
            f"{', '.join(result.to_dict()['models'])} (serve's drain closes the gate)",
        )

    def local_session(self, spec, *, device="cpu", use_cache=True, threads=None, overlap=None):
        from specbuild.llmapi.local_pair import local_pair
        from specbuild.session.local import LocalSession

        parts = local_pair(spec, device=device)
        return LocalSession(parts.pop("drafter"), parts.pop("verifier"), parts.pop("encode"), **parts)

    # ---- deploy ----
    def build_outputs(self, spec) -> list[Path]:
        from specbuild.llmapi.build import config_dir
        from specbuild.llmapi.checkpoint import checkpoint_dir

        return [*(checkpoint_dir(spec, role) for role in spec.roles), config_dir(spec)]

    def repo_argv_extra(self, backend: str, models_dir: Path) -> list[str]:
        return ["--runtime", "tensorrt_llm", "--checkpoints-dir", str(models_dir)]


PATH = LlmApiPath()
