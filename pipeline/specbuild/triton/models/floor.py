"""Triton's floor for one BLS call on this machine: two Python models that do nothing else (`triton.floor`).

- `floor_identity`: takes the tensors of a verify call to `tensorrt_llm` (input_ids, draft_input_ids,
  request_output_len; contract.tensors) and answers output_ids and sequence_length built from them, with no model
  behind it.
- `floor_bls`: for one request (CALLS, PROMPT_LEN, DRAFT_LEN), calls `floor_identity` CALLS times from its execute
  the way specbuild's BLS calls its models (`pb_utils.InferenceRequest(...).exec()`, the batch dimension of 1, the
  outputs read back as numpy) and answers the seconds of each call (SECONDS, FP64 [CALLS]).

What a call costs here is what the BLS cannot avoid: the stub's IPC to tritonserver and back, the scheduler, the
tensors in shared memory. specbuild's own per-call cost is measured against it (`bench --url`).
"""

from __future__ import annotations

import time

import numpy as np

IDENTITY = "floor_identity"
CALLER = "floor_bls"


class Identity:
    def execute(self, requests):
        import triton_python_backend_utils as pb_utils

        responses = []
        for request in requests:
            prompt = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy()
            draft = pb_utils.get_input_tensor_by_name(request, "draft_input_ids")
            tokens = np.concatenate([prompt, draft.as_numpy()], axis=1) if draft is not None else prompt
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("output_ids", tokens[:, None, :].astype(np.int32)),
                pb_utils.Tensor("sequence_length", np.asarray([[tokens.shape[1]]], dtype=np.int32)),
            ]))
        return responses


class Caller:
    def execute(self, requests):
        import triton_python_backend_utils as pb_utils

        responses = []
        for request in requests:
            value = lambda name: int(pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0])  # noqa: E731
            calls, prompt_len, draft_len = value("CALLS"), value("PROMPT_LEN"), value("DRAFT_LEN")
            inputs = {"input_ids": np.arange(prompt_len, dtype=np.int32) % 1000,
                      "draft_input_ids": np.arange(draft_len, dtype=np.int32) % 1000,
                      "request_output_len": np.asarray([draft_len + 1], dtype=np.int32)}
            seconds = np.zeros(calls, dtype=np.float64)
            for i in range(calls):
                start = time.perf_counter()
                tensors = [pb_utils.Tensor(name, np.ascontiguousarray(array[None])) for name, array in inputs.items()]
                response = pb_utils.InferenceRequest(model_name=IDENTITY, inputs=tensors,
                                                     requested_output_names=[]).exec()
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                {t.name(): t.as_numpy() for t in response.output_tensors()}
                seconds[i] = time.perf_counter() - start
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("SECONDS", seconds[None])]))
        return responses


class TritonPythonModel:
    """One class for both models: the model's name says which it is."""

    def initialize(self, args: dict) -> None:
        self.model = Identity() if args["model_name"] == IDENTITY else Caller()

    def execute(self, requests):
        return self.model.execute(requests)
