"""speculative.guide without a model or xgrammar: a small grammar over a 12-token vocabulary (digits, then the end
id), a target whose logits are a fixed function of the context, and drafters that propose allowed and refused tokens.
The loop's guided output at every K equals the constrained argmax computed directly; what guide.py does at each
point (the cut, the kept token, the banned step, the forced token, the refusals) is asserted on its own.
(With real grammars and the reference model: tests/test_guided.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from specbuild.errors import GenerationError, RequestError
from specbuild.speculative.guide import check_guided_sampling, cut_draft, keep_allowed
from specbuild.speculative.interfaces import Draft, SamplingParams, Verification
from specbuild.speculative.loop import GenerationRequest, run

VOCAB, END, LETTER = 12, 10, 11  # 0-9 digits, the end id, a letter the grammar never allows
MAX_DIGITS = 3


class Digits:
    """1 to MAX_DIGITS digits, then the end id (the guide protocol over a list of tokens kept)."""

    def __init__(self):
        self.kept: list[int] = []

    def _allowed(self, kept: list[int]) -> set[int]:
        if kept and kept[-1] == END:
            return set()
        digits = len(kept)
        allowed = set(range(10)) if digits < MAX_DIGITS else set()
        if digits >= 1:
            allowed.add(END)
        return allowed

    def allowed_prefix(self, tokens):
        kept = list(self.kept)
        for n, token in enumerate(tokens):
            if int(token) not in self._allowed(kept):
                return n
            kept.append(int(token))
        return len(tokens)

    def advance(self, tokens):
        for token in tokens:
            assert int(token) in self._allowed(self.kept), (token, self.kept)
            self.kept.append(int(token))

    def allowed(self):
        mask = np.zeros(VOCAB, dtype=bool)
        mask[list(self._allowed(self.kept))] = True
        return mask


def logits(context: list[int]) -> np.ndarray:
    """The target's logits after `context`: a fixed function of it, favouring the letter now and then."""
    rng = np.random.default_rng(abs(hash(tuple(context))) % 2**32)
    row = rng.normal(size=VOCAB)
    if len(context) % 3 == 0:
        row[LETTER] += 5.0  # the target's own choice is refused here
    return row


class Target:
    max_draft_len = 8

    def __init__(self):
        self.banned_calls = 0

    def verify(self, tokens, draft, sampling):
        out, context = [], list(tokens)
        for token in draft.tokens:
            choice = int(np.argmax(logits(context)))
            if choice != token:
                return Verification(len(out), [*out, choice])
            out.append(token)
            context.append(token)
        return Verification(len(out), [*out, int(np.argmax(logits(context)))])

    def step_banning(self, tokens, banned, sampling):
        assert isinstance(sampling, SamplingParams)  # the step's own sampling reaches the banned call
        self.banned_calls += 1
        row = logits(list(tokens)).copy()
        row[np.asarray(banned, dtype=int)] = -np.inf
        return int(np.argmax(row))


class Drafter:
    """Proposes the target's own tokens mostly, a refused letter now and then."""

    def propose(self, tokens, k, sampling):
        out, context = [], list(tokens)
        for i in range(k):
            token = LETTER if (len(context) + i) % 5 == 0 else int(np.argmax(logits(context)))
            out.append(token)
            context.append(token)
        return Draft(out)


def constrained_argmax(prompt: list[int], max_tokens: int) -> list[int]:
    guide, out = Digits(), []
    while len(out) < max_tokens:
        row = logits(prompt + out).copy()
        row[~guide.allowed()] = -np.inf
        token = int(np.argmax(row))
        if token == END:
            return out
        guide.advance([token])
        out.append(token)
    return out


@pytest.mark.parametrize("k", [0, 1, 2, 4])
def test_guided_output_is_the_constrained_argmax_at_every_k(k):
    constrained = 0
    for seed in range(12):
        prompt = [int(t) for t in np.random.default_rng(seed).integers(0, 10, size=4)]
        target = Target()
        result = run(prompt, Drafter(), target, GenerationRequest(8, k, end_id=END), guide=Digits())
        assert result.tokens == constrained_argmax(prompt, 8), (seed, k)
        assert result.finish_reason == "eos"  # the grammar closes: the end id ends it
        assert result.stats.constrained_steps == target.banned_calls
        constrained += target.banned_calls
    assert constrained > 0


