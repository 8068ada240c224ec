"""The pipeline paths: one object per way a pair is built and served, which plans and runs its stages.

    from specbuild import paths
    path = paths.for_backend("reference")        # the engine path (trtllm, reference) or the LLM API path (llmapi)
    outcome = path.convert(spec, list(spec.roles), ConvertOptions(), dry_run=True)
    outcome.document, outcome.lines              # the --json document, the lines a person reads

A backend's record (`specbuild.backends`) names its path; `for_backend` finds that path's object here. `up`
(`up.stages`), the commands `convert`, `build`, `repo`, `serve` and `generate --local`, and `deploy`'s chart ask
the path instead of comparing backend names. A new path is one module beside `engine` and `llmapi` implementing
`interface.PipelinePath`, and one line in `PATHS`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specbuild import backends

if TYPE_CHECKING:
    from specbuild.paths.interface import PipelinePath

# A backend record's path -> the module whose PATH plans it
PATHS = {"engine": "specbuild.paths.engine_path", "llmapi": "specbuild.paths.llmapi_path"}


def for_backend(name: str) -> PipelinePath:
    """The path that builds and serves with backend `name` (SpecError for an unknown name)."""
    import importlib

    return importlib.import_module(PATHS[backends.get(name).path]).PATH
