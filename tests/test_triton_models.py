"""The Python-backend models' logic, without Triton: pre/postprocessing and the reference LLM wrapper."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from specbuild.contract.words import to_word_list, word_sequences
from specbuild.errors import RequestError
from specbuild.triton.models import reference_llm
from specbuild.triton.models.common import resolve_path
from specbuild.triton.models.postprocessing import Postprocessor
from specbuild.triton.models.preprocessing import Preprocessor, load_tokenizer


@pytest.fixture(scope="module")
def tokenizer(example_tiny):
    return load_tokenizer(example_tiny.target)


def test_preprocessing_encodes_with_nvidia_outputs(tokenizer):
    pre = Preprocessor(tokenizer)
    out = pre(
        {
            "QUERY": np.array([[b"def add(a, b):"], [b"x"]], dtype=object),
            "REQUEST_OUTPUT_LEN": np.array([[7], [3]], dtype=np.int32),
        }
    )
    first = tokenizer.encode("def add(a, b):")
    assert out["REQUEST_INPUT_LEN"].tolist() == [[len(first)], [len(tokenizer.encode("x"))]]
    assert out["INPUT_ID"].dtype == np.int32 and out["INPUT_ID"].shape == (2, len(first))
    assert out["INPUT_ID"][0].tolist() == first
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    assert out["INPUT_ID"][1, len(tokenizer.encode("x")) :].tolist() == [pad] * (
        len(first) - len(tokenizer.encode("x"))
    )
    assert out["OUT_END_ID"].tolist() == [[tokenizer.eos_token_id]] * 2
    assert out["REQUEST_OUTPUT_LEN"].tolist() == [[7], [3]]
    assert out["EMBEDDING_BIAS"].shape == (2, 0)
    assert out["STOP_WORDS_IDS"].shape == (2, 2, 0)  # not sent: NVIDIA's np.empty([batch, 2, 0])
    assert out["DECODER_INPUT_ID"].tolist() == [[pad], [pad]] and out["REQUEST_DECODER_INPUT_LEN"].tolist() == [
        [1],
        [1],
    ]
    with pytest.raises(RequestError, match="REQUEST_OUTPUT_LEN"):
        pre({"QUERY": np.array([[b"x"]], dtype=object)})
    with pytest.raises(RequestError, match="UTF-8"):
        pre({"QUERY": np.array([[b"\xff\xfe"]], dtype=object), "REQUEST_OUTPUT_LEN": np.array([[1]], np.int32)})


def test_preprocessing_takes_nvidia_clients_neutral_inputs(tokenizer):
    """What NVIDIA's end-to-end clients send: empty bad/stop words ([[""]]) and empty bias words/weights."""
    out = Preprocessor(tokenizer)(
        {
            "QUERY": np.array([[b"def f("]], dtype=object),
            "REQUEST_OUTPUT_LEN": np.array([[4]], np.int32),
            "BAD_WORDS_DICT": np.array([[b""]], dtype=object),
            "STOP_WORDS_DICT": np.array([[b""]], dtype=object),
            "EMBEDDING_BIAS_WORDS": np.empty((1, 0), dtype=object),
            "EMBEDDING_BIAS_WEIGHTS": np.empty((1, 0), np.float32),
        }
    )
    assert out["EMBEDDING_BIAS"].shape == (1, 0)  # no word: no bias, which the engine treats as absent
    for name in ("BAD_WORDS_IDS", "STOP_WORDS_IDS"):
        assert out[name].tolist() == [[[0], [-1]]]  # NVIDIA's padding of a list without words
    for name in ("BAD_WORDS_DICT", "STOP_WORDS_DICT"):  # a word that is not text is refused by its input's name
        with pytest.raises(RequestError, match=f"input '{name}' is not valid UTF-8"):
            Preprocessor(tokenizer)(
                {
                    "QUERY": np.array([[b"def f("]], dtype=object),
                    "REQUEST_OUTPUT_LEN": np.array([[4]], np.int32),
                    name: np.array([[b"\x80"]], dtype=object),
                }
            )
    bias = Preprocessor(tokenizer)(
        {
            "QUERY": np.array([[b"x"]], dtype=object),
            "REQUEST_OUTPUT_LEN": np.array([[4]], np.int32),
            "EMBEDDING_BIAS_WORDS": np.array([[b"return"]], dtype=object),
            "EMBEDDING_BIAS_WEIGHTS": np.array([[2.0]], np.float32),
        }
    )["EMBEDDING_BIAS"]
    assert bias.shape == (1, len(tokenizer)) and bias.max() == 2.0


