"""Non-finite weights: scan a checkpoint's safetensors tensors for NaN and Inf before any GPU work.

A checkpoint corrupted in place (same size, NaN bytes written over weights) passes every header
check and converts without complaint; only a forward pass shows it. `scan_checkpoint` reads every
floating-point tensor once, memory-mapped, CHUNK_BYTES at a time, and releases the pages it read
from the mapping every RELEASE_BYTES, so a checkpoint larger than RAM scans in constant memory.

Each value is judged by its bit pattern. IEEE 754 binary16/32/64 and bfloat16: NaN or Inf exactly
when every exponent bit is set (NaN when the mantissa is not zero). FP8 (OCP 8-bit floating point
specification): E5M2 likewise; E4M3 (`float8_e4m3fn`) has no Inf and its NaN is S.1111.111; the
`fnuz` variants' only NaN is 0x80; E8M0 (OCP microscaling) has NaN 0xFF.

File layout (https://github.com/huggingface/safetensors#format): 8 bytes little-endian header
size N, N bytes of JSON header, then the data; each tensor's `data_offsets` are [begin, end) from
the first data byte.
"""

from __future__ import annotations

import mmap
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specbuild.errors import CheckpointError
from specbuild.hfmodel import safetensors_header

CHUNK_BYTES = 1 << 20  # bytes tested per step: its temporaries stay in a core's cache (measured fastest)
RELEASE_BYTES = 64 << 20  # mapped pages are released (and progress reported) this often


@dataclass(frozen=True)
class BitLayout:
    bits: type  # the unsigned integer type of the element's width
    mask: int  # the bits that decide non-finiteness
    value: int  # (x & mask) == value  <=>  x is NaN or Inf
    mantissa: int | None  # non-zero mantissa marks NaN (else Inf); None: every match is NaN

    @property
    def itemsize(self) -> int:
        return np.dtype(self.bits).itemsize


FLOAT_LAYOUTS = {  # safetensors dtype -> bit layout; integer and boolean tensors cannot hold NaN or Inf
    "F64": BitLayout(np.uint64, 0x7FF0_0000_0000_0000, 0x7FF0_0000_0000_0000, 0x000F_FFFF_FFFF_FFFF),
    "F32": BitLayout(np.uint32, 0x7F80_0000, 0x7F80_0000, 0x007F_FFFF),
    "C64": BitLayout(np.uint32, 0x7F80_0000, 0x7F80_0000, 0x007F_FFFF),  # two float32 per value
    "F16": BitLayout(np.uint16, 0x7C00, 0x7C00, 0x03FF),
    "BF16": BitLayout(np.uint16, 0x7F80, 0x7F80, 0x007F),
    "F8_E5M2": BitLayout(np.uint8, 0x7C, 0x7C, 0x03),
    "F8_E4M3": BitLayout(np.uint8, 0x7F, 0x7F, None),
    "F8_E4M3FNUZ": BitLayout(np.uint8, 0xFF, 0x80, None),
    "F8_E5M2FNUZ": BitLayout(np.uint8, 0xFF, 0x80, None),
    "F8_E8M0": BitLayout(np.uint8, 0xFF, 0xFF, None),
}


@dataclass(frozen=True)
class BadTensor:
    file: str  # relative to the checkpoint folder
    tensor: str
    dtype: str
    values: int  # stored floating-point values in the tensor
    nan: int
    inf: int

    def describe(self) -> str:
        kinds = " and ".join(f"{n:,} {name}" for n, name in ((self.nan, "NaN"), (self.inf, "Inf")) if n)
        return f"{self.file}: tensor {self.tensor!r} ({self.dtype}) has {kinds} of {self.values:,} values"


@dataclass
class WeightScan:
    files: int = 0
    tensors: int = 0  # floating-point tensors scanned
    bytes: int = 0  # bytes of tensor data scanned
    seconds: float = 0.0
    not_scanned: dict[str, int] = field(default_factory=dict)  # dtype -> tensors skipped (integers, unknown)
    nonfinite: list[BadTensor] = field(default_factory=list)
    damaged: list[str] = field(default_factory=list)  # a file whose tensors lie outside it: what is wrong

    @property
    def ok(self) -> bool:
        return not self.nonfinite and not self.damaged

    def to_dict(self) -> dict[str, Any]:
        rate = self.bytes / self.seconds if self.seconds > 0 else None
        return {
            "scanned": True,
            "files": self.files,
            "tensors": self.tensors,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 4),
            "bytes_per_second": round(rate) if rate else None,
            "not_scanned": dict(sorted(self.not_scanned.items())),
            "nonfinite": [asdict(t) for t in self.nonfinite],
            "damaged": list(self.damaged),
        }


