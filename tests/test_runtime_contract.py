"""The tensorrt_llm tensor contract served by the reference engine, with the executor's request rules."""

from __future__ import annotations

import numpy as np
import pytest
from runtime_models import make_llama, prompts, single_thread  # noqa: F401 (autouse fixture)

from specbuild.contract.sampling import TrtllmSampling
from specbuild.errors import RequestError
from specbuild.reference.contract_model import ContractModel, Limits
from specbuild.reference.engine import ReferenceEngine
from specbuild.reference.model import LlamaModel

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
    r = {
        "input_ids": np.array(ids, np.int32),
        "input_lengths": np.array([len(ids)], np.int32),
        "request_output_len": np.array([out_len], np.int32),
    }
    r.update({k: np.asarray(v) for k, v in extra.items()})
    return r


def greedy_continuation(contract, ids, n):
    return contract(req(ids, n))["output_ids"][0, len(ids) :].tolist()


def test_decode_outputs_names_dtypes_shapes(contract):
    ids = prompts(1, VOCAB, seed=1)[0]
    out = contract(req(ids, 5, return_generation_logits=np.array([True])))
    assert set(out) == {"output_ids", "sequence_length", "generation_logits"}
    assert out["output_ids"].dtype == np.int32 and out["output_ids"].shape == (1, len(ids) + 5)
    assert out["output_ids"][0, : len(ids)].tolist() == ids  # exclude_input_in_output = false
    assert out["sequence_length"].dtype == np.int32 and out["sequence_length"].tolist() == [len(ids) + 5]
    logits = out["generation_logits"]
    assert logits.dtype == np.float32 and logits.shape == (1, 5, VOCAB)
    assert out["output_ids"][0, len(ids) :].tolist() == np.argmax(logits[0], axis=1).tolist()


def test_verify_accepts_the_targets_own_continuation_plus_bonus(contract):
    ids = prompts(1, VOCAB, seed=2)[0]
    cont = greedy_continuation(contract, ids, 5)
    out = contract(req(ids, 5, draft_input_ids=np.array(cont[:4], np.int32), return_perf_metrics=[True]))
    assert out["output_ids"][0].tolist() == ids + cont  # 4 accepted + the bonus token
    assert out["total_accepted_draft_tokens"].tolist() == [4] and out["total_draft_tokens"].tolist() == [4]
    assert out["acceptance_rate"].dtype == np.float32 and out["acceptance_rate"].tolist() == [1.0]


@pytest.mark.parametrize("extra", [{}, {"return_perf_metrics": [False]}])
def test_the_acceptance_outputs_come_only_with_return_perf_metrics(contract, extra):
    """As the C++ backend, which fills them only when the request sets return_perf_metrics."""
    ids = prompts(1, VOCAB, seed=2)[0]
    cont = greedy_continuation(contract, ids, 3)
    out = contract(req(ids, 3, draft_input_ids=np.array(cont[:2], np.int32), **extra))
    assert out["output_ids"][0].tolist() == ids + cont
    assert not {"acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens"} & set(out)


def test_verify_rejects_at_first_mismatch_and_recovers_the_targets_token(contract):
    ids = prompts(1, VOCAB, seed=3)[0]
    cont = greedy_continuation(contract, ids, 4)
    wrong = (cont[2] + 1) % VOCAB
    out = contract(
        req(ids, 5, draft_input_ids=np.array(cont[:2] + [wrong, cont[3]], np.int32), return_perf_metrics=[True])
    )
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


