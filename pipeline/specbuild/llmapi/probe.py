"""Check the installed TensorRT-LLM against the pinned contract: `python -m specbuild.llmapi.probe`.

Run by docker/Dockerfile.llmapi at build time (needs no GPU), because the pinned names could not be read at
the v1.2.1 tag itself (contract module docstring). It checks, on the installed release:
1. every LLM-argument key specbuild writes is a field of TorchLlmArgs (pydantic model_fields, aliases
   included), and every kv_cache_config key a field of KvCacheConfig;
2. which spelling of the speculative config the release parses into a DraftTarget config, the pinned one
   ({decoding_type: DraftTarget, max_draft_len, speculative_model_dir}) or the later one (Draft_Target +
   speculative_model): through DecodingBaseConfig.from_dict where that exists (the 1.2-era parser), else through
   the speculative_config field's own type (later releases). The first that parses is the one to write;
   `--write [PATH]` records it (default `contract.SPELLING_RECORD`, where docker/Dockerfile.llmapi runs it), and
   `repo`, `build` and the trtllm-serve options then write that spelling (specbuild.llmapi.args.spelling).
Exit 0 when the fields hold and a spelling parses; 1 with the reason otherwise.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
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
        "pinned": {
            contract.DECODING_TYPE_KEY: contract.DECODING_TYPE,
            "max_draft_len": 3,
            contract.DRAFT_MODEL_KEY: "/d",
        },
        "later": {
            contract.DECODING_TYPE_KEY: contract.LATER_DECODING_TYPE,
            "max_draft_len": 3,
            contract.LATER_DRAFT_MODEL_KEY: "/d",
        },
    }
    for name, config in spellings.items():
        try:
            report[f"{name}_spelling"] = parse_speculative(module, config)
        except Exception as err:  # noqa: BLE001 - the release's own error is the answer
            report[f"{name}_spelling"] = f"refused: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
    taken = [name for name in spellings if report[f"{name}_spelling"] == "DraftTargetDecodingConfig"]
    report["spelling"] = taken[0] if taken else None  # the one to write: the pinned one where both parse
    report["ok"] = not report["missing_llm_args"] and not report["missing_kv_cache_config"] and bool(taken)
    return report


def main(argv: list[str] | None = None) -> int:
    """`python -m specbuild.llmapi.probe [--write [PATH]]`."""
    argv = sys.argv[1:] if argv is None else argv
    report = probe()
    print(json.dumps(report, indent=2))
    if not report["ok"]:
        print(
            f"TensorRT-LLM {report['tensorrt_llm']} does not take what specbuild writes for TensorRT-LLM "
            f"{contract.RELEASE} (above). Fix specbuild/contract/llmapi.py (the spellings, the field lists) for "
            "this release, or use a base image with TensorRT-LLM 1.2.x.",
            file=sys.stderr,
        )
        return 1
    if argv[:1] == ["--write"]:
        path = Path(argv[1] if len(argv) > 1 else contract.SPELLING_RECORD)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"spelling": report["spelling"], "tensorrt_llm": report["tensorrt_llm"]}) + "\n")
        print(f"recorded the {report['spelling']} spelling in {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
