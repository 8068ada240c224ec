"""Triton's model configuration as text: `config.pbtxt` is a `ModelConfig` message (triton-inference-server/common
`protobuf/model_config.proto`) in protobuf text format. The one writer and reader of it, for both repository
kinds (`triton.configs` for the engine path, `llmapi.repository` for the LLM API path) and their tests."""

from __future__ import annotations

from typing import TYPE_CHECKING

from specbuild.errors import SpecError

if TYPE_CHECKING:
    from tritonclient.grpc import model_config_pb2

__all__ = ["config_proto", "parameter_values", "parse_pbtxt", "to_pbtxt"]


def parameter_values(config: dict) -> dict[str, str]:
    """A model configuration's parameters in Triton's JSON form (a Python model's `args["model_config"]`, the
    model-config API's answer): key -> string_value."""
    return {key: (value or {}).get("string_value", "") for key, value in config.get("parameters", {}).items()}


def config_proto():
    """tritonclient's `model_config_pb2` module (the serving extra)."""
    try:
        from tritonclient.grpc import model_config_pb2
    except ImportError:
        raise SpecError(
            "tritonclient is not installed, so Triton configs cannot be built. "
            "Install the serving extra: pip install 'specbuild[serve]'."
        ) from None
    return model_config_pb2


def to_pbtxt(config: model_config_pb2.ModelConfig) -> str:
    from google.protobuf import text_format

    text = text_format.MessageToString(config)
    if "${" in text:  # the writers refuse unfilled values; kept as the last line of defence
        raise SpecError(f"the generated config of {config.name} contains a '${{' placeholder; this is a bug.")
    return text


def parse_pbtxt(text: str) -> model_config_pb2.ModelConfig:
    from google.protobuf import text_format

    return text_format.Parse(text, config_proto().ModelConfig())
