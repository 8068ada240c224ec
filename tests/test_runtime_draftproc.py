"""The draft model in a child process (reference/draftproc.py): the same answers as in this process, early drafts
that never block the caller, errors raised in the caller, the overlapped loop over it equal to the sequential loop."""

from __future__ import annotations

import numpy as np
import pytest
from runtime_models import single_thread  # noqa: F401 (autouse fixture)

from specbuild.contract.adapters import ContractDrafter, ContractVerifier
from specbuild.errors import GenerationError, RequestError
from specbuild.reference.contract_model import ContractModel, Limits
from specbuild.reference.draftproc import DraftProcess
from specbuild.reference.engine import ReferenceEngine
from specbuild.reference.loading import HF_CHECKPOINT, ModelSource
from specbuild.reference.model import LlamaModel
from specbuild.speculative.interfaces import AheadDrafter, SamplingParams
from specbuild.speculative.loop import GenerationRequest, run
from specbuild.speculative.overlap import propose_ahead


@pytest.fixture(scope="module")
def tiny(example_tiny):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(example_tiny.target), local_files_only=True)
    local = ContractModel(ReferenceEngine(LlamaModel.from_folder(example_tiny.draft)), Limits())
    process = DraftProcess.start(
        ModelSource("draft", example_tiny.draft, HF_CHECKPOINT, {}), "cpu", threads=1, end_id=tokenizer.eos_token_id
    )
    process = process.matching(local.engine.model.row_block)
    yield tokenizer, local, process
    process.close()


def test_the_child_answers_bit_for_bit_like_the_model_here(tiny):
    tokenizer, local, process = tiny
    ids = np.asarray(tokenizer('def read(path):\n    """')["input_ids"], np.int32)
    for extra in (
        {"runtime_top_k": np.array([1], np.int32)},
        {
            "temperature": np.array([0.8], np.float32),
            "runtime_top_k": np.array([0], np.int32),
            "runtime_top_p": np.array([0.9], np.float32),
            "seed": np.array([7], np.uint64),
        },
    ):
        request = {
            "input_ids": ids,
            "input_lengths": np.array([len(ids)], np.int32),
            "request_output_len": np.array([6], np.int32),
            "return_generation_logits": np.array([True]),
            **extra,
        }
        ours, theirs = local(request), process(request)
        assert ours.keys() == theirs.keys()
        for key in ours:
            assert np.array_equal(ours[key], theirs[key]), key


def test_a_bad_request_raises_in_the_caller_and_the_child_keeps_serving(tiny):
    _, _, process = tiny
    with pytest.raises(RequestError, match="missing required input"):
        process({"input_ids": np.array([1, 2], np.int32)})
    ok = process(
        {
            "input_ids": np.array([1, 2], np.int32),
            "input_lengths": np.array([2], np.int32),
            "request_output_len": np.array([1], np.int32),
        }
    )
    assert ok["sequence_length"].tolist() == [3]


def test_propose_and_propose_ahead_in_the_child_equal_the_drafter_here(tiny):
    tokenizer, local, process = tiny
    here = ContractDrafter(local, end_id=tokenizer.eos_token_id)
    ids = tokenizer('{"id": 3, "name": "')["input_ids"]
    greedy, sampled = SamplingParams(), SamplingParams(temperature=0.8, seed=5)
    assert isinstance(process, AheadDrafter)
    pending = [process.propose_ahead(ids, 3, s) for s in (greedy, sampled)]  # both sent before either is read
    for sampling, reply in zip((greedy, sampled), pending):
        ahead, expected = reply.result(), propose_ahead(here, ids, 3, sampling)
        assert (ahead.guess, ahead.draft.tokens) == (expected.guess, expected.draft.tokens)
    dropped = process.propose_ahead(ids, 4, greedy)
    assert not dropped.cancel()  # already sent: its answer is read and dropped before the next one
    assert process.propose(ids, 2, sampled).tokens == here.propose(ids, 2, sampled).tokens


def test_overlapped_loop_over_the_child_equals_the_sequential_loop_here(tiny, example_tiny):
    tokenizer, local, process = tiny
    target = ContractModel(ReferenceEngine(LlamaModel.from_folder(example_tiny.target)), Limits(max_draft_len=8))
    verifier = ContractVerifier(target, max_draft_len=8, end_id=tokenizer.eos_token_id)
    here = ContractDrafter(local, end_id=tokenizer.eos_token_id)
    there = process
    from test_runtime_speculative import tiny_prompts

    hits = 0
    for seed, ids in enumerate(tiny_prompts(tokenizer, 2)):
        for sampling in (SamplingParams(), SamplingParams(temperature=0.9, top_p=0.95, seed=seed)):
            request = GenerationRequest(
                max_tokens=20, num_draft_tokens=3, end_id=tokenizer.eos_token_id, sampling=sampling
            )
            sequential = run(ids, here, verifier, request)
            overlapped = run(ids, there, verifier, GenerationRequest(**{**vars(request), "overlap": True}))
            assert overlapped.tokens == sequential.tokens
            hits += overlapped.stats.early_draft_hits
    assert hits > 0


def test_a_child_that_cannot_load_reports_why_and_a_closed_one_refuses(tmp_path):
    broken = DraftProcess.start(ModelSource("draft", tmp_path / "missing", HF_CHECKPOINT, {}), "cpu", threads=1)
    with pytest.raises(Exception, match="config.json"):
        broken.matching(4)
    broken.close()
    with pytest.raises(GenerationError, match="draft model's process"):
        broken({"input_ids": np.array([1], np.int32)})
