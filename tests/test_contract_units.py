"""The contract's small rules, one by one: TensorRT-LLM's sampling set-up and temperature kernel as the stand-in
applies them (specbuild.contract.sampling), and the [2, m] word-list format (specbuild.contract.words). Each expected
value is worked out by hand from the rule the module cites, so a wrong rule fails here rather than only through a
whole generation."""

from __future__ import annotations

import numpy as np
import pytest

from specbuild.contract.sampling import TrtllmSampling
from specbuild.contract.words import from_sequences, to_word_list, word_sequences
from specbuild.errors import RequestError


# ---- sampling ---------------------------------------------------------------------------------------------------
def test_the_setup_turns_unset_fields_into_the_layers_values():
    assert TrtllmSampling.from_tensors() == TrtllmSampling(1.0, 1, 1.0, 0)  # nothing sent: greedy (k 1, then p 1)
    assert TrtllmSampling.from_tensors(top_k=4) == TrtllmSampling(1.0, 4, 1.0, 0)  # top_k alone: top_p 1
    assert TrtllmSampling.from_tensors(top_p=0.5).top_k == 0  # top_p alone keeps top_k 0 (off)
    assert TrtllmSampling.from_tensors(top_k=0, top_p=-1.0) == TrtllmSampling(1.0, 1, 1.0, 0)  # top_p <= 0: unset
    assert TrtllmSampling.from_tensors(temperature=0.5, seed=9) == TrtllmSampling(0.5, 1, 1.0, 9)
    with pytest.raises(RequestError, match=r"Assertion failed: topP.value\(\) <= 1.f"):
        TrtllmSampling.from_tensors(top_p=1.5)
    with pytest.raises(RequestError, match=r"Assertion failed: topK.value\(\) >= 0"):
        TrtllmSampling.from_tensors(top_k=-1)
    with pytest.raises(RequestError, match=r"Assertion failed: temperature.value\(\) >= 0.f"):
        TrtllmSampling.from_tensors(temperature=-0.1)


def test_top_k_and_top_p_reach_the_distribution():
    logits = np.array([4.0, 3.0, 2.0, 1.0, 0.0], np.float32)
    top2 = TrtllmSampling.from_tensors(temperature=1.0, top_k=2).probs(logits, "float32")
    e = np.exp([0.0, -1.0])
    np.testing.assert_allclose(top2, [*(e / e.sum()), 0, 0, 0], rtol=1e-12)
    p = np.exp(-np.arange(5.0)) / np.exp(-np.arange(5.0)).sum()  # 0.636, 0.234, ...: 0.6 is reached by the first
    nucleus = TrtllmSampling.from_tensors(top_k=0, top_p=0.6).probs(logits, "float32")
    np.testing.assert_allclose(nucleus, [1, 0, 0, 0, 0], atol=0)
    assert TrtllmSampling.from_tensors(top_k=0, top_p=1.0).probs(logits, "float32") == pytest.approx(p, rel=1e-12)


def test_the_scaled_logits_are_stored_back_in_the_logits_dtype():
    """penaltyKernels.cu multiplies in float32 and stores the result in the logits' own dtype: with float16 logits
    the probabilities are those of the float16-rounded scaled logits, not of the exact ones."""
    rng = np.random.default_rng(3)
    logits = rng.normal(0.0, 3.0, 64).astype(np.float16)
    sampling = TrtllmSampling.from_tensors(temperature=0.7, top_k=0, top_p=1.0)
    inv = np.float32(1.0) / (np.float32(0.7) + np.float32(1e-6))
    stored = (logits.astype(np.float32) * inv).astype(np.float16).astype(np.float64)
    expected = np.exp(stored - stored.max()) / np.exp(stored - stored.max()).sum()
    np.testing.assert_allclose(sampling.probs(logits, "float16"), expected, rtol=1e-12)
    exact = logits.astype(np.float64) * float(inv)
    assert not np.allclose(np.exp(exact - exact.max()) / np.exp(exact - exact.max()).sum(), expected, rtol=1e-6)


