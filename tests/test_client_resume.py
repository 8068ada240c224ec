"""A stream cut because the server went away is sent again and resumed where it was cut
(triton.client.resume_stream): nothing twice, nothing skipped, a replay that differs refused, a sampled request
without a seed reported, a server that does not come back reported. Against the real server (the BLS's process killed
mid-stream): tests/test_triton_faults.py."""

from __future__ import annotations

import pytest

from specbuild.errors import ClientError
from specbuild.triton.client import Chunk, StreamCut, resume_stream

CUT = StreamCut("tensorrt_llm_bls: Socket closed")


def attempts(*scripts):
    """attempt() for resume_stream: each call plays the next script (chunks, then a cut where it says CUT)."""
    calls = iter(scripts)

    def attempt():
        for item in next(calls):
            if item is CUT:
                raise CUT
            yield item

    return attempt


def final(text="", **stats):
    return Chunk(text, True, dict(stats or {"finish_reason": "length"}))


class Waits:
    def __init__(self, answers=True):
        self.answers, self.deadlines = answers, []

    def __call__(self, deadline):
        self.deadlines.append(deadline)
        return self.answers


def test_an_uncut_stream_passes_through_as_it_came():
    attempt = attempts([Chunk("ab", False), Chunk("", False), Chunk("c", False), final("")])
    chunks = list(resume_stream(attempt, exact=True, wait_for_server=Waits()))
    assert [(c.text, c.final) for c in chunks] == [("ab", False), ("c", False), ("", True)]
    assert chunks[-1].stats == {"finish_reason": "length"}


def test_a_cut_stream_goes_on_where_it_was_cut_and_says_it_resumed():
    waits = Waits()
    attempt = attempts(
        [Chunk("ab", False), Chunk("c", False), CUT],
        [Chunk("a", False), Chunk("bcd", False), Chunk("ef", False), final("")],
    )
    chunks = list(resume_stream(attempt, exact=True, wait_for_server=waits, resume_s=30))
    assert [c.text for c in chunks] == ["ab", "c", "d", "ef", ""]
    assert chunks[-1].stats == {"finish_reason": "length", "resumed": 1} and len(waits.deadlines) == 1


def test_a_stream_cut_twice_and_one_cut_after_its_last_text_both_end_once():
    attempt = attempts([Chunk("ab", False), CUT], [Chunk("abc", False), CUT], [Chunk("abc", False), final("")])
    chunks = list(resume_stream(attempt, exact=True, wait_for_server=Waits()))
    assert "".join(c.text for c in chunks) == "abc" and [c.final for c in chunks].count(True) == 1
    assert chunks[-1].stats["resumed"] == 2


def test_a_replay_that_differs_is_refused_where_it_differs():
    attempt = attempts([Chunk("abcd", False), CUT], [Chunk("abXd", False), final("")])
    with pytest.raises(ClientError) as err:
        list(resume_stream(attempt, exact=True, wait_for_server=Waits()))
    assert "differs from the text already received at character 2 ('cd' received, 'Xd' now)" in str(err.value)
    shorter = attempts([Chunk("abcd", False), CUT], [final("ab")])
    with pytest.raises(ClientError, match="at character 2"):
        list(resume_stream(shorter, exact=True, wait_for_server=Waits()))


def test_a_sampled_request_without_a_seed_is_reported_not_resumed():
    waits = Waits()
    with pytest.raises(StreamCut) as err:
        list(resume_stream(attempts([Chunk("abc", False), CUT]), exact=False, wait_for_server=waits))
    assert "cut after 3 characters; a request that samples without a seed cannot be resumed" in str(err.value)
    assert waits.deadlines == []


def test_a_cut_before_any_text_is_sent_again_even_sampled_and_a_server_that_stays_away_is_said():
    for exact in (True, False):  # nothing was shown, so even another sample is no change to what the caller has
        chunks = list(resume_stream(attempts([CUT], [Chunk("ab", False), final("")]), exact, Waits()))
        assert [c.text for c in chunks] == ["ab", ""] and chunks[-1].stats["resumed"] == 1
    with pytest.raises(StreamCut) as err:
        list(resume_stream(attempts([Chunk("ab", False), CUT]), True, Waits(answers=False), resume_s=7))
    assert "cut after 2 characters and the server did not serve again within 7 s" in str(err.value)


def test_cuts_without_new_text_share_one_deadline_and_new_text_starts_a_fresh_one():
    """A server that answers ready while a model's stub is still dead cuts the request again at once: the wait is
    resume_s from the first such cut, not from each, so it cannot go on for ever; new text resets it."""
    waits, ticks = Waits(), iter(range(100, 200))  # a clock that moves on by 1 at each reading
    attempt = attempts(
        [Chunk("ab", False), CUT], [Chunk("ab", False), CUT], [CUT], [Chunk("abc", False), CUT], [final("abcd")]
    )
    chunks = list(resume_stream(attempt, True, waits, resume_s=30, clock=lambda: next(ticks)))
    assert "".join(c.text for c in chunks) == "abcd" and chunks[-1].stats["resumed"] == 4
    # the same deadline while the stream did not move on; "c" arrived: the next cut waits afresh, from a later reading
    assert waits.deadlines == [130, 130, 130, 131]


def test_tritons_answer_for_a_dead_or_hung_stub_is_a_cut_and_other_answers_are_not():
    """Triton's Python backend answers a request to a model whose stub died or hangs with "Stub process '<instance>'
    is not healthy." (python_backend src/python_be.cc): the supervisor brings the model back, so the request is
    resumed like a stream the server's going away cut (found by the chaos soak)."""
    from specbuild.triton.client import _answer

    dead = _answer("tensorrt_llm_bls: Stub process 'tensorrt_llm_bls_0_0' is not healthy.")
    assert isinstance(dead, StreamCut)
    refused = _answer("tensorrt_llm_bls: input 'max_tokens' = 0: must be in 1..256 for this deployment.")
    assert type(refused) is ClientError
    assert isinstance(_answer("tensorrt_llm_bls: Socket closed", cut=True), StreamCut)
