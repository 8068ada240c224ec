"""The engine path (backends trtllm and reference): TensorRT-LLM checkpoints, engines, the BLS repository.

check    the pair checks with the engines' memory plan
convert  HF -> TensorRT-LLM checkpoints per role (`convert`)
build    engines per role: trtllm-build, or specbuild's reference engines (`engines`)
repo     Triton's inflight_batcher_llm repository with the speculative BLS (`triton.repository`)
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from specbuild.artifacts import default_repo_dir, recorded_hash
from specbuild.paths.context import UpContext, dry_status, earlier_will_run, statuses
from specbuild.paths.interface import Outcome, PipelinePath, repo_plan_outcome, repo_result_outcome


def build_row(result: dict) -> dict:
    """One engine of `build --json`."""
    manifest = result.get("manifest") or {}
    return {
        "role": result["role"],
        "status": result["status"],
        "engine_dir": result["engine_dir"],
        "backend": manifest.get("backend"),
        "input_hash": manifest.get("input_hash"),
        "argv_text": manifest.get("argv_text"),
        "seconds": manifest.get("seconds") if result["status"] == "ran" else 0.0,
    }


class EnginePath(PipelinePath):
    name = "engine"
    openai_frontend = True  # the BLS takes the frontend's TensorRT-LLM tensors (triton.openai_frontend)

    # ---- up ----
    def claim_outputs(self, ctx: UpContext) -> None:
        from specbuild.artifacts import claim_output, resolve_output

        folders = [
            (ctx.spec.pair_dir / role / name, stage)
            for role in ctx.spec.roles
            for name, stage in (("checkpoint", "convert"), ("engine", "build"))
        ]
        folders.append((ctx.repo or default_repo_dir(ctx.spec.output_dir), "repo"))
        for path, stage in folders:
            if stage in ctx.stages:
                claim_output(resolve_output(path, stage), stage)

    def check_stage(self, ctx: UpContext) -> dict[str, Any]:
        from specbuild.check import record

        self.claim_outputs(ctx)
        return record.run_stage(ctx.spec, ctx.backend, ctx.force, ctx.dry_run, ctx.log, ctx.progress)

    def convert_stage(self, ctx: UpContext) -> dict[str, Any]:
        from specbuild.convert.plan import ConvertOptions, describe, plan_roles

        options = ConvertOptions()
        plans = plan_roles(ctx.spec, list(ctx.spec.roles), options)
        if ctx.dry_run:
            from specbuild.artifacts import tool_versions
            from specbuild.convert.export import input_hash, source_hashes
            from specbuild.convert.plan import TOOLS

            versions = tool_versions(*TOOLS)
            roles = {
                plan.role: "skipped"
                if not ctx.force and recorded_hash(plan.out_dir) == input_hash(plan, source_hashes(plan), versions)
                else "planned"
                for plan in plans
            }
            return dry_status(roles, [describe(plan) for plan in plans])
        from specbuild.convert.export import convert_role

        results = [convert_role(plan, options, force=ctx.force, log=ctx.log, progress=ctx.progress) for plan in plans]
        return {"status": statuses(results), "roles": {r["role"]: r["status"] for r in results}}

    def build_stage(self, ctx: UpContext) -> dict[str, Any]:
        from specbuild.engines.stage import build_engines, dry_run

        if ctx.dry_run:
            detail = dry_run(ctx.spec, list(ctx.spec.roles), ctx.backend, ctx.trtllm_build)
            rerun = ctx.force or earlier_will_run(ctx, "convert")  # new checkpoints: new engines
            roles = {
                e["role"]: "skipped"
                if not rerun and e["input_hash"] is not None and recorded_hash(Path(e["engine_dir"])) == e["input_hash"]
                else "planned"
                for e in detail["engines"]
            }
            return dry_status(roles, detail)
        results = build_engines(
            ctx.spec, list(ctx.spec.roles), ctx.backend, force=ctx.force, trtllm_build=ctx.trtllm_build, log=ctx.log
        )
        return {
            "status": statuses(results),
            "backend": ctx.backend,
            "roles": {r["role"]: r["status"] for r in results},
            "engines": {r["role"]: r["engine_dir"] for r in results},
        }

    def repo_stage(self, ctx: UpContext) -> dict[str, Any]:
        from specbuild.triton.repository import input_hash, plan_settings, render, write_repository

        repo = ctx.repo or default_repo_dir(ctx.spec.output_dir)
        if ctx.dry_run:
            from specbuild.artifacts import UP_TO_DATE

            settings, _ = plan_settings(ctx.spec, ctx.backend, repo, None, None)
            if not ctx.force and recorded_hash(repo) == input_hash(settings, render(settings)):
                return {"status": "skipped", "detail": UP_TO_DATE, "repo": str(repo)}
            return {"status": "planned", "detail": f"write the {ctx.backend} model repository to {repo}"}
        result = write_repository(ctx.spec, ctx.backend, repo, force=ctx.force)
        for warning in result.warnings:
            ctx.log(f"repo warning: {warning}")
        ctx.log(f"repo: {result.out_dir}" + (" (up to date)" if result.skipped else ""))
        return {"status": "skipped" if result.skipped else "ran", "repo": str(result.out_dir), "backend": ctx.backend}

    # ---- commands ----
    def convert(
        self, spec, roles, options, *, force=False, verify=False, dry_run=False, log=print, progress=False
    ) -> Outcome:
        from specbuild.convert.plan import describe, plan_roles

        plans = plan_roles(spec, roles, options)
        if dry_run:
            lines = []
            for p in plans:
                d = describe(p)
                lines.append(f"{p.role}: {p.hf_dir} -> {p.out_dir}")
                lines.append(
                    f"  quantization {p.quantization} (quant_algo {p.quant_algo}), kv_cache {p.kv_cache}, "
                    f"dtype {p.dtype}, tp {p.tp_size}, pp {p.pp_size}, vocab {p.vocab_rows}"
                    + (f" padded to {p.pad_vocab_to}" if p.pad_vocab_to else "")
                )
                if p.calibration:
                    lines.append(
                        f"  calibration: {p.calibration.source}, {p.calibration.size} samples x "
                        f"{p.calibration.seq_len} tokens"
                    )
                lines.append("  would write: " + ", ".join(Path(f).name for f in d["would_write"]))
            return Outcome(
                {"command": "convert", "dry_run": True, "pair": spec.name, "roles": [describe(p) for p in plans]}, lines
            )
        from specbuild.convert.export import convert_role

        results = [convert_role(p, options, force=force, verify=verify, log=log, progress=progress) for p in plans]
        lines = []
        for r in results:
            m = r["manifest"]
            state = "up to date, skipped" if r["status"] == "skipped" else "written"
            mapping = m.get("mapping", {})
            lines.append(
                f"{r['role']}: {r['checkpoint']} ({state}; quant_algo {m.get('quant_algo')}, "
                f"kv_cache_quant_algo {m.get('kv_cache_quant_algo')}, vocab {m.get('vocab_size')}, "
                f"tp {mapping.get('tp_size')} pp {mapping.get('pp_size')})"
            )
            lines += verification_lines(r)
        return Outcome({"command": "convert", "pair": spec.name, "roles": results}, lines)

    def build(self, spec, backend, roles, *, trtllm_build=None, force=False, dry_run=False, log=print) -> Outcome:
        from specbuild.engines.stage import build_engines
        from specbuild.engines.stage import dry_run as plan_dry_run

        if dry_run:
            document = plan_dry_run(spec, roles, backend, trtllm_build)
            lines = []
            for engine in document["engines"]:
                lines.append(f"# {engine['role']}: {engine['checkpoint_dir']} -> {engine['engine_dir']}")
                if engine["argv_text"]:
                    lines.append(engine["argv_text"])
                lines += [f"# note: {note}" for note in engine["notes"]]
                lines.append("# would write: " + ", ".join(engine["writes"]))
            return Outcome(document, lines)
        started = time.monotonic()
        results = build_engines(spec, roles, backend, force=force, trtllm_build=trtllm_build, log=log)
        rows = [build_row(result) for result in results]
        return Outcome(
            {
                "stage": "build",
                "backend": backend,
                "pair": spec.name,
                "engines": rows,
                "seconds": round(time.monotonic() - started, 3),
            },
            [f"{row['role']}: {row['status']} ({row['backend']}) {row['engine_dir']}" for row in rows],
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
        from specbuild.triton import repository

        if dry_run:
            from dataclasses import asdict

            settings, warnings = repository.plan_settings(spec, backend, out_dir, engines_dir, tokenizer_dir)
            return repo_plan_outcome(
                out_dir, backend, repository.render(settings), warnings, backend=backend, settings=asdict(settings)
            )
        result = repository.write_repository(spec, backend, out_dir, engines_dir, tokenizer_dir, force=force)
        models = ", ".join(sorted({f.split("/")[0] for f in result.files}))
        return repo_result_outcome(result, f"backend {backend}, models: {models}")

    def local_session(self, spec, *, device="cpu", use_cache=True, threads=None, overlap=None):
        from specbuild.session.local import LocalSession

        return LocalSession.from_spec(spec, device=device, use_cache=use_cache, threads=threads, overlap=overlap)

    # ---- deploy ----
    def build_outputs(self, spec) -> list[Path]:
        return [spec.pair_dir / role / "engine" for role in spec.roles]

    def repo_argv_extra(self, backend: str, models_dir: Path) -> list[str]:
        # a trtllm repository names its engines at the GPU image's mount (models_dir); a reference one where the
        # spec's output_dir has them, which is the default
        return ["--engines-dir", str(models_dir)] if backend == "trtllm" else []


def verification_lines(result: dict) -> list[str]:
    """`convert --verify`'s line for one role (either path)."""
    v = result.get("verification")
    if not v:
        return []
    return [
        f"  verify: {'passed' if v['passed'] else 'FAILED'}: top-1 {v['top1_agreement']:.1%}, "
        f"max |logit error| {v['max_abs_logit_error']:.3g} vs {v['reference']}"
    ]


PATH = EnginePath()
