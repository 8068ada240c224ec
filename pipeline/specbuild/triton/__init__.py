"""Triton serving: the model repository (configs + Python models), the server process, the client.

- `tensors`: the tensor contracts (NVIDIA `inflight_batcher_llm` names).
- `configs`: typed `ModelConfig` builders; `repository`: `specbuild repo`.
- `models`: the Python-backend models (preprocessing, postprocessing, the reference LLM); the BLS
  model is `specbuild.bls.model`.
- `server`: find and run `tritonserver` (`specbuild serve`); `client`: `SpecbuildClient`.
"""
