"""The tensorrt_llm tensor contract served by the reference engine (trtllm-facts.md section 2.4)."""

from __future__ import annotations

import numpy as np
import pytest

from runtime_models import make_llama, prompts, single_thread  # noqa: F401 (autouse fixture)
from specbuild.errors import RequestError
from specbuild.runtime.contract import ContractModel, Limits
from specbuild.runtime.engine import ReferenceEngine
from specbuild.runtime.model import LlamaModel

VOCAB = 97


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    make_llama(folder, vocab=VOCAB)
    return LlamaModel.from_folder(folder)


@pytest.fixture
def contract(model):
    return ContractModel(ReferenceEngine(model), Limits(max_batch_size=4, max_seq_len=64, max_draft_len=8))


def req(ids, out_len, **extra):
    r = {"input_ids": np.array(ids, np.int32), "input_lengths": np.array([len(ids)], np.int32),
         "request_output_len": np.array([out_len], np.int32)}
    r.update({k: np.asarray(v) for k, v in extra.items()})
    return r


def greedy_continuation(contract, ids, n):
    return contract(req(ids, n))["output_ids"][0, len(ids):].tolist()


def test_decode_outputs_names_dtypes_shapes(contract):
    ids = prompts(1, VOCAB, seed=1)[0]
    out = contract(req(ids, 5, return_generation_logits=np.array([True])))
    assert set(out) == {"output_ids", "sequence_length", "generation_logits"}
    assert out["output_ids"].dtype == np.int32 and out["output_ids"].shape == (1, len(ids) + 5)
    assert out["output_ids"][0, : len(ids)].tolist() == ids  # exclude_input_in_output = false
    assert out["sequence_length"].dtype == np.int32 and out["sequence_length"].tolist() == [len(ids) + 5]
    logits = out["generation_logits"]
    assert logits.dtype == np.float32 and logits.shape == (1, 5, VOCAB)
    assert out["output_ids"][0, len(ids):].tolist() == np.argmax(logits[0], axis=1).tolist()


def test_verify_accepts_the_targets_own_continuation_plus_bonus(contract):
    ids = prompts(1, VOCAB, seed=2)[0]
    cont = greedy_continuation(contract, ids, 5)
    out = contract(req(ids, 5, draft_input_ids=np.array(cont[:4], np.int32)))
    assert out["output_ids"][0].tolist() == ids + cont  # 4 accepted + the bonus token
    assert out["total_accepted_draft_tokens"].tolist() == [4] and out["total_draft_tokens"].tolist() == [4]
    assert out["acceptance_rate"].dtype == np.float32 and out["acceptance_rate"].tolist() == [1.0]


def test_verify_rejects_at_first_mismatch_and_recovers_the_targets_token(contract):
    ids = prompts(1, VOCAB, seed=3)[0]
    cont = greedy_continuation(contract, ids, 4)
    wrong = (cont[2] + 1) % VOCAB
    out = contract(req(ids, 5, draft_input_ids=np.array(cont[:2] + [wrong, cont[3]], np.int32)))
    assert out["output_ids"][0].tolist() == ids + cont[:3]  # 2 accepted, then the target's own token
    assert out["total_accepted_draft_tokens"].tolist() == [2]
    assert out["acceptance_rate"].tolist() == [0.5]


def test_end_id_stops_and_is_left_out(contract):
    ids = prompts(1, VOCAB, seed=4)[0]
    cont = greedy_continuation(contract, ids, 6)
    end = cont[2]
    first = cont.index(end)
    out = contract(req(ids, 6, end_id=np.array([end], np.int32)))
    assert out["output_ids"][0].tolist() == ids + cont[:first]
    assert out["sequence_length"].tolist() == [len(ids) + first]
    verified = contract(req(ids, 5, draft_input_ids=np.array(cont[:4], np.int32), end_id=np.array([end], np.int32)))
    assert verified["output_ids"][0].tolist() == ids + cont[:first]


def test_batched_call_equals_single_calls(model, contract):
    seqs = prompts(6, VOCAB, seed=5)
    requests = []
    for i, s in enumerate(seqs):
        if i % 2:
            cont = greedy_continuation(ContractModel(ReferenceEngine(model), contract.limits), s, 3)
            requests.append(req(s, 4, draft_input_ids=np.array([cont[0], 5, cont[2]], np.int32)))
        else:
            requests.append(req(s, 4))
    together = contract.execute(requests)
    for r, got in zip(requests, together):
        alone = ContractModel(ReferenceEngine(model), contract.limits)(r)
        assert got.keys() == alone.keys()
        for name in got:
            assert np.array_equal(got[name], alone[name])


def test_sampling_is_deterministic_given_the_seed(contract):
    ids = prompts(1, VOCAB, seed=6)[0]
    sampling = {"temperature": np.array([1.0], np.float32), "runtime_top_k": np.array([20], np.int32),
                "runtime_top_p": np.array([0.9], np.float32)}
    runs = [contract(req(ids, 12, seed=np.array([s], np.uint64), **sampling))["output_ids"].tolist() for s in (1, 1, 2)]
    assert runs[0] == runs[1] and runs[0] != runs[2]
    logits = np.random.default_rng(0).normal(size=(3, VOCAB)).astype(np.float32)
    draft = np.argmax(logits, axis=1).astype(np.int32)
    verify = [contract(req(ids, 4, draft_input_ids=draft, draft_logits=logits, seed=np.array([9], np.uint64),
                           **sampling))["output_ids"].tolist() for _ in range(2)]
    assert verify[0] == verify[1]


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: r.pop("input_lengths"), "missing required input(s) input_lengths"),
        (lambda r: r.update(input_ids=np.array([1, 2, 500], np.int32)), "token ids outside [0, 97)"),
        (lambda r: r.update(input_ids=np.array([1.5, 2.0])), "must be a 1-D integer array"),
        (lambda r: r.update(input_lengths=np.array([9], np.int32)), "input_lengths = 9 does not fit input_ids"),
        (lambda r: r.update(request_output_len=np.array([0], np.int32)), "request_output_len = 0"),
        (lambda r: r.update(draft_input_ids=np.arange(9, dtype=np.int32)), "9 draft tokens exceed the engine's max_draft_len = 8"),
        (lambda r: r.update(draft_input_ids=np.array([1, 2], np.int32), draft_logits=np.zeros((3, 97), np.float32)),
         "draft_logits has shape (3, 97), expected [num_draft_tokens, vocab] = [2, 97]"),
        (lambda r: r.update(request_output_len=np.array([70], np.int32)), "over the engine's max_seq_len = 64"),
        (lambda r: r.update(temperature=np.array([-1.0], np.float32)), "temperature = -1.0 is invalid"),
        (lambda r: r.update(runtime_top_p=np.array([0.0], np.float32)), "top_p = 0.0 is invalid"),
    ],
)
def test_bad_requests_raise_request_error(contract, change, message):
    r = req([1, 2, 3], 2)
    change(r)
    with pytest.raises(RequestError) as err:
        contract(r)
    assert message in str(err.value)


def test_one_bad_request_does_not_fail_the_others(contract):
    good = req([4, 5, 6], 3)
    bad = req([4, 5, 6], 3, draft_input_ids=np.arange(9, dtype=np.int32))
    out = contract.execute([good, bad, good], errors="return")
    assert isinstance(out[1], RequestError) and "max_draft_len" in str(out[1])
    assert out[0]["output_ids"].tolist() == out[2]["output_ids"].tolist()
    with pytest.raises(RequestError, match="^request 1: "):
        contract.execute([good, bad])