def test_temperature_zero_saturates_both_ways_in_float16():
    """T = 0 scales by 1e6: float16 logits saturate at +-65504 (the kernel clamps to the dtype's largest finite value
    on both sides), so two negative logits tie, as two positive ones do."""
    sampling = TrtllmSampling.from_tensors(temperature=0.0, top_k=0, top_p=1.0)
    negative = np.array([-0.5, -0.25], np.float16)
    np.testing.assert_array_equal(sampling.probs(negative, "float16"), [0.5, 0.5])
    positive = np.array([0.5, 0.25, -0.5], np.float16)
    np.testing.assert_array_equal(sampling.probs(positive, "float16"), [0.5, 0.5, 0.0])


# ---- word lists -------------------------------------------------------------------------------------------------
class SpyTokenizer:
    """Encodes each character as its code point; records the add_special_tokens it was given."""

    def __init__(self):
        self.special: list[object] = []

    def encode(self, text: str, add_special_tokens=True) -> list[int]:
        self.special.append(add_special_tokens)
        return ([1] if add_special_tokens else []) + [ord(c) for c in text]


def test_an_absent_input_is_b_by_2_by_0():
    out = to_word_list(SpyTokenizer(), None)
    assert out.shape == (1, 2, 0) and out.dtype == np.int32
    assert to_word_list(SpyTokenizer(), None, batch=3).shape == (3, 2, 0)


def test_words_are_tokenized_without_special_tokens_and_padded_with_minus_one():
    tokenizer = SpyTokenizer()
    out = to_word_list(tokenizer, [["ab", "c"], ["d"], [""]], batch=3)
    assert tokenizer.special == [False] * 4
    expected = np.array(
        [
            [[97, 98, 99], [2, 3, -1]],
            [[100, 0, 0], [1, -1, -1]],
            [[0, 0, 0], [-1, -1, -1]],  # "" encodes to nothing: no word
        ],
        np.int32,
    )
    np.testing.assert_array_equal(out, expected)
    assert out.dtype == np.int32


def test_extra_sequences_join_every_row_even_without_words():
    out = to_word_list(SpyTokenizer(), None, batch=2, extra=[[7]])
    np.testing.assert_array_equal(out, np.array([[[7], [1]], [[7], [1]]], np.int32))
    out = to_word_list(SpyTokenizer(), [["a"]], batch=1, extra=[[7, 8]])
    np.testing.assert_array_equal(out, np.array([[[97, 7, 8], [1, 3, -1]]], np.int32))


def test_rows_with_no_words_are_one_wide():
    np.testing.assert_array_equal(from_sequences([[]]), np.array([[[0], [-1]]], np.int32))
    np.testing.assert_array_equal(from_sequences([[[5]]]), np.array([[[5], [1]]], np.int32))


def test_word_sequences_reads_back_what_was_written():
    rows = [[[5, 6], [7]], [[8]]]
    written = from_sequences(rows)
    assert [word_sequences(written[i]) for i in range(2)] == rows
    assert word_sequences(written[1][None]) == [[8]]  # with its batch dimension
    assert word_sequences(None) == [] and word_sequences(np.empty((1, 2, 0), np.int32)) == []


def test_an_empty_word_in_a_clients_list_is_skipped_not_the_end():
    """A client's own list may hold an empty word (its end offset equal to the one before, 0 for the first): it names
    no tokens, and the words after it still count; -1 ends the list."""
    assert word_sequences(np.array([[5, 6, 7], [0, 2, 3]], np.int32)) == [[5, 6], [7]]
    assert word_sequences(np.array([[5, 6, 7], [2, 2, 3]], np.int32)) == [[5, 6], [7]]
    assert word_sequences(np.array([[5, 6, 7], [2, -1, 3]], np.int32)) == [[5, 6]]


# ---- logits dtype -----------------------------------------------------------------------------------------------
def _spec(tmp_path, dtypes: dict[str, str]):
    """What role_logits_dtype and pair_logits_datatype read of a spec: its pair folder, its roles and their dtype."""
    from types import SimpleNamespace

    return SimpleNamespace(
        pair_dir=tmp_path / "pair",
        roles=list(dtypes),
        role=lambda role: SimpleNamespace(dtype=dtypes[role]),
    )


