"""What every specbuild Python-backend model shares: config parameters, paths, request tensors."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from specbuild.contract.pbtxt import parameter_values
from specbuild.errors import RequestError


def parameters(args: dict[str, Any]) -> dict[str, str]:
    return parameter_values(json.loads(args["model_config"]))


def required(params: dict[str, str], key: str, model: str) -> str:
    value = params.get(key, "")
    if not value or value.startswith("${"):
        raise ValueError(
            f"{model}: config parameter {key!r} is missing or unfilled ({value!r}). "
            "Regenerate the repository with `specbuild repo`."
        )
    return value


def flag(params: dict[str, str], key: str, default: bool) -> bool:
    value = params.get(key, "").strip().lower()
    if not value or value.startswith("${"):
        return default
    return value in ("1", "true", "yes")


def resolve_path(value: str, args: dict[str, Any]) -> Path:
    """Absolute paths as given; relative ones against the model repository folder (the parent of the
    model's folder), so a committed repository beside an `engines/` folder works on any machine."""
    path = Path(value)
    if path.is_absolute():
        return path
    return (Path(args["model_repository"]).parent / path).resolve()


def request_inputs(request, names) -> dict[str, np.ndarray]:
    """The request's input tensors among `names` (batch dimension included) that are present, in one
    pass over the request's tensors (pb_utils.get_input_tensor_by_name lists and scans them per name)."""
    wanted = set(names)
    return {tensor.name(): tensor.as_numpy() for tensor in request.inputs() if tensor.name() in wanted}


class ModelCallError(RuntimeError):
    """A BLS sub-request to another model failed; the message is the server's."""


def call_model(pb_utils, model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One BLS request to `model` (the BLS's draft and verify calls, and Triton's floor, `triton.floor_probe`); contract
    tensors ([len], [1], ...) get Triton's batch dimension of 1, every output comes back as numpy. An INVALID_ARG
    answer is the client's request at fault (e.g. an end_id outside the vocabulary): RequestError; any other error,
    ModelCallError."""
    tensors = [pb_utils.Tensor(name, np.ascontiguousarray(value[None])) for name, value in inputs.items()]
    response = pb_utils.InferenceRequest(model_name=model, inputs=tensors, requested_output_names=[]).exec()
    if response.has_error():
        error = response.error()
        message = f"model '{model}' failed: {error.message()}"
        code = error.code() if hasattr(error, "code") else None
        if code is not None and code == pb_utils.TritonError.INVALID_ARG:
            raise RequestError(message)
        raise ModelCallError(message)
    return {t.name(): t.as_numpy() for t in response.output_tensors()}


def serve_each(
    pb_utils, requests, names, handle: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]], model: str
) -> list:
    """One response per request; a bad request (RequestError) gets INVALID_ARG, a bug an INTERNAL error with no
    traceback (it goes to the server log)."""
    responses = []
    for request in requests:
        try:
            outputs = handle(request_inputs(request, names))
            tensors = [pb_utils.Tensor(name, np.ascontiguousarray(value)) for name, value in outputs.items()]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        except RequestError as err:
            responses.append(
                pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"{model}: {err}", pb_utils.TritonError.INVALID_ARG)
                )
            )
        except Exception as err:  # noqa: BLE001 - reported to the client and the log; the server keeps serving
            import traceback

            pb_utils.Logger.log_error(f"{model}: {traceback.format_exc()}")
            responses.append(
                pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"{model}: internal error: {type(err).__name__}: {err}")
                )
            )
    return responses


def as_text(value: Any, name: str) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise RequestError(f"input {name!r} is not valid UTF-8.") from None
    return str(value)