def count_nonfinite(buffer: Any, layout: BitLayout, offset: int, count: int) -> tuple[int, int]:
    """(NaN count, Inf count) among `count` elements of `buffer` from byte `offset` (no copy)."""
    bits = np.frombuffer(buffer, dtype=layout.bits, count=count, offset=offset)  # [count]
    bad = (bits & layout.mask) == layout.value
    n = int(np.count_nonzero(bad))
    if n == 0 or layout.mantissa is None:
        return n, 0
    nan = int(np.count_nonzero(bits[bad] & layout.mantissa))
    return nan, n - nan


def _release(mm: mmap.mmap, begin: int, end: int) -> None:
    """Drop pages [begin, end) from this mapping (the page cache keeps them): bounded resident memory."""
    if hasattr(mmap, "MADV_DONTNEED"):
        start = begin - begin % mmap.PAGESIZE
        mm.madvise(mmap.MADV_DONTNEED, start, end - start)


def _tensor_entries(
    path: Path, header: dict[str, Any], data_start: int, size: int, scan: WeightScan
) -> list[tuple[str, str, int, int]]:
    """(name, dtype, absolute begin, absolute end) of the floating-point tensors, in file order; tensors
    that lie outside the file are recorded in scan.damaged."""
    entries = []
    for name, entry in header.items():
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        dtype = entry.get("dtype") if isinstance(entry, dict) else None
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(o, int) for o in offsets)
            and 0 <= offsets[0] <= offsets[1]
        ):
            raise CheckpointError(
                f"{path}: tensor {name!r} has no valid data_offsets in the header. "
                "Download or save the checkpoint again."
            )
        begin, end = data_start + offsets[0], data_start + offsets[1]
        if end > size:
            scan.damaged.append(
                f"{path.name}: tensor {name!r} ends at byte {end:,} but the file has {size:,} bytes (truncated)"
            )
            continue
        layout = FLOAT_LAYOUTS.get(str(dtype))
        if layout is None:
            scan.not_scanned[str(dtype)] = scan.not_scanned.get(str(dtype), 0) + 1
        elif (end - begin) % layout.itemsize:
            scan.damaged.append(
                f"{path.name}: tensor {name!r} has {end - begin} bytes, not a whole number of {dtype} values"
            )
        else:
            entries.append((name, str(dtype), begin, end))
    return sorted(entries, key=lambda e: e[2])


def scan_file(path: Path, scan: WeightScan, label: str, progress: Callable[[int], None]) -> None:
    header = safetensors_header(path)
    with open(path, "rb") as f:
        data_start = 8 + int.from_bytes(f.read(8), "little")
        size = path.stat().st_size
        entries = _tensor_entries(path, header, data_start, size, scan)
        scan.files += 1
        if not entries:
            return
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            _scan_mapped(mm, entries, scan, label, progress)
        finally:
            try:
                mm.close()
            except BufferError:  # an exception in flight still holds a chunk's array; the GC unmaps it
                pass


