"""`postprocessing`: token ids -> text, the tensors of NVIDIA's postprocessing model.

TOKENS_BATCH [b, beam, len] and SEQUENCE_LENGTH [b, beam] -> OUTPUT [b * beam]: each row's first
SEQUENCE_LENGTH ids decoded with the tokenizer (special tokens skipped unless configured otherwise),
one string per sequence, batch x beam flattened, as NVIDIA/TensorRT-LLM
`triton_backend/all_models/inflight_batcher_llm/postprocessing/1/model.py` returns it (its clients
read `OUTPUT[0]` as the text). An id past the tokenizer (the padded rows of a vocabulary padded for the
engine, as Qwen2.5's 152064 rows beside 151665 tokens) has no text and decodes to nothing, as the
tokenizer decodes it there and in the BLS; a negative id is refused.
"""

from __future__ import annotations

import numpy as np

from specbuild.contract import tensors
from specbuild.errors import RequestError
from specbuild.triton.models.common import flag, parameters, required, resolve_path, serve_each
from specbuild.triton.models.preprocessing import load_tokenizer


def decode_ids(tokenizer, ids: list[int], skip_special_tokens: bool = True) -> str:
    """The text of one sequence, decoded as postprocessing decodes it (the BLS uses the same call, so its text
    equals postprocessing's for the same ids)."""
    return tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


class Postprocessor:
    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if "TOKENS_BATCH" not in inputs or "SEQUENCE_LENGTH" not in inputs:
            raise RequestError("inputs TOKENS_BATCH and SEQUENCE_LENGTH are required.")
        tokens = inputs["TOKENS_BATCH"]
        if tokens.ndim == 2:  # [b, len]: a single beam
            tokens = tokens[:, None, :]
        batch, beams, width = tokens.shape
        lengths = inputs["SEQUENCE_LENGTH"]
        if lengths.size != batch * beams:
            raise RequestError(
                f"SEQUENCE_LENGTH holds {lengths.size} lengths for the {batch * beams} sequences of TOKENS_BATCH "
                f"{list(tokens.shape)}: send one length per sequence."
            )
        lengths = lengths.reshape(batch, beams)
        out = np.empty(batch * beams, dtype=object)  # [b * beam]
        for i in range(batch):
            for j in range(beams):
                n = int(lengths[i, j])
                if not 0 <= n <= width:
                    raise RequestError(f"SEQUENCE_LENGTH {n} is outside 0..{width} (the TOKENS_BATCH length).")
                ids = [int(t) for t in tokens[i, j, :n]]
                if any(t < 0 for t in ids):  # the tokenizer would raise: a client's mistake, said as one
                    raise RequestError("TOKENS_BATCH holds negative ids: token ids are >= 0.")
                out[i * beams + j] = decode_ids(self.tokenizer, ids, self.skip_special_tokens).encode("utf-8")
        return {"OUTPUT": out}


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        import triton_python_backend_utils as pb_utils

        self.pb = pb_utils
        params = parameters(args)
        path = resolve_path(required(params, "tokenizer_dir", "postprocessing"), args)
        self.run = Postprocessor(load_tokenizer(path), flag(params, "skip_special_tokens", True))
        self.names = [t.name for t in tensors.POST_INPUTS]

    def execute(self, requests: list) -> list:
        return serve_each(self.pb, requests, self.names, self.run, "postprocessing")
