"""Check the installed TensorRT-LLM against the pinned contract: `python -m specbuild.llmapi.probe`.

Run by docker/Dockerfile.llmapi at build time (needs no GPU), because the pinned names could not be read at
the v1.2.1 tag itself (contract module docstring). It checks, on the installed release:
1. every LLM-argument key specbuild writes is a field of TorchLlmArgs (pydantic model_fields, aliases
   included), and every kv_cache_config key a field of KvCacheConfig;
2. the speculative config as specbuild writes it ({decoding_type: DraftTarget, max_draft_len,
   speculative_model_dir}) parses into a DraftTarget config: through DecodingBaseConfig.from_dict where that
   exists (the 1.2-era parser), else through the speculative_config field's own type (later releases);
3. and reports whether the later spelling (Draft_Target + speculative_model) parses too.
Exit 0 when 1 and 2 hold; 1 with the reason otherwise (then change contract.DECODING_TYPE / DRAFT_MODEL_KEY).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from specbuild.contract import llmapi as contract


def _fields(cls: Any) -> set[str]:
    names = set()
    for name, info in getattr(cls, "model_fields", {}).items():
        names.add(name)
        alias = getattr(info, "alias", None)
        if alias:
            names.add(alias)
        choices = getattr(getattr(info, "validation_alias", None), "choices", None) or ()
        names.update(str(choice) for choice in choices)
    return names


def written_args() -> dict[str, Any]:
    """What specbuild writes for a default spec with speculation (the keys matter, not the values)."""
    from pathlib import Path

    from specbuild.config import spec_from_dict
    from specbuild.llmapi.args import Locations, llm_args

    spec = spec_from_dict({"target": {"checkpoint": "/t"}, "draft": {"checkpoint": "/d"}}, base_dir=Path("/"))
    return llm_args(spec, Locations("/t", "/d"))


def parse_speculative(llm_args_module: Any, config: dict[str, Any]) -> str:
    """The class the release parses `config` into; raises what the release raises."""
    base = getattr(llm_args_module, "DecodingBaseConfig", None)
    if base is not None and hasattr(base, "from_dict"):
        return type(base.from_dict(dict(config))).__name__
    from pydantic import TypeAdapter

    annotation = llm_args_module.TorchLlmArgs.model_fields["speculative_config"].annotation
    return type(TypeAdapter(annotation).validate_python(dict(config))).__name__


def probe() -> dict[str, Any]:
    import importlib.metadata

    from tensorrt_llm.llmapi import llm_args as module

    args = written_args()
    report: dict[str, Any] = {"tensorrt_llm": importlib.metadata.version("tensorrt_llm"), "pinned": contract.RELEASE}
    report["missing_llm_args"] = sorted(set(args) - _fields(module.TorchLlmArgs))
    report["missing_kv_cache_config"] = sorted(set(args["kv_cache_config"]) - _fields(module.KvCacheConfig))
    spellings = {
        "pinned": {contract.DECODING_TYPE_KEY: contract.DECODING_TYPE, "max_draft_len": 3, contract.DRAFT_MODEL_KEY: "/d"},
        "later": {contract.DECODING_TYPE_KEY: contract.LATER_DECODING_TYPE, "max_draft_len": 3,
                  contract.LATER_DRAFT_MODEL_KEY: "/d"},
    }
    for name, config in spellings.items():
        try:
            report[f"{name}_spelling"] = parse_speculative(module, config)
        except Exception as err:  # noqa: BLE001 - the release's own error is the answer
            report[f"{name}_spelling"] = f"refused: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
    report["ok"] = (not report["missing_llm_args"] and not report["missing_kv_cache_config"]
                    and "DraftTarget" in report["pinned_spelling"] and not report["pinned_spelling"].startswith("refused"))
    return report


def main() -> int:
    report = probe()
    print(json.dumps(report, indent=2))
    if not report["ok"]:
        print(f"TensorRT-LLM {report['tensorrt_llm']} does not take what specbuild writes for TensorRT-LLM "
              f"{contract.RELEASE} (above). Fix specbuild/contract/llmapi.py (DECODING_TYPE, DRAFT_MODEL_KEY, the "
              "field lists) for this release, or use a base image with TensorRT-LLM 1.2.x.", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
