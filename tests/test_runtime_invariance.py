"""Batch invariance and the caches: the same logits, bit for bit, however a position is computed.

This is what makes speculative greedy output equal target-only output (a k + 1-token verification
and k + 1 one-token steps see identical numbers) and what makes the KV rollback and the prefix
cache invisible in the output.

Whether a row block is invariant depends on the machine's BLAS code path (reference/exactness.py), so
these tests never assume a block passes: `probed` is the runtime's own choice on this machine, and a
fixed block is tested only where the probe accepts it (a block the probe accepts must be exact in
decoding; a rejected one makes no claim to check). tests/test_runtime_exactness.py covers the probe.
"""

from __future__ import annotations

import numpy as np
import pytest
from runtime_models import make_llama, prompts, single_thread  # noqa: F401 (autouse fixture)

from specbuild.reference.engine import ReferenceEngine
from specbuild.reference.exactness import probe
from specbuild.reference.kvcache import PrefixCache, common_prefix
from specbuild.reference.model import LlamaModel


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    make_llama(folder, layers=2, hidden=64, intermediate=160, vocab=211)
    return folder


@pytest.fixture(scope="module", params=["probed", 2, 8], ids=["probed", "row_block=2", "row_block=8"])
def model(folder, request):
    if request.param == "probed":
        model = LlamaModel.from_folder(folder)  # what the runtime chooses on this machine
        assert model.exactness.exact and not model.exactness.tried[-1].failures
        return model
    model = LlamaModel.from_folder(folder, row_block=request.param, probe=False)
    failures = probe(model, request.param)
    if failures:
        pytest.skip(
            f"the probe rejects row_block={request.param} on this machine ({', '.join(failures[:2])}): "
            "the runtime would not use it, so there is no exactness claim to check"
        )
    return model


def fresh(model, use_cache=True):
    return ReferenceEngine(model, use_cache=use_cache)  # a new engine (empty caches) over the same weights


def test_prefill_equals_one_token_steps_and_batched(model):
    seqs = prompts(5, 211, seed=3, min_len=9, max_len=17)
    whole = [fresh(model).logits([s], [len(s)])[0] for s in seqs]  # one prefill each
    engine = fresh(model)
    for s, expected in zip(seqs, whole):
        for n in range(1, len(s) + 1):  # one token at a time, reusing the cache
            assert np.array_equal(engine.logits([s[:n]], [1])[0][0], expected[n - 1])
    batched = fresh(model).logits(seqs, [len(s) for s in seqs])  # all sequences in one forward
    for got, expected in zip(batched, whole):
        assert np.array_equal(got, expected)


def test_verification_rows_equal_single_steps_in_any_batch(model):
    base = prompts(4, 211, seed=4, min_len=6, max_len=10)
    engine = fresh(model)
    for k in (1, 2, 4, 8):
        drafts = prompts(4, 211, seed=10 + k, min_len=k, max_len=k)
        verify = engine.logits([b + d for b, d in zip(base, drafts)], [k + 1] * 4)  # [k + 1, vocab] each
        for b, d, rows in zip(base, drafts, verify):
            single = fresh(model, use_cache=False)
            for j in range(k + 1):
                assert np.array_equal(single.logits([b + d[:j]], [1])[0][0], rows[j])


def test_positions_across_attention_key_buckets_match_however_they_are_grouped(model):
    """Attention reads keys in buckets of 64 positions, query rows in blocks: a position's logits must
    not depend on where its group starts or on which side of a bucket end its neighbours fall."""
    seq = prompts(1, 211, seed=13, min_len=140, max_len=140)[0]
    whole = fresh(model).logits([seq], [len(seq)])[0]  # one prefill: groups split at 64 and 128
    engine = fresh(model)
    engine.logits([seq[:56]], [1])
    for n in range(57, 75):  # one-token steps over the first bucket end
        assert np.array_equal(engine.logits([seq[:n]], [1])[0][0], whole[n - 1])
    for start in (59, 60, 61, 62, 63, 64, 124, 126):  # 5-row verifications starting anywhere near an end
        engine = fresh(model)
        engine.logits([seq[:start]], [1])
        rows = engine.logits([seq[: start + 5]], [5])[0]  # only the 5 new rows are computed
        for j in range(5):
            assert np.array_equal(rows[j], whole[start + j]), (start, j)


