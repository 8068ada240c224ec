"""The tiny built-in example pair: loads offline, shares one tokenizer, target costlier than draft."""

from __future__ import annotations

import json

import pytest

from specbuild.example.tokenizer import BOS_ID, EOS_ID, PAD_ID, TOKENIZER_FILES, UNK_ID


def test_pair_layout_and_info(example_tiny):
    for folder in (example_tiny.target, example_tiny.draft):
        assert (folder / "config.json").is_file()
        assert list(folder.glob("*.safetensors")), f"no safetensors in {folder}"
        for name in TOKENIZER_FILES:
            assert (folder / name).is_file()
    for name in TOKENIZER_FILES:
        assert (example_tiny.target / name).read_bytes() == (example_tiny.draft / name).read_bytes()
    info = json.loads((example_tiny.root / "example.json").read_text())
    assert info == example_tiny.info
    assert info["variant"] == "tiny"
    assert 0.0 <= info["agreement"] <= 1.0 and 0.0 <= info["agreement_on_text"] <= 1.0
    assert set(info["agreement_by_kind"]) == set(info["samples"]) == {"code", "prose", "json"}
    assert info["positions"] > 0
    assert info["cost_ratio"] == pytest.approx(info["draft_step_ms"] / info["target_step_ms"], rel=0.01)
    assert info["params"]["target"] > 3 * info["params"]["draft"]


def test_models_load_offline_with_auto_classes(example_tiny, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(example_tiny.target)
    target = AutoModelForCausalLM.from_pretrained(example_tiny.target)
    draft = AutoModelForCausalLM.from_pretrained(example_tiny.draft)
    assert type(target).__name__ == type(draft).__name__ == "LlamaForCausalLM"
    assert target.config.vocab_size == draft.config.vocab_size == len(tok)
    assert target.config.num_key_value_heads < target.config.num_attention_heads  # GQA, like real targets
    ids = tok("def add(a, b):\n    return a + b\n", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert target(input_ids=ids).logits.shape == (1, ids.shape[1], len(tok))
        assert draft(input_ids=ids).logits.shape == (1, ids.shape[1], len(tok))


def test_tokenizer_round_trip_and_special_ids(example_tiny):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(example_tiny.draft)
    assert (tok.unk_token_id, tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (UNK_ID, BOS_ID, EOS_ID, PAD_ID)
    assert (tok.bos_token, tok.eos_token, tok.pad_token, tok.unk_token) == ("<s>", "</s>", "<pad>", "<unk>")
    for text in [
        '{"id": 7, "name": "Ada Lovelace", "active": true}',
        "    for x in range(10):\n\tpass\n",
        "naïve café ✓ 中文",
        "",
    ]:
        ids = tok(text)["input_ids"]
        assert ids[0] == BOS_ID
        assert UNK_ID not in ids
        assert tok.decode(ids, skip_special_tokens=True) == text


def test_unknown_variant_is_a_clear_error():
    from specbuild.errors import SpecbuildError
    from specbuild.example import ensure_example

    with pytest.raises(SpecbuildError, match="unknown example variant 'huge': choose one of full, tiny"):
        ensure_example("huge")