def test_a_stop_word_ends_the_output_and_stays_in_it(contract):
    """TensorRT-LLM's stop_words_list ([1, 2, n]): decoding ends after the generated tokens complete a stop word,
    which is kept; verification cuts its tokens the same way."""
    from specbuild.contract.words import from_sequences

    ids = prompts(1, VOCAB, seed=4)[0]
    cont = greedy_continuation(contract, ids, 8)
    at = next(i for i in range(2, 8) if cont[i] not in cont[:i])
    words = from_sequences([[cont[at - 1 : at + 1], [VOCAB + 5]]])  # a two-token word, and one never generated
    out = contract(req(ids, 8, stop_words_list=words))
    assert out["output_ids"][0].tolist() == ids + cont[: at + 1]
    verified = contract(req(ids, 8, draft_input_ids=np.array(cont[:6], np.int32), stop_words_list=words))
    assert verified["output_ids"][0].tolist() == ids + cont[: min(at + 1, 7)]


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
    sampling = {
        "temperature": np.array([1.0], np.float32),
        "runtime_top_k": np.array([20], np.int32),
        "runtime_top_p": np.array([0.9], np.float32),
    }
    runs = [contract(req(ids, 12, seed=np.array([s], np.uint64), **sampling))["output_ids"].tolist() for s in (1, 1, 2)]
    assert runs[0] == runs[1] and runs[0] != runs[2]
    logits = np.random.default_rng(0).normal(size=(3, VOCAB)).astype(np.float32)
    draft = np.argmax(logits, axis=1).astype(np.int32)
    verify = [
        contract(req(ids, 4, draft_input_ids=draft, draft_logits=logits, seed=np.array([9], np.uint64), **sampling))[
            "output_ids"
        ].tolist()
        for _ in range(2)
    ]
    assert verify[0] == verify[1]


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: r.pop("input_lengths"), "missing required input(s) input_lengths"),
        (lambda r: r.update(input_ids=np.array([1, 2, 500], np.int32)), "token ids outside [0, 97)"),
        (lambda r: r.update(input_ids=np.array([1.5, 2.0])), "must be a 1-D integer array"),
        (lambda r: r.update(input_lengths=np.array([9], np.int32)), "input_lengths = 9 does not fit input_ids"),
        (lambda r: r.update(request_output_len=np.array([0], np.int32)), "request_output_len = 0"),
        (
            lambda r: r.update(draft_input_ids=np.arange(9, dtype=np.int32)),
            "Draft tokens length (9) exceeds maximum draft tokens length (8).",
        ),
        (
            lambda r: r.update(draft_input_ids=np.array([1, 2], np.int32), draft_logits=np.zeros((3, 97), np.float32)),
            "draft_logits has shape (3, 97), expected [num_draft_tokens, vocab] = [2, 97]",
        ),
        (
            lambda r: r.update(input_ids=np.arange(64, dtype=np.int32) % 97, input_lengths=np.array([64], np.int32)),
            "Prompt length (64) exceeds maximum input length (63). Set log level to info and check TRTGptModel logs",
        ),
        (lambda r: r.update(end_id=np.array([97], np.int32)), "EndId (97) is not within acceptable range [-1, 97)."),
        (
            lambda r: r.update(temperature=np.array([-1.0], np.float32)),
            "[TensorRT-LLM][ERROR] Assertion failed: temperature.value() >= 0.f",
        ),
        (lambda r: r.update(runtime_top_p=np.array([1.5], np.float32)), "Assertion failed: topP.value() <= 1.f"),
        (lambda r: r.update(runtime_top_k=np.array([-1], np.int32)), "Assertion failed: topK.value() >= 0"),
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
    assert isinstance(out[1], RequestError) and "maximum draft tokens length" in str(out[1])
    assert out[0]["output_ids"].tolist() == out[2]["output_ids"].tolist()
    with pytest.raises(RequestError, match="^request 1: "):
        contract.execute([good, bad])


# --- TensorRT-LLM's sampling-parameter semantics (runtime.trtllm_sampling) ------------------------


@pytest.mark.parametrize(
    "tensors, greedy, top_k, top_p",
    [
        ({}, True, 1, 1.0),  # nothing sent: top_k 0 and top_p 0 -> the sampling layer's greedy case
        ({"temperature": 1.0}, True, 1, 1.0),  # NVIDIA's clients send only a temperature: still greedy
        ({"temperature": 0.7}, True, 1, 1.0),
        ({"top_p": 0.0}, True, 1, 1.0),  # top_p <= 0 is dropped as if not sent
        ({"top_k": 1, "top_p": 0.9}, True, 1, 0.9),
        ({"temperature": 0.0, "top_k": 0, "top_p": 1.0}, False, 0, 1.0),  # the old "greedy" request samples
        ({"top_k": 5}, False, 5, 1.0),  # top_k > 0 with top_p 0 -> top_p 1
        ({"top_p": 0.9}, False, 0, 0.9),
    ],
)
def test_sampling_tensors_resolve_as_the_executor_does(tensors, greedy, top_k, top_p):
    s = TrtllmSampling.from_tensors(**tensors)
    assert (s.greedy, s.top_k, s.top_p) == (greedy, top_k, top_p)
    assert s.temperature == tensors.get("temperature", 1.0) and s.seed == 0


def test_temperature_scaling_happens_in_the_logits_dtype():
    sampling = TrtllmSampling.from_tensors(temperature=0.0, top_k=0, top_p=1.0)
    # float16: every logit above 65504 / 1e6 saturates at 65504 and ties: three tokens equally likely.
    half = sampling.probs(np.array([3.0, 2.0, 0.1, -1.0]), "float16")
    np.testing.assert_allclose(half, [1 / 3, 1 / 3, 1 / 3, 0.0], atol=1e-12)
    # float32: no saturation, but logits 1.2e-7 apart stay close after the 1e6 scale: still a coin flip.
    single = sampling.probs(
        np.array([1.0, np.nextafter(np.float32(1.0), np.float32(2.0)), -3.0], np.float32), "float32"
    )
    assert 0.3 < single[0] < 0.5 and 0.5 < single[1] < 0.7 and single[2] == 0.0
    # temperature 1.0 is not applied at all; 0.5 doubles the logits (1 / (0.5 + 1e-6) in float32).
    np.testing.assert_allclose(
        TrtllmSampling.from_tensors(temperature=1.0, top_p=1.0).probs(np.array([0.0, 1.0]), "float32"),
        [1 / (1 + np.e), np.e / (1 + np.e)],
        rtol=1e-6,
    )
    np.testing.assert_allclose(
        TrtllmSampling.from_tensors(temperature=0.5, top_p=1.0).probs(np.array([0.0, 1.0]), "float32"),
        [1 / (1 + np.e**2), np.e**2 / (1 + np.e**2)],
        rtol=1e-5,
    )


