"""Every key and tensor the LLM API path writes, checked against the pinned contract (specbuild.contract.llmapi):
config.pbtxt tensors and top level, model.yaml keys (LLM-argument fields of TensorRT-LLM 1.2.1), the speculative
config's spelling, the trtllm-serve options file, and the refusals that mirror TensorRT-LLM's."""

from __future__ import annotations

import json

import pytest
import yaml
from fakes.build_fixtures import make_spec

from specbuild.contract import llmapi as contract
from specbuild.contract.pbtxt import parse_pbtxt
from specbuild.errors import SpecError
from specbuild.llmapi import args as args_mod
from specbuild.llmapi import build, repository


@pytest.fixture
def spec(tmp_path):
    return make_spec(
        tmp_path,
        speculative={"max_draft_len": 6, "num_draft_tokens": 3},
        build={"tp_size": 2, "pp_size": 1},
        gpu={"count": 2},
    )


def _files(spec, runtime="reference", checkpoints_dir=None):
    _, where, files, settings, warnings = repository.plan(spec, runtime, checkpoints_dir)
    return where, files, settings, warnings


def test_config_pbtxt_is_nvidias_tensor_table(spec):
    _, files, _, _ = _files(spec)
    config = parse_pbtxt(files["tensorrt_llm/config.pbtxt"])
    assert config.name == "tensorrt_llm" and config.backend == "python"
    assert config.max_batch_size == 0  # NVIDIA's file sets none: one prompt per request (model.yaml JIRA-4496)
    assert [(g.count, g.kind) for g in config.instance_group] == [(1, config.instance_group[0].KIND_CPU)]
    assert not config.HasField("dynamic_batching")
    # one addition to NVIDIA's parameters: the serving gate its execute checks (contract.serving_gate.gated)
    assert {key: value.string_value for key, value in config.parameters.items()} == {"serving_gate": "serving_gate"}
    from tritonclient.grpc import model_config_pb2 as pb

    for generated, pinned in ((config.input, contract.INPUTS), (config.output, contract.OUTPUTS)):
        assert [t.name for t in generated] == [t.name for t in pinned]  # NVIDIA's order
        for t, p in zip(generated, pinned):
            assert pb.DataType.Name(t.data_type) == p.data_type, t.name
            assert tuple(t.dims) == p.dims, t.name
            assert getattr(t, "optional", False) == p.optional, t.name  # outputs have no optional field
    assert [t.name for t in config.input if not t.optional] == ["text_input"]


def test_the_llmapi_repository_has_the_engine_paths_serving_gate(spec):
    """One gate for both repository kinds: the same config, the same model code; the drain finds it by its
    folder (triton.canary.gate_model) and closes it before the entry model unloads."""
    from specbuild.contract import serving_gate
    from specbuild.contract.pbtxt import to_pbtxt
    from specbuild.triton.repository import SHIMS

    _, files, _, _ = _files(spec)
    assert files["serving_gate/config.pbtxt"] == to_pbtxt(serving_gate.model_config())
    assert f"from {SHIMS['serving_gate']} import TritonPythonModel" in files["serving_gate/1/model.py"]
    for runtime in ("reference", "tensorrt_llm"):
        assert "serving_gate/1/model.py" in _files(spec, runtime)[1]


@pytest.mark.parametrize("decoupled", [True, False])
def test_transaction_policy_follows_the_spec_and_model_yaml(tmp_path, decoupled):
    spec = make_spec(tmp_path, serve={"decoupled": decoupled})
    _, files, _, _ = _files(spec)
    config = parse_pbtxt(files["tensorrt_llm/config.pbtxt"])
    model_yaml = yaml.safe_load(files["tensorrt_llm/1/model.yaml"])
    assert config.model_transaction_policy.decoupled is decoupled
    assert model_yaml["triton_config"] == {"max_batch_size": 0, "decoupled": decoupled}


def test_every_model_yaml_key_is_an_llm_argument_of_the_pinned_release(spec):
    where, files, _, _ = _files(spec)
    data = yaml.safe_load(files["tensorrt_llm/1/model.yaml"])
    triton_config = data.pop("triton_config")
    assert set(triton_config) <= set(contract.TRITON_CONFIG_REQUIRED + contract.TRITON_CONFIG_OPTIONAL)
    assert set(data) <= contract.LLM_ARGS
    assert set(data["kv_cache_config"]) <= contract.KV_CACHE_CONFIG
    assert set(data["speculative_config"]) <= contract.DECODING_CONFIG | {contract.DECODING_TYPE_KEY}
    assert contract.unknown_llm_args(data) == []
    assert data["backend"] == "pytorch" and data["model"] == where.target
    assert data["tensor_parallel_size"] == 2 and data["pipeline_parallel_size"] == 1
    assert data["speculative_config"] == {
        "decoding_type": "DraftTarget",
        "max_draft_len": 3,
        "speculative_model_dir": where.draft,
    }
    assert data["kv_cache_config"] == {"free_gpu_memory_fraction": 0.9, "enable_block_reuse": True}
    assert data["disable_overlap_scheduler"] is True
    assert (data["max_batch_size"], data["max_seq_len"], data["max_num_tokens"]) == (4, 2048, 8192)


