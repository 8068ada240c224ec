"""Triton's floor for one BLS call on this machine, measured: a BLS call to an identity Python model.

`measure_floor()` writes a two-model repository into a temporary folder (`triton.models.floor`: `floor_bls`
verifies a draft through `floor_identity`, which declares `tensorrt_llm`'s tensors and answers after `work_s` of
busy work, nothing else), starts tritonserver on it (loopback, free ports), asks for `calls` calls, stops it and
returns the median and quartiles of each call's seconds beyond the work. `bench --url` runs it after measuring
the deployment, when that server runs on this machine, with the shape of the deployment's calls (the best K's
draft length, and the in-process seconds of one model call as the work), and reports specbuild's own cost per
model call against it, and the most one stream through Triton could get at that floor
(`serving_overhead.floor`, `ceiling`).
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

from specbuild.contract import tensors
from specbuild.contract.pbtxt import config_proto, to_pbtxt
from specbuild.triton.configs import add_tensors
from specbuild.triton.models.floor import CALLER, IDENTITY, WORK_PARAMETER
from specbuild.triton.repository import shim_source

FLOOR_MODULE = "specbuild.triton.models.floor"


def _config(name: str, work_us: int, inputs: tuple[tensors.Tensor, ...], outputs: tuple[tensors.Tensor, ...]) -> str:
    """A bare Python model: one CPU instance, Triton's default scheduler (no dynamic batcher, no queue policy)."""
    pb = config_proto()
    config = pb.ModelConfig(name=name, backend="python", max_batch_size=1)
    add_tensors(pb, config.input, inputs, "TYPE_FP32")
    add_tensors(pb, config.output, outputs, "TYPE_FP32")
    config.instance_group.add(count=1, kind=pb.ModelInstanceGroup.KIND_CPU)
    config.parameters[WORK_PARAMETER].string_value = str(work_us)
    return to_pbtxt(config)


def write_floor_repository(folder: Path, work_s: float = 0.0) -> Path:
    """The two models (config.pbtxt and a model.py that imports the installed specbuild's code); the identity
    declares `tensorrt_llm`'s inputs and outputs (contract.tensors) and works `work_s` seconds per call."""
    work_us = max(0, round(work_s * 1e6))
    counts = tuple(tensors.Tensor(name, "TYPE_INT32", (1,)) for name in ("CALLS", "PROMPT_LEN", "DRAFT_LEN"))
    configs = {
        IDENTITY: _config(IDENTITY, work_us, tensors.LLM_INPUTS, tensors.LLM_OUTPUTS),
        CALLER: _config(CALLER, work_us, counts, (tensors.Tensor("SECONDS", "TYPE_FP64", (-1,)),)),
    }
    for name, text in configs.items():
        (folder / name / "1").mkdir(parents=True, exist_ok=True)
        (folder / name / "config.pbtxt").write_text(text)
        (folder / name / "1" / "model.py").write_text(shim_source(FLOOR_MODULE))
    return folder


WORK_BUDGET_S = 5.0  # a floor of long calls takes fewer of them: at most this much of its time is the calls' work


def floor_calls(work_s: float) -> int:
    """How many calls measure a floor: 300, fewer (down to 50) when their work would take more than WORK_BUDGET_S."""
    return max(50, min(300, int(WORK_BUDGET_S / work_s))) if work_s > 0 else 300


def measure_floor(
    calls: int | None = None, prompt_len: int = 64, draft_len: int = 3, work_s: float = 0.0, install: Any = None
) -> dict[str, Any]:
    """The seconds of one BLS call here beyond its work: {"median_s", "p25_s", "p75_s", "calls", "prompt_len",
    "draft_len", "work_s"} (the first tenth of the calls, warm-up, left out). calls: None = `floor_calls(work_s)`."""
    calls = floor_calls(work_s) if calls is None else calls
    import numpy as np
    import tritonclient.grpc as grpcclient

    from specbuild.triton.server import ServerHandle, ServerOptions

    with tempfile.TemporaryDirectory(prefix="specbuild-floor-") as tmp:
        repo = write_floor_repository(Path(tmp) / "repo", work_s)
        handle = ServerHandle(ServerOptions(repo=repo), log_path=Path(tmp) / "tritonserver.log", install=install)
        handle.start(timeout=120)
        try:
            client = grpcclient.InferenceServerClient(handle.grpc_url)
            inputs = []
            for name, value in (("CALLS", calls), ("PROMPT_LEN", prompt_len), ("DRAFT_LEN", draft_len)):
                tensor = grpcclient.InferInput(name, [1, 1], "INT32")
                tensor.set_data_from_numpy(np.asarray([[value]], dtype=np.int32))
                inputs.append(tensor)
            seconds = client.infer(CALLER, inputs).as_numpy("SECONDS").reshape(-1)
            client.close()
        finally:
            handle.stop()
    kept = sorted(float(s) for s in seconds[len(seconds) // 10 :])
    quartiles = statistics.quantiles(kept, n=4)
    return {
        "median_s": round(statistics.median(kept), 7),
        "p25_s": round(quartiles[0], 7),
        "p75_s": round(quartiles[2], 7),
        "calls": len(kept),
        "prompt_len": prompt_len,
        "draft_len": draft_len,
        "work_s": round(max(work_s, 0.0), 7),
    }
