"""Config parameters read the way the C++ `tensorrtllm` backend reads them (TensorRT-LLM 1.2).

Source: NVIDIA/TensorRT-LLM `triton_backend/inflight_batcher_llm/src/model_state.cc` (commit 5cdd692,
`ModelState::GetParameter`) and `model_instance_state.cc` (commit c8c6df0, the constructor and the
`get*FromParams` functions). Most keys are read inside try/catch and fall back to a default; these are
read with no fallback, so a config without them fails to load:

- `gpt_model_type` (`getBatchingTypeFromParams`), which must also be a known batching type;
- `tokenizer_dir`, `xgrammar_tokenizer_info_path`, `guided_decoding_backend`
  (`getGuidedDecodingConfigFromParams`); empty or a `${...}` placeholder means "not set".

`gpt_model_path` is read with a fallback, but a missing or nonexistent path leaves the decoder path
empty and, with no `encoder_model_path`, the load fails with "Both encoder and decoder model paths are
empty". A boolean parameter must be one of True/true/TRUE/1/False/false/FALSE/0; anything else is
ignored with a warning and the default applies.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

REQUIRED = ("gpt_model_type", "tokenizer_dir", "xgrammar_tokenizer_info_path", "guided_decoding_backend")
BATCHING_TYPES = ("V1", "v1", "inflight_batching", "inflight_fused_batching")
_TRUE, _FALSE = ("True", "true", "TRUE", "1"), ("False", "false", "FALSE", "0")
LOAD_ERROR = "unexpected error when creating modelInstanceState: "  # ModelInstanceState::Create's wrapping


class ModelLoadError(RuntimeError):
    """The model cannot load with this config; the message is the C++ backend's."""


def _unset(value: str, key: str) -> bool:
    return not value or value == "${" + key + "}"


class BackendParams:
    def __init__(self, config: dict):
        if "parameters" not in config:
            raise ModelLoadError(LOAD_ERROR + "Model config doesn't have a parameters section")
        self.values = {key: value.get("string_value", "") for key, value in config["parameters"].items()}

    def string(self, key: str) -> str:
        if key not in self.values:
            raise ModelLoadError(LOAD_ERROR + f"Cannot find parameter with name: {key}")
        return self.values[key]

    def boolean(self, key: str, default: bool) -> bool:
        value = self.values.get(key)
        if value in _TRUE:
            return True
        if value in _FALSE:
            return False
        return default

    def check_required(self, resolve: Callable[[str], Path]) -> Path:
        """Raise what the C++ backend raises at load for a config it cannot start with; return the engine path.

        resolve: turns the gpt_model_path value into a path (the reference flavour writes it relative to
        the repository)."""
        batching = self.string("gpt_model_type")
        if batching not in BATCHING_TYPES:
            raise ModelLoadError(
                LOAD_ERROR + "Invalid gpt_model_type. Must be v1/inflight_batching/inflight_fused_batching."
            )
        self.string("tokenizer_dir")  # read and ignored ("Guided decoding C++ workflow does not use tokenizer_dir")
        info_path = self.string("xgrammar_tokenizer_info_path")
        backend = self.string("guided_decoding_backend")
        if not (_unset(backend, "guided_decoding_backend") or _unset(info_path, "xgrammar_tokenizer_info_path")):
            if not Path(info_path).exists():
                raise ModelLoadError(LOAD_ERROR + f"Xgrammar's tokenizer info path at {info_path} does not exist.")
            if backend != "xgrammar":
                raise ModelLoadError(
                    LOAD_ERROR + "Guided decoding is currently supported with 'xgrammar' backend. "
                    "Invalid guided_decoding_backend parameter provided."
                )
            raise ModelLoadError(
                "guided decoding (guided_decoding_backend = xgrammar) is not supported by the reference "
                "model; leave guided_decoding_backend empty, or serve with the tensorrtllm backend."
            )
        value = self.values.get("gpt_model_path", "")
        engine = resolve(value) if value else None
        if engine is None or not engine.exists():
            hint = f"gpt_model_path {value!r} does not exist" if value else "gpt_model_path is not set"
            raise ModelLoadError(
                LOAD_ERROR + f"Both encoder and decoder model paths are empty ({hint}: build the "
                "engines with `specbuild build`, or fix the path with `specbuild repo`)"
            )
        return engine
