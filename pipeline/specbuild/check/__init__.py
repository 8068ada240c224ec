"""`specbuild check`: can this target/draft pair work, and does it fit the GPU?

    from specbuild.check import run_check
    report = run_check(spec)          # CheckReport; report.ok, report.to_dict()

Modules: `pair` (the orchestrator), `tokenizer` (equivalence), `memory` (the memory plan) and
`advice` (what to change when it does not fit), `llmapi_memory` (the LLM API path's plan and advice:
one process, one KV pool, one fraction), `weights` (the NaN/Inf scan of the weights), `report`
(findings and the report document), `record` (the last passing check, for `specbuild up`), `measure`
(`check --measure`: alpha, c and the best K, measured in-process with the benchmark's tools).
Checkpoint facts come from `specbuild.hfmodel`.
"""

from specbuild.check.advice import plan_memory
from specbuild.check.memory import MemoryPlan
from specbuild.check.pair import run_check
from specbuild.check.report import CheckReport, Finding

__all__ = ["CheckReport", "Finding", "MemoryPlan", "plan_memory", "run_check"]
