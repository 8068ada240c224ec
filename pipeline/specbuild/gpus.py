"""One record per known GPU (its usable memory, SM version, memory bandwidth and where the figures come from) and the
cost model of a decode step on it.

A decode or verify step at small batch is memory-bound: every weight is read once per step and every row reads its
KV cache once, so the step takes about (weight bytes + KV bytes read) / achieved bandwidth, plus a fixed launch cost
per decoder layer. What the model cannot know: how close a given engine's kernels come to the bandwidth (taken as
`ACHIEVED_BANDWIDTH_FRACTION` of peak), compute-bound batches (large batches, long prefills), multi-GPU
communication, and the scheduler's own time between steps.

`specbuild.config.GPUS` (the memory and SM a spec's `[gpu] name` stands for), `bench.theory`'s cost ratio estimate,
the timed stand-in (`reference.timing`) and `bench --predict` all read this table.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_gib: float  # usable memory as the driver reports it
    sm: int  # compute capability x 10
    bandwidth_gbs: float  # peak memory bandwidth, GB/s (10^9 bytes)
    source: str  # where the bandwidth figure is published


DATA_CENTER = "https://www.nvidia.com/en-us/data-center/"
GPUS: dict[str, Gpu] = {
    gpu.name: gpu
    for gpu in (
        Gpu("H100-80GB", 79.6, 90, 3350.0, DATA_CENTER + "h100/ (H100 SXM: 3.35 TB/s)"),
        Gpu("H100-94GB", 93.1, 90, 3900.0, DATA_CENTER + "h100/ (H100 NVL: 3.9 TB/s)"),
        Gpu("H200", 139.8, 90, 4800.0, DATA_CENTER + "h200/ (4.8 TB/s)"),
        Gpu("H20", 95.0, 90, 4000.0, "NVIDIA H20 product brief as published by OEMs (4.0 TB/s); no NVIDIA web page"),
        Gpu("GH200", 94.5, 90, 4000.0, DATA_CENTER + "grace-hopper-superchip/ (96 GB HBM3: 4 TB/s)"),
        Gpu("B200", 178.4, 100, 8000.0, DATA_CENTER + "dgx-b200/ (64 TB/s for 8 GPUs: 8 TB/s each)"),
        Gpu("A100-80GB", 79.2, 80, 2039.0, DATA_CENTER + "a100/ (A100 80GB SXM: 2,039 GB/s)"),
        Gpu("A100-40GB", 39.4, 80, 1555.0, DATA_CENTER + "a100/ (A100 40GB SXM: 1,555 GB/s)"),
        Gpu("A10G", 22.0, 86, 600.0, "https://aws.amazon.com/ec2/instance-types/g5/ (A10G, 24 GB GDDR6: 600 GB/s)"),
        Gpu("L4", 22.0, 89, 300.0, DATA_CENTER + "l4/ (300 GB/s)"),
        Gpu("L40S", 44.4, 89, 864.0, DATA_CENTER + "l40s/ (864 GB/s)"),
        Gpu("RTX-4090", 23.6, 89, 1008.0, "https://www.nvidia.com/en-us/geforce/graphics-cards/40-series/rtx-4090/"),
        Gpu("RTX-6000-ADA", 47.5, 89, 960.0, "https://www.nvidia.com/en-us/design-visualization/rtx-6000/ (960 GB/s)"),
    )
}

ACHIEVED_BANDWIDTH_FRACTION = 0.7  # decode kernels reach roughly this share of peak bandwidth (an assumption)
LAUNCH_SECONDS_PER_LAYER = 5e-6  # fixed cost per decoder layer per step (kernel launches), an assumption
ASSUMPTIONS = (
    f"memory-bound steps at {ACHIEVED_BANDWIDTH_FRACTION:.0%} of peak bandwidth (weights once per step, each row's "
    f"KV cache once), plus {LAUNCH_SECONDS_PER_LAYER * 1e6:.0f} us per layer per step"
)


def lookup(name: str) -> Gpu:
    """The record of `name`, matched without regard to case; KeyError lists the known names."""
    for key, gpu in GPUS.items():
        if key.lower() == name.strip().lower():
            return gpu
    raise KeyError(f"unknown GPU {name!r}: known GPUs are {', '.join(GPUS)}")


def step_seconds(gpu: Gpu, weight_bytes: float, layers: int, kv_bytes: float = 0.0) -> float:
    """One memory-bound step on `gpu`: weights read once, `kv_bytes` of KV cache read in all, plus the launch floor."""
    return (weight_bytes + kv_bytes) / (gpu.bandwidth_gbs * 1e9 * ACHIEVED_BANDWIDTH_FRACTION) + (
        layers * LAUNCH_SECONDS_PER_LAYER
    )