def _scan_mapped(
    mm: mmap.mmap,
    entries: list[tuple[str, str, int, int]],
    scan: WeightScan,
    label: str,
    progress: Callable[[int], None],
) -> None:
    released = entries[0][2]
    for name, dtype, begin, end in entries:
        layout = FLOAT_LAYOUTS[dtype]
        step = CHUNK_BYTES - CHUNK_BYTES % layout.itemsize
        nan = inf = 0
        for at in range(begin, end, step):
            stop = min(at + step, end)
            chunk_nan, chunk_inf = count_nonfinite(mm, layout, at, (stop - at) // layout.itemsize)
            nan, inf = nan + chunk_nan, inf + chunk_inf
            if stop - released >= RELEASE_BYTES:
                _release(mm, released, stop)
                progress(stop - released)
                released = stop
        scan.tensors += 1
        scan.bytes += end - begin
        if nan or inf:
            scan.nonfinite.append(BadTensor(label, name, dtype, (end - begin) // layout.itemsize, nan, inf))
    if entries[-1][3] > released:
        _release(mm, released, entries[-1][3])
        progress(entries[-1][3] - released)


def scan_checkpoint(folder: Path, files: Sequence[str], progress: Callable[[int], None] = lambda n: None) -> WeightScan:
    """Scan the named safetensors files of `folder`; progress(n) is called with each chunk's byte count."""
    scan = WeightScan()
    started = time.perf_counter()
    for name in files:
        path = Path(folder) / name
        if path.suffix != ".safetensors":
            continue
        try:
            scan_file(path, scan, name, progress)
        except OSError as err:
            raise CheckpointError(f"{path}: cannot be read ({err.strerror}). Check its permissions.") from None
    scan.seconds = time.perf_counter() - started
    return scan


def weight_bytes(folder: Path, files: Sequence[str]) -> int:
    return sum((Path(folder) / name).stat().st_size for name in files if name.endswith(".safetensors"))


def check_weights(report: Any, infos: dict[str, Any], progress: bool = False) -> None:
    """Scan each role's safetensors weights; add a `weights` section and a problem per bad checkpoint.
    report: a CheckReport; infos: role -> ModelInfo (read_model_info)."""
    section: dict[str, Any] = {}
    total = sum(weight_bytes(info.path, info.weight_files) for info in infos.values() if info.has_safetensors)
    bar = None
    if progress:
        import sys

        from tqdm import tqdm

        bar = tqdm(total=total, unit="B", unit_scale=True, desc="check: NaN/Inf scan", file=sys.stderr, leave=False)
    try:
        for role, info in infos.items():
            if not info.has_safetensors:
                section[role] = {"scanned": False, "reason": "pickle weights: check does not load them"}
                continue
            scan = scan_checkpoint(info.path, info.weight_files, bar.update if bar else lambda n: None)
            section[role] = scan.to_dict()
            _report_findings(report, role, info.path, scan)
    finally:
        if bar is not None:
            bar.close()
    report.sections["weights"] = section


def _report_findings(report: Any, role: str, folder: Path, scan: WeightScan) -> None:
    if scan.nonfinite:
        first, rest = scan.nonfinite[0], scan.nonfinite[1:]
        more = f"; {len(rest)} more tensor(s) too: {', '.join(t.tensor for t in rest[:3])}" if rest else ""
        more += ", ..." if len(rest) > 3 else ""
        report.problem(
            "nonfinite_weights",
            f"the {role} checkpoint {folder} holds non-finite weights: {first.describe()}{more}.",
            "The checkpoint files are damaged (or were saved from a diverged training run); conversion copies "
            "the values, so no later stage can repair them. Download or save the checkpoint again and compare "
            "the files' sha256 with the source's.",
        )
    if scan.damaged:
        report.problem(
            "weights_truncated",
            f"the {role} checkpoint {folder} is incomplete: {scan.damaged[0]}"
            + (f" (and {len(scan.damaged) - 1} more)" if len(scan.damaged) > 1 else "")
            + ".",
            "Download the file again: its size must match the source's.",
        )


def smoke_failure_advice(source: Path, converted: Path) -> str:
    """What to do when an engine's logits are not finite: find which weights hold NaN/Inf.
    source: the Hugging Face checkpoint; converted: the TensorRT-LLM checkpoint made from it."""
    from specbuild.hfmodel import read_model_info

    try:
        info = read_model_info(source)
        bad = scan_checkpoint(source, info.weight_files).nonfinite if info.has_safetensors else []
    except CheckpointError:
        bad = []
    if bad:
        return (
            f"The source checkpoint {source} holds non-finite weights ({bad[0].describe()}"
            + (f"; {len(bad) - 1} more tensor(s)" if len(bad) > 1 else "")
            + "): conversion copies them, so "
            "`specbuild convert --force` cannot help. Download or save the checkpoint again, and run "
            "`specbuild check`, which scans for them."
        )
    converted_files = sorted(p.name for p in Path(converted).glob("*.safetensors"))
    bad = scan_checkpoint(converted, converted_files).nonfinite
    if bad:
        return (
            f"The source weights are finite but the converted checkpoint {converted} is not "
            f"({bad[0].describe()}): the conversion produced them. Run `specbuild convert --force` and check "
            "its log."
        )
    return (
        "Every weight is finite, so the forward pass itself overflowed: check the checkpoint's dtype and "
        "config.json (e.g. rope or norm settings), and report this with them."
    )
