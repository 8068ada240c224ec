"""Triton config generation: typed ModelConfig messages, no placeholders, the names and parameters of NVIDIA's
`inflight_batcher_llm` templates and of the C++ backend's required keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from specbuild.config import spec_from_dict
from specbuild.contract import pbtxt, tensors
from specbuild.errors import SpecError
from specbuild.triton import configs, repository

pytest.importorskip("tritonclient.grpc.model_config_pb2")
from tritonclient.grpc import model_config_pb2 as pb  # noqa: E402


def make_spec(tmp_path: Path, **sections) -> object:
    raw = {
        "name": "pair-x",
        "target": {"checkpoint": str(tmp_path / "no-target")},
        "draft": {"checkpoint": str(tmp_path / "no-draft")},
        "speculative": {"max_draft_len": 5, "num_draft_tokens": 3},
        "build": {"max_batch_size": 6, "max_input_len": 100, "max_seq_len": 300},
        "output_dir": str(tmp_path / "engines"),
    }
    raw.update(sections)
    return spec_from_dict(raw, base_dir=tmp_path)


def rendered(tmp_path: Path, backend: str, **sections) -> tuple[configs.RepoSettings, dict[str, str]]:
    spec = make_spec(tmp_path, **sections)
    settings, _ = repository.plan_settings(spec, backend, tmp_path / "triton_repo")
    return settings, repository.render(settings)


def params(config: pb.ModelConfig) -> dict[str, str]:
    return {k: v.string_value for k, v in config.parameters.items()}


def io(entries) -> list[tuple]:
    return [
        (
            e.name,
            pb.DataType.Name(e.data_type),
            list(e.dims),
            getattr(e, "optional", None),
            e.HasField("reshape"),
            getattr(e, "allow_ragged_batch", None),
        )
        for e in entries
    ]


@pytest.mark.parametrize("backend", ["trtllm", "reference"])
def test_every_config_parses_back_and_has_no_placeholder(tmp_path, backend):
    settings, files = rendered(tmp_path, backend)
    pbtxts = {rel: text for rel, text in files.items() if rel.endswith("config.pbtxt")}
    assert sorted(rel.split("/")[0] for rel in pbtxts) == sorted(configs.MODEL_NAMES)
    for rel, text in files.items():
        assert "${" not in text, rel
    built = configs.build_all(settings)
    for rel, text in pbtxts.items():
        parsed = pbtxt.parse_pbtxt(text)
        assert parsed == built[rel.split("/")[0]]
        assert parsed.name == rel.split("/")[0]
        assert parsed.max_batch_size == (0 if parsed.name == "serving_gate" else 6)  # the gate batches nothing


def test_draft_has_exactly_the_target_tensors(tmp_path):
    for backend in ("trtllm", "reference"):
        settings, _ = rendered(tmp_path, backend)
        target, draft = configs.llm(settings, "target"), configs.llm(settings, "draft")
        assert (target.name, draft.name) == ("tensorrt_llm", "tensorrt_llm_draft")
        assert io(target.input) == io(draft.input)
        assert io(target.output) == io(draft.output)
        assert target.backend == draft.backend == ("tensorrtllm" if backend == "trtllm" else "python")


def test_trtllm_parameters_are_filled_with_the_dtm_values(tmp_path):
    settings, files = rendered(tmp_path, "trtllm")
    target = pbtxt.parse_pbtxt(files["tensorrt_llm/config.pbtxt"])
    draft = pbtxt.parse_pbtxt(files["tensorrt_llm_draft/config.pbtxt"])
    t, d = params(target), params(draft)
    assert t["gpt_model_path"] == "/engines/pair-x/target/engine"
    assert d["gpt_model_path"] == "/engines/pair-x/draft/engine"
    for p in (t, d):
        assert p["gpt_model_type"] == "inflight_fused_batching"
        assert p["enable_kv_cache_reuse"] == "true"
        assert p["FORCE_CPU_ONLY_INPUT_TENSORS"] == "no"
        assert p["exclude_input_in_output"] == "false"
        assert p["max_beam_width"] == "1"
        assert p["executor_worker_path"] == "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker"
        assert 0.0 < float(p["kv_cache_free_gpu_mem_fraction"]) < 1.0
        assert p["gpu_device_ids"] == "0"
        assert all(v.strip() for k, v in p.items() if k not in configs.UNSET_LLM_PARAMS)
    # no checkpoint on disk: no memory plan, the documented default split and no token cap
    assert (t["kv_cache_free_gpu_mem_fraction"], d["kv_cache_free_gpu_mem_fraction"]) == ("0.5", "0.5")
    assert "max_tokens_in_paged_kv_cache" not in t
    assert target.model_transaction_policy.decoupled is False
    assert target.instance_group[0].kind == pb.ModelInstanceGroup.KIND_CPU
    assert target.dynamic_batching.preferred_batch_size == [6]


def test_memory_plan_split_is_used_when_the_checkpoints_are_readable(tiny_spec_path):
    from specbuild.config import load_spec

    spec = load_spec(tiny_spec_path)
    split = repository.kv_cache_split(spec)
    assert split.source == "memory plan"
    settings, warnings = repository.plan_settings(spec, "trtllm", tiny_spec_path.parent / "repo")
    t = params(configs.llm(settings, "target"))
    assert float(t["kv_cache_free_gpu_mem_fraction"]) == pytest.approx(split.fraction["target"], abs=1e-4)
    assert int(t["max_tokens_in_paged_kv_cache"]) == split.max_tokens["target"] > 0
    assert not any("kv_cache_free_gpu_mem_fraction" in w for w in warnings)


def test_llm_tensor_contract_matches_nvidias_template(tmp_path):
    settings, _ = rendered(tmp_path, "trtllm")
    config = configs.llm(settings, "target")
    inputs = {e.name: e for e in config.input}
    outputs = {e.name: e for e in config.output}
    expect = {
        "input_ids": ("TYPE_INT32", [-1]),
        "input_lengths": ("TYPE_INT32", [1]),
        "request_output_len": ("TYPE_INT32", [1]),
        "draft_input_ids": ("TYPE_INT32", [-1]),
        "draft_logits": ("TYPE_FP16", [-1, -1]),
        "draft_acceptance_threshold": ("TYPE_FP32", [1]),
        "end_id": ("TYPE_INT32", [1]),
        "stop_words_list": ("TYPE_INT32", [2, -1]),
        "runtime_top_k": ("TYPE_INT32", [1]),
        "runtime_top_p": ("TYPE_FP32", [1]),
        "min_tokens": ("TYPE_INT32", [1]),
        "seed": ("TYPE_UINT64", [1]),
        "return_generation_logits": ("TYPE_BOOL", [1]),
        "streaming": ("TYPE_BOOL", [1]),
    }
    for name, (dtype, dims) in expect.items():
        assert (pb.DataType.Name(inputs[name].data_type), list(inputs[name].dims)) == (dtype, dims), name
    # TensorRT-LLM 1.2 names: the v0.19 ones are gone
    assert "min_length" not in inputs and "random_seed" not in inputs
    required = [e.name for e in config.input if not e.optional]
    assert required == ["input_lengths", "request_output_len"]
    assert inputs["input_lengths"].HasField("reshape") and not inputs["input_ids"].HasField("reshape")
    assert inputs["draft_input_ids"].allow_ragged_batch
    for name, dtype in (
        ("output_ids", "TYPE_INT32"),
        ("sequence_length", "TYPE_INT32"),
        ("generation_logits", "TYPE_FP16"),
        ("acceptance_rate", "TYPE_FP32"),
        ("total_accepted_draft_tokens", "TYPE_INT32"),
        ("total_draft_tokens", "TYPE_INT32"),
    ):
        assert pb.DataType.Name(outputs[name].data_type) == dtype
    assert list(outputs["output_ids"].dims) == [-1, -1]


def test_bls_config(tmp_path):
    settings, files = rendered(tmp_path, "reference", serve={"decoupled": True, "bls_instance_count": 2})
    bls = pbtxt.parse_pbtxt(files["tensorrt_llm_bls/config.pbtxt"])
    assert bls.backend == "python" and bls.model_transaction_policy.decoupled is True
    p = params(bls)
    assert p["tensorrt_llm_model_name"] == "tensorrt_llm"
    assert p["tensorrt_llm_draft_model_name"] == "tensorrt_llm_draft"
    assert (p["max_draft_len"], p["num_draft_tokens"]) == ("5", "3")
    assert (p["max_input_len"], p["max_output_len"]) == ("100", "200")
    names = {e.name: pb.DataType.Name(e.data_type) for e in bls.input}
    for name, dtype in (
        ("text_input", "TYPE_STRING"),
        ("max_tokens", "TYPE_INT32"),
        ("num_draft_tokens", "TYPE_INT32"),
        ("use_draft_logits", "TYPE_BOOL"),
        ("stream", "TYPE_BOOL"),
        ("temperature", "TYPE_FP32"),
        ("top_k", "TYPE_INT32"),
        ("top_p", "TYPE_FP32"),
        ("seed", "TYPE_UINT64"),
        ("end_id", "TYPE_INT32"),
        ("stop_words", "TYPE_STRING"),
    ):
        assert names[name] == dtype, name
    assert [e.name for e in bls.input if not e.optional] == ["text_input", "max_tokens"]
    outs = {e.name for e in bls.output}
    assert {
        "text_output",
        "acceptance_rate",
        "total_accepted_draft_tokens",
        "total_draft_tokens",
        "mean_accepted_len",
        "output_ids",
    } <= outs
    assert bls.instance_group[0].count == 2
    _, files = rendered(tmp_path, "reference", serve={"decoupled": False})
    assert pbtxt.parse_pbtxt(files["tensorrt_llm_bls/config.pbtxt"]).model_transaction_policy.decoupled is False


@pytest.mark.parametrize("backend", ["trtllm", "reference"])
def test_no_model_has_a_triton_queue_bound_so_the_batcher_prefetches(tmp_path, backend):
    """Any Triton queue bound (or timeout, or priority levels) puts the dynamic batcher on the path where a request
    that met a busy instance can wait 500 ms beside the freed one (core r24.10 src/scheduler_utils.cc:
    support_prefetching_ only for the policy's defaults; specbuild.triton.configs has the whole cause). So every
    model keeps the defaults, whatever the spec's bound and delay, and the spec's delay is kept as given."""
    for serve in ({}, {"max_queue_size": 64, "max_queue_delay_microseconds": 500}, {"max_queue_size": 0}):
        _, files = rendered(tmp_path, backend, serve=serve)
        for model in ("preprocessing", "postprocessing", "tensorrt_llm", "tensorrt_llm_draft", "tensorrt_llm_bls"):
            config = pbtxt.parse_pbtxt(files[f"{model}/config.pbtxt"])
            assert config.HasField("dynamic_batching"), model
            batching = config.dynamic_batching
            assert configs.prefetches(batching), (model, serve)
            assert not batching.HasField("default_queue_policy") and not batching.priority_queue_policy, model
            assert batching.max_queue_delay_microseconds == serve.get("max_queue_delay_microseconds", 0), model
    batching = pb.ModelConfig().dynamic_batching
    batching.default_queue_policy.max_queue_size = 16
    assert not configs.prefetches(batching)  # the configuration that stalled (scripts/batcher_stall_probe.py)


def test_the_bls_bounds_its_own_queue_split_over_its_instances(tmp_path):
    """By default 4 waiting requests per request the BLS runs at once (max_batch_size 6 x 2 instances here), all
    instances together; each instance refuses past its share (rounded up). 0 = no bound."""
    for serve, per_instance in (
        ({"bls_instance_count": 2}, "24"),
        ({}, "24"),
        ({"max_queue_size": 0}, "0"),
        ({"bls_instance_count": 2, "max_queue_size": 5}, "3"),
    ):
        _, files = rendered(tmp_path, "reference", serve=serve)
        bls = pbtxt.parse_pbtxt(files["tensorrt_llm_bls/config.pbtxt"])
        assert (params(bls)["max_queue_size"], params(bls)["max_concurrent_requests"]) == (per_instance, "6"), serve
        assert list(bls.dynamic_batching.preferred_batch_size) == []


def test_a_queue_smaller_than_what_the_bls_runs_at_once_is_allowed(tmp_path):
    """The bound is the BLS's alone, so it no longer has to hold the BLS's own calls to the draft and target."""
    assert make_spec(tmp_path, serve={"max_queue_size": 1}).serve.queue_size(6) == 1
    with pytest.raises(SpecError, match="serve.max_queue_size"):
        make_spec(tmp_path, serve={"max_queue_size": -1})


def test_ensemble_wiring_is_consistent(tmp_path):
    settings, _ = rendered(tmp_path, "reference")
    models = configs.build_all(settings)
    ensemble = models["ensemble"]
    assert ensemble.platform == "ensemble"
    available = {e.name for e in ensemble.input}
    for step in ensemble.ensemble_scheduling.step:
        model = models[step.model_name]
        model_inputs, model_outputs = {e.name for e in model.input}, {e.name for e in model.output}
        for key, value in step.input_map.items():
            assert key in model_inputs, (step.model_name, key)
            assert value in available, (step.model_name, value)
        for key, value in step.output_map.items():
            assert key in model_outputs, (step.model_name, key)
            available.add(value)
    assert [s.model_name for s in ensemble.ensemble_scheduling.step] == [
        "preprocessing",
        "tensorrt_llm",
        "postprocessing",
    ]
    assert {e.name for e in ensemble.output} <= available
    required = {e.name for e in models["tensorrt_llm"].input if not e.optional}
    assert required <= set(ensemble.ensemble_scheduling.step[1].input_map)


def test_reference_paths_are_relative_to_the_repository(tmp_path):
    settings, files = rendered(tmp_path, "reference")
    assert settings.target.engine_dir == "../engines/pair-x/target/engine"
    assert settings.draft.engine_dir == "../engines/pair-x/draft/engine"
    assert settings.tokenizer_dir == "../engines/pair-x/target/engine"
    assert str(tmp_path) not in "".join(files.values())
    assert "from specbuild.triton.models.reference_llm import TritonPythonModel" in files["tensorrt_llm/1/model.py"]
    assert "from specbuild.triton.models.bls import TritonPythonModel" in files["tensorrt_llm_bls/1/model.py"]


@pytest.mark.parametrize(
    "count,tp,target,draft", [(1, 1, "0", "0"), (2, 1, "0", "1"), (4, 2, "0,1", "2,3"), (2, 2, "0,1", "0,1")]
)
def test_gpu_device_ids(tmp_path, count, tp, target, draft):
    spec = make_spec(
        tmp_path,
        gpu={"name": "H100-80GB", "count": count},
        build={"max_batch_size": 6, "max_input_len": 100, "max_seq_len": 300, "tp_size": tp},
    )
    assert (repository.gpu_device_ids(spec, "target"), repository.gpu_device_ids(spec, "draft")) == (target, draft)


@pytest.mark.parametrize(
    "count,tp,ids,draft,separate",
    [
        (2, 1, [1], "1", True),
        (2, 1, [0], "0", False),
        (3, 1, [2], "2", True),
        (4, 2, [2, 3], "2,3", True),
        (4, 2, [3, 2], "3,2", True),
        (4, 2, [0, 1], "0,1", False),
    ],
)
def test_draft_device_ids_place_the_draft_in_the_generated_config(tmp_path, count, tp, ids, draft, separate):
    """[gpu] draft_device_ids is what the draft's tensorrt_llm config gets as gpu_device_ids, and what the memory
    plan counts as shared or not."""
    from specbuild.check.memory import separate_gpus

    gpu = {"name": "H100-80GB", "count": count, "draft_device_ids": ids}
    build = {"max_batch_size": 6, "max_input_len": 100, "max_seq_len": 300, "tp_size": tp}
    _, files = rendered(tmp_path, "trtllm", gpu=gpu, build=build)
    assert params(pbtxt.parse_pbtxt(files["tensorrt_llm_draft/config.pbtxt"]))["gpu_device_ids"] == draft
    assert params(pbtxt.parse_pbtxt(files["tensorrt_llm/config.pbtxt"]))["gpu_device_ids"] == ",".join(
        str(i) for i in range(tp)
    )
    assert separate_gpus(make_spec(tmp_path, gpu=gpu, build=build)) is separate


@pytest.mark.parametrize("setting,written", [("auto", "auto"), (True, "true"), (False, "false")])
def test_bls_config_carries_the_overlap_setting(tmp_path, setting, written):
    _, files = rendered(
        tmp_path, "reference", speculative={"max_draft_len": 5, "num_draft_tokens": 3, "overlap": setting}
    )
    assert params(pbtxt.parse_pbtxt(files["tensorrt_llm_bls/config.pbtxt"]))["overlap"] == written


def test_missing_values_raise_instead_of_writing_placeholders(tmp_path):
    import dataclasses

    settings, _ = rendered(tmp_path, "trtllm")
    empty = dataclasses.replace(settings, target=dataclasses.replace(settings.target, engine_dir=""))
    with pytest.raises(SpecError, match="engine_dir"):
        configs.build_all(empty)
    placeholder = dataclasses.replace(settings, tokenizer_dir="${tokenizer_dir}")
    with pytest.raises(SpecError, match="placeholder"):
        configs.build_all(placeholder)
    bad_fraction = dataclasses.replace(
        settings, draft=dataclasses.replace(settings.draft, kv_cache_free_gpu_mem_fraction=1.5)
    )
    with pytest.raises(SpecError, match="kv_cache_free_gpu_mem_fraction"):
        configs.build_all(bad_fraction)
    with pytest.raises(SpecError, match="not supported"):
        repository.plan_settings(make_spec(tmp_path), "vllm", tmp_path / "r")


def test_tensor_tables_have_unique_names_and_known_dtypes():
    for table in (
        tensors.LLM_INPUTS,
        tensors.LLM_OUTPUTS,
        tensors.PRE_INPUTS,
        tensors.PRE_OUTPUTS,
        tensors.BLS_INPUTS,
        tensors.BLS_OUTPUTS,
        tensors.ENSEMBLE_INPUTS,
    ):
        names = [t.name for t in table]
        assert len(names) == len(set(names))
        for t in table:
            assert t.dtype == tensors.LOGITS or t.dtype in tensors.NUMPY_DTYPES


@pytest.mark.parametrize("backend", ["trtllm", "reference"])
def test_llm_configs_carry_every_parameter_the_backend_reads_without_fallback(tmp_path, backend):
    """model_instance_state.cc reads these with no fallback: a config without them fails to load."""
    from specbuild.contract.backend_params import REQUIRED

    settings, files = rendered(tmp_path, backend)
    for name in ("tensorrt_llm", "tensorrt_llm_draft"):
        p = params(pbtxt.parse_pbtxt(files[f"{name}/config.pbtxt"]))
        assert set(REQUIRED) <= set(p), name
        assert p["gpt_model_type"] == "inflight_fused_batching" and p["gpt_model_path"]
        assert {k: p[k] for k in ("tokenizer_dir", "guided_decoding_backend", "xgrammar_tokenizer_info_path")} == {
            "tokenizer_dir": "",
            "guided_decoding_backend": "",
            "xgrammar_tokenizer_info_path": "",
        }


def test_empty_values_are_allowed_for_exactly_the_unset_llm_parameters(tmp_path):
    assert set(configs.UNSET_LLM_PARAMS) == {"tokenizer_dir", "guided_decoding_backend", "xgrammar_tokenizer_info_path"}
    config = pb.ModelConfig(name="m")
    configs._params(config, {"tokenizer_dir": ""}, may_be_empty=tuple(configs.UNSET_LLM_PARAMS))
    with pytest.raises(SpecError, match=r"m.parameters\[gpt_model_path\] = '' is missing"):
        configs._params(config, {"gpt_model_path": ""}, may_be_empty=tuple(configs.UNSET_LLM_PARAMS))
    settings, _ = rendered(tmp_path, "reference")
    import dataclasses

    with pytest.raises(SpecError, match="tokenizer_dir"):  # preprocessing's tokenizer_dir is a real path
        configs.preprocessing(dataclasses.replace(settings, tokenizer_dir=""))


def logits_types(files: dict[str, str]) -> dict[str, str]:
    found = {}
    for model in ("tensorrt_llm", "tensorrt_llm_draft", "tensorrt_llm_bls", "ensemble"):
        config = pbtxt.parse_pbtxt(files[f"{model}/config.pbtxt"])
        for e in [*config.input, *config.output]:
            if e.name in ("generation_logits", "context_logits", "draft_logits"):
                found[f"{model}.{e.name}"] = pb.DataType.Name(e.data_type)
    return found


@pytest.mark.parametrize(
    "dtype, expected", [("float16", "TYPE_FP16"), ("bfloat16", "TYPE_FP16"), ("float32", "TYPE_FP32")]
)
def test_logits_are_declared_in_the_dtype_modelopt_will_write(tmp_path, dtype, expected):
    """Before convert: modelopt writes logits_dtype float16 for a bfloat16 model, else the model dtype."""
    _, files = rendered(
        tmp_path,
        "trtllm",
        target={"checkpoint": str(tmp_path / "t"), "dtype": dtype},
        draft={"checkpoint": str(tmp_path / "d"), "dtype": dtype},
    )
    found = logits_types(files)
    assert set(found) == {
        f"{m}.{t}"
        for m in ("tensorrt_llm", "tensorrt_llm_draft")
        for t in ("draft_logits", "context_logits", "generation_logits")
    } | {f"{m}.{t}" for m in ("tensorrt_llm_bls", "ensemble") for t in ("context_logits", "generation_logits")}
    assert set(found.values()) == {expected}, found


def test_logits_dtype_comes_from_the_checkpoint_then_the_built_engine(tmp_path):
    import json

    spec = make_spec(tmp_path)
    for role in ("target", "draft"):
        (spec.pair_dir / role / "checkpoint").mkdir(parents=True)
        (spec.pair_dir / role / "checkpoint" / "config.json").write_text(json.dumps({"logits_dtype": "float32"}))
    settings, _ = repository.plan_settings(spec, "trtllm", tmp_path / "r")
    assert settings.logits_datatype == "TYPE_FP32"  # the spec's dtype says float16; the checkpoint wins
    for role in ("target", "draft"):
        (spec.pair_dir / role / "engine").mkdir(parents=True)
        (spec.pair_dir / role / "engine" / "engine.json").write_text(json.dumps({"logits_dtype": "float16"}))
    settings, _ = repository.plan_settings(spec, "reference", tmp_path / "r")
    assert settings.logits_datatype == "TYPE_FP16"  # a built engine wins over its checkpoint
    (spec.pair_dir / "draft" / "engine" / "engine.json").write_text(json.dumps({"logits_dtype": "float32"}))
    with pytest.raises(SpecError, match="the target's logits are float16 .* but the draft's are float32"):
        repository.plan_settings(spec, "reference", tmp_path / "r")


@pytest.mark.parametrize("backend", ["trtllm", "reference"])
def test_the_entry_points_name_the_serving_gate_the_repository_has(tmp_path, backend):
    """The drain closes `serving_gate`; the BLS and preprocessing (the ensemble's first step) refuse new requests
    while it is closed, so both must name that model, and it must be a model of the repository."""
    from specbuild.contract import serving_gate

    settings, files = rendered(tmp_path, backend)
    built = configs.build_all(settings)
    gate = built[serving_gate.MODEL_NAME]
    assert gate.backend == "python" and gate.max_batch_size == 0 and f"{gate.name}/1/model.py" in files
    assert [o.name for o in gate.output] == [serving_gate.OUTPUT] and not gate.HasField("dynamic_batching")
    for entry in ("tensorrt_llm_bls", "preprocessing"):
        assert params(built[entry])[serving_gate.GATE_PARAMETER] == gate.name, entry
    assert "serving_gate" not in params(built["postprocessing"])  # called for running ensemble requests' responses


def test_the_bls_final_response_is_one_table_sent_and_read():
    """contract.tensors.BLS_FINAL_OUTPUTS: the BLS builds its final response from it (final_values refuses a name
    missing or unknown), its config declares each with BLS_OUTPUTS' type, and the client reads the same names."""
    import numpy as np

    from specbuild.triton import client

    declared = {t.name: t for t in tensors.BLS_OUTPUTS}
    assert set(tensors.BLS_FINAL_OUTPUTS) <= set(declared)
    assert client.STAT_OUTPUTS == tensors.BLS_FINAL_OUTPUTS and set(client.TEXT_OUTPUTS) == {
        "finish_reason",
        "stop_reason",
    }
    values = {name: None for name in tensors.BLS_FINAL_OUTPUTS}
    values.update(finish_reason="stop", output_ids=[5, 6], num_output_tokens=2, speculation_stats={"k": {"k": 2}})
    arrays = tensors.final_values(values)
    assert set(arrays) == {"finish_reason", "output_ids", "num_output_tokens", "speculation_stats"}
    assert arrays["output_ids"].dtype == np.int32 and arrays["output_ids"].shape == (1, 2)
    assert arrays["finish_reason"].tolist() == [[b"stop"]] and arrays["num_output_tokens"].shape == (1, 1)
    assert client._stats({name: array for name, array in arrays.items()})["speculation_stats"] == {"k": {"k": 2}}
    with pytest.raises(ValueError, match="missing"):
        tensors.final_values({"finish_reason": "stop"})
    with pytest.raises(ValueError, match=r"unknown \['draft_tokens'\], missing \[\]"):
        tensors.final_values({**values, "draft_tokens": 3})
    empty = tensors.final_values({**values, "output_ids": [], "stop_reason": b"</s>", "finish_reason": "length"})
    assert empty["output_ids"].shape == (1, 0) and empty["stop_reason"].tolist() == [[b"</s>"]]
    assert empty["finish_reason"].tolist() == [[b"length"]] and empty["speculation_stats"].shape == (1, 1)


def test_the_bls_reads_back_the_record_repo_wrote(tmp_path):
    """contract.bls_params is the one record: the config writer writes it, the BLS and clients read it back."""
    from specbuild.contract import serving_gate
    from specbuild.contract.bls_params import BlsParameters

    settings, files = rendered(
        tmp_path,
        "reference",
        speculative={"max_draft_len": 5, "num_draft_tokens": 3, "overlap": "auto", "adaptive": False},
    )
    written = params(pbtxt.parse_pbtxt(files["tensorrt_llm_bls/config.pbtxt"]))
    read = BlsParameters.from_parameters(written)
    assert read.to_parameters() == written  # every parameter the writer writes is a field, and nothing else
    assert (read.max_draft_len, read.num_draft_tokens, read.overlap, read.adaptive_draft_len) == (5, 3, "auto", False)
    assert (read.max_input_len, read.max_output_len, read.max_concurrent_requests) == (100, 200, 6)
    assert read.serving_gate == serving_gate.MODEL_NAME and serving_gate.GATE_PARAMETER in written


def test_the_bls_record_refuses_a_missing_or_bad_parameter_by_name():
    from specbuild.contract.bls_params import BlsParameters

    good = BlsParameters(
        max_draft_len=4, num_draft_tokens=2, max_input_len=8, max_output_len=8, tokenizer_dir="t"
    ).to_parameters()
    for key, value, message in (
        ("tokenizer_dir", "", "'tokenizer_dir' is required"),
        ("max_input_len", "${max_input_len}", "'max_input_len' is required"),
        ("max_draft_len", "four", "'max_draft_len' = 'four' is invalid: use an integer"),
        ("use_draft_logits", "maybe", "'use_draft_logits' = 'maybe' is invalid"),
        ("overlap", "sometimes", "'overlap' = 'sometimes' is invalid"),
    ):
        with pytest.raises(ValueError, match=message):
            BlsParameters.from_parameters({**good, key: value})
    older = {key: value for key, value in good.items() if key not in ("overlap", "max_queue_size", "serving_gate")}
    assert BlsParameters.from_parameters(older) == BlsParameters.from_parameters(good)  # an older repository
