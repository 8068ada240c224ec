"""TensorRT-LLM's sampling-parameter semantics, as the `tensorrt_llm` model applies them to one request.

What the C++ stack does with the sampling tensors, read in NVIDIA/TensorRT-LLM:
- `triton_backend/inflight_batcher_llm/src/utils.cc` (`getSamplingConfigFromTensors`, commit c8c6df0):
  an absent tensor stays unset; `runtime_top_p <= 0` is dropped as if absent.
- `cpp/tensorrt_llm/executor/samplingConfig.cpp` (commit 3585984; `checkTopK`, `checkTopP`, `checkTemperature`): a set
  top_k must be >= 0, top_p in (0, 1], temperature >= 0; a failed check throws
  "[TensorRT-LLM][ERROR] Assertion failed: <condition>" and the request fails.
- `cpp/tensorrt_llm/layers/defaultDecodingParams.h` (commit 1020a8d): unset means temperature 1.0, top_k 0, top_p 0.0,
  seed 0 (so unseeded sampling is reproducible).
- `cpp/tensorrt_llm/layers/topKSamplingLayer.cu` (commit 027cd51, `setup_topk_runtime_args`; the same rule
  in every stored version of it and of its successor `setupTopKRuntimeArgs`): top_k 0 with top_p 0 becomes
  top_k 1, i.e. greedy; top_k > 0 with top_p 0 becomes top_p 1. So a request that sends no sampling tensor, or only a temperature, is greedy; top_k 0 with top_p 1.0
  samples from the whole distribution; top_k 1 is greedy whatever the rest says.
- `cpp/tensorrt_llm/kernels/penaltyKernels.cu` (`batchApplyPenalty`): a temperature other than 1.0
  multiplies every logit by 1 / (T + 1e-6) in float32, clamps it to the logits dtype's largest finite
  value, and stores it back in the logits dtype (the newer stored version; the older one, commit 249d93d,
  has the same scale without the clamp, so float16 overflows to inf instead). With T = 0 that factor is 1e6: float16 logits
  above 0.0655 all saturate at 65504 and tie, so "temperature 0" samples among them. It is not greedy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specbuild.contract.logits import LOGITS_DTYPES, engine_logits
from specbuild.errors import RequestError
from specbuild.speculative.interfaces import SamplingParams
from specbuild.speculative.sampling import process_logits

__all__ = ["TrtllmSampling"]

DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DEFAULT_TOP_P, DEFAULT_SEED = 1.0, 0, 0.0, 0


def _check(condition: bool, text: str) -> None:
    if not condition:
        raise RequestError(f"[TensorRT-LLM][ERROR] Assertion failed: {text}")


@dataclass(frozen=True)
class TrtllmSampling:
    temperature: float  # 1.0 when the request sent none
    top_k: int  # after the sampling layer's setup: 1 means greedy
    top_p: float  # after setup: in (0, 1] unless greedy
    seed: int  # 0 when the request sent none

    @classmethod
    def from_tensors(
        cls,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
    ) -> TrtllmSampling:
        """The executor's SamplingConfig from the request's (possibly absent) tensors, checked and set up."""
        if top_p is not None and top_p <= 0.0:
            top_p = None  # utils.cc: runtime_top_p <= 0 is treated as not given
        if top_k is not None:
            _check(top_k >= 0, "topK.value() >= 0")
        if top_p is not None:  # checkTopP's "topP.value() > 0.f" cannot fail here: utils.cc dropped it first
            _check(top_p <= 1.0, "topP.value() <= 1.f")
        if temperature is not None:
            _check(temperature >= 0.0, "temperature.value() >= 0.f")
        k = DEFAULT_TOP_K if top_k is None else int(top_k)
        p = DEFAULT_TOP_P if top_p is None else float(top_p)
        if k == 0 and p == 0.0:
            k = 1  # the sampling layer's greedy case
        if k > 0 and p == 0.0:
            p = 1.0
        return cls(
            temperature=DEFAULT_TEMPERATURE if temperature is None else float(temperature),
            top_k=k,
            top_p=p,
            seed=DEFAULT_SEED if seed is None else int(seed),
        )

    @property
    def greedy(self) -> bool:
        return self.top_k == 1

    @property
    def scales(self) -> bool:
        """penaltyKernels.cu applies the temperature only when it differs from 1.0 by 1e-9 or more."""
        return abs(self.temperature - DEFAULT_TEMPERATURE) >= 1e-9

    def probs(self, logits: np.ndarray, logits_dtype: str) -> np.ndarray:
        """[n, vocab] (or [vocab]) logits -> float64 probabilities the executor samples from."""
        x = engine_logits(logits, logits_dtype)
        if self.scales:
            dtype = LOGITS_DTYPES[logits_dtype]
            inv = np.float32(1.0) / (np.float32(self.temperature) + np.float32(1e-6))
            limit = np.float32(np.finfo(dtype).max)
            x = np.clip(x.astype(np.float32) * inv, -limit, limit).astype(dtype)
        return process_logits(x.astype(np.float64), SamplingParams(temperature=1.0, top_k=self.top_k, top_p=self.top_p))
