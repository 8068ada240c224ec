"""The reference runtime's Llama forward against transformers' LlamaForCausalLM."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from runtime_models import make_llama, prompts, single_thread  # noqa: F401 (autouse fixture)

from specbuild.errors import CheckpointError
from specbuild.reference.engine import ReferenceEngine
from specbuild.reference.model import LlamaModel

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"tie": True, "kv_heads": 1},
        {"rope_scaling": LLAMA3, "kv_heads": 4},
        {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
        {"attention_bias": True, "mlp_bias": True},
    ],
    ids=["default", "tied-mqa", "llama3-rope-mha", "linear-rope", "biases"],
)
def test_logits_match_transformers(tmp_path, options):
    hf = make_llama(tmp_path, **options)
    engine = ReferenceEngine(LlamaModel.from_folder(tmp_path))
    ids = prompts(1, 97, seed=1, min_len=60, max_len=60)[0]  # long enough for llama3's low/medium/high bands
    with torch.no_grad():
        expected = hf(torch.tensor([ids])).logits[0].numpy()
    got = engine.logits([ids], [len(ids)])[0]
    assert got.shape == expected.shape == (60, 97)
    np.testing.assert_allclose(got, expected, rtol=0, atol=2e-5 * np.abs(expected).max())


def test_greedy_decoding_equals_transformers_generate(tmp_path):
    hf = make_llama(tmp_path, layers=3, rope_scaling=LLAMA3)
    engine = ReferenceEngine(LlamaModel.from_folder(tmp_path))
    cases = prompts(12, 97, seed=2)
    decoded = engine.decode(
        cases, [20] * len(cases), [lambda row: int(np.argmax(row))] * len(cases), [None] * len(cases)
    )
    distinct = set()
    for ids, ours in zip(cases, decoded):
        with torch.no_grad():
            theirs = hf.generate(
                torch.tensor([ids]),
                max_new_tokens=20,
                do_sample=False,
                eos_token_id=None,
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            )[0, len(ids) :].tolist()
        assert ours.tokens == theirs
        distinct.update(theirs)
    assert len(distinct) > 10  # the model really varies its output


def test_unsupported_architecture_is_refused(tmp_path):
    make_llama(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        CheckpointError, match="architecture 'GPT2LMHeadModel' is not one of the model families specbuild supports"
    ):
        LlamaModel.from_folder(tmp_path)


def test_unsupported_rope_type_is_refused(tmp_path):
    make_llama(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.pop("rope_scaling", None)
    config["rope_parameters"] = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="rope type 'yarn' is not supported"):
        LlamaModel.from_folder(tmp_path)


def test_missing_weights_and_config(tmp_path):
    with pytest.raises(CheckpointError, match="has no config.json"):
        LlamaModel.from_folder(tmp_path)
    make_llama(tmp_path)
    for path in tmp_path.glob("*.safetensors"):
        path.unlink()
    with pytest.raises(CheckpointError, match="no \\*.safetensors weights"):
        LlamaModel.from_folder(tmp_path)


def test_unknown_weights_are_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    make_llama(tmp_path)
    path = next(tmp_path.glob("*.safetensors"))
    state = load_file(str(path))
    state["model.layers.0.self_attn.q_norm.weight"] = torch.ones(8)  # a Qwen3-style extra the Llama forward lacks
    save_file(state, str(path), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="weights a plain Llama does not use \\(model.layers.0.self_attn.q_norm"):
        LlamaModel.from_folder(tmp_path)
