"""`serving_gate`: the model that is READY while the deployment takes new requests; the drain closes it
(specbuild.triton.drain). What it means, and the check each entry model makes, are in specbuild.contract.serving_gate."""

from __future__ import annotations

import numpy as np

from specbuild.contract.serving_gate import OUTPUT


class TritonPythonModel:
    def execute(self, requests: list) -> list:
        import triton_python_backend_utils as pb_utils

        return [pb_utils.InferenceResponse([pb_utils.Tensor(OUTPUT, np.array([True]))]) for _ in requests]
