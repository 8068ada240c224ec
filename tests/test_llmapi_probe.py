"""`python -m specbuild.llmapi.probe` (run by docker/Dockerfile.llmapi at build time) against two hand-written
stand-ins of tensorrt_llm.llmapi.llm_args: the 1.2-era parser (DecodingBaseConfig.from_dict, key "DraftTarget",
field speculative_model_dir) and the later one (a pydantic discriminator "Draft_Target", field speculative_model
with the alias speculative_model_dir), as NVIDIA/TensorRT-LLM's llm_args.py has them in those eras. Only the
probe's logic is tested here; the real release is checked when the GPU image is built."""

from __future__ import annotations

import sys
import textwrap

import pytest

from specbuild.contract import llmapi as contract

WRITTEN = [
    "model",
    "backend",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "dtype",
    "trust_remote_code",
    "max_batch_size",
    "max_input_len",
    "max_seq_len",
    "max_num_tokens",
    "kv_cache_config",
    "disable_overlap_scheduler",
    "guided_decoding_backend",
    "speculative_config",
]

ERA_B = """
from typing import Optional, Union
from pydantic import BaseModel, ConfigDict

class StrictBaseModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

class DecodingBaseConfig(StrictBaseModel):
    max_draft_len: Optional[int] = None
    speculative_model_dir: Optional[str] = None

    @classmethod
    def from_dict(cls, data):
        classes = {"DraftTarget": DraftTargetDecodingConfig}
        decoding_type = data.get("decoding_type")
        if decoding_type not in classes:
            raise ValueError(f"Invalid decoding type: {decoding_type}")
        data.pop("decoding_type")
        return classes[decoding_type](**data)

class DraftTargetDecodingConfig(DecodingBaseConfig):
    pass

class KvCacheConfig(StrictBaseModel):
    free_gpu_memory_fraction: Optional[float] = 0.9
    enable_block_reuse: bool = True

class TorchLlmArgs(StrictBaseModel):
FIELDS
"""

ERA_C = """
from typing import Literal, Optional, Union
from pydantic import AliasChoices, BaseModel, ConfigDict, Field
from typing_extensions import Annotated

class StrictBaseModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

class DraftTargetDecodingConfig(StrictBaseModel):
    decoding_type: Literal["Draft_Target"] = "Draft_Target"
    max_draft_len: Optional[int] = None
    speculative_model: Optional[str] = Field(default=None, validation_alias=AliasChoices("speculative_model",
                                                                                          "speculative_model_dir"))

class EagleDecodingConfig(StrictBaseModel):
    decoding_type: Literal["Eagle"] = "Eagle"

class KvCacheConfig(StrictBaseModel):
    free_gpu_memory_fraction: Optional[float] = 0.9
    enable_block_reuse: bool = True

class TorchLlmArgs(StrictBaseModel):
FIELDS
"""


@pytest.fixture(autouse=True)
def _stand_ins_end_with_their_test():
    """The stand-in tensorrt_llm a test imports leaves sys.modules with it: later, `importlib.util.find_spec` would
    still find it (and `repo --runtime auto`, `families.export_refusal` would take it for an installed release)."""
    before = {name for name in sys.modules if name.startswith("tensorrt_llm")}
    yield
    for name in [m for m in sys.modules if m.startswith("tensorrt_llm") and m not in before]:
        del sys.modules[name]


def _install(tmp_path, monkeypatch, source: str, fields: list[str]):
    body = "\n".join(f"    {name}: object = None" for name in fields)
    if "Draft_Target" in source:
        body = body.replace(
            "    speculative_config: object = None",
            "    speculative_config: Optional[Annotated[Union["
            "DraftTargetDecodingConfig, EagleDecodingConfig], Field(discriminator='decoding_type')]] = None",
        )
    package = tmp_path / "tensorrt_llm"
    (package / "llmapi").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "llmapi" / "__init__.py").write_text("")
    (package / "llmapi" / "llm_args.py").write_text(textwrap.dedent(source).replace("FIELDS", body))
    dist = tmp_path / "tensorrt_llm-1.2.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorrt_llm\nVersion: 1.2.1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.startswith("tensorrt_llm")]:
        monkeypatch.delitem(sys.modules, name)


