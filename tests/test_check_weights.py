"""The NaN/Inf scan of `specbuild check` (specbuild.check.weights), on hand-made safetensors files.

The files are written byte by byte here (8-byte header size, JSON header, data), so every dtype,
including bfloat16 and FP8 that numpy cannot hold, can be tested bit pattern by bit pattern.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from check_fixtures import make_pair
from click.testing import CliRunner

from specbuild.check import weights
from specbuild.cli import main


def write_raw(path: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> Path:
    """A safetensors file from {name: (dtype, shape, raw bytes)}, tensors in the given order."""
    header, blobs, at = {}, [], 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    return path


def poison(path: Path, tensor: str, positions: list[int], value: float = float("nan")) -> None:
    """Overwrite values of one float16/float32 tensor in place: the file keeps its size."""
    raw = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    entry = json.loads(raw[8 : 8 + n])[tensor]
    dtype = {"F16": np.float16, "F32": np.float32}[entry["dtype"]]
    start = 8 + n + entry["data_offsets"][0]
    size = np.dtype(dtype).itemsize
    for i in positions:
        raw[start + i * size : start + (i + 1) * size] = np.array([value], dtype=dtype).tobytes()
    before = path.stat().st_size
    path.write_bytes(bytes(raw))
    assert path.stat().st_size == before


def scan(folder: Path, *names: str) -> weights.WeightScan:
    return weights.scan_checkpoint(folder, list(names))


def counts(scan_result: weights.WeightScan) -> dict[str, tuple[int, int]]:
    return {t.tensor: (t.nan, t.inf) for t in scan_result.nonfinite}


def test_every_float16_and_bfloat16_bit_pattern_is_classified_like_the_float_it_encodes(tmp_path):
    patterns = np.arange(1 << 16, dtype=np.uint16)
    as_f16 = patterns.view(np.float16)
    as_bf16 = (patterns.astype(np.uint32) << 16).view(np.float32)  # bfloat16 is float32's upper half
    write_raw(
        tmp_path / "m.safetensors",
        {"f16": ("F16", [1 << 16], patterns.tobytes()), "bf16": ("BF16", [1 << 16], patterns.tobytes())},
    )
    found = counts(scan(tmp_path, "m.safetensors"))
    assert found["f16"] == (int(np.isnan(as_f16).sum()), int(np.isinf(as_f16).sum())) == (2046, 2)
    assert found["bf16"] == (int(np.isnan(as_bf16).sum()), int(np.isinf(as_bf16).sum())) == (254, 2)


def test_every_fp8_bit_pattern_matches_torch(tmp_path):
    torch = pytest.importorskip("torch")
    patterns = np.arange(256, dtype=np.uint8)
    tensors, expected = {}, {}
    for dtype, torch_dtype in (
        ("F8_E4M3", torch.float8_e4m3fn),
        ("F8_E5M2", torch.float8_e5m2),
        ("F8_E4M3FNUZ", torch.float8_e4m3fnuz),
        ("F8_E5M2FNUZ", torch.float8_e5m2fnuz),
    ):
        values = torch.from_numpy(patterns.copy()).view(torch_dtype).float()
        tensors[dtype] = (dtype, [256], patterns.tobytes())
        expected[dtype] = (int(values.isnan().sum()), int(values.isinf().sum()))
    write_raw(tmp_path / "m.safetensors", tensors)
    assert counts(scan(tmp_path, "m.safetensors")) == expected
    assert expected == {"F8_E4M3": (2, 0), "F8_E5M2": (6, 2), "F8_E4M3FNUZ": (1, 0), "F8_E5M2FNUZ": (1, 0)}


def test_float32_float64_values_and_integer_tensors(tmp_path):
    f32 = np.ones(1000, np.float32)
    f32[[3, 500]] = np.nan
    f32[999] = -np.inf
    f64 = np.zeros(10, np.float64)
    f64[0] = np.inf
    ints = np.full(100, -1, np.int32)  # all bits set: an integer is never NaN
    write_raw(
        tmp_path / "m.safetensors",
        {
            "a": ("F32", [1000], f32.tobytes()),
            "b": ("F64", [10], f64.tobytes()),
            "ids": ("I32", [100], ints.tobytes()),
            "ok": ("F32", [4], bytes(16)),
        },
    )
    result = scan(tmp_path, "m.safetensors")
    assert counts(result) == {"a": (2, 1), "b": (0, 1)}
    assert result.tensors == 3 and result.not_scanned == {"I32": 1}
    assert result.bytes == 4000 + 80 + 16 and result.files == 1
    assert result.nonfinite[0].describe() == "m.safetensors: tensor 'a' (F32) has 2 NaN and 1 Inf of 1,000 values"


def test_chunk_and_release_boundaries_miss_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(weights, "CHUNK_BYTES", 64)  # 16 float32 per chunk
    monkeypatch.setattr(weights, "RELEASE_BYTES", 4096)
    values = np.zeros(5000, np.float32)
    bad = [0, 15, 16, 17, 1023, 1024, 4999]
    values[bad] = np.nan
    write_raw(tmp_path / "m.safetensors", {"pad": ("F16", [3], bytes(6)), "w": ("F32", [5000], values.tobytes())})
    seen = []
    result = weights.scan_checkpoint(tmp_path, ["m.safetensors"], progress=seen.append)
    assert counts(result) == {"w": (len(bad), 0)}
    assert sum(seen) == 6 + 20000 and max(seen) <= 4096 + 64


def test_truncated_file_is_named(tmp_path):
    path = write_raw(tmp_path / "m.safetensors", {"a": ("F32", [100], bytes(400)), "b": ("F32", [100], bytes(400))})
    path.write_bytes(path.read_bytes()[:-100])
    result = scan(tmp_path, "m.safetensors")
    assert not result.ok and result.tensors == 1
    assert result.damaged == [
        f"m.safetensors: tensor 'b' ends at byte {path.stat().st_size + 100:,} but the file has "
        f"{path.stat().st_size:,} bytes (truncated)"
    ]


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads VmHWM from /proc")
def test_scanning_a_file_larger_than_the_release_window_keeps_memory_bounded(tmp_path):
    size = 96 << 20
    ones = np.full(size // 4, 1.5, np.float32)
    write_raw(tmp_path / "big.safetensors", {"w": ("F32", [size // 4], ones.tobytes())})
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from specbuild.check import weights\n"
        "def peak_kib():  # VmHWM: this process's peak resident memory (ru_maxrss survives exec)\n"
        "    return int(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')))\n"
        "weights.RELEASE_BYTES = 8 << 20\n"
        "before = peak_kib()\n"
        "result = weights.scan_checkpoint(Path(sys.argv[1]), ['big.safetensors'])\n"
        "assert result.ok and result.bytes == 96 << 20\n"
        "print((peak_kib() - before) // 1024)\n"
    )
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, check=True)
    assert int(out.stdout) < 40, f"peak resident memory grew by {out.stdout.strip()} MiB for a 96 MiB file"


def check_json(spec: Path, *args: str):
    result = CliRunner().invoke(main, ["check", "-c", str(spec), "--json", *args])
    return result, json.loads(result.stdout)


def test_check_names_the_file_tensor_and_count_of_a_same_size_nan_corruption(tmp_path):
    spec = make_pair(tmp_path)
    poison(tmp_path / "draft" / "model.safetensors", "model.layers.0.mlp.up_proj.weight", [0, 7, 99])
    poison(tmp_path / "draft" / "model.safetensors", "lm_head.weight", [5], float("inf"))
    result, doc = check_json(spec)
    assert result.exit_code == 1 and doc["ok"] is False
    [problem] = doc["problems"]
    assert problem["code"] == "nonfinite_weights"
    assert problem["message"] == (
        f"the draft checkpoint {(tmp_path / 'draft').resolve()} holds non-finite weights: model.safetensors: tensor "
        "'lm_head.weight' (F16) has 1 Inf of 32,000 values; 1 more tensor(s) too: model.layers.0.mlp.up_proj.weight."
    )
    assert "cannot repair" in problem["fix"] or "no later stage can repair" in problem["fix"]
    draft = doc["weights"]["draft"]
    assert draft["scanned"] is True and draft["files"] == 1 and draft["bytes"] > 0 and draft["seconds"] >= 0
    assert [(t["tensor"], t["nan"], t["inf"]) for t in draft["nonfinite"]] == [
        ("lm_head.weight", 0, 1),
        ("model.layers.0.mlp.up_proj.weight", 3, 0),
    ]
    assert doc["weights"]["target"]["nonfinite"] == [] and doc["weights"]["target"]["damaged"] == []
    human = CliRunner().invoke(main, ["check", "-c", str(spec)])
    assert human.exit_code == 1
    assert "weights    target all finite" in human.stdout and "draft 4 NaN/Inf values" in human.stdout


def test_no_weight_scan_skips_it(tmp_path):
    spec = make_pair(tmp_path)
    poison(tmp_path / "target" / "model.safetensors", "model.norm.weight", [0])
    result, doc = check_json(spec, "--no-weight-scan")
    assert result.exit_code == 0 and doc["ok"] is True
    assert doc["weights"] == {
        "target": {"scanned": False, "reason": "--no-weight-scan"},
        "draft": {"scanned": False, "reason": "--no-weight-scan"},
    }
    assert list(doc) == [
        "ok",
        "pair",
        "backend",
        "models",
        "tokenizer",
        "vocab",
        "memory",
        "weights",
        "problems",
        "warnings",
    ]


def test_sharded_checkpoint_names_the_shard(tmp_path):
    spec = make_pair(tmp_path)
    folder = tmp_path / "target"
    raw = (folder / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    names = sorted(header)
    shards = {"model-00001-of-00002.safetensors": names[:3], "model-00002-of-00002.safetensors": names[3:]}
    for shard, members in shards.items():
        tensors = {}
        for m in members:
            begin, end = header[m]["data_offsets"]
            tensors[m] = (header[m]["dtype"], header[m]["shape"], data[begin:end])
        write_raw(folder / shard, tensors)
    (folder / "model.safetensors").unlink()
    index = {"weight_map": {m: shard for shard, members in shards.items() for m in members}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    poison(folder / "model-00002-of-00002.safetensors", names[-1], [1, 2])
    result, doc = check_json(spec)
    assert result.exit_code == 1
    assert f"model-00002-of-00002.safetensors: tensor '{names[-1]}' (F16) has 2 NaN of" in doc["problems"][0]["message"]
    assert doc["weights"]["target"]["files"] == 2


def test_truncated_checkpoint_is_a_problem(tmp_path):
    spec = make_pair(tmp_path)
    path = tmp_path / "target" / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-64])
    result, doc = check_json(spec)
    assert result.exit_code == 1
    [problem] = doc["problems"]
    assert problem["code"] == "weights_truncated" and "(truncated)" in problem["message"]


def test_up_checks_again_after_a_same_size_rewrite_of_the_weights(tmp_path):
    spec = make_pair(tmp_path)
    first = CliRunner().invoke(main, ["up", "-c", str(spec), "--until", "check", "--json"])
    assert first.exit_code == 0, first.output
    path = tmp_path / "target" / "model.safetensors"
    stat = path.stat()
    poison(path, "model.embed_tokens.weight", [10])
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # a later write, same size
    second = CliRunner().invoke(main, ["up", "-c", str(spec), "--until", "check", "--json"])
    assert second.exit_code == 1
    stage = json.loads(second.stdout)["stages"][0]
    assert stage["status"] == "failed" and "holds non-finite weights" in stage["error"]
    assert "model.embed_tokens.weight" in stage["error"]