def test_rollback_and_prefix_cache_give_identical_logits(model):
    engine = fresh(model)
    prompt = prompts(1, 211, seed=5, min_len=12, max_len=12)[0]
    engine.logits([prompt + [7, 8, 9]], [4])  # a draft that will be rejected
    before = engine.computed_rows
    got = engine.logits([prompt + [10, 11]], [2])[0]  # shares the prompt only: rolled back to it
    assert engine.computed_rows - before == 2  # only the two new positions were computed
    assert engine.prefix_cache.hits >= 1
    assert np.array_equal(got, fresh(model, use_cache=False).logits([prompt + [10, 11]], [2])[0])


def test_decode_with_and_without_caches_is_identical(model):
    seqs = prompts(6, 211, seed=6)
    greedy = [lambda row: int(np.argmax(row))] * len(seqs)
    cached = fresh(model).decode(seqs, [12] * 6, greedy, [None] * 6)
    uncached = fresh(model, use_cache=False).decode(seqs, [12] * 6, greedy, [None] * 6)
    one_by_one = [fresh(model).decode([s], [12], greedy[:1], [None])[0] for s in seqs]
    for a, b, c in zip(cached, uncached, one_by_one):
        assert a.tokens == b.tokens == c.tokens
        assert np.array_equal(a.logits, b.logits) and np.array_equal(a.logits, c.logits)


def test_decode_stops_at_end_id(model):
    seq = prompts(1, 211, seed=7)[0]
    greedy = [lambda row: int(np.argmax(row))]
    full = fresh(model).decode([seq], [10], greedy, [None])[0].tokens
    stop = full[3]
    cut = fresh(model).decode([seq], [10], greedy, [stop])[0].tokens
    assert cut == full[: full.index(stop) + 1]


def test_prefix_cache_budget_evicts_least_recently_used(model):
    probe = model.new_cache()
    probe.reserve(5)
    engine = ReferenceEngine(model, prefix_cache_bytes=2 * probe.nbytes)  # room for two short sequences
    seqs = [[3 + i] * 5 for i in range(3)]
    for s in seqs:
        engine.logits([s], [1])
    assert len(engine.prefix_cache.entries) == 2
    kept = [e.tokens for e in engine.prefix_cache.entries.values()]
    assert seqs[0] not in kept and seqs[1] in kept and seqs[2] in kept


def test_prefix_cache_entry_limit(model):
    engine = ReferenceEngine(model)
    engine.prefix_cache.max_entries = 3
    for i in range(5):
        engine.logits([[3 + i, 4, 5]], [1])
    assert [e.tokens for e in engine.prefix_cache.entries.values()] == [[5, 4, 5], [6, 4, 5], [7, 4, 5]]


def test_a_sequence_sharing_only_a_preamble_copies_it_and_leaves_the_owner_its_cache(model):
    preamble = prompts(1, 211, seed=8, min_len=20, max_len=20)[0]
    owner = preamble + prompts(1, 211, seed=9, min_len=30, max_len=30)[0]
    other = preamble + [1, 2, 3]
    engine = fresh(model)
    engine.logits([owner], [1])
    before = engine.computed_rows
    got = engine.logits([other], [1])[0]  # reuses the preamble, from a copy
    assert engine.computed_rows - before == 3
    assert engine.prefix_cache.copies == 1
    before = engine.computed_rows
    engine.logits([owner + [4]], [1])  # the owner's cache is still whole: one new position
    assert engine.computed_rows - before == 1
    assert np.array_equal(got, fresh(model, use_cache=False).logits([other], [1])[0])