def _write(path, data) -> None:
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)


def test_the_logits_dtype_comes_from_the_first_source_that_has_one(tmp_path):
    """A built engine (the reference engine's engine.json, else TensorRT-LLM's config.json), then the converted
    checkpoint, then what modelopt will write; a source without the field means float32."""
    from specbuild.contract.logits import role_logits_dtype

    spec, engine = _spec(tmp_path, {"target": "bfloat16"}), tmp_path / "engine"
    checkpoint = spec.pair_dir / "target" / "checkpoint" / "config.json"
    assert role_logits_dtype(spec, "target", engine) == ("float16", "the spec's target.dtype (what convert will write)")
    _write(checkpoint, "[1, 2]")  # not a JSON object: not a source
    assert role_logits_dtype(spec, "target", engine)[0] == "float16"
    _write(checkpoint, {"architecture": "LlamaForCausalLM"})
    assert role_logits_dtype(spec, "target", engine) == ("float32", str(checkpoint))
    _write(checkpoint, {"logits_dtype": "float16"})
    assert role_logits_dtype(spec, "target", engine) == ("float16", str(checkpoint))
    _write(engine / "config.json", {"pretrained_config": {"dtype": "float16"}})
    assert role_logits_dtype(spec, "target", engine) == ("float32", str(engine / "config.json"))
    _write(engine / "config.json", {"pretrained_config": {"logits_dtype": "float16"}})
    assert role_logits_dtype(spec, "target", engine) == ("float16", str(engine / "config.json"))
    _write(engine / "engine.json", {"format": "reference"})  # an older reference engine: float32
    assert role_logits_dtype(spec, "target", engine) == ("float32", str(engine / "engine.json"))


def test_both_roles_must_declare_the_same_supported_logits_type(tmp_path):
    from specbuild.contract.logits import engine_logits, pair_logits_datatype
    from specbuild.errors import SpecError

    engines = {"target": tmp_path / "t", "draft": tmp_path / "d"}
    assert pair_logits_datatype(_spec(tmp_path, {"target": "bfloat16", "draft": "float16"}), engines) == "TYPE_FP16"
    assert pair_logits_datatype(_spec(tmp_path, {"target": "float32"}), {"target": engines["target"]}) == "TYPE_FP32"
    with pytest.raises(SpecError) as info:
        pair_logits_datatype(_spec(tmp_path, {"target": "float16", "draft": "float32"}), engines)
    assert str(info.value).endswith("Give [target] and [draft] the same dtype, then convert and build again.")
    assert "the draft's are float32 (from the spec's draft.dtype (what convert will write))" in str(info.value)
    _write(tmp_path / "t" / "engine.json", {"logits_dtype": "bfloat16"})
    with pytest.raises(SpecError) as info:
        pair_logits_datatype(_spec(tmp_path, {"target": "float16", "draft": "float16"}), engines)
    assert str(info.value) == (
        f"logits dtype 'bfloat16' (from {tmp_path / 't' / 'engine.json'}) is not one trtllm-build supports "
        "(float16, float32): convert the checkpoint again."
    )
    with pytest.raises(ValueError) as info:
        engine_logits(np.zeros(2), "bfloat16")
    assert str(info.value) == "logits dtype 'bfloat16' is not one of ['float16', 'float32']"


