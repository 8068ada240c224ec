"""The LLM API path stops at every end id a checkpoint lists (specbuild.llmapi.end_ids): TensorRT-LLM's LLM ends at
the tokenizer's eos only, so the wrapper around NVIDIA's llmapi model (and its CPU stand-in) adds the others to each
request's SamplingParams keyword arguments as stop_token_ids, through NVIDIA's `_convert_request`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from convert_helpers import make_tokenizer

from specbuild.llmapi.end_ids import every_end_id, stop_token_ids


class Logger:
    """triton_python_backend_utils.Logger, keeping what it was told (also for test_llmapi_answered)."""

    lines: list[tuple[str, str]] = []

    @classmethod
    def log_info(cls, message):
        cls.lines.append(("info", message))

    @classmethod
    def log_warn(cls, message):
        cls.lines.append(("warn", message))

    @classmethod
    def log_error(cls, message):
        cls.lines.append(("error", message))


class BackendUtils:
    """What the wrapper uses of triton_python_backend_utils: its Logger."""

    Logger = Logger


class NvidiaLike:
    """The shape of NVIDIA's model.py as the wrapper relies on it (@044a90d): initialize(args), and
    _convert_request(request) -> (prompt, SamplingParams keyword arguments, streaming, output config)."""

    def initialize(self, args):
        self.loaded = True

    def _convert_request(self, request):
        return request["prompt"], dict(request["sampling"]), False, {}


def model_folder(root: Path, listed, tokenizer: bool = True) -> Path:
    """A model version folder whose model.yaml points at a checkpoint listing `listed` end ids (its tokenizer's eos
    is 2, `</s>`)."""
    checkpoint = root / "hf_checkpoint"
    checkpoint.mkdir(parents=True)
    if tokenizer:
        make_tokenizer(checkpoint, 64)
    (checkpoint / "generation_config.json").write_text(json.dumps({"eos_token_id": listed}))
    version = root / "tensorrt_llm" / "1"
    version.mkdir(parents=True)
    (version / "model.yaml").write_text(
        f"model: {checkpoint}\nbackend: pytorch\ntriton_config:\n  max_batch_size: 4\n  decoupled: true\n"
    )
    return version


def loaded(model_class, version: Path):
    Logger.lines = []
    sys.modules["triton_python_backend_utils"] = BackendUtils
    try:
        model = every_end_id(model_class)()
        model.initialize({"model_repository": str(version.parent), "model_version": version.name, "model_config": "{}"})
    finally:
        del sys.modules["triton_python_backend_utils"]
    return model


def test_the_checkpoints_other_end_ids_go_with_every_request_as_stop_token_ids(tmp_path):
    model = loaded(NvidiaLike, model_folder(tmp_path, [2, 9, 7]))
    assert model.loaded and type(model).__name__ == "NvidiaLike"
    prompt, sampling, streaming, config = model._convert_request({"prompt": "hi", "sampling": {"max_tokens": 4}})
    assert sampling == {"max_tokens": 4, "stop_token_ids": [9, 7]}  # the tokenizer's eos is the LLM's end_id
    # ids a request already has come first, each id once
    _, sampling, _, _ = model._convert_request({"prompt": "hi", "sampling": {"stop_token_ids": [7, 30]}})
    assert sampling["stop_token_ids"] == [7, 30, 9]
    assert Logger.lines == [
        (
            "info",
            "[specbuild] end ids: the LLM ends at the tokenizer's eos 2; the checkpoint's "
            "other end ids [9, 7] go with every request as stop_token_ids",
        )
    ]


@pytest.mark.parametrize("listed", [[2], []])
def test_a_checkpoint_listing_only_the_tokenizers_eos_or_nothing_changes_no_request(tmp_path, listed):
    model = loaded(NvidiaLike, model_folder(tmp_path, listed))
    assert model._convert_request({"prompt": "hi", "sampling": {"max_tokens": 4}})[1] == {"max_tokens": 4}
    assert Logger.lines == []


def test_the_llms_end_id_is_its_tokenizers_eos_not_the_first_id_listed(tmp_path):
    version = model_folder(tmp_path, [5, 2])
    args = {"model": str(tmp_path / "hf_checkpoint")}
    assert stop_token_ids(args) == (2, [5])
    assert stop_token_ids({**args, "skip_tokenizer_init": True}) == (None, [])  # requests name their own end_id
    assert loaded(NvidiaLike, version)._convert_request({"prompt": "", "sampling": {}})[1] == {"stop_token_ids": [5]}


def test_a_model_py_without_the_hook_is_served_as_it_is_with_a_warning_naming_the_ids(tmp_path):
    class Later:
        def initialize(self, args):
            pass

        def execute(self, requests):
            return None

    loaded(Later, model_folder(tmp_path / "a", [2, 9]))
    assert Logger.lines[0][0] == "warn" and "not at the checkpoint's other end ids [9]" in Logger.lines[0][1]

    class OtherShape(NvidiaLike):
        def _convert_request(self, request):
            return "a prompt"

    model = loaded(OtherShape, model_folder(tmp_path / "b", [2, 9]))
    sys.modules["triton_python_backend_utils"] = BackendUtils
    try:
        assert model._convert_request({}) == "a prompt" and model._convert_request({}) == "a prompt"
    finally:
        del sys.modules["triton_python_backend_utils"]
    assert [level for level, _ in Logger.lines] == ["info", "warn"]  # said once
