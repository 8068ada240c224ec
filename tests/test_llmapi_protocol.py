"""The CPU stand-in's request/response rules, free of Triton, one NVIDIA rule per test (contract MODEL/HELPERS):
what it reads from a request, what it sends back (types, order, "None"), and what it refuses, including the
LLM-argument checks TensorRT-LLM makes when model.yaml is loaded."""

from __future__ import annotations

import numpy as np
import pytest

from specbuild.contract import llmapi as contract
from specbuild.llmapi.llm import LlmArgsError, sampling_from_request, validate_args
from specbuild.llmapi.protocol import (
    CompletionOutput,
    ModelException,
    RequestOutput,
    parse_request,
    read_model_yaml,
    response_tensors,
    stop_strings,
)


def getter(**inputs):
    return lambda name: inputs.get(name)


def test_defaults_are_nvidias_helpers_defaults():
    req = parse_request(getter(text_input=np.array([b"Hello"], dtype=object)))
    assert req.prompt == "Hello" and req.streaming is False
    # absent: best_of 1, exclude_input_from_output False (the prompt is in text_output), return_perf_metrics False
    assert req.sampling == {
        "best_of": 1,
        "exclude_input_from_output": False,
        "return_perf_metrics": False,
        "stop": None,
    }
    assert req.output_config == {
        "return_finish_reason": False,
        "return_stop_reason": False,
        "return_cumulative_logprob": False,
    }


def test_sampling_inputs_map_to_sampling_params_names():
    req = parse_request(
        getter(
            text_input=np.array([b"x"], dtype=object),
            sampling_param_max_tokens=np.array([7], np.int32),
            sampling_param_temperature=np.array([0.5], np.float32),
            sampling_param_seed=np.array([3], np.uint64),
            sampling_param_stop=np.array([b"\n\n", b"END"], dtype=object),
            streaming=np.array([True]),
            return_finish_reason=np.array([True]),
        )
    )
    assert req.sampling["max_tokens"] == 7 and req.sampling["temperature"] == 0.5 and req.sampling["seed"] == 3
    assert stop_strings(req.sampling["stop"]) == ["\n\n", "END"]
    assert req.streaming and req.output_config["return_finish_reason"]


def test_only_the_first_prompt_is_used():
    req = parse_request(getter(text_input=np.array([b"first", b"second"], dtype=object)))
    assert req.prompt == "first"


@pytest.mark.parametrize(
    "inputs, message",
    [
        ({}, "text_input is missing from the request"),
        ({"text_input": np.array([[b"a"]], dtype=object)}, "only supports text_input being a 1D tensor"),
        (
            {"text_input": np.array([b"a"], dtype=object), "sampling_param_max_tokens": np.array([1, 2], np.int32)},
            "Expected a scalar tensor for tensor sampling_param_max_tokens",
        ),
        (
            {"text_input": np.array([b"a"], dtype=object), "streaming": np.array([], np.bool_)},
            "Expected a scalar tensor for tensor streaming",
        ),
    ],
)
def test_malformed_requests_get_nvidias_messages(inputs, message):
    with pytest.raises(ModelException, match=message):
        parse_request(getter(**inputs))


def _output(finished: bool, metrics=None):
    return RequestOutput(
        [CompletionOutput("Hi there", [1, 2], "length" if finished else None, None, request_perf_metrics=metrics)],
        finished,
    )


def test_response_always_has_text_output_and_reasons_only_when_asked():
    tensors = dict(response_tensors(_output(True), {}))
    assert list(tensors) == ["text_output"]
    assert tensors["text_output"].dtype == object and tensors["text_output"].tolist() == [b"Hi there"]
    config = {"return_finish_reason": True, "return_stop_reason": True, "return_cumulative_logprob": True}
    names = [n for n, _ in response_tensors(_output(True), config)]
    assert names == ["text_output", "finish_reason", "stop_reason", "cumulative_logprob"]
    reasons = dict(response_tensors(_output(False), config))
    # str(None): an unfinished streamed response says "None", as NVIDIA's str(output.finish_reason) does
    assert reasons["finish_reason"].tolist() == ["None"] and reasons["cumulative_logprob"].tolist() == ["None"]
    assert dict(response_tensors(_output(True), config))["finish_reason"].tolist() == ["length"]