def test_the_bls_parameters_as_triton_carries_them_and_back():
    """Every value a string: booleans as true/false; read back with the BLS's spellings (1/true/yes, 0/false/no, any
    case), a negative integer, a whole-string setting, and optional fields left as `${...}` or blank take defaults."""
    from specbuild.contract.bls_params import BlsParameters
    from specbuild.drafters import LookupSettings

    record = BlsParameters(
        max_draft_len=4, num_draft_tokens=2, max_input_len=8, max_output_len=9, tokenizer_dir="tok", overlap="auto"
    )
    written = record.to_parameters()
    assert written["use_draft_logits"] == "false" and written["adaptive_draft_len"] == "true"
    assert written["max_output_len"] == "9" and written["overlap"] == "auto" and written["tokenizer_dir"] == "tok"
    assert BlsParameters.from_parameters(written) == record
    for raw, value in (("1", True), ("TRUE", True), (" yes ", True), ("0", False), ("False", False), ("NO", False)):
        assert BlsParameters.from_parameters({**written, "use_draft_logits": raw}).use_draft_logits is value
    assert BlsParameters.from_parameters({**written, "max_queue_size": "-1"}).max_queue_size == -1
    assert BlsParameters.from_parameters({**written, "tokenizer_dir": "  /a b/c  "}).tokenizer_dir == "/a b/c"
    assert BlsParameters.from_parameters({**written, "overlap": "true"}).overlap is True
    defaults = BlsParameters.from_parameters({**written, "drafter": "${drafter}", "max_queue_size": " "})
    assert (defaults.drafter, defaults.max_queue_size) == (BlsParameters.drafter, BlsParameters.max_queue_size)
    with pytest.raises(
        ValueError, match=r"^model config parameter 'max_input_len' = '8\.5' is invalid: use an integer\.$"
    ):
        BlsParameters.from_parameters({**written, "max_input_len": "8.5"})
    with pytest.raises(
        ValueError, match=r"^model config parameter 'is_keep_all' = 'y' is invalid: use true or false\.$"
    ):
        BlsParameters.from_parameters({**written, "is_keep_all": "y"})
    with pytest.raises(
        ValueError,
        match=r"^model config parameter 'tokenizer_dir' is required; regenerate the repository with `specbuild repo`\.$",
    ):
        BlsParameters.from_parameters({k: v for k, v in written.items() if k != "tokenizer_dir"})
    from specbuild import drafters

    with pytest.raises(ValueError) as refused:
        BlsParameters.from_parameters({**written, "drafter": "psychic"})
    assert str(refused.value) == (
        f"model config parameter 'drafter' = 'psychic' is invalid: use one of {', '.join(drafters.NAMES)}."
    )
    with pytest.raises(ValueError, match="'max_queue_size' = 'X5' is invalid: use an integer"):
        BlsParameters.from_parameters({**written, "max_queue_size": "X5"})
    lookup = LookupSettings(max_matching_ngram_size=3, is_keep_all=False, is_use_oldest=False, pool_max_tokens=64)
    carried = BlsParameters(
        max_draft_len=4,
        num_draft_tokens=2,
        max_input_len=8,
        max_output_len=9,
        tokenizer_dir="t",
        **BlsParameters.lookup_parameters(lookup),
    )
    assert carried.lookup() == lookup
    assert BlsParameters.from_parameters(carried.to_parameters()).lookup() == lookup


def test_config_pbtxt_text_its_parameters_and_the_last_defence_against_placeholders(monkeypatch):
    import sys

    from specbuild.contract import pbtxt
    from specbuild.errors import SpecError

    config = pbtxt.config_proto().ModelConfig(name="m", backend="python", max_batch_size=4)
    config.parameters["k"].string_value = "v"
    text = pbtxt.to_pbtxt(config)
    assert pbtxt.parse_pbtxt(text) == config
    assert pbtxt.parameter_values({"parameters": {"k": {"string_value": "v"}, "empty": None, "other": {}}}) == {
        "k": "v",
        "empty": "",
        "other": "",
    }
    assert pbtxt.parameter_values({}) == {}
    config.parameters["k"].string_value = "${engine_dir}"
    with pytest.raises(SpecError, match=r"^the generated config of m contains a '\$\{' placeholder; this is a bug\.$"):
        pbtxt.to_pbtxt(config)
    monkeypatch.setitem(sys.modules, "tritonclient.grpc", None)  # not installed
    with pytest.raises(
        SpecError, match=r"^tritonclient is not installed, so Triton configs cannot be built\. Install "
    ):
        pbtxt.config_proto()
