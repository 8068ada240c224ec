"""Run the exactness tests under each CPU kernel selection this machine can emulate.

    python scripts/kernel_matrix.py [--all] [--budget SECONDS]        (make test-kernels)

The reference runtime's bit-exactness (speculative greedy output == target-only output) rests on
row-block invariance, which depends on the code path the math libraries take on a given CPU
(reference/exactness.py). One machine can take other CPUs' code paths through environment controls:
- ATEN_CPU_CAPABILITY=default|avx2|avx512: torch's own vectorized kernels (softmax, exp, norms);
- MKL_ENABLE_INSTRUCTIONS=SSE4_2|AVX2|AVX512: the highest instruction set MKL dispatches to, i.e.
  the SGEMM kernels a CPU without AVX-512 (or AVX2) gets;
- MKL_CBWR=COMPATIBLE|<ISA>,STRICT: MKL's conditional numerical reproducibility modes, other kernels;
- ONEDNN_MAX_CPU_ISA and MKL_DEBUG_CPU_TYPE are in the list to show whether they change anything
  (in torch 2.13's CPU build float32 matmuls and attention do not go through oneDNN, and MKL has
  ignored MKL_DEBUG_CPU_TYPE since 2020.1).
For each selection a child process first prints a fingerprint: hashes of matmul, attention and
elementwise results on fixed inputs (made with numpy, so they do not depend on torch's kernels),
the row blocks 1-16 the probe rejects with 1 and 2 threads, the block the runtime chooses, and the wide calls
(a prefill's long runs of rows) its probe rejects beside that block.
Then the invariance and greedy-equality tests run in a child with that environment, unless the
fingerprint equals one already tested (the same kernels; --all tests every selection anyway).
Exit status 1 if any tests failed or the time budget ran out.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SELECTIONS: list[tuple[str, dict[str, str]]] = [
    ("as installed", {}),
    ("ATen scalar", {"ATEN_CPU_CAPABILITY": "default"}),
    ("AVX2-only CPU", {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}),
    ("MKL SSE4.2", {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}),
    ("MKL CNR compatible", {"MKL_CBWR": "COMPATIBLE"}),
    ("MKL CNR AVX512 strict", {"MKL_CBWR": "AVX512,STRICT"}),
    ("oneDNN AVX2", {"ONEDNN_MAX_CPU_ISA": "AVX2"}),
    ("MKL_DEBUG_CPU_TYPE=5", {"MKL_DEBUG_CPU_TYPE": "5"}),
]
CONTROLS = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "MKL_DEBUG_CPU_TYPE")

TESTS = ["tests/test_runtime_invariance.py", "tests/test_runtime_exactness.py"]  # invariance, probe, greedy equality


def fingerprint(two_threads: bool = True) -> dict:
    """Run in the child: what this kernel selection computes, and what the probe says about it."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from specbuild.reference.exactness import probe
    from specbuild.reference.model import LlamaArgs, LlamaModel

    rng = np.random.default_rng(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32))

    def digest(*tensors: torch.Tensor) -> str:
        h = hashlib.sha256()
        for t in tensors:
            h.update(t.contiguous().numpy().tobytes())
        return h.hexdigest()[:8]

    torch.set_num_threads(1)
    w, x, bias = randn(192, 2048), randn(16, 192), randn(2048)
    q, k = randn(1, 4, 4, 16), randn(1, 2, 576, 16)
    args = LlamaArgs(
        vocab_size=211,
        hidden_size=64,
        intermediate_size=160,
        num_layers=1,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        rope={},
        tie_word_embeddings=False,
        max_position_embeddings=512,
    )
    shapes = {"model.embed_tokens.weight": (211, 64), "model.norm.weight": (64,), "lm_head.weight": (211, 64)}
    layer = {
        "input_layernorm.weight": (64,),
        "post_attention_layernorm.weight": (64,),
        "self_attn.q_proj.weight": (64, 64),
        "self_attn.k_proj.weight": (32, 64),
        "self_attn.v_proj.weight": (32, 64),
        "self_attn.o_proj.weight": (64, 64),
        "mlp.gate_proj.weight": (160, 64),
        "mlp.up_proj.weight": (160, 64),
        "mlp.down_proj.weight": (64, 160),
    }
    shapes.update({f"model.layers.0.{name}": shape for name, shape in layer.items()})
    state = {name: 0.2 * randn(*shape) for name, shape in shapes.items()}
    model = LlamaModel(args, state, probe=False)
    rejected: dict[int, list[int] | None] = {2: None}
    for threads in (2, 1) if two_threads else (1,):
        torch.set_num_threads(threads)
        rejected[threads] = [b for b in range(1, 17) if probe(model, b)]
    unfaithful = []  # blocks the probe accepts but decoding shows not exact: must stay empty
    for block in set(range(1, 17)) - set(rejected[1]):
        model.row_block = block
        if not decodes_exactly(model, rng):
            unfaithful.append(block)
    chosen = LlamaModel(args, state)  # probed with 1 thread, as the tests run: its block and its wide calls
    return {
        "capability": torch.backends.cpu.get_cpu_capability(),
        "matmul": digest(*(torch.mm(x[:m], w) for m in (1, 2, 4, 8, 16)), torch.addmm(bias, x[:4], w)),
        "attention": digest(F.scaled_dot_product_attention(q, k, k, attn_mask=torch.zeros(4, 576), enable_gqa=True)),
        "elementwise": digest(x.exp(), F.silu(x), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)),
        "rejected_1_thread": rejected[1],
        "rejected_2_threads": rejected[2],
        "chosen_row_block": chosen.row_block,
        "accepted_but_not_exact": sorted(unfaithful),
        "wide_rejected": [t.row_block for t in chosen.exactness.wide_tried if t.failures],
        "wide_accepted_but_not_exact": (
            list(chosen.wide_blocks) if chosen.wide_blocks and not decodes_exactly(chosen, rng) else []
        ),
    }


