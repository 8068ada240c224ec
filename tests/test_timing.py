"""Timed stand-ins (specbuild.reference.timing) and the GPU table's cost model (specbuild.gpus)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from specbuild import gpus
from specbuild.reference.timing import TIMING_ENV, CallClock, StandInTiming, from_environ


def _model(parameters: int = 1000, layers: int = 2, kv_heads: int = 2, head_dim: int = 4):
    return SimpleNamespace(
        parameter_count=parameters, args=SimpleNamespace(num_layers=layers, num_kv_heads=kv_heads, head_dim=head_dim)
    )


def test_the_timing_texts_and_what_each_means():
    every = StandInTiming.parse("20ms")
    assert every.fixed == {"target": 0.02, "draft": 0.02} and every.gpu is None
    per_role = StandInTiming.parse("target=20ms, draft=1.5ms")
    assert per_role.fixed == {"target": 0.02, "draft": 0.0015}
    assert StandInTiming.parse("draft=250us").fixed == {"draft": 0.00025}
    assert StandInTiming.parse("0.5s").fixed["target"] == 0.5
    gpu = StandInTiming.parse("gpu=h100-80gb,target=8B,draft=500M,bytes_per_weight=1")
    assert gpu.gpu is gpus.GPUS["H100-80GB"] and gpu.parameters == {"target": 8e9, "draft": 5e8}
    assert gpu.bytes_per_weight == 1.0 and gpu.fixed == {}
    assert "H100-80GB" in gpu.describe() and "8B" in gpu.describe()
    assert per_role.describe() == "target 20 ms per step, draft 1.5 ms per step"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "fast",
        "20",
        "-1ms",
        "target=20",
        "target=1ms,target=2ms",
        "verifier=1ms",
        "bytes_per_weight=1",
        "gpu=H100-80GB,target=fast",
        "gpu=H100-80GB,bytes_per_weight=0",
        "target=1ms,bytes_per_weight=1",
    ],
)
def test_a_timing_that_means_nothing_is_refused_with_what_to_give(text):
    with pytest.raises(ValueError, match="give the time per step"):
        StandInTiming.parse(text)


def test_an_unknown_gpu_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="unknown GPU 'H9000': known GPUs are H100-80GB, "):
        StandInTiming.parse("gpu=H9000")


def test_the_environment_names_the_variable_when_its_value_is_bad():
    assert from_environ({}) is None and from_environ({TIMING_ENV: "  "}) is None
    assert from_environ({TIMING_ENV: "5ms"}).fixed == {"target": 0.005, "draft": 0.005}
    with pytest.raises(ValueError, match=f"^{TIMING_ENV}: timed stand-in 'soon'"):
        from_environ({TIMING_ENV: "soon"})


class ScriptedTime:
    def __init__(self):
        self.t = 100.0
        self.slept: list[float] = []

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += seconds


def test_a_call_waits_for_what_its_computation_left_and_an_overrun_is_counted():
    time = ScriptedTime()
    clock = CallClock(lambda contexts, steps: steps * 0.010, now=time.now, sleep=time.sleep)
    started = time.now()
    time.t += 0.004  # the computation took 4 ms of a 10 ms step
    clock.finish(started, [([7], 1)])
    assert time.slept == [pytest.approx(0.006)] and (clock.calls, clock.overruns) == (1, 0)
    started = time.now()
    time.t += 0.025  # 25 ms of computation for 2 steps of 10 ms: nothing to wait, one overrun
    clock.finish(started, [([7], 2)])
    assert len(time.slept) == 1 and (clock.calls, clock.overruns) == (2, 1)
    started = time.now()
    time.t += 0.001
    clock.finish(started, [([7], 3)])  # a call of 3 steps (a draft proposing 3 tokens) lasts 30 ms
    assert time.slept[-1] == pytest.approx(0.029)
    started = time.now()
    clock.finish(started, [([7, 8], 1), ([9], 1)])  # more rows than a batch holds: two batches, one after the other
    assert time.slept[-1] == pytest.approx(0.020) and clock.timed_seconds == pytest.approx(0.080)


def test_fixed_timing_is_per_step_of_the_named_role_only():
    timing = StandInTiming.parse("target=20ms")
    assert timing.clock_for("draft", _model()) is None
    clock = timing.clock_for("target", _model())
    assert clock.seconds_for([5, 9], 1) == 0.02 and clock.seconds_for([5], 4) == pytest.approx(0.08)


def test_the_gpu_cost_model_reads_weights_once_per_step_and_each_rows_kv_cache():
    h100 = gpus.GPUS["H100-80GB"]
    rate = h100.bandwidth_gbs * 1e9 * gpus.ACHIEVED_BANDWIDTH_FRACTION
    model = _model(parameters=1000, layers=2, kv_heads=2, head_dim=4)
    kv_per_token = 2 * 2 * 2 * 4 * 2  # K and V, layers, kv heads, head_dim, float16 bytes
    own = StandInTiming.parse("gpu=H100-80GB").clock_for("target", model)
    floor = 2 * gpus.LAUNCH_SECONDS_PER_LAYER
    assert own.seconds_for([10], 1) == pytest.approx((1000 * 2 + 10 * kv_per_token) / rate + floor)
    assert own.seconds_for([10, 30], 1) == pytest.approx((1000 * 2 + 40 * kv_per_token) / rate + floor)
    assert own.seconds_for([10], 3) == pytest.approx(3 * own.seconds_for([10], 1))
    as_8b = StandInTiming.parse("gpu=H100-80GB,target=8B").clock_for("target", model)
    assert as_8b.seconds_for([0], 1) == pytest.approx(16e9 / rate + floor)  # about 6.8 ms at 70 % of 3.35 TB/s
    assert StandInTiming.parse("gpu=H100-80GB,target=8B").clock_for("draft", model).seconds_for([0], 1) == (
        pytest.approx(2000 / rate + floor)
    )  # the draft's own size where only the target's is named


def test_every_gpu_has_its_bandwidth_and_a_source_and_the_spec_table_derives_from_it():
    from specbuild.bench import theory
    from specbuild.config import GPUS

    assert GPUS == {name: (gpu.memory_gib, gpu.sm) for name, gpu in gpus.GPUS.items()}
    for name, gpu in gpus.GPUS.items():
        assert gpu.name == name and gpu.bandwidth_gbs > 0 and gpu.source
        assert gpus.lookup(name.lower()) is gpu
    size = theory.ModelSize(parameters=7_000_000_000, layers=32)
    spec_model = SimpleNamespace(quantization="none", dtype="float16")
    assert theory.gpu_step_seconds(size, spec_model, "A100-80GB") == pytest.approx(
        14e9 / (2039e9 * gpus.ACHIEVED_BANDWIDTH_FRACTION) + 32 * gpus.LAUNCH_SECONDS_PER_LAYER
    )


def test_a_timed_pair_gives_the_same_tokens_and_each_call_lasts_its_steps(tiny_spec_path, monkeypatch):
    """The in-process pair under `target=30ms,draft=3ms`: greedy output equal to the untimed pair's at K = 0 and K = 3;
    every call was timed, and the request lasted at least its calls' steps (a wait only adds time, so this bound holds
    on a machine of any speed)."""
    import time as clock

    from specbuild.config import load_spec
    from specbuild.reference.loading import load_pair
    from specbuild.speculative.loop import GenerationRequest, run

    spec = load_spec(tiny_spec_path)
    plain = load_pair(spec, device="cpu")
    monkeypatch.setenv(TIMING_ENV, "target=30ms,draft=3ms")
    timed = load_pair(spec, device="cpu")
    assert plain.target_model.clock is None and plain.draft_model.clock is None
    ids = list(range(5, 25))
    for k in (0, 3):
        request = GenerationRequest(max_tokens=12, num_draft_tokens=k, end_id=None)
        expected = run(ids, plain.drafter, plain.verifier, request)
        target, draft = timed.target_model.clock, timed.draft_model.clock
        before = (target.calls, draft.calls, target.timed_seconds, draft.timed_seconds)
        started = clock.perf_counter()
        result = run(ids, timed.drafter, timed.verifier, request)
        took = clock.perf_counter() - started
        assert result.tokens == expected.tokens
        target_calls, draft_calls = target.calls - before[0], draft.calls - before[1]
        assert target_calls == result.stats.steps and draft_calls == (result.stats.steps if k else 0)
        target_seconds, draft_seconds = target.timed_seconds - before[2], draft.timed_seconds - before[3]
        assert target_seconds == pytest.approx(0.030 * target_calls)  # a verify call is one step
        assert draft_seconds == pytest.approx(0.003 * result.stats.drafted)  # a proposal of n tokens is n steps
        assert took >= target_seconds + draft_seconds


def test_a_call_of_more_rows_than_the_engine_batches_lasts_one_step_per_batch(tiny_spec_path, monkeypatch):
    """A verify call of 5 rows to a model whose max_batch_size is 2 runs 3 batches: 3 timed steps, as an engine that
    holds 2 rows at a time would take."""
    import dataclasses

    import numpy as np

    from specbuild.config import load_spec
    from specbuild.reference.loading import load_pair

    monkeypatch.setenv(TIMING_ENV, "target=10ms")
    model = load_pair(load_spec(tiny_spec_path), device="cpu").target_model
    model.limits = dataclasses.replace(model.limits, max_batch_size=2)
    rows = [
        {
            "input_ids": np.array([[5, 6, 7 + i]]),
            "input_lengths": np.array([[3]]),
            "draft_input_ids": np.array([[8, 9]]),
            "request_output_len": np.array([[3]]),
        }
        for i in range(5)
    ]
    before = model.clock.timed_seconds
    model.execute(rows)
    assert model.clock.timed_seconds - before == pytest.approx(0.030)


def test_a_served_stand_in_times_its_whole_call_its_tensor_work_included():
    """In tritonserver the stand-in's step runs from Triton handing it the requests to its answer: reading and writing
    the tensors (the C++ backend's microseconds) falls inside the timed step instead of adding to it; a call that ran
    no rows (every request refused) waits for nothing."""
    from specbuild.triton.models import reference_llm

    time = ScriptedTime()
    clock = CallClock(lambda contexts, steps: steps * 0.010, now=time.now, sleep=time.sleep)
    model = object.__new__(reference_llm.TritonPythonModel)
    model.contract = SimpleNamespace(clock=clock, timed_steps=[([3], 9)])  # a stale figure from an earlier call

    def served(requests, ran=True):
        time.t += 0.004  # tensors read, the model's computation, tensors written
        if ran:
            model.contract.timed_steps = [([4, 5], 1)]
        return ["answer"] * len(requests)

    model._execute = served
    assert model.execute([object()]) == ["answer"] and time.slept == [pytest.approx(0.006)]
    model._execute = lambda requests: served(requests, ran=False)
    assert model.execute([object(), object()]) == ["answer", "answer"] and len(time.slept) == 1
