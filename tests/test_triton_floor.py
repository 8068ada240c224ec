"""Triton's floor for a BLS call (specbuild.triton.floor), and specbuild's own cost per call reported against it."""

from __future__ import annotations

import pytest

from specbuild.bench.run import serving_section
from specbuild.bench.runner import Measurements
from specbuild.bench.stats import RequestResult


@pytest.mark.server
def test_a_bare_bls_call_is_timed_on_a_real_server():
    from specbuild.triton.floor import measure_floor

    floor = measure_floor(calls=60, prompt_len=32, draft_len=4)
    assert floor["calls"] == 54 and floor["prompt_len"] == 32 and floor["draft_len"] == 4  # warm-up left out
    assert 0 < floor["p25_s"] <= floor["median_s"] <= floor["p75_s"] < 1.0


def _cell(k: int, seconds: float, steps: int) -> Measurements:
    measured = Measurements()
    measured.add(k, 1, [RequestResult(prompt_index=0, num_draft_tokens=k, output_tokens=60, seconds=seconds,
                                      ttft_seconds=0.01, steps=steps)], seconds)
    return measured


def test_the_cost_per_call_is_what_triton_adds_per_model_call_and_is_set_against_the_floor():
    # 60 tokens: in-process 0.30 s; through Triton 0.36 s over 20 steps at K = 3, a draft and a verify each
    triton, local = _cell(3, 0.36, 20), _cell(3, 0.30, 20)
    section = serving_section(triton, local, 3, {"median_s": 0.0005})
    row = section["runs"][0]
    assert row["overhead_s_per_call"] == pytest.approx(0.06 / 40)
    assert section["overhead_s_per_call"] == row["overhead_s_per_call"]
    assert section["overhead_over_floor"] == pytest.approx(3.0)  # 1.5 ms against 0.5 ms
    assert "floor" not in serving_section(triton, local, 3)  # not measured: not reported