def test_the_1_2_era_parser_takes_what_specbuild_writes(tmp_path, monkeypatch):
    from specbuild.llmapi.probe import probe

    _install(tmp_path, monkeypatch, ERA_B, WRITTEN)
    report = probe()
    assert report["ok"] and report["tensorrt_llm"] == "1.2.1"
    assert report["pinned_spelling"] == "DraftTargetDecodingConfig"
    assert report["later_spelling"].startswith("refused: ValueError: Invalid decoding type: Draft_Target")


def test_a_missing_field_fails_the_probe_by_name(tmp_path, monkeypatch):
    from specbuild.llmapi.probe import main, probe

    _install(tmp_path, monkeypatch, ERA_B, [f for f in WRITTEN if f != "disable_overlap_scheduler"])
    report = probe()
    assert not report["ok"] and report["missing_llm_args"] == ["disable_overlap_scheduler"]
    assert main() == 1


def test_the_installed_release_decides_the_spelling_and_what_is_written_follows_the_record(tmp_path, monkeypatch):
    """A later release refuses the pinned spelling (DraftTarget + speculative_model_dir) and takes Draft_Target +
    speculative_model: the probe records that one, and the LLM arguments repo/build write follow the record (the
    image's build would have failed before, whatever the release took)."""
    from specbuild.llmapi import args
    from specbuild.llmapi.probe import main, probe, written_args

    record = tmp_path / "record" / "spelling.json"
    monkeypatch.setenv(contract.SPELLING_RECORD_ENV, str(record))
    assert written_args()["speculative_config"]["decoding_type"] == "DraftTarget"  # no record: the pinned one
    _install(tmp_path / "later", monkeypatch, ERA_C, WRITTEN)
    report = probe()
    assert report["later_spelling"] == "DraftTargetDecodingConfig" and report["ok"] and report["spelling"] == "later"
    assert report["pinned_spelling"].startswith("refused: ValidationError")
    assert main(["--write", str(record)]) == 0 and args.spelling() == "later"
    speculative = written_args()["speculative_config"]
    assert speculative["decoding_type"] == "Draft_Target" and speculative["speculative_model"] == "/d"
    assert "speculative_model_dir" not in speculative
    _install(tmp_path / "pinned", monkeypatch, ERA_B, WRITTEN)  # the 1.2-era parser takes the pinned one
    assert main(["--write", str(record)]) == 0 and args.spelling() == "pinned"
    assert written_args()["speculative_config"]["speculative_model_dir"] == "/d"


def test_a_release_taking_neither_spelling_fails_the_probe(tmp_path, monkeypatch, capsys):
    from specbuild.llmapi.probe import main, probe

    _install(tmp_path, monkeypatch, ERA_C.replace('Literal["Draft_Target"]', 'Literal["DraftTargetV3"]'), WRITTEN)
    report = probe()
    assert report["spelling"] is None and not report["ok"]
    assert main([]) == 1 and "Fix specbuild/contract/llmapi.py" in capsys.readouterr().err


def test_a_bad_record_is_refused_by_name(tmp_path, monkeypatch):
    from specbuild.errors import SpecError
    from specbuild.llmapi import args

    record = tmp_path / "spelling.json"
    record.write_text('{"spelling": "sideways"}')
    monkeypatch.setenv(contract.SPELLING_RECORD_ENV, str(record))
    with pytest.raises(SpecError, match="records the speculative config spelling 'sideways'"):
        args.spelling()


@pytest.fixture(autouse=True)
def _no_real_tensorrt_llm():
    import importlib.util

    if importlib.util.find_spec("tensorrt_llm") is not None and "tensorrt_llm" not in sys.modules:
        pytest.skip("a real tensorrt_llm is installed: the stand-ins would shadow it")