def test_the_draft_is_cut_at_its_first_refused_token_with_its_rows():
    from specbuild.contract.adapters import ContractDraft

    guide = Digits()
    rows = np.arange(4 * VOCAB).reshape(4, VOCAB)
    draft = ContractDraft([1, 2, LETTER, 3], probs=rows, logits=rows + 0.5)
    cut = cut_draft(draft, guide)
    assert cut.tokens == [1, 2] and guide.kept == []  # the state unchanged
    assert np.array_equal(cut.probs, rows[:2]) and np.array_equal(cut.logits, rows[:2] + 0.5)  # the rows go too
    assert cut_draft(Draft([1, 2]), guide).tokens == [1, 2]
    assert cut_draft(Draft([LETTER, 1]), guide).tokens == []


def test_an_allowed_last_token_is_kept_a_refused_one_replaced_by_the_banned_step():
    guide, target = Digits(), Target()
    kept, called = keep_allowed(Verification(1, [3, 4]), guide, target, [0], SamplingParams())
    assert (kept.tokens, called, guide.kept, target.banned_calls) == ([3, 4], False, [3, 4], 0)
    guide = Digits()
    replaced, called = keep_allowed(Verification(1, [3, LETTER]), guide, target, [0], SamplingParams())
    row = logits([0, 3]).copy()
    row[[LETTER]] = -np.inf
    assert called and replaced.tokens == [3, int(np.argmax(row))] and target.banned_calls == 1
    assert replaced.accepted == 1 and guide.kept == [3, replaced.tokens[-1]]


def test_a_single_allowed_token_is_taken_without_a_call():
    guide, target = Digits(), Target()
    guide.advance([1, 2])  # two digits: a third, or the end
    forced, called = keep_allowed(Verification(1, [3, LETTER]), guide, target, [0], SamplingParams())
    assert forced.tokens == [3, END] and not called and target.banned_calls == 0  # only the end id is left


def test_after_a_kept_end_id_nothing_is_judged_the_loop_ends_there():
    """A verifier that accepts a drafted end id and adds a bonus token (the toy target does; the loop ends at the end
    id before reaching it): the grammar allows nothing more, and no call is made."""
    guide, target = Digits(), Target()
    verification = Verification(2, [1, END, 5])
    assert keep_allowed(verification, guide, target, [0], SamplingParams()) == (verification, False)
    assert guide.kept == [1, END] and target.banned_calls == 0


def test_a_target_that_ignores_the_ban_is_an_error_not_wrong_text():
    class Deaf(Target):
        def step_banning(self, tokens, banned, sampling):
            return LETTER

    with pytest.raises(
        GenerationError, match="the guide refuses it: the target model does not honour bad_words_list.$"
    ):
        keep_allowed(Verification(0, [LETTER]), Digits(), Deaf(), [0], SamplingParams())


def test_sampling_and_a_verifier_without_the_banned_step_are_refused():
    check_guided_sampling(SamplingParams(temperature=0.0))
    check_guided_sampling(SamplingParams(temperature=0.7, top_k=1))  # top-1 is greedy
    with pytest.raises(RequestError) as refused:
        check_guided_sampling(SamplingParams(temperature=0.7, seed=1))
    assert str(refused.value) == (
        "a guided request must be greedy (temperature 0): sampling under a guide is not exact with speculation "
        "here, as the target's verification does not restrict its distribution to the grammar's tokens."
    )
    with pytest.raises(RequestError, match="a guided request must be greedy"):
        run([1], Drafter(), Target(), GenerationRequest(4, 2, SamplingParams(temperature=0.5)), guide=Digits())

    class Plain:
        max_draft_len = 4

        def verify(self, tokens, draft, sampling):
            return Verification(0, [1])

    with pytest.raises(GenerationError, match="step with banned tokens"):
        run([1], Drafter(), Plain(), GenerationRequest(4, 2, end_id=END), guide=Digits())
