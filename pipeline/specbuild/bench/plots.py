"""PNG plots of a benchmark document (matplotlib, Agg backend, imported only here).

speedup_vs_k.png            measured speedup per K with the closed-form bound (and Hugging Face's, if measured)
acceptance_by_position.png  P(position i accepted | drafted) for each K
throughput_vs_concurrency.png  tokens/s vs concurrent streams, speculation off and at each K
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specbuild.errors import BenchError


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise BenchError("--plot needs matplotlib: pip install 'specbuild[bench]'.") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plots(doc: dict[str, Any], folder: Path) -> list[Path]:
    """Write the plots for `doc` into `folder` (created); returns the files written."""
    plt = _pyplot()
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise BenchError(f"--plot {folder}: cannot create the folder ({err}). Pass a writable folder.") from None
    runs = doc["runs"]
    title = f"{doc['spec']} ({doc['mode']}, {doc['workload']})"
    written = []

    one = sorted((r for r in runs if r["concurrency"] == 1), key=lambda r: r["num_draft_tokens"])
    fig, ax = plt.subplots(figsize=(6, 4))
    ks = [r["num_draft_tokens"] for r in one]
    ax.plot(ks, [r["speedup"] for r in one], "o-", label="measured")
    bound_ks = [r["num_draft_tokens"] for r in one if r["bound"] is not None or r["num_draft_tokens"] == 0]
    bounds = [
        1.0 if r["num_draft_tokens"] == 0 else r["bound"]
        for r in one
        if r["bound"] is not None or r["num_draft_tokens"] == 0
    ]
    ax.plot(bound_ks, bounds, "s--", label="bound (1-a^(K+1))/(1-a)/(Kc+1)")
    hf_rows = (doc.get("hf") or {}).get("runs") or []
    if hf_rows:
        ax.plot(
            [r["num_draft_tokens"] for r in hf_rows],
            [r["speedup_vs_ours_k0"] for r in hf_rows],
            "^:",
            label="HF assisted generation (vs our K=0)",
        )
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set(xlabel="K (num_draft_tokens)", ylabel="speedup over K = 0", title=title, xticks=ks)
    ax.legend()
    written.append(_save(fig, plt, folder / "speedup_vs_k.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in one:
        acc = r["per_position_acceptance"]
        if r["num_draft_tokens"] and acc:
            ax.plot(
                range(1, len(acc) + 1),
                [a if a is not None else float("nan") for a in acc],
                "o-",
                label=f"K = {r['num_draft_tokens']}",
            )
    ax.set(xlabel="draft position", ylabel="acceptance rate at position", ylim=(0, 1.05), title=title)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    written.append(_save(fig, plt, folder / "acceptance_by_position.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    for k in sorted({r["num_draft_tokens"] for r in runs}):
        at = sorted((r for r in runs if r["num_draft_tokens"] == k), key=lambda r: r["concurrency"])
        ax.plot(
            [r["concurrency"] for r in at],
            [r["tokens_per_s"] for r in at],
            "o-",
            label="speculation off" if k == 0 else f"K = {k}",
        )
    ax.set(
        xlabel="concurrent requests",
        ylabel="output tokens/s (all streams)",
        title=title,
        xticks=sorted({r["concurrency"] for r in runs}),
    )
    ax.legend()
    written.append(_save(fig, plt, folder / "throughput_vs_concurrency.png"))
    return written


def _save(fig, plt, path: Path) -> Path:
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as err:
        raise BenchError(f"cannot write {path} ({err}). Pass a writable folder to --plot.") from None
    finally:
        plt.close(fig)
    return path


def write_workload_plot(summary: dict[str, dict[str, Any]], path: Path) -> Path:
    """alpha and speedup per K for each workload (does structured output get higher acceptance?)."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for workload, s in summary.items():
        rows = [r for r in s["per_k"] if r["num_draft_tokens"] > 0]
        ks = [r["num_draft_tokens"] for r in rows]
        left.plot(ks, [r["alpha"] for r in rows], "o-", label=workload)
        right.plot([0, *ks], [1.0, *[r["speedup"] for r in rows]], "o-", label=workload)
    left.set(xlabel="K", ylabel="alpha (per-token acceptance)", ylim=(0, 1.05), title="acceptance by workload")
    right.axhline(1.0, color="grey", linewidth=0.8)
    right.set(xlabel="K", ylabel="speedup over K = 0", title="speedup by workload (median of runs)")
    left.legend()
    right.legend()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return _save(fig, plt, Path(path))
