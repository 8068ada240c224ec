"""Concurrent in-process generations share batched forwards and still get exactly their own output."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from runtime_models import make_llama, prompts, single_thread  # noqa: F401 (autouse fixture)

from specbuild.contract.adapters import ContractDrafter, ContractVerifier
from specbuild.errors import RequestError
from specbuild.reference.batcher import Batcher
from specbuild.reference.contract_model import ContractModel, Limits
from specbuild.reference.engine import ReferenceEngine
from specbuild.reference.model import LlamaModel
from specbuild.speculative.loop import GenerationRequest, run


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    make_llama(root / "target", seed=1, vocab=61)
    make_llama(root / "draft", seed=2, vocab=61, layers=1)
    return root


def contract_pair(folders):
    target = ContractModel(ReferenceEngine(LlamaModel.from_folder(folders / "target")), Limits(max_draft_len=4))
    draft = ContractModel(ReferenceEngine(LlamaModel.from_folder(folders / "draft")))
    return target, draft


def test_concurrent_generations_are_batched_and_exact(folders):
    cases = prompts(6, 61, seed=3)
    request = GenerationRequest(max_tokens=12, num_draft_tokens=3, end_id=2)
    target, draft = contract_pair(folders)
    expected = [
        run(ids, ContractDrafter(draft, end_id=2), ContractVerifier(target, 4, end_id=2), request).tokens
        for ids in cases
    ]

    target, draft = contract_pair(folders)
    results: list = [None] * len(cases)
    barrier = threading.Barrier(len(cases))
    with Batcher(target, max_wait_s=0.01) as bt, Batcher(draft, max_wait_s=0.01) as bd:

        def worker(i):
            barrier.wait()
            results[i] = run(cases[i], ContractDrafter(bd, end_id=2), ContractVerifier(bt, 4, end_id=2), request)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(cases))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert [r.tokens for r in results] == expected
    verify_calls = sum(r.stats.steps for r in results)
    assert bt.batches < verify_calls  # several requests shared an execute (one forward per kind of request)
    assert target.engine.forward_calls < verify_calls


def test_a_bad_request_fails_only_its_caller(folders):
    target, _ = contract_pair(folders)
    good = {
        "input_ids": np.array([3, 4, 5], np.int32),
        "input_lengths": np.array([3], np.int32),
        "request_output_len": np.array([2], np.int32),
    }
    bad = dict(good, input_lengths=np.array([7], np.int32))
    with Batcher(target) as batcher:
        assert batcher(good)["sequence_length"].tolist() == [5]
        with pytest.raises(RequestError, match="input_lengths = 7 does not fit"):
            batcher(bad)
    with pytest.raises(RuntimeError, match="closed"):
        batcher(good)