def decodes_exactly(model, rng) -> bool:
    """Reality, for the probe to agree with: every position's logits in one batched prefill of three sequences
    (crossing attention's 64-key buckets) equal those of one-token steps through the KV cache."""
    import numpy as np

    from specbuild.reference.engine import ReferenceEngine

    seqs = [rng.integers(3, model.args.vocab_size, n).tolist() for n in (70, 5, 12)]
    batched = ReferenceEngine(model, use_cache=False).logits(seqs, [len(s) for s in seqs])
    for seq, rows in zip(seqs, batched):
        engine = ReferenceEngine(model)
        for n in range(1, len(seq) + 1):
            if not np.array_equal(engine.logits([seq[:n]], [1])[0][0], rows[n - 1]):
                return False
    return True


def child_env(selection: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CONTROLS}
    return {**env, **selection}


def run_child(argv: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=max(timeout, 1))
    except subprocess.TimeoutExpired:
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--all", action="store_true", help="test every selection, even one with already-tested kernels")
    parser.add_argument("--budget", type=float, default=600, help="seconds for the whole matrix (default 600)")
    parser.add_argument("--fingerprint", action="store_true", help=argparse.SUPPRESS)  # the child's mode
    args = parser.parse_args()
    if args.fingerprint:
        print(json.dumps(fingerprint()))
        return 0

    deadline = time.monotonic() + args.budget
    tested: dict[str, str] = {}  # fingerprint -> the selection that tested it
    failed = False
    rows = []
    for name, selection in SELECTIONS:
        env = child_env(selection)
        started = time.monotonic()
        fp = run_child([sys.executable, __file__, "--fingerprint"], env, deadline - time.monotonic())
        if fp is None or fp.returncode != 0:
            rows.append((name, selection, None, "fingerprint " + ("timed out" if fp is None else "failed")))
            print(fp.stderr[-2000:] if fp else "", file=sys.stderr)
            failed = True
            continue
        info = json.loads(fp.stdout.strip().splitlines()[-1])
        if info["accepted_but_not_exact"] or info["wide_accepted_but_not_exact"]:
            print(
                f"{name}: the probe accepted row blocks {info['accepted_but_not_exact']} or wide calls "
                f"{info['wide_accepted_but_not_exact']} that decoding shows are not exact: the probe is too weak for "
                "these kernels",
                file=sys.stderr,
            )
            failed = True
        key = json.dumps({k: v for k, v in info.items() if k != "chosen_row_block"}, sort_keys=True)
        if key in tested and not args.all:
            rows.append((name, selection, info, f"same kernels as {tested[key]!r}: not tested again"))
            continue
        tests = run_child([sys.executable, "-m", "pytest", "-q", *TESTS], env, deadline - time.monotonic())
        seconds = time.monotonic() - started
        if tests is None:
            rows.append((name, selection, info, f"TIMED OUT (budget {args.budget:.0f} s)"))
            failed = True
            break
        summary = tests.stdout.strip().splitlines()[-1] if tests.stdout.strip() else "no output"
        if tests.returncode != 0:
            failed = True
            print(
                f"--- {name}: {' '.join(f'{k}={v}' for k, v in selection.items())}\n{tests.stdout[-6000:]}",
                file=sys.stderr,
            )
        tested.setdefault(key, name)
        rows.append(
            (name, selection, info, f"{'passed' if tests.returncode == 0 else 'FAILED'}: {summary} ({seconds:.0f} s)")
        )

    print(
        f"{'selection':<22} {'capability':<10} {'matmul':<8} {'attn':<8} {'elem':<8} {'rejected blocks 1 / 2 threads':<32} "
        f"{'chosen':<6} {'wide rejected':<13} tests"
    )
    for name, _selection, info, result in rows:
        if info is None:
            print(f"{name:<22} {result}")
            continue
        rejected = f"{_ranges(info['rejected_1_thread'])} / {_ranges(info['rejected_2_threads'])}"
        print(
            f"{name:<22} {info['capability']:<10} {info['matmul']:<8} {info['attention']:<8} {info['elementwise']:<8} "
            f"{rejected:<32} {info['chosen_row_block']:<6} {_ranges(info['wide_rejected']):<13} {result}"
        )
    for name, selection, _, _ in rows:
        print(f"  {name}: {' '.join(f'{k}={v}' for k, v in selection.items()) or '(no controls set)'}")
    return 1 if failed else 0


def _ranges(blocks: list[int]) -> str:
    """[5, 6, 7, 9] -> "5-7,9"; [] -> "none"."""
    runs: list[list[int]] = []
    for b in blocks:
        if runs and b == runs[-1][1] + 1:
            runs[-1][1] = b
        else:
            runs.append([b, b])
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs) or "none"


if __name__ == "__main__":
    sys.exit(main())
