"""Which weights the runtime loads (reference engine or HF checkpoint), and incremental detokenization."""

from __future__ import annotations

import json
import shutil

import pytest
from runtime_models import make_llama, single_thread  # noqa: F401 (autouse fixture)

from specbuild.config import spec_from_dict
from specbuild.decode.textstream import TextStream
from specbuild.errors import CheckpointError
from specbuild.reference.loading import HF_CHECKPOINT, REFERENCE_ENGINE, load_pair, model_source


@pytest.fixture
def spec(tmp_path):
    make_llama(tmp_path / "target", seed=1)
    make_llama(tmp_path / "draft", seed=2, layers=1)
    raw = {
        "name": "p",
        "target": {"checkpoint": "target"},
        "draft": {"checkpoint": "draft"},
        "speculative": {"max_draft_len": 5, "num_draft_tokens": 3},
        "build": {"max_input_len": 200, "max_seq_len": 300},
    }
    return spec_from_dict(raw, base_dir=tmp_path)


def fake_reference_engine(spec, role, **engine):
    folder = spec.pair_dir / role / "engine"
    shutil.copytree(spec.role(role).checkpoint, folder)
    (folder / "engine.json").write_text(json.dumps({"max_batch_size": 2, "max_seq_len": 128, **engine}))
    (folder / "manifest.json").write_text(json.dumps({"backend": "reference"}))
    return folder


def test_without_an_engine_the_hf_checkpoint_is_used_with_the_spec_limits(spec):
    source = model_source(spec, "target")
    assert source.kind == HF_CHECKPOINT and source.path == spec.target.checkpoint
    assert source.limits["max_draft_len"] == 5 and source.limits["max_seq_len"] == 305  # + max_draft_len
    assert model_source(spec, "draft").limits["max_draft_len"] == 0


def test_a_reference_engine_is_preferred_and_its_limits_apply(spec):
    folder = fake_reference_engine(spec, "target", max_draft_len=3)
    source = model_source(spec, "target")
    assert (source.kind, source.path, source.limits["max_draft_len"]) == (REFERENCE_ENGINE, folder, 3)
    pair = load_pair(spec, device="cpu")
    assert pair.engine_source == REFERENCE_ENGINE and pair.draft.kind == HF_CHECKPOINT
    assert pair.max_draft_len == 3 and pair.verifier.max_draft_len == 3
    assert pair.target_model.limits.max_batch_size == 2 and pair.target_model.limits.max_seq_len == 128
    assert pair.end_id == 2  # eos_token_id from the model's config


def test_an_engine_folder_from_another_backend_is_ignored(spec):
    folder = fake_reference_engine(spec, "target")
    (folder / "manifest.json").write_text(json.dumps({"backend": "tensorrt_llm"}))
    assert model_source(spec, "target").kind == HF_CHECKPOINT


def test_missing_checkpoint_says_what_to_do(spec):
    shutil.rmtree(spec.draft.checkpoint)
    with pytest.raises(CheckpointError, match=r"draft checkpoint .* has no config.json and no reference engine"):
        model_source(spec, "draft")


def test_vocabulary_mismatch_is_refused(spec, tmp_path):
    shutil.rmtree(spec.draft.checkpoint)
    make_llama(spec.draft.checkpoint, vocab=101, layers=1)
    with pytest.raises(CheckpointError, match="target vocab_size 97 != draft vocab_size 101"):
        load_pair(spec, device="cpu")


def test_text_stream_never_splits_a_character(example_tiny):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(example_tiny.target), local_files_only=True)
    prompt = tokenizer("print(")["input_ids"]
    text = 'héllo wörld € 😀 "ok"\n  naïve — done'
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids)  # the tokenizer really splits characters
    stream = TextStream(tokenizer, prompt)
    deltas = [stream.push([i]) for i in ids] + [stream.finish()]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == stream.text == tokenizer.decode(prompt + ids, skip_special_tokens=True)[len("print(") :]
