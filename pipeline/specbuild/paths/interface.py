"""What every pipeline path provides: its `up` stages and the bodies of the commands that differ by path.

Each method returns an `Outcome` (the `--json` document, the lines a person reads, warnings for stderr) or, for
`up`, a stage summary ({"status": "ran" | "skipped" | "planned", ...}); printing is the caller's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specbuild.config import Spec
    from specbuild.convert.plan import ConvertOptions
    from specbuild.paths.context import UpContext

Log = Callable[[str], None]


@dataclass
class Outcome:
    document: dict[str, Any]  # what --json prints
    lines: list[str] = field(default_factory=list)  # what a person reads on stdout, in order
    warnings: list[str] = field(default_factory=list)  # logged on stderr, before the rest


class PipelinePath:
    name: str  # "engine" | "llmapi": the backend record's `path`
    multi_node: bool = False  # one deployment spans nodes with NVIDIA's launcher (deploy --nodes N)
    trtllm_serve: bool = False  # also served by TensorRT-LLM's trtllm-serve (serve --server trtllm-serve)
    openai_frontend: bool = False  # its repository is also served by NVIDIA's OpenAI frontend (serve --server openai)
    queue_metric: bool = True  # the served entry model reports the BLS's queue depth, which the chart's HPA scales on
    local_note: str = ""  # what `generate --local --backend B` runs on, when it is not the engine pair

    # ---- `specbuild up`'s stages (the serve stage is `up.serving`'s, the same for every path) ----
    def claim_outputs(self, ctx: UpContext) -> None:
        """Refuse, before any work, a folder a later stage of this run may not replace (specbuild.artifacts)."""
        raise NotImplementedError

    def check_stage(self, ctx: UpContext) -> dict[str, Any]:
        raise NotImplementedError

    def convert_stage(self, ctx: UpContext) -> dict[str, Any]:
        raise NotImplementedError

    def build_stage(self, ctx: UpContext) -> dict[str, Any]:
        raise NotImplementedError

    def repo_stage(self, ctx: UpContext) -> dict[str, Any]:
        raise NotImplementedError

    # ---- the commands ----
    def convert(
        self,
        spec: Spec,
        roles: list[str],
        options: ConvertOptions,
        *,
        force: bool = False,
        verify: bool = False,
        dry_run: bool = False,
        log: Log = print,
        progress: bool = False,
    ) -> Outcome:
        raise NotImplementedError

    def build(
        self,
        spec: Spec,
        backend: str,
        roles: list[str],
        *,
        trtllm_build: str | None = None,
        force: bool = False,
        dry_run: bool = False,
        log: Log = print,
    ) -> Outcome:
        raise NotImplementedError

    def repo(
        self,
        spec: Spec,
        backend: str,
        out_dir: Path,
        *,
        runtime: str = "auto",
        checkpoints_dir: Path | None = None,
        engines_dir: Path | None = None,
        tokenizer_dir: Path | None = None,
        force: bool = False,
        dry_run: bool = False,
    ) -> Outcome:
        raise NotImplementedError

    def local_session(
        self,
        spec: Spec,
        *,
        device: str = "cpu",
        use_cache: bool = True,
        threads: int | None = None,
        overlap: str | None = None,
    ):
        """The in-process session `generate --local` runs (a context manager with `generate`)."""
        raise NotImplementedError

    def build_outputs(self, spec: Spec) -> list[Path]:
        """The folders whose manifest.json says the build finished (the chart's serving pods wait for them)."""
        raise NotImplementedError

    def repo_argv_extra(self, backend: str, models_dir: Path) -> list[str]:
        """The `specbuild repo` options that point a repository at models built into `models_dir` (the chart)."""
        raise NotImplementedError


def repo_plan_outcome(out_dir: Path, what: str, files: list[str], warnings: list[str], **fields: Any) -> Outcome:
    """`repo --dry-run` (either layout): the files it would write, under "# would write <out_dir> (<what>):"."""
    planned = [*files, "manifest.json"]
    document = {
        "stage": "repo",
        "dry_run": True,
        **fields,
        "out_dir": str(out_dir.resolve()),
        "files": planned,
        "warnings": warnings,
    }
    return Outcome(
        document, [f"# would write {out_dir.resolve()} ({what}):", *(f"  {rel}" for rel in planned)], list(warnings)
    )


def repo_result_outcome(result: Any, what: str) -> Outcome:
    """`repo` (either layout) after writing or skipping: one line "<out_dir>: written|up to date ..., <what>"."""
    state = "up to date (unchanged inputs; --force rewrites)" if result.skipped else "written"
    return Outcome({"stage": "repo", **result.to_dict()}, [f"{result.out_dir}: {state}, {what}"], list(result.warnings))
