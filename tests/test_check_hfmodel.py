"""specbuild.hfmodel: checkpoint facts and the refusals (missing, pickle-only, no weights...)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from check_fixtures import llama_config, llama_tensors, write_checkpoint

import specbuild
from specbuild.errors import CheckpointError
from specbuild.hfmodel import SUPPORTED_ARCHITECTURES, info_from_config, read_model_info


def test_reads_a_real_transformers_checkpoint(tmp_path):
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(tmp_path, safe_serialization=True)
    info = read_model_info(tmp_path)
    assert info.num_params == model.num_parameters()
    assert info.num_params_source == "safetensors"
    assert info_from_config(json.loads((tmp_path / "config.json").read_text())).num_params == model.num_parameters()
    assert (info.architecture, info.trtllm_model_type, info.vocab_size) == ("LlamaForCausalLM", "llama", 300)
    assert (info.num_layers, info.num_heads, info.num_kv_heads, info.head_dim) == (2, 4, 2, 8)
    assert info.max_position_embeddings == info.position_limit == 512
    assert info.rope_scaling is None
    assert info.has_safetensors and info.weight_files == ("model.safetensors",)


def test_safetensors_header_count_wins_over_the_config_estimate(tmp_path):
    folder = write_checkpoint(tmp_path / "m", 100)
    # config says 1 layer and the file has 1 layer: both agree ...
    assert read_model_info(folder).num_params == info_from_config(llama_config(100)).num_params
    # ... but a config lying about the layer count does not change the counted parameters
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 5}))
    info = read_model_info(folder)
    assert info.num_layers == 5
    assert info.num_params == info_from_config(llama_config(100)).num_params


def test_sharded_checkpoint_counts_only_the_indexed_shards(tmp_path):
    from safetensors.numpy import save_file

    folder = write_checkpoint(tmp_path / "m", 100)
    tensors = dict(sorted(llama_tensors(llama_config(100)).items()))
    names = list(tensors)
    (folder / "model.safetensors").unlink()
    save_file({n: tensors[n] for n in names[:4]}, str(folder / "model-00001-of-00002.safetensors"))
    save_file({n: tensors[n] for n in names[4:]}, str(folder / "model-00002-of-00002.safetensors"))
    save_file(tensors, str(folder / "consolidated.safetensors"))  # the original-format copy Mistral repos ship
    weight_map = {n: f"model-0000{1 if i < 4 else 2}-of-00002.safetensors" for i, n in enumerate(names)}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    info = read_model_info(folder)
    assert info.num_params == sum(t.size for t in tensors.values())
    assert info.weight_files == ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"1 weight shard\(s\) named in model.safetensors.index.json are missing"):
        read_model_info(folder)


def test_missing_folder(tmp_path):
    with pytest.raises(CheckpointError, match=r"target checkpoint '.*nope' does not exist\. Fix target\.checkpoint"):
        read_model_info(tmp_path / "nope", role="target")


def test_a_file_instead_of_a_folder(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="is not a folder"):
        read_model_info(tmp_path / "model.safetensors")


def test_no_config_json(tmp_path):
    with pytest.raises(CheckpointError, match="has no config.json: not a Hugging Face model folder"):
        read_model_info(tmp_path)


def test_invalid_config_json(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json is not valid JSON"):
        read_model_info(tmp_path)


NOBODY = 65534  # the unprivileged user and group of Debian and most Linux images


def read_as_nobody(folder: Path) -> subprocess.CompletedProcess:
    """read_model_info(folder) in a child process that gives up root for the user nobody once it has imported what
    it needs (the interpreter may live where only root may go): root reads a file whatever its mode, so where the
    suite runs as root (CI's containers) a file's permissions are tried by a process they bind."""
    code = (
        "import os, sys\n"
        "from specbuild.errors import CheckpointError\n"
        "from specbuild.hfmodel import read_model_info\n"
        f"os.setgroups([]); os.setgid({NOBODY}); os.setuid({NOBODY})\n"
        "try:\n    read_model_info(sys.argv[1])\n"
        "except CheckpointError as err:\n    print(err)\n    sys.exit(3)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(specbuild.__file__).resolve().parents[1])}
    return subprocess.run(
        [sys.executable, "-c", code, str(folder)], env=env, cwd="/", capture_output=True, text=True, timeout=120
    )


def test_unreadable_config_json(tmp_path):
    """A config.json its reader may not open, by its mode: the refusal names the file and the cause."""
    if os.geteuid() != 0:
        folder = write_checkpoint(tmp_path / "m", 100)
        (folder / "config.json").chmod(0)
        try:
            with pytest.raises(CheckpointError, match=r"config.json cannot be read \(Permission denied\)"):
                read_model_info(folder)
        finally:
            (folder / "config.json").chmod(0o644)
        return
    outer = Path(tempfile.mkdtemp(prefix="specbuild-unreadable-"))  # pytest's own folders are root's alone (0700)
    try:
        outer.chmod(0o755)
        folder = write_checkpoint(outer / "m", 100)
        for path in folder.iterdir():
            path.chmod(0o644)  # everything readable by anyone (safetensors writes 0600) but config.json
        (folder / "config.json").chmod(0)
        done = read_as_nobody(folder)
        assert done.returncode == 3, done.stdout + done.stderr
        assert "config.json cannot be read (Permission denied)" in done.stdout
        (folder / "config.json").chmod(0o644)
        readable = read_as_nobody(folder)
        assert readable.returncode == 0, readable.stdout + readable.stderr  # readable: the mode was the cause
    finally:
        shutil.rmtree(outer)


def test_config_without_architectures(tmp_path):
    folder = write_checkpoint(tmp_path / "m", 100)
    config = json.loads((folder / "config.json").read_text())
    del config["architectures"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="no 'architectures' list"):
        read_model_info(folder)


def test_config_without_hidden_size(tmp_path):
    folder = write_checkpoint(tmp_path / "m", 100)
    config = json.loads((folder / "config.json").read_text())
    del config["hidden_size"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="no positive integer 'hidden_size'"):
        read_model_info(folder)


def test_no_weights(tmp_path):
    folder = write_checkpoint(tmp_path / "m", 100, weights="none")
    with pytest.raises(CheckpointError, match=r"has no weights \(\*\.safetensors\)"):
        read_model_info(folder)


def test_pickle_only_is_refused_unless_allowed(tmp_path):
    folder = write_checkpoint(tmp_path / "m", 100, weights="pickle")
    with pytest.raises(CheckpointError) as err:
        read_model_info(folder, role="draft")
    assert "has only pickle weights (pytorch_model.bin)" in str(err.value)
    assert "Convert it to safetensors" in str(err.value) and "--allow-pickle" in str(err.value)
    info = read_model_info(folder, allow_pickle=True)
    assert not info.has_safetensors
    assert info.num_params_source == "config"
    assert info.weight_files == ("pytorch_model.bin",)


def test_safetensors_preferred_when_both_exist(tmp_path):
    folder = write_checkpoint(tmp_path / "m", 100)
    (folder / "pytorch_model.bin").write_bytes(b"pickle")
    info = read_model_info(folder)  # no --allow-pickle needed: the pickle is never used
    assert info.has_safetensors and info.weight_files == ("model.safetensors",)


def test_corrupt_safetensors_header(tmp_path):
    folder = write_checkpoint(tmp_path / "m", 100)
    (folder / "model.safetensors").write_bytes((20).to_bytes(8, "little") + b"{broken")
    with pytest.raises(CheckpointError, match="corrupt safetensors header"):
        read_model_info(folder)
    (folder / "model.safetensors").write_bytes(b"abc")
    with pytest.raises(CheckpointError, match="truncated safetensors file"):
        read_model_info(folder)


def test_position_limit_with_rope_scaling():
    base = llama_config(100, max_position_embeddings=4096)
    assert info_from_config({**base, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}).position_limit == 8192
    assert info_from_config({**base, "rope_scaling": {"type": "yarn", "factor": 4.0}}).position_limit == 16384
    # llama3 rope: max_position_embeddings already is the scaled length
    llama3 = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 512}
    assert info_from_config({**base, "rope_scaling": llama3}).position_limit == 4096
    # transformers 5 writes rope_parameters without scaling: no factor applies
    plain = info_from_config({**base, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}})
    assert plain.rope_scaling is None and plain.position_limit == 4096
    assert info_from_config({k: v for k, v in base.items() if k != "max_position_embeddings"}).position_limit is None


def test_multimodal_config_is_refused():
    with pytest.raises(CheckpointError, match="multimodal checkpoint"):
        info_from_config({"architectures": ["LlavaForConditionalGeneration"], "text_config": {"hidden_size": 8}})


def test_supported_architectures_match_modelopt_export_types():
    """Our table must give the model_type modelopt's export derives from the class name."""
    pytest.importorskip("modelopt")
    from modelopt.torch.export.model_utils import get_model_type

    for name, model_type in SUPPORTED_ARCHITECTURES.items():
        fake_model = type(name, (), {})()
        assert get_model_type(fake_model) == model_type, name


def test_summary_is_json_ready(tmp_path):
    info = read_model_info(write_checkpoint(tmp_path / "m", 100))
    summary = json.loads(json.dumps(info.summary()))
    assert summary["path"] == str(Path(tmp_path / "m").resolve())
    assert summary["weight_format"] == "safetensors" and summary["trtllm_model_type"] == "llama"


def test_end_ids_are_read_once_for_every_path(tmp_path):
    """generation_config.json's eos_token_id, an id or a list (kept in order, each once), else config.json's; the
    tokenizer's eos joins them; the first is what the models get as end_id."""
    from specbuild.hfmodel import end_ids, listed_end_ids

    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 2}))
    assert listed_end_ids(tmp_path) == [2]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [128001, 128008, 128009, 128001]}))
    assert listed_end_ids(tmp_path) == [128001, 128008, 128009]
    assert end_ids(128001, [128008, 128009, 128009]) == (128001, 128008, 128009)
    assert end_ids(None, [None, 5]) == (5,)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": ["x", True]}))
    assert listed_end_ids(tmp_path) == [2]  # nothing usable there: config.json's
    assert listed_end_ids(tmp_path / "absent") == []
