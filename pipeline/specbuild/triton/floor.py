"""Triton's floor for one BLS call on this machine, measured: a bare BLS call to an identity Python model.

`measure_floor()` writes a two-model repository into a temporary folder (`triton.models.floor`: `floor_bls` calls
`floor_identity` with the tensors of a verify call, nothing else), starts tritonserver on it (loopback, free
ports), asks for `calls` calls, stops it and returns their median and quartiles. `bench --url` runs it beside
the deployment it measures, when that server runs on this machine, and reports specbuild's own cost per model
call against it (`serving_overhead.floor`).
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

from specbuild.contract.pbtxt import config_proto, to_pbtxt
from specbuild.triton.models.floor import CALLER, IDENTITY
from specbuild.triton.repository import shim_source

FLOOR_MODULE = "specbuild.triton.models.floor"


def _config(name: str, inputs: list[tuple[str, str, list[int]]], outputs: list[tuple[str, str, list[int]]]) -> str:
    pb = config_proto()
    config = pb.ModelConfig(name=name, backend="python", max_batch_size=1)
    for field, rows in (("input", inputs), ("output", outputs)):
        for tensor, dtype, dims in rows:
            getattr(config, field).add(name=tensor, data_type=getattr(pb, dtype), dims=dims)
    config.instance_group.add(count=1, kind=pb.ModelInstanceGroup.KIND_CPU)
    return to_pbtxt(config)


def write_floor_repository(folder: Path) -> Path:
    """The two models (config.pbtxt and a model.py that imports the installed specbuild's code)."""
    configs = {
        IDENTITY: _config(IDENTITY, [("input_ids", "TYPE_INT32", [-1]), ("draft_input_ids", "TYPE_INT32", [-1]),
                                     ("request_output_len", "TYPE_INT32", [1])],
                          [("output_ids", "TYPE_INT32", [-1, -1]), ("sequence_length", "TYPE_INT32", [-1])]),
        CALLER: _config(CALLER, [("CALLS", "TYPE_INT32", [1]), ("PROMPT_LEN", "TYPE_INT32", [1]),
                                 ("DRAFT_LEN", "TYPE_INT32", [1])], [("SECONDS", "TYPE_FP64", [-1])]),
    }
    for name, text in configs.items():
        (folder / name / "1").mkdir(parents=True, exist_ok=True)
        (folder / name / "config.pbtxt").write_text(text)
        (folder / name / "1" / "model.py").write_text(shim_source(FLOOR_MODULE))
    return folder


def measure_floor(calls: int = 300, prompt_len: int = 64, draft_len: int = 3, install: Any = None) -> dict[str, Any]:
    """The seconds of one bare BLS call here: {"median_s", "p25_s", "p75_s", "calls", "prompt_len", "draft_len"}
    (the first tenth of the calls, warm-up, left out)."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    from specbuild.triton.server import ServerHandle, ServerOptions

    with tempfile.TemporaryDirectory(prefix="specbuild-floor-") as tmp:
        repo = write_floor_repository(Path(tmp) / "repo")
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
    kept = sorted(float(s) for s in seconds[len(seconds) // 10:])
    quartiles = statistics.quantiles(kept, n=4)
    return {"median_s": round(statistics.median(kept), 7), "p25_s": round(quartiles[0], 7),
            "p75_s": round(quartiles[2], 7), "calls": len(kept), "prompt_len": prompt_len, "draft_len": draft_len}