def test_many_sequences_in_flight_with_a_shared_preamble_keep_their_caches(model):
    """More sequences than a batch, interleaved, sharing a preamble: each step computes one row each."""
    preamble = prompts(1, 211, seed=10, min_len=80, max_len=80)[0]
    seqs = [preamble + [5 + i] * 3 for i in range(6)]
    engine = fresh(model)
    greedy = lambda row: int(np.argmax(row))  # noqa: E731
    for s in seqs:
        engine.logits([s], [1])
    before = engine.computed_rows
    for _ in range(4):
        for group in (seqs[:4], seqs[4:]):  # a batch of 4, then the other 2, like a Batcher at max_batch_size 4
            rows = engine.logits(group, [1] * len(group))
            for s, r in zip(group, rows):
                s.append(greedy(r[0]))
    assert engine.computed_rows - before == 4 * len(seqs)


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 3, 4]) == 3
    assert common_prefix([1, 2, 3], [1, 9, 3]) == 1
    assert common_prefix([5], [6]) == 0
    assert common_prefix([], [1]) == 0
    cache = PrefixCache(max_bytes=10)
    assert cache.take([1, 2]) == (None, 0)


def _kv(tokens, capacity=4):
    import torch

    from specbuild.reference.kvcache import SequenceKV

    kv = SequenceKV(2, 1, 2, torch.device("cpu"), torch.float32)
    kv.reserve(capacity)
    kv.commit(tokens)
    kv.settled = len(tokens)
    return kv


def test_prefix_cache_takes_the_longest_shared_prefix_whatever_the_order():
    short, long, other = _kv([1, 2]), _kv([1, 2, 3, 4]), _kv([7, 8, 9])
    assert long.nbytes == sum(t.numel() * t.element_size() for t in long.k + long.v)
    for order in ((short, long, other), (long, short, other), (other, long, short)):
        cache = PrefixCache(max_bytes=1 << 20)
        for entry in order:
            cache.put(entry)
        entry, n = cache.take([1, 2, 3, 4, 5])
        assert (entry, n) == (long, 4)
        assert cache.take([1, 2, 6]) == (short, 2)  # long is out (in use): the next best
        assert cache.take([5]) == (None, 0)


def test_prefix_cache_drops_the_least_recent_over_budget():
    first, second, third = _kv([1]), _kv([2]), _kv([3])
    cache = PrefixCache(max_bytes=2 * first.nbytes)
    for entry in (first, second, third):
        cache.put(entry)
    assert list(cache.entries.values()) == [second, third]


def test_invariance_holds_with_two_threads(model):
    """The CLI uses torch's default thread count for larger models, and the BLAS code path can depend on the
    thread count: the probed model probes again under 2 threads; a fixed block is checked where the probe
    accepts it under 2 threads."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        if model.exactness is None and probe(model, model.row_block):
            pytest.skip(f"the probe rejects row_block={model.row_block} with 2 threads on this machine")
        base, draft = prompts(1, 211, seed=8, min_len=7, max_len=7)[0], [5, 6, 7, 8]
        rows = fresh(model).logits([base + draft], [5])[0]
        for j in range(5):
            assert np.array_equal(fresh(model, use_cache=False).logits([base + draft[:j]], [1])[0][0], rows[j])
        assert model.exactness is None or (model.exactness.threads == 2 and model.exactness.exact)
    finally:
        torch.set_num_threads(previous)


def test_positions_past_the_first_rope_chunk_do_not_depend_on_history(folder):
    long = prompts(1, 211, seed=12, min_len=1100, max_len=1100)[0]
    direct = fresh(LlamaModel.from_folder(folder)).logits([long], [3])[0]  # the table grows to 2048 at once
    engine = ReferenceEngine(LlamaModel.from_folder(folder))
    engine.logits([long[:10]], [1])  # first a short sequence: a 1024-position table
    assert np.array_equal(engine.logits([long], [3])[0], direct)