def test_the_pinned_spelling_is_the_from_dict_key_and_the_later_one_is_not():
    assert contract.DECODING_TYPE in contract.DECODING_TYPES
    assert contract.LATER_DECODING_TYPE not in contract.DECODING_TYPES
    assert contract.DRAFT_MODEL_KEY in contract.DECODING_CONFIG
    assert contract.LATER_DRAFT_MODEL_KEY not in contract.DECODING_CONFIG


def test_serve_options_file_holds_the_same_arguments_without_model_and_backend(spec):
    files = build.render(spec)
    options = yaml.safe_load(files[build.OPTIONS_FILE])
    model_yaml = yaml.safe_load(files[build.MODEL_YAML])
    assert "model" not in options and "backend" not in options
    assert set(options) <= contract.LLM_ARGS and contract.unknown_llm_args(options) == []
    model_yaml.pop("triton_config")
    assert {k: v for k, v in model_yaml.items() if k not in ("model", "backend")} == options


def test_yaml_round_trip_keeps_every_value(spec):
    data = args_mod.model_yaml_data(spec, args_mod.Locations('/x/"quoted" target', "/y/draft: colon"))
    assert yaml.safe_load(args_mod.render_yaml(data, header="a\nb")) == data
    tricky = {"digits": "947313551256", "exponent": "123e45", "word": "no", "octal": "0123", "nested": {"x": "1.0"}}
    assert yaml.safe_load(args_mod.render_yaml(tricky)) == tricky  # strings stay strings, whatever they look like


def test_repository_paths_per_runtime(spec, tmp_path):
    where, _, _, warnings = _files(spec, "tensorrt_llm")
    assert where.target == "/engines/pair/target/hf_checkpoint" and where.draft == "/engines/pair/draft/hf_checkpoint"
    assert any("--checkpoints-dir" in w for w in warnings)
    where, files, _, warnings = _files(spec, "reference")
    assert where.target == str(spec.output_dir / "pair" / "target" / "hf_checkpoint")
    assert any("not converted yet" in w for w in warnings)
    assert "specbuild.llmapi.standin" in files["tensorrt_llm/1/model.py"]
    where, files, _, _ = _files(spec, "tensorrt_llm", "/mnt/out")
    assert where.draft == "/mnt/out/pair/draft/hf_checkpoint"
    assert "specbuild.llmapi.nvidia_model" in files["tensorrt_llm/1/model.py"]


def test_no_speculation_writes_no_speculative_config(tmp_path):
    spec = make_spec(tmp_path, speculative={"max_draft_len": 4, "num_draft_tokens": 0})
    data = args_mod.llm_args(spec, args_mod.Locations("/t", "/d"))
    assert "speculative_config" not in data


@pytest.mark.parametrize(
    "change, message",
    [
        ({"extra_key": 1}, "not fields of TensorRT-LLM 1.2.1"),
        ({"kv_cache_config": {"free_gpu_memory_fraction": 0.9, "fraction": 1}}, "kv_cache_config.fraction"),
        (
            {
                "speculative_config": {
                    "decoding_type": "Draft_Target",
                    "max_draft_len": 3,
                    "speculative_model_dir": "/d",
                }
            },
            "Invalid decoding type: Draft_Target",
        ),
        (
            {"speculative_config": {"decoding_type": "DraftTarget", "max_draft_len": 3, "speculative_model": "/d"}},
            "speculative_config.speculative_model",
        ),
        (
            {"speculative_config": {"decoding_type": "DraftTarget", "max_draft_len": 0, "speculative_model_dir": "/d"}},
            "max_draft_len must be > 0",
        ),
        ({"speculative_config": {"decoding_type": "DraftTarget", "max_draft_len": 2}}, "Path to draft model"),
        ({"backend": "tensorrt"}, "backend must be 'pytorch'"),
        ({"kv_cache_config": {"free_gpu_memory_fraction": 1.5}}, "between 0 and 1"),
    ],
)
def test_validation_refuses_what_the_release_refuses(spec, change, message):
    data = {**args_mod.llm_args(spec, args_mod.Locations("/t", "/d")), **change}
    with pytest.raises(SpecError, match=message):
        args_mod.validate_llm_args(data)


