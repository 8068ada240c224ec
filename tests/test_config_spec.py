"""The spec file: typed values, cross-field rules, and messages that name the field, value and fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from specbuild.config import GPUS, Spec, load_spec, replace, spec_from_dict
from specbuild.errors import SpecError

BASE = Path("/specs")


def raw(**sections):
    data = {"target": {"checkpoint": "models/target"}, "draft": {"checkpoint": "/abs/draft"}}
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values} if isinstance(values, dict) else values
    return data


def error(data) -> str:
    with pytest.raises(SpecError) as err:
        spec_from_dict(data, base_dir=BASE)
    return str(err.value)


def test_minimal_spec_gets_the_defaults():
    spec = spec_from_dict(raw(), base_dir=BASE)
    assert spec.name == "pair"
    assert spec.target.checkpoint == Path("/specs/models/target")  # relative to the spec's folder
    assert spec.draft.checkpoint == Path("/abs/draft")
    assert spec.output_dir == Path("/specs/engines")
    assert (spec.target.quantization, spec.speculative.max_draft_len, spec.gpu.name) == ("none", 4, "H100-80GB")
    assert spec.pair_dir == Path("/specs/engines/pair")
    assert spec.speculative.overlap == "auto"
    for value in (True, False, "auto"):
        assert (
            spec_from_dict(raw(speculative={"overlap": value}), base_dir=BASE).speculative.overlap is value
            or value == "auto"
        )


def test_home_folder_paths_are_expanded(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    spec = spec_from_dict({**raw(target={"checkpoint": "~/llama"}), "output_dir": "~/out"}, base_dir=BASE)
    assert spec.target.checkpoint == tmp_path / "llama"
    assert spec.output_dir == tmp_path / "out"


@pytest.mark.parametrize(
    "data, message",
    [
        ({**raw(), "targte": {}}, "spec: unknown key 'targte'. Did you mean \"target\"?"),
        (raw(build={"max_seqlen": 10}), "[build]: unknown key 'max_seqlen'. Did you mean \"max_seq_len\"?"),
        (
            raw(speculative={"max_draft_length": 3}),
            "[speculative]: unknown key 'max_draft_length'. Did you mean \"max_draft_len\"?",
        ),
        (raw(gpu={"memory": 80}), "[gpu]: unknown key 'memory'. Did you mean \"memory_gib\"?"),
        (raw(gpu={"zzz": 1}), "[gpu]: unknown key 'zzz'. Known keys: name, memory_gib, count, draft_device_ids."),
    ],
)
def test_unknown_keys_suggest_the_closest(data, message):
    assert error(data) == message


@pytest.mark.parametrize(
    "data, message",
    [
        (
            raw(target={"quantization": "fp9"}),
            "target.quantization = 'fp9' is not supported. Did you mean \"fp8\"? Choose one of: none, fp8, int8_sq, "
            "int4_awq, w4a8_awq, int8_wo, int4_wo.",
        ),
        (raw(draft={"quantization": "awq"}), "draft.quantization = 'awq' is not supported."),
        (raw(target={"dtype": "fp16"}), "target.dtype = 'fp16' is not supported."),
        (raw(gpu={"name": "H100"}), 'gpu.name = \'H100\' is not supported. Did you mean "H100-80GB" or "H100-94GB"?'),
        (raw(gpu={"name": "h200"}), "gpu.name = 'h200' is not supported. Did you mean \"H200\"?"),
        (raw(gpu={"name": "A100-80G"}), "gpu.name = 'A100-80G' is not supported. Did you mean \"A100-80GB\"?"),
        (raw(gpu={"name": "TPU-v5"}), "gpu.name = 'TPU-v5' is not supported. Choose one of: H100-80GB"),
        (raw(target={"kv_cache": "int8"}), "target.kv_cache = 'int8' cannot be used: an INT8 KV cache disables"),
        (raw(target={"kv_cache": "fp4"}), "target.kv_cache = 'fp4' is not supported."),
    ],
)
def test_unknown_choices(data, message):
    assert error(data).startswith(message)


@pytest.mark.parametrize(
    "section, key, value, minimum",
    [
        ("build", "max_batch_size", 0, 1),
        ("build", "max_batch_size", -1, 1),
        ("build", "max_input_len", 0, 1),
        ("build", "max_seq_len", -2048, 1),
        ("build", "max_num_tokens", 0, 1),
        ("build", "tp_size", 0, 1),
        ("build", "pp_size", 0, 1),
        ("speculative", "max_draft_len", 0, 1),
        ("speculative", "num_draft_tokens", -1, 0),
        ("gpu", "count", 0, 1),
        ("serve", "bls_instance_count", 0, 1),
        ("serve", "max_queue_size", -1, 0),
    ],
)
def test_zero_and_negative_limits(section, key, value, minimum):
    assert error(raw(**{section: {key: value}})) == f"{section}.{key} = {value}: must be >= {minimum}."


def test_gpu_memory_must_be_positive():
    assert error(raw(gpu={"name": "custom", "memory_gib": 0})) == "gpu.memory_gib = 0.0: must be >= 1."
    assert error(raw(gpu={"name": "custom", "memory_gib": -8})) == "gpu.memory_gib = -8.0: must be >= 1."


@pytest.mark.parametrize(
    "data, message",
    [
        (raw(build={"max_seq_len": "2048"}), "build.max_seq_len = '2048': expected an integer."),
        (raw(build={"max_seq_len": 2048.0}), "build.max_seq_len = 2048.0: expected an integer."),
        (raw(build={"tp_size": True}), "build.tp_size = True: expected an integer."),
        (raw(speculative={"adaptive": "yes"}), "speculative.adaptive = 'yes': expected true or false."),
        (raw(speculative={"overlap": "yes"}), "speculative.overlap = 'yes': expected true, false or \"auto\"."),
        (raw(speculative={"overlap": 1}), 'speculative.overlap = 1: expected true, false or "auto".'),
        (raw(gpu={"memory_gib": "80"}), "gpu.memory_gib = '80': expected a number."),
        (raw(target={"checkpoint": ""}), "target.checkpoint = '': expected a non-empty string."),
        ({**raw(), "build": 4}, "[build] must be a table, got 4."),
        ({**raw(), "name": 3}, "name = 3: expected a non-empty string."),
        ({**raw(), "name": "my/pair"}, "name = 'my/pair': use letters, digits"),
    ],
)
def test_wrong_types(data, message):
    assert error(data).startswith(message)


def test_missing_tables_and_fields():
    assert error({"target": {"checkpoint": "t"}}) == (
        "the spec has no [draft] table, and speculative.drafter = 'model' needs a draft model: add [draft] with "
        'checkpoint = "<HF model dir>", or set speculative.drafter = "lookup" (a target-only deployment).'
    )
    assert error({"target": {"checkpoint": "t"}, "speculative": {"drafter": "hybrid"}}).startswith(
        "the spec has no [draft] table, and speculative.drafter = 'hybrid' needs a draft model"
    )
    assert error(raw(draft={"checkpoint": None}) | {"draft": {}}).startswith("[draft] is missing checkpoint")


def test_cross_field_rules():
    assert error(raw(speculative={"num_draft_tokens": 5})).startswith(
        "speculative.num_draft_tokens = 5 exceeds max_draft_len = 4"
    )
    assert error(raw(build={"max_input_len": 2048})).startswith(
        "build.max_input_len = 2048 must be below build.max_seq_len = 2048"
    )
    assert error(raw(build={"tp_size": 2})).startswith(
        "build.tp_size x pp_size = 2 needs that many GPUs, but gpu.count = 1."
    )
    assert error(raw(serve={"http_port": 70000})).startswith("serve.http_port = 70000: must be a TCP port")
    assert error(raw(gpu={"name": "custom"})).startswith("gpu.name = 'custom' is not supported.")


def test_draft_device_ids_place_the_draft_and_are_checked():
    two = spec_from_dict(raw(gpu={"count": 2}), base_dir=BASE)
    assert (two.device_ids("target"), two.device_ids("draft")) == ((0,), (1,))  # unset: its own when count allows
    shared = spec_from_dict(raw(gpu={"count": 2, "draft_device_ids": [0]}), base_dir=BASE)
    assert shared.device_ids("draft") == (0,) and shared.gpu.draft_device_ids == (0,)
    four = spec_from_dict(raw(gpu={"count": 4, "draft_device_ids": [3, 2]}, build={"tp_size": 2}), base_dir=BASE)
    assert four.device_ids("target") == (0, 1) and four.device_ids("draft") == (3, 2)
    assert spec_from_dict(four.to_dict(), base_dir=BASE).gpu.draft_device_ids == (3, 2)  # manifests round-trip
    assert error(raw(gpu={"count": 2, "draft_device_ids": [1, 0]})) == (
        "gpu.draft_device_ids = [1, 0]: the draft engine runs on tp_size x pp_size = 1 GPU; list 1."
    )
    assert error(raw(gpu={"count": 2, "draft_device_ids": [2]})) == (
        "gpu.draft_device_ids = [2]: list distinct GPU numbers in 0..1 (gpu.count = 2)."
    )
    assert error(raw(gpu={"count": 4, "draft_device_ids": [1, 2]}, build={"tp_size": 2})).startswith(
        "gpu.draft_device_ids = [1, 2] shares some GPUs with the target's [0, 1]: give the draft the target's GPUs "
        "or GPUs of its own"
    )
    assert error(raw(gpu={"draft_device_ids": 1})) == "gpu.draft_device_ids = 1: expected a list of integers, e.g. [1]."


def test_custom_gpu_with_memory():
    spec = spec_from_dict(raw(gpu={"name": "lab-card", "memory_gib": 48}), base_dir=BASE)
    assert spec.gpu.memory_per_gpu_gib == 48.0 and spec.gpu.sm is None
    known = spec_from_dict(raw(gpu={"name": "L40S"}), base_dir=BASE)
    assert (known.gpu.memory_per_gpu_gib, known.gpu.sm) == GPUS["L40S"]


def test_load_spec_errors(tmp_path):
    with pytest.raises(SpecError, match=r"spec file '.*nope.toml' not found\. Create one with `specbuild init`"):
        load_spec(tmp_path / "nope.toml")
    with pytest.raises(SpecError, match="is a folder. Pass the spec file itself"):
        load_spec(tmp_path)
    bad = tmp_path / "bad.toml"
    bad.write_text("[target\ncheckpoint = 1")
    with pytest.raises(SpecError, match="bad.toml: not valid TOML"):
        load_spec(bad)
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(SpecError, match="cannot be read"):
        load_spec(binary)


def test_load_spec_resolves_against_its_folder(tmp_path):
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "specbuild.toml"
    path.write_text('name = "p"\n[target]\ncheckpoint = "../t"\n[draft]\ncheckpoint = "d"\n')
    spec = load_spec(path)
    assert spec.target.checkpoint == tmp_path / "t"
    assert spec.draft.checkpoint == tmp_path / "sub" / "d"
    assert spec.path == path.resolve()


def test_replace_revalidates():
    spec = spec_from_dict(raw(), base_dir=BASE)
    assert replace(spec, "build", max_seq_len=4096).build.max_seq_len == 4096
    with pytest.raises(SpecError, match="build.max_seq_len = 0: must be >= 1."):
        replace(spec, "build", max_seq_len=0)
    with pytest.raises(SpecError, match="unknown role 'critic'"):
        spec.role("critic")


def test_to_dict_is_plain_and_round_trips():
    spec = spec_from_dict(raw(target={"quantization": "fp8"}), base_dir=BASE)
    data = spec.to_dict()
    assert data["target"]["checkpoint"] == "/specs/models/target" and "path" not in data
    again = spec_from_dict(data, base_dir=Path("/elsewhere"))
    assert isinstance(again, Spec) and again.to_dict() == data
