"""The Python-backend models' logic, without Triton: pre/postprocessing and the reference LLM wrapper."""

from __future__ import annotations

import numpy as np
import pytest

from specbuild.triton.models import reference_llm
from specbuild.triton.models.common import InvalidInput, resolve_path
from specbuild.triton.models.postprocessing import Postprocessor
from specbuild.triton.models.preprocessing import Preprocessor, load_tokenizer, word_list


@pytest.fixture(scope="module")
def tokenizer(example_tiny):
    return load_tokenizer(example_tiny.target)


def test_preprocessing_encodes_with_nvidia_outputs(tokenizer):
    pre = Preprocessor(tokenizer)
    out = pre({"QUERY": np.array([[b"def add(a, b):"], [b"x"]], dtype=object),
               "REQUEST_OUTPUT_LEN": np.array([[7], [3]], dtype=np.int32)})
    first = tokenizer.encode("def add(a, b):")
    assert out["REQUEST_INPUT_LEN"].tolist() == [[len(first)], [len(tokenizer.encode("x"))]]
    assert out["INPUT_ID"].dtype == np.int32 and out["INPUT_ID"].shape == (2, len(first))
    assert out["INPUT_ID"][0].tolist() == first
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    assert out["INPUT_ID"][1, len(tokenizer.encode("x")):].tolist() == [pad] * (len(first) - len(tokenizer.encode("x")))
    assert out["OUT_END_ID"].tolist() == [[tokenizer.eos_token_id]] * 2
    assert out["REQUEST_OUTPUT_LEN"].tolist() == [[7], [3]]
    assert out["EMBEDDING_BIAS"].shape == (2, 0)
    assert out["STOP_WORDS_IDS"].shape == (2, 2, 1) and (out["STOP_WORDS_IDS"][:, 1] == -1).all()
    with pytest.raises(InvalidInput, match="REQUEST_OUTPUT_LEN"):
        pre({"QUERY": np.array([[b"x"]], dtype=object)})
    with pytest.raises(InvalidInput, match="UTF-8"):
        pre({"QUERY": np.array([[b"\xff\xfe"]], dtype=object), "REQUEST_OUTPUT_LEN": np.array([[1]], np.int32)})


def test_word_list_format_is_tensorrt_llms(tokenizer):
    a, b = tokenizer.encode("return", add_special_tokens=False), tokenizer.encode(" None", add_special_tokens=False)
    out = word_list(tokenizer, [["return", " None"], []])
    assert out.shape == (2, 2, len(a) + len(b))
    assert out[0, 0].tolist() == a + b
    assert out[0, 1, :2].tolist() == [len(a), len(a) + len(b)] and (out[0, 1, 2:] == -1).all()
    assert (out[1, 1] == -1).all()


def test_postprocessing_decodes_up_to_sequence_length(tokenizer):
    ids = tokenizer.encode("print('hi')")
    post = Postprocessor(tokenizer)
    tokens = np.array([[ids + [0, 0]]], dtype=np.int32)  # [b, beam, len]
    out = post({"TOKENS_BATCH": tokens, "SEQUENCE_LENGTH": np.array([[len(ids)]], np.int32)})
    assert out["OUTPUT"][0, 0].decode() == tokenizer.decode(ids, skip_special_tokens=True)
    with pytest.raises(InvalidInput, match="SEQUENCE_LENGTH"):
        post({"TOKENS_BATCH": tokens, "SEQUENCE_LENGTH": np.array([[99]], np.int32)})
    with pytest.raises(InvalidInput, match="vocabulary"):
        post({"TOKENS_BATCH": np.array([[[10**6]]], np.int32), "SEQUENCE_LENGTH": np.array([[1]], np.int32)})


def test_resolve_path_is_relative_to_the_repository(tmp_path):
    args = {"model_repository": str(tmp_path / "repo" / "preprocessing")}
    assert resolve_path("../engines/p/target/engine", args) == (tmp_path / "engines/p/target/engine").resolve()
    assert resolve_path("/abs/dir", args) == __import__("pathlib").Path("/abs/dir")


def _llm_inputs(**extra):
    inputs = {"input_ids": np.array([[5, 6, 7, 0]], np.int32), "input_lengths": np.array([[3]], np.int32),
              "request_output_len": np.array([[2]], np.int32)}
    inputs.update(extra)
    return inputs


def test_reference_llm_refuses_what_it_cannot_honour():
    reference_llm.check_supported(_llm_inputs(beam_width=np.array([[1]], np.int32),
                                              embedding_bias=np.zeros((1, 0), np.float32),
                                              stop_words_list=np.array([[[0], [-1]]], np.int32),
                                              min_tokens=np.array([[2]], np.int32)))
    for name, value, match in (
        ("beam_width", np.array([[2]], np.int32), "beam_width"),
        ("streaming", np.array([[True]]), "decoupled"),
        ("return_log_probs", np.array([[True]]), "return_log_probs"),
        ("stop_words_list", np.array([[[7], [1]]], np.int32), "stop_words_list"),
        ("lora_task_id", np.array([[1]], np.uint64), "lora_task_id"),
    ):
        with pytest.raises(InvalidInput, match=match):
            reference_llm.check_supported(_llm_inputs(**{name: value}))
    with pytest.raises(InvalidInput, match="input_lengths"):
        reference_llm.split_rows({"input_ids": np.array([[1]], np.int32)})


def test_reference_llm_rows_and_assembly():
    inputs = _llm_inputs(input_ids=np.array([[5, 6, 7], [8, 9, 0]], np.int32),
                         input_lengths=np.array([[3], [2]], np.int32),
                         request_output_len=np.array([[2], [2]], np.int32),
                         pad_id=np.array([[0], [0]], np.int32))
    rows = reference_llm.split_rows(inputs)
    assert [r["input_ids"].tolist() for r in rows] == [[5, 6, 7], [8, 9, 0]]
    results = [{"output_ids": np.array([[5, 6, 7, 1, 2]], np.int32), "sequence_length": np.array([5], np.int32),
                "acceptance_rate": np.array([0.5], np.float32), "total_accepted_draft_tokens": np.array([1], np.int32),
                "total_draft_tokens": np.array([2], np.int32)},
               {"output_ids": np.array([[8, 9, 3]], np.int32), "sequence_length": np.array([3], np.int32),
                "acceptance_rate": np.array([0.0], np.float32), "total_accepted_draft_tokens": np.array([0], np.int32),
                "total_draft_tokens": np.array([0], np.int32)}]
    out = reference_llm.assemble(inputs, results, exclude_default=False)
    assert out["output_ids"].shape == (2, 1, 5)
    assert out["output_ids"][1, 0].tolist() == [8, 9, 3, 0, 0]
    assert out["sequence_length"].tolist() == [[5], [3]]
    assert out["total_draft_tokens"].tolist() == [[2], [0]]
    excluded = reference_llm.assemble({**inputs, "exclude_input_in_output": np.array([[True], [True]])}, results, False)
    assert excluded["output_ids"][0, 0, :2].tolist() == [1, 2] and excluded["sequence_length"].tolist() == [[2], [1]]


def test_served_reference_models_do_not_oversubscribe_the_cpu(example_tiny):
    """Each served LLM model runs in its own process: a small model gets one torch thread."""
    import torch

    from specbuild.runtime.loading import HF_CHECKPOINT, ModelSource

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        reference_llm._share_cpu(ModelSource("target", example_tiny.target, HF_CHECKPOINT, {}), "cpu")
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
