"""Every end id a checkpoint lists ends an LLM API request, as it ends an engine-path one.

TensorRT-LLM's LLM ends a request at one id, the tokenizer's eos: `LLM._prepare_sampling_params` calls
`SamplingParams._setup`, which sets `end_id = tokenizer.eos_token_id` when the request names none and takes nothing
else from generation_config.json (a kimi_k2 special case aside) (NVIDIA/TensorRT-LLM tensorrt_llm/sampling_params.py
@000a01d and @a98a906, tensorrt_llm/llmapi/llm.py). NVIDIA's Triton llmapi model builds the SamplingParams keyword
arguments from a fixed list of request inputs, none of them stop token ids (helpers.py
`get_sampling_params_from_request` @0df60f9, called by model.py `_convert_request` @044a90d). A Llama 3.1 instruct
checkpoint lists three end ids in generation_config.json, its tokenizer's eos (`<|eot_id|>`) one of them: left alone,
the LLM API path would run on past `<|eom_id|>` and `<|end_of_text|>`, where the engine path, which reads them all
(`specbuild.hfmodel.end_ids`), stops.

`every_end_id(model_class)` closes that without changing NVIDIA's code: a subclass whose `_convert_request` adds the
checkpoint's other end ids to the keyword arguments as `stop_token_ids`. The LLM then ends at any of them with
finish_reason "stop" and stop_reason the id, and leaves the id out of the output (`SamplingParams.
_get_stop_reasons_and_words`; tensorrt_llm/executor/result.py @005bc848 `_handle_sequence`, with
include_stop_str_in_output False), as it leaves out its end_id. The CPU stand-in gets the same subclass and takes
stop_token_ids as the LLM does (`specbuild.llmapi.llm`). trtllm-serve has no such hook: its clients send the ids as
the request's `stop_token_ids` (docs/llmapi.md).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from specbuild.hfmodel import listed_end_ids
from specbuild.llmapi.protocol import MODEL_YAML_ENV, read_model_yaml


def tokenizer_eos(engine_args: dict[str, Any]) -> int | None:
    """The LLM's end_id: its tokenizer's eos (from `tokenizer`, else `model`, as the LLM loads it); None without a
    tokenizer (`skip_tokenizer_init`), when a request must name its own end_id."""
    if engine_args.get("skip_tokenizer_init"):
        return None
    from transformers import AutoTokenizer

    source = str(engine_args.get("tokenizer") or engine_args["model"])
    tokenizer = AutoTokenizer.from_pretrained(
        source, trust_remote_code=bool(engine_args.get("trust_remote_code")), local_files_only=Path(source).is_dir()
    )
    return tokenizer.eos_token_id


def stop_token_ids(engine_args: dict[str, Any]) -> tuple[int | None, list[int]]:
    """(the LLM's end_id, the other ids the checkpoint lists): what every request gets as stop_token_ids."""
    listed = listed_end_ids(engine_args["model"]) if engine_args.get("model") else []
    if not listed:
        return None, []
    eos = tokenizer_eos(engine_args)
    return eos, [i for i in listed if i != eos] if eos is not None else []


def every_end_id(model_class: type) -> type:
    """`model_class` (NVIDIA's llmapi TritonPythonModel, or the CPU stand-in of it) with the checkpoint's other end ids
    added to every request's SamplingParams keyword arguments as stop_token_ids (after any the request has). The
    class itself is not changed. A class without `_convert_request` (a later model.py) is served as it is, with a
    warning at load naming the ids it will not stop at."""
    hook = callable(getattr(model_class, "_convert_request", None))

    class EveryEndId(model_class):
        def initialize(self, args: dict) -> Any:
            answer = super().initialize(args)
            import triton_python_backend_utils as pb_utils

            model_dir = Path(args["model_repository"]) / str(args["model_version"])
            eos, others = stop_token_ids(read_model_yaml(model_dir, os.environ.get(MODEL_YAML_ENV, "model.yaml")))
            self._other_end_ids = others if hook else []
            if others and hook:
                pb_utils.Logger.log_info(
                    f"[specbuild] end ids: the LLM ends at the tokenizer's eos {eos}; the "
                    f"checkpoint's other end ids {others} go with every request as stop_token_ids"
                )
            elif others:
                pb_utils.Logger.log_warn(
                    f"[specbuild] end ids: this model.py has no _convert_request, so requests end "
                    f"at the tokenizer's eos {eos} only, not at the checkpoint's other end ids "
                    f"{others}; clients can stop there with sampling_param_stop strings"
                )
            return answer

        def _convert_request(self, request: Any) -> Any:
            converted = super()._convert_request(request)
            sampling = converted[1] if isinstance(converted, tuple) and len(converted) > 1 else None
            if not self._other_end_ids:
                return converted
            if isinstance(sampling, dict):
                asked = list(sampling.get("stop_token_ids") or [])
                sampling["stop_token_ids"] = list(dict.fromkeys([*asked, *self._other_end_ids]))
            else:  # a model.py whose _convert_request returns something else: said once, served as it is
                import triton_python_backend_utils as pb_utils

                pb_utils.Logger.log_warn(
                    "[specbuild] end ids: _convert_request returned no SamplingParams keyword "
                    f"arguments; requests end at the tokenizer's eos only, not at "
                    f"{self._other_end_ids}"
                )
                self._other_end_ids = []
            return converted

    EveryEndId.__name__ = EveryEndId.__qualname__ = model_class.__name__
    EveryEndId.__module__ = model_class.__module__
    return EveryEndId