def test_perf_metrics_follow_nvidias_order_as_objects():
    metrics = {name: i for i, name in enumerate(contract.PERF_OUTPUTS)}
    metrics["acceptance_rate"] = 0.75
    tensors = response_tensors(_output(True, metrics), {})
    assert [n for n, _ in tensors] == ["text_output", *contract.PERF_OUTPUTS]
    values = dict(tensors)
    # object arrays of Python numbers: Triton's Python backend serializes them as BYTES str(value)
    assert values["acceptance_rate"].dtype == object and values["acceptance_rate"].tolist() == [0.75]
    assert values["total_draft_tokens"].tolist() == [metrics["total_draft_tokens"]]
    from tritonclient.utils import serialize_byte_tensor  # the same rule as the Python backend's utils

    assert serialize_byte_tensor(values["acceptance_rate"]) == b"\x04\x00\x00\x000.75"


@pytest.mark.parametrize(
    "params, message",
    [
        ({"best_of": 2}, "best_of = 2"),
        ({"frequency_penalty": 0.5}, "frequency_penalty = 0.5: not supported by the CPU stand-in"),
        ({"presence_penalty": -1.0}, "presence_penalty = -1.0"),
        ({"max_tokens": 0}, r"max_tokens \(0\) must be greater than 0"),
        ({"temperature": -0.1}, r"temperature \(-0.1\)"),
        ({"top_p": 0.0}, r"top_p \(0.0\) must be in \(0, 1\]"),
        ({"top_k": -1}, r"top_k \(-1\)"),
    ],
)
def test_sampling_params_the_stand_in_refuses(params, message):
    with pytest.raises(ModelException, match=message):
        sampling_from_request(params)


def test_sampling_defaults():
    s = sampling_from_request(
        {"best_of": 1, "exclude_input_from_output": False, "return_perf_metrics": False, "stop": None}
    )
    assert s.max_tokens == contract.DEFAULT_MAX_TOKENS and s.temperature == 0.0 and not s.exclude_input_from_output
    assert sampling_from_request({"top_p": 0.9}).temperature == 1.0  # sampling asked for without a temperature


BASE = {
    "model": "/t",
    "backend": "pytorch",
    "speculative_config": {"decoding_type": "DraftTarget", "max_draft_len": 3, "speculative_model_dir": "/d"},
}


@pytest.mark.parametrize(
    "change, message",
    [
        ({"max_draft_length": 3}, "max_draft_length: Extra inputs are not permitted"),
        (
            {
                "speculative_config": {
                    "decoding_type": "Draft_Target",
                    "max_draft_len": 3,
                    "speculative_model_dir": "/d",
                }
            },
            "Invalid decoding type: Draft_Target",
        ),
        (
            {"speculative_config": {"decoding_type": "DraftTarget", "max_draft_len": 3, "speculative_model": "/d"}},
            "speculative_config.speculative_model: Extra inputs are not permitted",
        ),
        (
            {"speculative_config": {"decoding_type": "DraftTarget", "max_draft_len": 0, "speculative_model_dir": "/d"}},
            "max_draft_len must be > 0",
        ),
        ({"speculative_config": {"decoding_type": "DraftTarget", "max_draft_len": 3}}, "Path to draft model"),
        ({"backend": "tensorrt"}, "backend must be 'pytorch'"),
    ],
)
def test_llm_arguments_are_refused_as_the_release_refuses_them(change, message):
    with pytest.raises(LlmArgsError, match=message):
        validate_args({**BASE, **change})


def test_decoding_type_is_consumed_by_the_parser():
    parsed = validate_args(dict(BASE))
    assert parsed["speculative_config"] == {"max_draft_len": 3, "speculative_model_dir": "/d"}
    assert validate_args({"model": "/t"})["backend"] == "pytorch"  # None -> pytorch (TorchLlmArgs.init_backend)


def test_model_yaml_errors_are_nvidias(tmp_path):
    with pytest.raises(ModelException, match="'model.yaml' containing TRT-LLM engine args not found in"):
        read_model_yaml(tmp_path)
    (tmp_path / "model.yaml").write_text("model: [unclosed\n")
    with pytest.raises(ModelException, match="Failed to parse YAML engine config"):
        read_model_yaml(tmp_path)
    (tmp_path / "model.yaml").write_text("model: /t\ntriton_config:\n  decoupled: true\n")
    with pytest.raises(ModelException, match=r"triton_config lacks \['max_batch_size'\]"):
        read_model_yaml(tmp_path)
