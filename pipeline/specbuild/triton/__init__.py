"""Triton serving: the model repository (configs + Python models), the server process, the client.

- `configs`: typed `ModelConfig` builders (tensor tables from `specbuild.contract.tensors`);
  `repository`: `specbuild repo`.
- `models`: the Python-backend models: preprocessing, postprocessing, the reference LLM and the
  speculative BLS (`models.bls`, with `bls_request` and `bls_metrics`).
- `server`, `deploy`: find, run and check `tritonserver` (`specbuild serve`).
- `client`: `SpecbuildClient`, the public tritonclient-based client (gRPC streaming or HTTP). The
  reading of a whole generation (text, timing, figures) is `specbuild.session.served`.
"""
