"""Triton's floor for a BLS call (specbuild.triton.floor_probe), and specbuild's own cost per call reported against it."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from specbuild.bench.run import serving_section
from specbuild.bench.runner import Measurements
from specbuild.bench.stats import RequestResult


@pytest.mark.server
def test_a_bls_call_of_a_verify_calls_shape_is_timed_on_a_real_server():
    from specbuild.triton.floor_probe import measure_floor

    floor = measure_floor(calls=60, prompt_len=32, draft_len=0)  # K = 0: a verify call without draft tensors
    assert floor["calls"] == 54 and floor["prompt_len"] == 32 and floor["draft_len"] == 0  # warm-up left out
    assert 0 < floor["p25_s"] <= floor["median_s"] <= floor["p75_s"]
    # the identity works 20 ms per call and the caller takes it off: every call took at least its work (one clock
    # for both processes), so no figure is below 0; the caller's ContractVerifier checked each answer as the BLS
    # does. That the work is taken off, and no more, is checked on a clock of its own below.
    worked = measure_floor(calls=6, prompt_len=32, draft_len=4, work_s=0.02)
    assert worked["draft_len"] == 4 and worked["work_s"] == 0.02
    assert 0 <= worked["p25_s"] <= worked["median_s"] <= worked["p75_s"]


class _Tensor:
    def __init__(self, name, array):
        self._name, self._array = name, np.asarray(array)

    def name(self):
        return self._name

    def as_numpy(self):
        return self._array


class _Message:
    """A request (`inputs`) or a response (`output_tensors`) of the fake triton_python_backend_utils."""

    def __init__(self, tensors):
        self.tensors = tensors

    def inputs(self):
        return self.tensors

    def output_tensors(self):
        return self.tensors


class _Clock:
    """time.perf_counter that moves 0.1 ms at each reading: the identity's spin ends after a known number of them."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        self.now += 1e-4
        return self.now


def test_the_caller_takes_the_identitys_work_off_each_call(monkeypatch):
    from specbuild.triton.models import floor as models

    pb_utils = types.SimpleNamespace(
        Tensor=_Tensor,
        InferenceResponse=lambda output_tensors: _Message(output_tensors),
        get_input_tensor_by_name=lambda request, name: next(t for t in request.inputs() if t.name() == name),
    )
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb_utils)
    clock = _Clock()
    monkeypatch.setattr(models, "time", clock)
    identity, asked = models.Identity(work_s=0.005), []

    def call_model(pb, model, inputs):  # the identity answers in this process, on the same clock
        asked.append(sorted(inputs))
        response = identity.execute([_Message([_Tensor(name, value[None]) for name, value in inputs.items()])])[0]
        return {t.name(): t.as_numpy() for t in response.output_tensors()}

    monkeypatch.setattr(models, "call_model", call_model)
    request = _Message(
        [_Tensor(name, [[value]]) for name, value in (("CALLS", 3), ("PROMPT_LEN", 8), ("DRAFT_LEN", 2))]
    )
    seconds = models.Caller(work_s=0.005).execute([request])[0].output_tensors()[0].as_numpy().reshape(-1)
    # a verify call's tensors at K = 2, each answer accepted by the ContractVerifier (else execute raised)
    assert (
        asked
        == [
            [
                "draft_input_ids",
                "end_id",
                "input_ids",
                "input_lengths",
                "pad_id",
                "request_output_len",
                "return_perf_metrics",
                "runtime_top_k",
            ]
        ]
        * 3
    )
    # each call took the identity's 5 ms spin and a few clock readings more: what is left is those readings only
    assert seconds.shape == (3,) and all(0 <= s <= 1e-3 for s in seconds)


def test_the_floor_identity_declares_the_targets_tensors(tmp_path):
    from specbuild.contract import tensors
    from specbuild.contract.pbtxt import parse_pbtxt
    from specbuild.triton.floor_probe import write_floor_repository

    repo = write_floor_repository(tmp_path, work_s=0.0021)
    config = parse_pbtxt((repo / "floor_identity" / "config.pbtxt").read_text())
    assert [t.name for t in config.input] == [t.name for t in tensors.LLM_INPUTS]
    assert [t.name for t in config.output] == [t.name for t in tensors.LLM_OUTPUTS]
    assert config.parameters["work_us"].string_value == "2100"


def test_a_floor_of_long_calls_takes_fewer_of_them():
    from specbuild.triton.floor_probe import floor_calls

    assert floor_calls(0.0) == floor_calls(0.0023) == 300  # the example pair's calls: 0.7 s of work
    assert floor_calls(0.05) == 100  # 5 s of work
    assert floor_calls(2.0) == 50  # never fewer


def _cell(k: int, seconds: float, steps: int) -> Measurements:
    measured = Measurements()
    measured.add(
        k,
        1,
        [
            RequestResult(
                prompt_index=0, num_draft_tokens=k, output_tokens=60, seconds=seconds, ttft_seconds=0.01, steps=steps
            )
        ],
        seconds,
    )
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
