"""The one K rule (speculative/draft_len.py): the default, the clamp, the refusal, the fixed-K deployment, a sweep,
and the stats form a client reads back. Every field is pinned, so that a changed rule fails here first."""

from __future__ import annotations

import numpy as np
import pytest

from specbuild.errors import RequestError
from specbuild.speculative.draft_len import ResolvedK, check_k, resolve_fixed_k, resolve_k, resolve_ks


def test_no_k_asked_takes_the_default():
    resolved = resolve_k(None, 6, default=4)
    assert resolved == ResolvedK(k=4, requested=4, max_draft_len=6)
    assert not resolved.clamped and resolved.note() is None


def test_no_k_and_no_default_is_refused_with_the_exact_message():
    with pytest.raises(RequestError) as err:
        resolve_k(None, 6)
    assert str(err.value) == "num_draft_tokens is not set and this deployment has no default K: send it."


def test_a_k_above_max_draft_len_is_clamped_and_says_so():
    clamped = resolve_k(50, 6, default=4)
    assert clamped == ResolvedK(k=6, requested=50, max_draft_len=6)
    assert clamped.clamped
    assert clamped.note() == (
        "num_draft_tokens = 50 exceeds the target engine's max_draft_len = 6: using 6. "
        "Rebuild with a larger speculative.max_draft_len to draft more."
    )


def test_a_k_within_the_limit_is_kept_and_the_limit_recorded():
    assert resolve_k(3, np.int64(6)) == ResolvedK(k=3, requested=3, max_draft_len=6)
    assert resolve_k(0, 6) == ResolvedK(k=0, requested=0, max_draft_len=6)  # 0: target only
    assert resolve_k(6, 6) == ResolvedK(k=6, requested=6, max_draft_len=6)  # the limit itself is not a clamp
    assert type(resolve_k(np.int32(2), 6).requested) is int  # numpy integers become ints (JSON, comparisons)


@pytest.mark.parametrize("bad", [-1, 1.5, 2.0, "3", True, False, None])
def test_a_bad_k_is_refused(bad):
    with pytest.raises(RequestError, match=r"num_draft_tokens = .* is invalid: use 0 \(target only\)"):
        check_k(bad)


def test_check_k_accepts_numpy_integers_and_returns_ints():
    assert check_k(np.int64(5)) == 5 and type(check_k(np.int64(5))) is int
    assert check_k(0) == 0


def test_a_fixed_k_deployment_uses_its_k_and_says_so():
    """The LLM API drafts its max_draft_len at every step and takes no K per request."""
    assert resolve_fixed_k(None, 4) == ResolvedK(k=4, requested=4, max_draft_len=4)
    assert not resolve_fixed_k(4, 4).clamped
    asked = resolve_fixed_k(2, 4)
    assert asked == ResolvedK(k=4, requested=2, max_draft_len=4) and asked.clamped
    assert asked.note() == (
        "num_draft_tokens = 2 cannot be asked of this deployment: it drafts max_draft_len = 4 "
        "tokens at every step (the LLM API path); using 4."
    )
    assert resolve_fixed_k(6, np.int64(4)) == ResolvedK(k=4, requested=6, max_draft_len=4)
    assert type(resolve_fixed_k(6, np.int64(4)).k) is int
    with pytest.raises(RequestError, match="num_draft_tokens = -1 is invalid"):
        resolve_fixed_k(-1, 4)


def test_a_sweep_is_clamped_deduplicated_sorted_and_starts_at_zero():
    assert resolve_ks((8, 2, 4, 2), 4) == (
        (0, 2, 4),
        ["K = 8 measured as K = 4: above the deployment's max_draft_len = 4"],
    )
    assert resolve_ks((3, 1), 8) == ((0, 1, 3), [])
    assert resolve_ks((), 8) == ((0,), [])
    with pytest.raises(RequestError, match="num_draft_tokens = -2 is invalid"):
        resolve_ks((2, -2), 8)


def test_the_stats_form_round_trips():
    resolved = resolve_k(9, 5)
    assert resolved.to_dict() == {"k": 5, "requested": 9, "max_draft_len": 5}
    assert ResolvedK.from_dict(resolved.to_dict()) == resolved
    assert ResolvedK.from_dict({"k": "3", "requested": 3.0, "max_draft_len": np.int64(4)}) == ResolvedK(3, 3, 4)