def test_temperature_zero_with_top_k_zero_samples_instead_of_greedy(model):
    """What every draft/verify call used to send: on float16 logits TensorRT-LLM samples among saturated logits."""
    half = ContractModel(
        ReferenceEngine(model), Limits(max_batch_size=4, max_seq_len=64, max_draft_len=8, logits_dtype="float16")
    )
    ids = prompts(1, VOCAB, seed=7)[0]
    greedy = half(req(ids, 8))["output_ids"].tolist()
    assert half(req(ids, 8, runtime_top_k=np.array([1], np.int32)))["output_ids"].tolist() == greedy
    old = [
        half(
            req(
                ids,
                8,
                temperature=np.array([0.0], np.float32),
                runtime_top_k=np.array([0], np.int32),
                runtime_top_p=np.array([1.0], np.float32),
                seed=np.array([s], np.uint64),
            )
        )["output_ids"].tolist()
        for s in range(4)
    ]
    assert all(run != greedy for run in old) and len({str(run) for run in old}) > 1


def test_unseeded_sampling_uses_the_default_seed_zero(contract):
    ids = prompts(1, VOCAB, seed=8)[0]
    sampling = {"temperature": np.array([1.0], np.float32), "runtime_top_p": np.array([1.0], np.float32)}
    unseeded = [contract(req(ids, 10, **sampling))["output_ids"].tolist() for _ in range(2)]
    assert (
        unseeded[0]
        == unseeded[1]
        == contract(req(ids, 10, seed=np.array([0], np.uint64), **sampling))["output_ids"].tolist()
    )


def test_generation_logits_are_in_the_engines_logits_dtype(model):
    half = ContractModel(ReferenceEngine(model), Limits(max_seq_len=64, logits_dtype="float16"))
    out = half(req([4, 5, 6], 3, return_generation_logits=np.array([True])))
    assert out["generation_logits"].dtype == np.float16 and out["generation_logits"].shape == (1, 3, VOCAB)


# --- the executor's length rules (LlmRequest::validate) ------------------------------------------


def test_largest_input_is_min_of_max_seq_len_minus_one_and_max_num_tokens(model):
    limited = ContractModel(ReferenceEngine(model), Limits(max_seq_len=64, max_draft_len=8, max_num_tokens=8))
    assert limited.limits.max_input_len == 8
    assert limited(req(list(range(3, 11)), 2))["sequence_length"].tolist() == [10]
    with pytest.raises(RequestError, match=r"^Prompt length \(9\) exceeds maximum input length \(8\)\."):
        limited(req(list(range(3, 12)), 2))
    assert Limits(max_seq_len=64).max_input_len == 63 and Limits(max_seq_len=64, max_num_tokens=100).max_input_len == 63


def test_output_beyond_max_seq_len_is_shortened_not_refused(contract):
    out = contract(req([3] * 10, 70))
    assert out["sequence_length"].tolist() == [64]


def test_a_draft_beyond_the_input_limit_is_cut(model):
    limited = ContractModel(ReferenceEngine(model), Limits(max_seq_len=64, max_draft_len=8, max_num_tokens=8))
    ids = list(range(3, 9))  # 6 tokens: room for 2 draft tokens under max_input_len 8
    cont = greedy_continuation(limited, ids, 4)
    out = limited(req(ids, 5, draft_input_ids=np.array(cont[:4], np.int32), return_perf_metrics=[True]))
    assert out["total_draft_tokens"].tolist() == [2] and out["output_ids"][0].tolist() == ids + cont[:3]


def test_limits_come_from_engine_json():
    limits = Limits.from_engine(
        {
            "max_batch_size": 4,
            "max_seq_len": 518,
            "max_draft_len": 6,
            "max_num_tokens": 2048,
            "logits_dtype": "float16",
        },
        default_max_seq_len=512,
    )
    assert (limits.max_seq_len, limits.max_num_tokens, limits.logits_dtype, limits.max_input_len) == (
        518,
        2048,
        "float16",
        517,
    )
    older = Limits.from_engine({"max_seq_len": 100}, default_max_seq_len=512)
    assert older.logits_dtype == "float32" and older.max_num_tokens is None