@pytest.mark.parametrize(
    "section, values, message",
    [
        ("build", {"backend": "llmapi2"}, "build.backend = 'llmapi2' is not supported"),
        ("llmapi", {"free_gpu_memory_fraction": 0.0}, r"must be a number in \(0, 1\]"),
        ("llmapi", {"free_gpu_memory_fraction": 1.2}, "free_gpu_memory_fraction = 1.2"),
    ],
)
def test_spec_keys_are_validated(tmp_path, section, values, message):
    with pytest.raises(SpecError, match=message):
        make_spec(tmp_path, **{section: values})


def test_spec_backend_and_fraction_reach_the_arguments(tmp_path):
    spec = make_spec(
        tmp_path, build={"backend": "llmapi"}, llmapi={"free_gpu_memory_fraction": 0.5, "enable_block_reuse": False}
    )
    assert spec.build.backend == "llmapi"
    data = args_mod.llm_args(spec, args_mod.Locations("/t", "/d"))
    assert data["kv_cache_config"] == {"free_gpu_memory_fraction": 0.5, "enable_block_reuse": False}


@pytest.mark.parametrize("quantization", ["int4_awq", "int8_sq", "w4a8_awq", "int8_wo", "int4_wo"])
def test_formats_the_path_does_not_export_are_refused_by_name(tmp_path, quantization):
    spec = make_spec(tmp_path, target={"quantization": quantization})
    with pytest.raises(SpecError, match=f"target.quantization = '{quantization}' is not supported on the LLM API"):
        args_mod.llm_args(spec, args_mod.Locations("/t", "/d"))


# ---- prompt lookup on the LLM API: NGramDecodingConfig; the hybrid has no equivalent -----------------------------
def test_the_lookup_drafter_writes_nvidias_ngram_config_without_a_draft_model(tmp_path):
    spec = make_spec(
        tmp_path,
        speculative={"max_draft_len": 4, "num_draft_tokens": 3, "drafter": "lookup"},
        lookup={"max_matching_ngram_size": 3, "is_public_pool": True},
    )
    data = args_mod.llm_args(spec, args_mod.Locations("/t", "/d"))
    assert data["speculative_config"] == {
        "decoding_type": "NGram",
        "max_draft_len": 3,
        "max_matching_ngram_size": 3,
        "is_keep_all": True,
        "is_use_oldest": True,
        "is_public_pool": True,
    }
    assert contract.unknown_llm_args(data) == [] and contract.unknown_llm_args(data, "later") == []
    assert "/d" not in json.dumps(data)  # no draft model on this path


def test_the_hybrid_is_refused_on_the_llm_api_path_by_the_args_and_by_check(tmp_path):
    from specbuild.drafters import path_refusal

    spec = make_spec(tmp_path, speculative={"max_draft_len": 4, "num_draft_tokens": 3, "drafter": "hybrid"})
    with pytest.raises(SpecError, match="speculative.drafter = 'hybrid' has no equivalent on the LLM API path"):
        args_mod.llm_args(spec, args_mod.Locations("/t", "/d"))
    assert path_refusal("hybrid", "engine") is None and path_refusal("lookup", "llmapi") is None


def test_the_stand_in_refuses_an_ngram_config_the_release_refuses():
    from specbuild.llmapi.llm import LlmArgsError, validate_args

    base = {"model": "/t", "backend": "pytorch"}
    ngram = {"decoding_type": "NGram", "max_draft_len": 3}
    assert validate_args({**base, "speculative_config": ngram})["speculative_config"] == {"max_draft_len": 3}
    with pytest.raises(LlmArgsError, match="max_draft_len must be > 0"):
        validate_args({**base, "speculative_config": {**ngram, "max_draft_len": 0}})
    with pytest.raises(LlmArgsError, match="max_matching_ngram_size: Input should be greater than 0"):
        validate_args({**base, "speculative_config": {**ngram, "max_matching_ngram_size": 0}})


@pytest.mark.parametrize(
    ("inputs", "mine"),
    [
        (["text_input", "sampling_param_max_tokens", "streaming"], True),
        (["text_input"], False),  # the BLS's and the ensemble's text input, without the LLM API's token bound
        (["sampling_param_max_tokens"], False),
        (["input_ids", "input_lengths", "request_output_len"], False),  # the engine path's tensorrt_llm
        ([], False),
    ],
)
def test_a_model_config_is_the_llmapi_models_by_its_two_inputs(inputs, mine):
    config = {"name": "tensorrt_llm", "input": [{"name": name, "data_type": "TYPE_STRING"} for name in inputs]}
    assert contract.is_llmapi_config(config) is mine
    assert contract.is_llmapi_config(None) is False and contract.is_llmapi_config({}) is False
