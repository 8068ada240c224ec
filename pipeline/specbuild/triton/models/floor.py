"""Triton's floor for one BLS call on this machine: two Python models that do nothing else (`triton.floor_probe`).

- `floor_identity`: declares the tensors of `tensorrt_llm` (contract.tensors) and answers a verify call the way a
  target that accepts the whole draft does (output_ids: the input, the draft, one more token; sequence_length;
  the acceptance figures when asked for), with no model behind it. It spins for `work_us` microseconds (its
  config parameter) first, on one thread, the way a model computes: a call of that length waits for its answer as
  a real one does (an idle wait and a busy one are not the same to Triton's threads on a busy machine).
- `floor_bls`: for one request (CALLS, PROMPT_LEN, DRAFT_LEN), verifies a draft CALLS times from its execute
  through the same code as the BLS (`contract.adapters.ContractVerifier` over `common.call_model`), so the call
  carries exactly the tensors of a verify call, and answers the seconds of each call beyond the identity's work
  (SECONDS, FP64 [CALLS]).

What a call costs here is what the BLS cannot avoid: the stub's IPC to tritonserver and back, the scheduler, the
tensors in shared memory. specbuild's own per-call cost is measured against it (`bench --url`).
"""

from __future__ import annotations

import time

import numpy as np

from specbuild.contract.adapters import ContractVerifier
from specbuild.speculative.interfaces import Draft, SamplingParams
from specbuild.triton.models.common import call_model, parameters

IDENTITY = "floor_identity"
CALLER = "floor_bls"
WORK_PARAMETER = "work_us"  # both models': the identity spins that long, the caller takes it off its figures
END_ID, PAD_ID, NEXT_TOKEN = 2, 0, 7  # the ids of the floor's requests; the prompt and the draft avoid END_ID


class Identity:
    def __init__(self, work_s: float):
        self.work_s = work_s

    def execute(self, requests):
        import triton_python_backend_utils as pb_utils

        responses = []
        for request in requests:
            started = time.perf_counter()
            inputs = {tensor.name(): tensor.as_numpy() for tensor in request.inputs()}
            draft = inputs.get("draft_input_ids", np.zeros((1, 0), np.int32)).reshape(-1)
            tokens = np.concatenate([inputs["input_ids"].reshape(-1), draft, [NEXT_TOKEN]]).astype(np.int32)
            outputs = {"output_ids": tokens[None, None, :], "sequence_length": np.asarray([[tokens.size]], np.int32)}
            if np.any(inputs.get("return_perf_metrics", False)):
                outputs.update(
                    acceptance_rate=np.asarray([[1.0]], np.float32),
                    total_accepted_draft_tokens=np.asarray([[draft.size]], np.int32),
                    total_draft_tokens=np.asarray([[draft.size]], np.int32),
                )
            while time.perf_counter() - started < self.work_s:
                pass
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor(name, value) for name, value in outputs.items()]
                )
            )
        return responses


class Caller:
    def __init__(self, work_s: float):
        self.work_s = work_s

    def execute(self, requests):
        import triton_python_backend_utils as pb_utils

        responses = []
        for request in requests:
            value = lambda name: int(pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0])  # noqa: E731, B023
            calls, prompt_len, draft_len = value("CALLS"), value("PROMPT_LEN"), value("DRAFT_LEN")
            seconds: list[float] = []

            def timed_call(inputs):
                start = time.perf_counter()
                outputs = call_model(pb_utils, IDENTITY, inputs)
                seconds.append(time.perf_counter() - start - self.work_s)  # noqa: B023 (called within this iteration)
                return outputs

            verifier = ContractVerifier(timed_call, max_draft_len=max(draft_len, 1), end_id=END_ID, pad_id=PAD_ID)
            prompt = [int(t) for t in 3 + np.arange(prompt_len) % 1000]
            draft = Draft(tokens=[int(t) for t in 3 + np.arange(draft_len) % 1000])
            for _ in range(calls):
                verifier.verify(prompt, draft, SamplingParams())
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor("SECONDS", np.asarray(seconds, dtype=np.float64)[None])]
                )
            )
        return responses


class TritonPythonModel:
    """One class for both models: the model's name says which it is."""

    def initialize(self, args: dict) -> None:
        work_s = float(parameters(args).get(WORK_PARAMETER) or 0) * 1e-6
        self.model = Identity(work_s) if args["model_name"] == IDENTITY else Caller(work_s)

    def execute(self, requests):
        return self.model.execute(requests)
