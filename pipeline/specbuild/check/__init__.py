"""`specbuild check`: can this target/draft pair work, and does it fit the GPU?

    from specbuild.check import run_check
    report = run_check(spec)          # CheckReport; report.ok, report.to_dict()

Modules: `pair` (the orchestrator), `tokenizer` (equivalence), `memory` (the memory plan),
`weights` (the NaN/Inf scan of the weights), `report` (findings and the report document).
Checkpoint facts come from `specbuild.hfmodel`.
"""

from specbuild.check.memory import MemoryPlan, plan_memory
from specbuild.check.pair import run_check
from specbuild.check.report import CheckReport, Finding

__all__ = ["CheckReport", "Finding", "MemoryPlan", "plan_memory", "run_check"]