def test_word_list_format_is_tensorrt_llms(tokenizer):
    a, b = tokenizer.encode("return", add_special_tokens=False), tokenizer.encode(" None", add_special_tokens=False)
    out = to_word_list(tokenizer, [["return", " None"], []])
    assert out.shape == (2, 2, len(a) + len(b))
    assert out[0, 0].tolist() == a + b
    assert out[0, 1, :2].tolist() == [len(a), len(a) + len(b)] and (out[0, 1, 2:] == -1).all()
    assert (out[1, 1] == -1).all()


def test_postprocessing_decodes_up_to_sequence_length(tokenizer):
    ids = tokenizer.encode("print('hi')")
    post = Postprocessor(tokenizer)
    tokens = np.array([[ids + [0, 0]]], dtype=np.int32)  # [b, beam, len]
    out = post({"TOKENS_BATCH": tokens, "SEQUENCE_LENGTH": np.array([[len(ids)]], np.int32)})
    assert out["OUTPUT"].shape == (1,) and out["OUTPUT"][0].decode() == tokenizer.decode(ids, skip_special_tokens=True)
    two = post(
        {
            "TOKENS_BATCH": np.array([[ids, ids[:2] + [0] * (len(ids) - 2)]], np.int32),
            "SEQUENCE_LENGTH": np.array([[len(ids), 2]], np.int32),
        }
    )["OUTPUT"]
    assert two.shape == (2,) and two[1].decode() == tokenizer.decode(ids[:2], skip_special_tokens=True)  # batch x beam
    with pytest.raises(RequestError, match="SEQUENCE_LENGTH"):
        post({"TOKENS_BATCH": tokens, "SEQUENCE_LENGTH": np.array([[99]], np.int32)})
    for lengths in ([[]], [[1, 2]]):  # not one length per sequence (found by tests/test_models_fuzz.py)
        with pytest.raises(RequestError, match=r"SEQUENCE_LENGTH holds \d lengths for the 1 sequences of TOKENS_BATCH"):
            post({"TOKENS_BATCH": tokens, "SEQUENCE_LENGTH": np.array(lengths, np.int32).reshape(1, -1)})
    padded = post(
        {
            "TOKENS_BATCH": np.array([[ids[:2] + [len(tokenizer) + 3]]], np.int32),
            "SEQUENCE_LENGTH": np.array([[3]], np.int32),
        }
    )["OUTPUT"]  # a padded vocabulary row: no text
    assert padded[0].decode() == tokenizer.decode(ids[:2], skip_special_tokens=True)
    with pytest.raises(RequestError, match="negative ids"):
        post({"TOKENS_BATCH": np.array([[[-3]]], np.int32), "SEQUENCE_LENGTH": np.array([[1]], np.int32)})


def test_resolve_path_is_relative_to_the_repository(tmp_path):
    args = {"model_repository": str(tmp_path / "repo" / "preprocessing")}
    assert resolve_path("../engines/p/target/engine", args) == (tmp_path / "engines/p/target/engine").resolve()
    assert resolve_path("/abs/dir", args) == __import__("pathlib").Path("/abs/dir")


def _llm_inputs(**extra):
    inputs = {
        "input_ids": np.array([[5, 6, 7, 0]], np.int32),
        "input_lengths": np.array([[3]], np.int32),
        "request_output_len": np.array([[2]], np.int32),
    }
    inputs.update(extra)
    return inputs


def test_reference_llm_refuses_what_it_cannot_honour():
    reference_llm.check_supported(
        _llm_inputs(
            beam_width=np.array([[1]], np.int32),
            embedding_bias=np.zeros((1, 0), np.float32),
            stop_words_list=np.array([[[0], [-1]]], np.int32),
            bad_words_list=np.empty((1, 2, 0), np.int32),
            min_tokens=np.array([[2]], np.int32),
        )
    )
    for name, value, match in (
        ("beam_width", np.array([[2]], np.int32), "beam_width"),
        ("streaming", np.array([[True]]), "Streaming is only supported if model is deployed using decoupled mode."),
        ("return_log_probs", np.array([[True]]), "return_log_probs"),
        ("embedding_bias", np.array([[0.0, 1.5]], np.float32), "embedding_bias"),
        ("lora_task_id", np.array([[1]], np.uint64), "lora_task_id"),
    ):
        with pytest.raises(RequestError, match=match):
            reference_llm.check_supported(_llm_inputs(**{name: value}))
    with pytest.raises(RequestError, match="input_lengths"):
        reference_llm.split_rows({"input_ids": np.array([[1]], np.int32)})


