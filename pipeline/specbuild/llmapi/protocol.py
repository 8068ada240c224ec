"""NVIDIA's llmapi request/response contract, free of Triton: what the CPU stand-in reads from a request
and what it sends back, rule for rule as NVIDIA's model.py and helpers.py do it (contract MODEL, HELPERS).

Reading (`parse_request`, `get(name)` returns the input as numpy or None):
- text_input: missing -> "text_input is missing from the request"; more than 1-D -> "The current
  implementation only supports text_input being a 1D tensor."; the prompt is text_input[0] (the rest is
  ignored), UTF-8;
- every other input is a scalar: a tensor of size != 1 -> "Expected a scalar tensor for tensor <name>";
- sampling_param_<name> -> SamplingParams(<name>=...), with best_of 1, exclude_input_from_output False and
  return_perf_metrics False when absent; sampling_param_stop is taken whole (a list of strings);
- return_finish_reason / return_stop_reason / return_cumulative_logprob default False; streaming False.

Writing (`response_tensors`): text_output always, one element per output, the output's *cumulative* text;
finish_reason / stop_reason / cumulative_logprob as [str(value)] when asked (so "None" on an unfinished
streamed response); with return_perf_metrics the twelve perf tensors in NVIDIA's order, each a one-element
array of the Python value in an object array: Triton sends them as BYTES strings ("0.75", "1234"), not as
the FP32/INT32/INT64 that config.pbtxt declares, exactly like NVIDIA's model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specbuild.contract import llmapi as contract

Getter = Callable[[str], "np.ndarray | None"]


class ModelException(Exception):
    """What NVIDIA's model raises as pb_utils.TritonModelException; answered "Error generating request: ..."."""


@dataclass
class LlmRequest:
    prompt: str
    sampling: dict[str, Any]  # SamplingParams keyword arguments, as NVIDIA's helpers build them
    streaming: bool
    output_config: dict[str, bool] = field(default_factory=dict)


MODEL_YAML_ENV = "LLM_CONFIG_PATH"  # MODEL: os.environ.get('LLM_CONFIG_PATH', 'model.yaml')


def read_model_yaml(model_dir: Path, filename: str = "model.yaml") -> dict[str, Any]:
    """model.yaml from the model's version folder, read as NVIDIA's model.py reads it (`get_model_config`)."""
    import yaml

    path = Path(model_dir) / filename
    config = None
    if path.is_file():
        try:
            config = yaml.safe_load(path.read_text())
        except Exception as err:  # noqa: BLE001 - NVIDIA's model wraps any parse error the same way
            raise ModelException(f"Failed to parse YAML engine config: {err}") from None
    if not isinstance(config, dict):
        raise ModelException(f"'{filename}' containing TRT-LLM engine args not found in '{model_dir}'")
    triton_config = config.get("triton_config")
    missing = [
        key
        for key in contract.TRITON_CONFIG_REQUIRED
        if not isinstance(triton_config, dict) or key not in triton_config
    ]
    if missing:
        raise ModelException(
            f"model.yaml: triton_config lacks {missing} (NVIDIA's model.py reads "
            "triton_config['max_batch_size'] and ['decoupled'])."
        )
    return config


def scalar(get: Getter, name: str) -> Any:
    value = get(name)
    if value is None:
        return None
    array = np.asarray(value)
    if array.size != 1:
        raise ModelException(contract.MSG_SCALAR.format(name=name))
    return array.item(0)


def parse_request(get: Getter) -> LlmRequest:
    text_input = get("text_input")
    if text_input is None:
        raise ModelException(contract.MSG_TEXT_INPUT_MISSING)
    text_input = np.asarray(text_input)
    if len(text_input.shape) > 1:
        raise ModelException(contract.MSG_TEXT_INPUT_1D)
    prompt = text_input[0]
    if isinstance(prompt, bytes):
        prompt = prompt.decode("utf-8")
    sampling: dict[str, Any] = {}
    for name in contract.SAMPLING_PARAMS:
        value = scalar(get, f"sampling_param_{name}")
        if value is None and name in contract.SAMPLING_DEFAULTS:
            sampling[name] = contract.SAMPLING_DEFAULTS[name]
        elif value is not None:
            sampling[name] = value
    sampling["stop"] = get("sampling_param_stop")
    output_config = {key: bool(scalar(get, key) or False) for key in contract.REASON_OUTPUTS}
    streaming = bool(scalar(get, "streaming") or False)
    return LlmRequest(str(prompt), sampling, streaming, output_config)


def stop_strings(value: Any) -> list[str]:
    """sampling_param_stop (a STRING tensor, or None) as the list of stop strings."""
    if value is None:
        return []
    return [item.decode("utf-8") if isinstance(item, bytes) else str(item) for item in np.asarray(value).reshape(-1)]


@dataclass
class CompletionOutput:
    """The fields of TensorRT-LLM's CompletionOutput that the Triton model reads (contract RESULT)."""

    text: str  # cumulative
    token_ids: list[int]
    finish_reason: str | None = None  # one of contract.FINISH_REASONS when finished
    stop_reason: int | str | None = None  # the matched stop string
    cumulative_logprob: float | None = None  # only with logprobs, which this model's inputs cannot ask for
    request_perf_metrics: dict[str, Any] | None = None


@dataclass
class RequestOutput:
    outputs: list[CompletionOutput]
    finished: bool


def response_tensors(output: RequestOutput, output_config: dict[str, bool]) -> list[tuple[str, np.ndarray]]:
    """The (name, array) pairs of one response, in NVIDIA's order (`_create_response`)."""
    tensors = [("text_output", np.asarray([o.text.encode("utf-8") for o in output.outputs], dtype=np.object_))]
    for key, name in contract.REASON_OUTPUTS.items():
        if output_config.get(key):
            tensors.append((name, np.asarray([str(getattr(o, name)) for o in output.outputs], dtype=np.object_)))
    metrics = output.outputs[0].request_perf_metrics
    if metrics:
        for name in contract.PERF_OUTPUTS:
            tensors.append((name, np.asarray([metrics[name]], dtype=np.object_)))
    return tensors
