"""Triton's floor for a BLS call (specbuild.triton.floor), and specbuild's own cost per call reported against it."""

from __future__ import annotations

import pytest

from specbuild.bench.run import serving_section
from specbuild.bench.runner import Measurements
from specbuild.bench.stats import RequestResult


@pytest.mark.server
def test_a_bls_call_of_a_verify_calls_shape_is_timed_on_a_real_server():
    from specbuild.triton.floor import measure_floor

    floor = measure_floor(calls=60, prompt_len=32, draft_len=0)  # K = 0: a verify call without draft tensors
    assert floor["calls"] == 54 and floor["prompt_len"] == 32 and floor["draft_len"] == 0  # warm-up left out
    assert 0 < floor["p25_s"] <= floor["median_s"] <= floor["p75_s"] < 1.0
    # the identity works 0.2 s per call and the caller takes it off: what is left is Triton's round trip. Every
    # call takes at least the work (none of the figures below 0); the median is far below the work (a 0.1 s
    # margin, which a busy machine holds). The caller's ContractVerifier checked each answer as the BLS does.
    worked = measure_floor(calls=6, prompt_len=32, draft_len=4, work_s=0.2)
    assert worked["draft_len"] == 4 and worked["work_s"] == 0.2
    assert 0 <= worked["p25_s"] <= worked["median_s"] < 0.1


def test_the_floor_identity_declares_the_targets_tensors(tmp_path):
    from specbuild.contract import tensors
    from specbuild.contract.pbtxt import parse_pbtxt
    from specbuild.triton.floor import write_floor_repository

    repo = write_floor_repository(tmp_path, work_s=0.0021)
    config = parse_pbtxt((repo / "floor_identity" / "config.pbtxt").read_text())
    assert [t.name for t in config.input] == [t.name for t in tensors.LLM_INPUTS]
    assert [t.name for t in config.output] == [t.name for t in tensors.LLM_OUTPUTS]
    assert config.parameters["work_us"].string_value == "2100"


def test_a_floor_of_long_calls_takes_fewer_of_them():
    from specbuild.triton.floor import floor_calls

    assert floor_calls(0.0) == floor_calls(0.0023) == 300  # the example pair's calls: 0.7 s of work
    assert floor_calls(0.05) == 100  # 5 s of work
    assert floor_calls(2.0) == 50  # never fewer


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
    # in-process 7.5 ms per call (0.30 s over 40 calls): at the floor a call would take 8 ms through Triton
    assert row["local_s_per_call"] == pytest.approx(0.0075)
    assert section["ceiling"] == row["ceiling"] == pytest.approx(0.0075 / 0.008, abs=1e-4)
    assert "floor" not in serving_section(triton, local, 3)  # not measured: not reported