def test_preprocessing_sends_a_checkpoints_other_end_ids_as_stop_words_unless_the_request_names_one(tokenizer):
    pre = Preprocessor(tokenizer, other_end_ids=(7, 9))
    base = {"QUERY": np.array([[b"x"]], dtype=object), "REQUEST_OUTPUT_LEN": np.array([[4]], np.int32)}
    assert word_sequences(pre(base)["STOP_WORDS_IDS"]) == [[7], [9]]
    asked = pre({**base, "STOP_WORDS_DICT": np.array([[b"return"]], dtype=object)})["STOP_WORDS_IDS"]
    assert word_sequences(asked) == [tokenizer.encode("return", add_special_tokens=False), [7], [9]]
    named = pre({**base, "END_ID": np.array([[5]], np.int32)})
    assert named["STOP_WORDS_IDS"].shape == (1, 2, 0) and named["OUT_END_ID"].tolist() == [[5]]  # its end id only


def test_reference_llm_passes_stop_words_on_per_row():
    rows = reference_llm.split_rows(_llm_inputs(stop_words_list=np.array([[[7, 8], [1, 2]]], np.int32)))
    assert word_sequences(rows[0]["stop_words_list"]) == [[7], [8]]


def test_reference_llm_accepts_what_the_backend_treats_as_absent():
    """NVIDIA's clients pass preprocessing's DECODER_INPUT_ID on; a decoder-only engine does not read it. An
    empty bias is dropped (utils.cc); an all-zero one adds nothing."""
    rows = reference_llm.split_rows(
        _llm_inputs(
            decoder_input_ids=np.array([[0]], np.int32),
            decoder_input_lengths=np.array([[1]], np.int32),
            embedding_bias=np.zeros((1, 97), np.float32),
        )
    )
    assert len(rows) == 1 and "decoder_input_ids" not in rows[0]


def test_batch_above_one_needs_a_decoupled_model():
    batched = _llm_inputs(
        input_ids=np.array([[5, 6], [7, 8]], np.int32),
        input_lengths=np.array([[2], [2]], np.int32),
        request_output_len=np.array([[2], [2]], np.int32),
    )
    with pytest.raises(
        RequestError,
        match="^Batch size > 1 requires the tensorrt_llm backend to be using decoupled transaction policy$",
    ):
        reference_llm.split_rows(batched)
    assert len(reference_llm.split_rows(batched, decoupled=True)) == 2


def test_reference_llm_rows_and_assembly():
    inputs = _llm_inputs(
        input_ids=np.array([[5, 6, 7], [8, 9, 0]], np.int32),
        input_lengths=np.array([[3], [2]], np.int32),
        request_output_len=np.array([[2], [2]], np.int32),
        pad_id=np.array([[0], [0]], np.int32),
    )
    rows = reference_llm.split_rows(inputs, decoupled=True)
    assert [r["input_ids"].tolist() for r in rows] == [[5, 6, 7], [8, 9, 0]]
    results = [
        {
            "output_ids": np.array([[5, 6, 7, 1, 2]], np.int32),
            "sequence_length": np.array([5], np.int32),
            "acceptance_rate": np.array([0.5], np.float32),
            "total_accepted_draft_tokens": np.array([1], np.int32),
            "total_draft_tokens": np.array([2], np.int32),
        },
        {
            "output_ids": np.array([[8, 9, 3]], np.int32),
            "sequence_length": np.array([3], np.int32),
            "acceptance_rate": np.array([0.0], np.float32),
            "total_accepted_draft_tokens": np.array([0], np.int32),
            "total_draft_tokens": np.array([0], np.int32),
        },
    ]
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

    from specbuild.reference.loading import HF_CHECKPOINT, ModelSource

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        reference_llm._share_cpu(ModelSource("target", example_tiny.target, HF_CHECKPOINT, {}), "cpu")
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


# --- the C++ backend's parameter rules (specbuild.contract.backend_params) ---------------------------------


