"""The BLS's model-config parameters, one typed record: what `specbuild repo` writes into
`tensorrt_llm_bls/config.pbtxt` (`triton.configs.bls`), what the BLS reads when it loads
(`triton.models.bls`) and what a client reads back from the model config (`session.served.Deployment`).

Each field's name is the parameter's key, as NVIDIA's BLS names its own (`tensorrt_llm_model_name`,
`tensorrt_llm_draft_model_name`: NVIDIA/TensorRT-LLM `triton_backend/all_models/inflight_batcher_llm/
tensorrt_llm_bls/config.pbtxt`); Triton carries every value as a string. A field without a default is required:
a value that is absent, empty or an unfilled template (`${...}`, as NVIDIA's templates ship) raises ValueError
naming it, so an old or hand-edited repository fails at load with the fix, not at the first request.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from specbuild import drafters
from specbuild.config import ServeSpec
from specbuild.contract import models
from specbuild.drafters import LookupSettings
from specbuild.speculative.overlap import parse_setting

__all__ = ["BlsParameters"]

_TRUE, _FALSE = ("1", "true", "yes"), ("0", "false", "no")  # as the BLS has always read its flags


@dataclass(frozen=True)
class BlsParameters:
    max_draft_len: int  # the target engine's: the most draft tokens one verify takes
    num_draft_tokens: int  # K when a request asks for none
    max_input_len: int  # prompt tokens
    max_output_len: int  # the most max_tokens one request may ask for
    tokenizer_dir: str  # absolute, or relative to the repository folder (the parent of the BLS's own folder)
    tensorrt_llm_model_name: str = models.TARGET
    # "" (or absent): no draft model, as in NVIDIA's BLS; its drafters are those without one (specbuild.drafters)
    tensorrt_llm_draft_model_name: str = ""
    use_draft_logits: bool = False  # the target verifies against the draft's logits (sampling requests)
    adaptive_draft_len: bool = True  # K adapts to the running acceptance
    overlap: bool | str = False  # draft the next step while the target verifies this one: true, false or "auto"
    add_special_tokens: bool = True  # tokenizing the prompt, as preprocessing's
    max_concurrent_requests: int = 16  # requests served at once, a thread each
    max_queue_size: int = 0  # more waiting for a slot; past that, UNAVAILABLE (0 = no bound)
    serving_gate: str = ""  # the model the drain closes (specbuild.triton.models.serving_gate); "" = none
    # seconds a request waits for a failed target to serve again (triton.models.target_retry): serve.target_retry_s
    target_retry_s: int = ServeSpec.target_retry_s
    drafter: str = drafters.DEFAULT  # what proposes when a request does not say (specbuild.drafters)
    # prompt lookup's settings, the spec's [lookup] (their defaults are LookupSettings')
    max_matching_ngram_size: int = LookupSettings.max_matching_ngram_size
    is_keep_all: bool = LookupSettings.is_keep_all
    is_use_oldest: bool = LookupSettings.is_use_oldest
    is_public_pool: bool = LookupSettings.is_public_pool
    pool_max_tokens: int = LookupSettings.pool_max_tokens
    hybrid_min_match: int = LookupSettings.hybrid_min_match

    def lookup(self) -> LookupSettings:
        """The lookup's settings these parameters carry."""
        return LookupSettings(**{f.name: getattr(self, f.name) for f in dataclasses.fields(LookupSettings)})

    @classmethod
    def lookup_parameters(cls, settings: LookupSettings) -> dict[str, Any]:
        """The fields that carry `settings` (the constructor's keywords)."""
        return dataclasses.asdict(settings)

    def to_parameters(self) -> dict[str, str]:
        """The config.pbtxt parameters, every value a string."""
        return {f.name: _text(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_parameters(cls, params: dict[str, str]) -> BlsParameters:
        """The record from a model config's parameters (key -> string_value); ValueError names a missing or bad one."""
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = (params.get(f.name) or "").strip()
            if not raw or raw.startswith("${"):
                if f.default is dataclasses.MISSING:
                    raise ValueError(
                        f"model config parameter '{f.name}' is required; regenerate the repository "
                        "with `specbuild repo`."
                    )
                continue
            values[f.name] = _parse(raw, f.type, f.name)
        record = cls(**values)
        if record.drafter not in drafters.NAMES:
            raise ValueError(
                f"model config parameter 'drafter' = {record.drafter!r} is invalid: use one of {', '.join(drafters.NAMES)}."
            )
        return record


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _parse(raw: str, kind: str, name: str) -> object:
    if kind == "bool | str":
        return parse_setting(raw, f"model config parameter '{name}'")
    if kind == "bool" and raw.lower() in _TRUE + _FALSE:
        return raw.lower() in _TRUE
    if kind == "int" and raw.lstrip("-").isdigit():
        return int(raw)
    if kind == "str":
        return raw
    expected = {"int": "an integer", "bool": "true or false"}[kind]
    raise ValueError(f"model config parameter '{name}' = {raw!r} is invalid: use {expected}.")
