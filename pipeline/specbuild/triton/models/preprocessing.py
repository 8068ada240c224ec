"""`preprocessing`: text -> token ids, the tensors of NVIDIA's preprocessing model, text only.

Per request (batch dimension b first), as NVIDIA/TensorRT-LLM
`triton_backend/all_models/inflight_batcher_llm/preprocessing/1/model.py` does it:
  QUERY [b, 1] -> INPUT_ID [b, max_len] (right-padded with the pad id), REQUEST_INPUT_LEN [b, 1];
  DECODER_INPUT_ID [b, 1] = the pad id and REQUEST_DECODER_INPUT_LEN [b, 1] = 1 (no DECODER_QUERY is served);
  STOP_WORDS_DICT / BAD_WORDS_DICT [b, n] -> STOP_WORDS_IDS / BAD_WORDS_IDS [b, 2, m] (TensorRT-LLM's
  word-list format: row 0 the flat ids, row 1 the cumulative end offsets padded with -1; [b, 2, 0] when
  the input is absent, [b, 2, 1] = [[0], [-1]] when it holds only empty words);
  EMBEDDING_BIAS_WORDS/WEIGHTS -> EMBEDDING_BIAS [b, vocab], or [b, 0] when absent or without any word;
  END_ID / PAD_ID [b, 1] default to the tokenizer's eos / pad (pad = eos when it has none).

One addition: a checkpoint that lists several end ids (generation_config.json's eos_token_id, three for Llama 3.x
instruct models; `specbuild.hfmodel.end_ids`) ends a request that names no END_ID at any of them, as the BLS and
the local path do. The engine takes one end_id, so the others go to the engine as stop words, which TensorRT-LLM
keeps in the output (postprocessing's skip_special_tokens hides the special ones from the text).

One deliberate difference: NVIDIA's model turns present-but-empty EMBEDDING_BIAS_WORDS/WEIGHTS (what its
end-to-end clients send) into an all-zero bias of the tokenizer's length, which the engine refuses when
the tokenizer is shorter than the padded vocabulary (triton-inference-server/tensorrtllm_backend#720).
An empty bias is what the C++ backend treats as no bias (`utils.cc` drops a bias of shape [0]).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specbuild.contract import tensors
from specbuild.contract.serving_gate import Gate
from specbuild.contract.words import to_word_list
from specbuild.errors import RequestError
from specbuild.hfmodel import end_ids, listed_end_ids
from specbuild.triton.models.common import as_text, flag, parameters, required, resolve_path, serve_each


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    if not path.is_dir():
        raise FileNotFoundError(
            f"tokenizer folder {path} does not exist: build the engines first (`specbuild build`) "
            "or regenerate the repository with the right --tokenizer-dir."
        )
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)


class Preprocessor:
    def __init__(self, tokenizer, add_special_tokens: bool = True, other_end_ids: tuple[int, ...] = ()):
        self.tokenizer = tokenizer
        self.add_special_tokens = add_special_tokens
        self.other_end_ids = other_end_ids  # stop words of the requests that name no END_ID (specbuild.hfmodel.end_ids)
        self.end_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.end_id
        if self.end_id is None:
            raise ValueError("the tokenizer has no eos token: specbuild needs one to stop generation.")

    def encode(self, text: str, name: str = "QUERY") -> list[int]:
        """One prompt's token ids, as the model's INPUT_ID row (the BLS tokenizes with this too)."""
        ids = self.tokenizer.encode(text, add_special_tokens=self.add_special_tokens)
        if len(ids) == 0:
            raise RequestError(f"input {name} encodes to no tokens: send non-empty text.")
        return [int(t) for t in ids]

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if "QUERY" not in inputs or "REQUEST_OUTPUT_LEN" not in inputs:
            raise RequestError("inputs QUERY and REQUEST_OUTPUT_LEN are required.")
        queries = inputs["QUERY"].reshape(inputs["QUERY"].shape[0], -1)
        batch = queries.shape[0]
        ids = [self.encode(as_text(q[0], "QUERY")) for q in queries]
        end_id = self._per_row(inputs.get("END_ID"), self.end_id, batch)
        pad_id = self._per_row(inputs.get("PAD_ID"), self.pad_id, batch)
        width = max(len(row) for row in ids)
        input_id = np.empty((batch, width), dtype=np.int32)
        for i, row in enumerate(ids):
            input_id[i, :] = pad_id[i, 0]
            input_id[i, : len(row)] = row
        return {
            "INPUT_ID": input_id,
            "REQUEST_INPUT_LEN": np.array([[len(row)] for row in ids], dtype=np.int32),
            "DECODER_INPUT_ID": pad_id.copy(),
            "REQUEST_DECODER_INPUT_LEN": np.ones((batch, 1), dtype=np.int32),
            "BAD_WORDS_IDS": to_word_list(self.tokenizer, self._words(inputs, "BAD_WORDS_DICT", batch), batch),
            "STOP_WORDS_IDS": to_word_list(
                self.tokenizer,
                self._words(inputs, "STOP_WORDS_DICT", batch),
                batch,
                None if "END_ID" in inputs else [[e] for e in self.other_end_ids],
            ),
            "EMBEDDING_BIAS": self._bias(inputs, batch),
            "REQUEST_OUTPUT_LEN": inputs["REQUEST_OUTPUT_LEN"].reshape(batch, -1).astype(np.int32),
            "OUT_END_ID": end_id,
            "OUT_PAD_ID": pad_id,
        }

    @staticmethod
    def _per_row(value: np.ndarray | None, default: int, batch: int) -> np.ndarray:  # -> [b, 1]
        if value is None:
            return np.full((batch, 1), default, dtype=np.int32)
        return value.reshape(batch, -1)[:, :1].astype(np.int32)

    @staticmethod
    def _words(inputs: dict[str, np.ndarray], name: str, batch: int) -> list[list[str]] | None:
        value = inputs.get(name)
        if value is None:
            return None
        rows = value.reshape(batch, -1)
        return [[w for w in (as_text(item, name) for item in row) if w] for row in rows]

    def _bias(self, inputs: dict[str, np.ndarray], batch: int) -> np.ndarray:  # -> [b, vocab] or [b, 0]
        words, weights = inputs.get("EMBEDDING_BIAS_WORDS"), inputs.get("EMBEDDING_BIAS_WEIGHTS")
        if (words is None or words.size == 0) and (weights is None or weights.size == 0):
            return np.zeros((batch, 0), dtype=np.float32)  # no bias: absent to the engine
        if words is None or weights is None or words.size != weights.size:
            raise RequestError(
                "EMBEDDING_BIAS_WORDS and EMBEDDING_BIAS_WEIGHTS must be sent together, one weight per word."
            )
        bias = np.zeros((batch, len(self.tokenizer)), dtype=np.float32)
        for i, (row_words, row_weights) in enumerate(zip(words.reshape(batch, -1), weights.reshape(batch, -1))):
            for word, weight in zip(row_words, row_weights):
                for token in self.tokenizer.encode(as_text(word, "EMBEDDING_BIAS_WORDS"), add_special_tokens=False):
                    bias[i, token] += float(weight)
        return bias


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        import triton_python_backend_utils as pb_utils

        self.pb = pb_utils
        params = parameters(args)
        path = resolve_path(required(params, "tokenizer_dir", "preprocessing"), args)
        tokenizer = load_tokenizer(path)
        others = end_ids(tokenizer.eos_token_id, listed_end_ids(path))[1:]  # the checkpoint's other end ids
        self.run = Preprocessor(tokenizer, flag(params, "add_special_tokens", True), others)
        self.names = [t.name for t in tensors.PRE_INPUTS]
        self.gate = Gate(pb_utils, params)

    def execute(self, requests: list) -> list:
        draining = self.gate.refusal("preprocessing: ")  # the ensemble's first step: new ensemble requests refused
        if draining is not None:
            return [self.pb.InferenceResponse(error=draining) for _ in requests]
        return serve_each(self.pb, requests, self.names, self.run, "preprocessing")