def backend_config(tmp_path, **changes):
    params = {
        "gpt_model_type": "inflight_fused_batching",
        "gpt_model_path": str(tmp_path),
        "tokenizer_dir": "",
        "guided_decoding_backend": "",
        "xgrammar_tokenizer_info_path": "",
        "exclude_input_in_output": "false",
    }
    params.update(changes)
    return {"parameters": {k: {"string_value": v} for k, v in params.items() if v is not None}}


def test_parameters_read_without_fallback_fail_the_load_with_the_backends_message(tmp_path):
    from specbuild.contract.backend_params import REQUIRED, BackendParams, ModelLoadError

    resolve = lambda value: Path(value)  # noqa: E731
    assert BackendParams(backend_config(tmp_path)).check_required(resolve) == tmp_path
    for key in REQUIRED:
        with pytest.raises(
            ModelLoadError,
            match=f"^unexpected error when creating modelInstanceState: Cannot find parameter with name: {key}$",
        ):
            BackendParams(backend_config(tmp_path, **{key: None})).check_required(resolve)
    wrapped = "unexpected error when creating modelInstanceState: "
    empty = wrapped + "Both encoder and decoder model paths are empty ("
    fix = ": build the engines with `specbuild build`, or fix the path with `specbuild repo`)"
    for changes, message in (
        (
            {"gpt_model_type": "static"},
            wrapped + "Invalid gpt_model_type. Must be v1/inflight_batching/inflight_fused_batching.",
        ),
        ({"gpt_model_path": None}, empty + "gpt_model_path is not set" + fix),
        ({"gpt_model_path": ""}, empty + "gpt_model_path is not set" + fix),
        (
            {"gpt_model_path": str(tmp_path / "missing")},
            empty + f"gpt_model_path {str(tmp_path / 'missing')!r} does not exist" + fix,
        ),
        (
            {"guided_decoding_backend": "xgrammar", "xgrammar_tokenizer_info_path": str(tmp_path / "no.json")},
            wrapped + f"Xgrammar's tokenizer info path at {tmp_path / 'no.json'} does not exist.",
        ),
        (
            {"guided_decoding_backend": "outlines", "xgrammar_tokenizer_info_path": str(tmp_path)},
            wrapped + "Guided decoding is currently supported with 'xgrammar' backend. Invalid "
            "guided_decoding_backend parameter provided.",
        ),
        (
            {"guided_decoding_backend": "xgrammar", "xgrammar_tokenizer_info_path": str(tmp_path)},
            "guided decoding (guided_decoding_backend = xgrammar) is not supported by the reference model; leave "
            "guided_decoding_backend empty, or serve with the tensorrtllm backend.",
        ),
    ):
        with pytest.raises(ModelLoadError, match="^" + re.escape(message) + "$"):
            BackendParams(backend_config(tmp_path, **changes)).check_required(resolve)
    with pytest.raises(ModelLoadError, match=f"^{wrapped}Model config doesn't have a parameters section$"):
        BackendParams({})
    valueless = BackendParams({"parameters": {"gpt_model_type": {}}})  # a parameter with no string_value
    assert valueless.string("gpt_model_type") == ""
    # placeholders and empty values mean "not set", as in NVIDIA's template, for either parameter
    BackendParams(
        backend_config(
            tmp_path, guided_decoding_backend="${guided_decoding_backend}", xgrammar_tokenizer_info_path="/nowhere"
        )
    ).check_required(resolve)
    BackendParams(
        backend_config(
            tmp_path, guided_decoding_backend="outlines", xgrammar_tokenizer_info_path="${xgrammar_tokenizer_info_path}"
        )
    ).check_required(resolve)


def test_boolean_parameters_follow_the_backends_spellings(tmp_path):
    from specbuild.contract.backend_params import BackendParams

    values = {"a": "TRUE", "b": "0", "c": "yes", "d": ""}
    params = BackendParams({"parameters": {k: {"string_value": v} for k, v in values.items()}})
    assert [params.boolean(k, False) for k in "abcd"] == [True, False, False, False]
    assert params.boolean("c", True) is True and params.boolean("missing", True) is True


def test_declared_logits_type_is_the_first_logits_output():
    config = {
        "output": [
            {"name": "output_ids", "data_type": "TYPE_INT32"},
            {"name": "context_logits", "data_type": "TYPE_FP16"},
            {"name": "generation_logits", "data_type": "TYPE_FP32"},
        ]
    }
    assert reference_llm.declared_logits_type(config) == "TYPE_FP16"
    assert reference_llm.declared_logits_type({"output": []}) is None
