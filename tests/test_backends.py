"""One record per backend (specbuild.backends): the spec and every `--backend` option take exactly its names, and
the stages read its facts instead of comparing names."""

from __future__ import annotations

import click
import pytest

from specbuild import backends
from specbuild.cli import main
from specbuild.config import BACKENDS
from specbuild.errors import SpecError


def test_every_backend_option_and_the_spec_take_the_registry_names():
    assert BACKENDS == backends.NAMES
    ctx = click.Context(main)
    for name in ("convert", "build", "check", "repo", "serve", "up"):
        command = main.get_command(ctx, name)
        option = next(p for p in command.params if p.name == "backend")
        assert tuple(option.type.choices) == backends.NAMES, name


def test_the_records_say_what_the_stages_ask():
    assert backends.ENGINE_BACKENDS == ("trtllm", "reference")
    assert [b.name for b in backends.BACKENDS.values() if b.llm_api] == ["llmapi"] and not backends.is_llm_api(None)
    assert backends.get("trtllm").builder == "trtllm-build" and backends.get("trtllm").triton_backend == "tensorrtllm"
    assert not backends.get("reference").gpu and backends.get("reference").triton_backend == "python"
    with pytest.raises(SpecError, match="backend 'vllm' is not supported. Choose one of: trtllm, reference, llmapi"):
        backends.get("vllm")
