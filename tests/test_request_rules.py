"""decode.request.RequestRules: one request assembled once (K, end ids, stop words) for the BLS, the local session
and the LLM API stand-in; and a local session with stop words, on the toy pair."""

from __future__ import annotations

import numpy as np
import pytest
from toy_model import NGramModel, ToyDrafter, ToyVerifier, random_model

from specbuild.contract.words import to_word_list, word_sequences
from specbuild.decode.generation import Options
from specbuild.decode.request import NO_END_ID, RequestRules
from specbuild.errors import RequestError
from specbuild.session.local import LocalSession
from specbuild.speculative.interfaces import SamplingParams

VOCAB = 24


class CharTokenizer:
    """One token per character (its code point modulo VOCAB); the BOS 0 when special tokens are asked for."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([0] if add_special_tokens else []) + [ord(ch) % VOCAB for ch in text]


def rules(**kwargs) -> RequestRules:
    return RequestRules(CharTokenizer(), **{"end_ids": (2, 7, 9), "max_draft_len": 6, "default_k": 4, **kwargs})


def test_k_is_the_requests_else_the_default_clamped_to_max_draft_len_and_nothing_adapts_at_k_0():
    assert rules().prepare(max_tokens=8, sampling=SamplingParams()).k.k == 4
    clamped = rules().prepare(max_tokens=8, sampling=SamplingParams(), num_draft_tokens=50)
    assert (clamped.k.k, clamped.k.clamped, clamped.request.num_draft_tokens) == (6, True, 6)
    assert rules(adaptive=True).prepare(max_tokens=8, sampling=SamplingParams()).request.adaptive
    assert (
        not rules(adaptive=True).prepare(max_tokens=8, sampling=SamplingParams(), num_draft_tokens=0).request.adaptive
    )
    assert not rules(adaptive=True).prepare(max_tokens=8, sampling=SamplingParams(), adaptive=False).request.adaptive


def test_a_request_naming_no_end_id_ends_at_all_of_the_deployments_one_naming_an_id_at_that_one_only():
    default = rules().prepare(max_tokens=8, sampling=SamplingParams())
    assert (default.model_end_id, default.request.end_id, tuple(default.request.other_end_ids)) == (2, 2, (7, 9))
    named = rules().prepare(max_tokens=8, sampling=SamplingParams(), end_id=5)
    assert (named.model_end_id, named.request.end_id, tuple(named.request.other_end_ids)) == (5, 5, ())
    none = rules().prepare(max_tokens=8, sampling=SamplingParams(), end_id=NO_END_ID)
    # TensorRT-LLM's -1 goes to the models as sent; the loop ends on no token
    assert (none.model_end_id, none.request.end_id, tuple(none.request.other_end_ids)) == (-1, None, ())
    assert rules(end_ids=()).prepare(max_tokens=8, sampling=SamplingParams()).model_end_id is None


def test_stop_words_are_the_sequences_nvidias_word_list_carries_and_map_back_to_their_text():
    words = ["ab", "", "xyz", "ab"]
    ready = rules().prepare(max_tokens=8, sampling=SamplingParams(), stop=words)
    expected = word_sequences(to_word_list(CharTokenizer(), [words]))  # what preprocessing sends the engines
    assert sorted(map(list, ready.request.stop_sequences)) == sorted(map(list, {tuple(s) for s in expected}))
    assert ready.stop_words == {tuple(CharTokenizer().encode(w, add_special_tokens=False)): w for w in ("ab", "xyz")}


def test_stop_words_without_a_tokenizer_are_refused_by_name():
    bare = RequestRules(None, end_ids=(), max_draft_len=4, default_k=4)
    assert bare.prepare(max_tokens=8, sampling=SamplingParams()).stop_words == {}
    with pytest.raises(RequestError, match="stop words need a tokenizer"):
        bare.prepare(max_tokens=8, sampling=SamplingParams(), stop=["x"])


def test_a_local_generation_ends_with_the_first_stop_word_it_produces():
    target = random_model(VOCAB, order=2, scale=3.0, seed=1)
    draft = NGramModel(target.table + np.random.default_rng(2).normal(0.0, 0.5, size=target.table.shape))
    tokenizer = CharTokenizer()
    session = LocalSession(
        ToyDrafter(draft), ToyVerifier(target, max_draft_len=4), encode=tokenizer.encode, tokenizer=tokenizer
    )
    options = Options(max_tokens=24, num_draft_tokens=3, adaptive=False)
    undisturbed = session.generate("abc", options, text=False).output_ids
    at = next(i for i in range(2, len(undisturbed)) if undisturbed[i] not in undisturbed[:i])
    word = chr(ord("a") + (undisturbed[at] - ord("a")) % VOCAB)  # a character that tokenizes to that id
    assert tokenizer.encode(word, add_special_tokens=False) == [undisturbed[at]]
    stopped = session.generate(
        "abc", Options(max_tokens=24, num_draft_tokens=3, adaptive=False, stop=(word,)), text=False
    )
    assert stopped.output_ids == undisturbed[: at + 1]
    assert (stopped.finish_reason, stopped.stop_reason) == ("stop", word)
