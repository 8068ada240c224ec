"""One `specbuild bench` run: pick the transports, run the schedule, assemble the report document.

--local: the reference runtime in-process (+ Hugging Face with --vs-hf, + target-only decoding on
         1-row matmuls with --vs-plain, interleaved), in the schedule `overlap` names (None: the spec's);
         overlap="compare" runs the sequential and the overlapped (draft-ahead) schedules on the same
         models, interleaved request by request, and adds an "overlap" section comparing them.
--url:   a Triton server, each request asking for the schedule `overlap` names (None: the server's own;
         "compare": sequential and overlapped requests interleaved, with the same "overlap" section)
         (+ the local runtime, sequential, when it can be loaded here, for the serving overhead: Triton
         tokens/s over local tokens/s on one stream, for each schedule, and at each --concurrency above 1).
Greedy runs also say whether every K gave exactly the K = 0 tokens (`same_tokens_as_k0`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specbuild import drafters
from specbuild.bench import report, runner, theory, workloads
from specbuild.bench.runner import Measurements, Settings
from specbuild.bench.stats import RequestResult
from specbuild.config import Spec
from specbuild.errors import BenchError, SpecbuildError
from specbuild.speculative.stats import add_drafter_counts


def _progress(enabled: bool) -> Callable[[int], Callable[[], None]]:
    """A bar on a terminal, else a progress line every few seconds on stderr (enabled=False: nothing)."""

    def start(total: int) -> Callable[[], None]:
        from specbuild.progress import Progress

        bar = Progress(total=total, desc="bench", unit="requests", mode=None if enabled else "off", stream=sys.stderr)

        def tick() -> None:
            bar.update(1)
            if bar.n >= total:
                bar.close()

        return tick

    return start


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a and b else None


def _rate(m: Measurements, k: int) -> float | None:
    """One stream's tokens/s at K = k."""
    return _throughput(m, k, 1)


def _throughput(m: Measurements, k: int, concurrency: int) -> float | None:
    """All streams' tokens over the wall time of their batches, at K = k and `concurrency` streams."""
    results, wall = m.cells.get((k, concurrency)), m.wall.get((k, concurrency))
    return sum(r.output_tokens for r in results) / wall if results and wall else None


def _per_prompt(m: Measurements, k: int) -> dict[int, float]:
    """One stream's tokens/s per prompt at K = k (each prompt ran once per transport, back to back with the others)."""
    return {r.prompt_index: r.tokens_per_s for r in m.cells.get((k, 1), [])}


def _spread(ours: dict[int, float], *others: dict[int, float]) -> dict[str, float] | None:
    """Quartiles over the prompts of ours / the best of the others on the same prompt: how far one run's ratio can
    be trusted (a ratio whose quartiles straddle 1 is not a difference)."""
    import statistics

    ratios = [ours[i] / best for i in ours if all(i in o for o in others) and (best := max(o[i] for o in others)) > 0]
    if len(ratios) < 2:
        return None
    p25, median, p75 = statistics.quantiles(ratios, n=4, method="inclusive")
    return {"p25": round(p25, 4), "median": round(median, 4), "p75": round(p75, 4), "prompts": len(ratios)}


def _acceptance(results: list[RequestResult]) -> float:
    drafted = sum(r.drafted for r in results)
    return round(sum(r.accepted for r in results) / drafted, 4) if drafted else 0.0


def drafter_section(
    ours: Measurements, others: dict[str, Measurements | None], prompts: workloads.Workload, ours_name: str
) -> dict[str, Any]:
    """Every drafter against K = 0 on the same models, per K at concurrency 1 (ours: drafter `ours_name`'s, with K = 0),
    with who proposed and what was accepted; `best`: each drafter's fastest K. Where the workload repeats a prompt (the
    agent workload's second turns), each row also gives the acceptance of first turns and of repeated ones."""
    base = _rate(ours, 0)
    first_seen: dict[str, int] = {}
    for index, prompt in enumerate(prompts.prompts):
        first_seen.setdefault(prompt.text, index)
    repeated = {i for i, p in enumerate(prompts.prompts) if first_seen[p.text] != i}
    rows, best = [], {}
    for name, measured in {ours_name: ours, **others}.items():
        if measured is None:
            continue
        for (k, concurrency), results in sorted(measured.cells.items()):
            if k == 0 or concurrency != 1:
                continue
            counts: dict[str, dict[str, int]] = {}
            for result in results:
                for source, entry in result.by_drafter.items():
                    add_drafter_counts(counts, source, entry)
            row = {
                "drafter": name,
                "num_draft_tokens": k,
                "tokens_per_s": _rate(measured, k),
                "speedup": _ratio(_rate(measured, k), base),
                "acceptance_rate": _acceptance(results),
                "by_drafter": counts,
            }
            if repeated:
                row["first_turn_acceptance"] = _acceptance([r for r in results if r.prompt_index not in repeated])
                row["repeated_turn_acceptance"] = _acceptance([r for r in results if r.prompt_index in repeated])
            rows.append(row)
            if row["speedup"] is not None and row["speedup"] > best.get(name, {}).get("speedup", 0.0):
                best[name] = {"num_draft_tokens": k, "speedup": row["speedup"]}
    return {"k0_tokens_per_s": base, "rows": rows, "best": best}


def hf_section(ours: Measurements, hf: Measurements, best_k: int | None) -> dict[str, Any]:
    """Hugging Face assisted generation next to ours, per K, and at our best K."""
    hf_base, our_base = _rate(hf, 0), _rate(ours, 0)
    rows = []
    for k in sorted(k for k, c in hf.cells if c == 1):
        rows.append(
            {
                "num_draft_tokens": k,
                "tokens_per_s": round(_rate(hf, k) or 0.0, 3),
                "speedup": _ratio(_rate(hf, k), hf_base),
                "speedup_vs_ours_k0": _ratio(_rate(hf, k), our_base),
                "ours_over_hf": _ratio(_rate(ours, k), _rate(hf, k)),
            }
        )
    at = next((r for r in rows if r["num_draft_tokens"] == best_k), None)
    return {
        "num_draft_tokens": best_k,
        "tokens_per_s": at["tokens_per_s"] if at else None,
        "baseline_tokens_per_s": round(hf_base, 3) if hf_base else None,
        "speedup": at["speedup"] if at else None,
        "ours_over_hf": at["ours_over_hf"] if at else None,
        "ours_k0_over_hf_k0": _ratio(our_base, hf_base),
        "runs": rows,
    }


def serving_section(
    triton: Measurements, local: Measurements, best_k: int | None, floor: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Triton against in-process on one stream: the cost of serving (tokenizer models, BLS calls, network), and at each
    concurrency above 1 (`streams`: all streams' tokens per second, batch by batch beside each other). Per K,
    `overhead_s_per_call`: the seconds Triton adds per model call the BLS makes (a draft and a verify per step at
    K > 0, a verify at K = 0; the request's own costs, tokenizing and the client's round trip, spread over them).
    With `floor` (triton.floor_probe: a BLS call to an identity model on this machine, beyond its work), that cost over
    the floor, and `ceiling`: the most Triton / in-process one stream could get here if every model call cost the
    in-process call plus the floor and nothing else (in-process seconds per call / (those + the floor))."""
    rows = []
    for k in sorted(k for k, c in local.cells if c == 1):
        t_ttft = sorted(r.ttft_seconds for r in triton.cells.get((k, 1), []))
        l_ttft = sorted(r.ttft_seconds for r in local.cells[(k, 1)])
        rows.append(
            {
                "num_draft_tokens": k,
                "triton_tokens_per_s": round(_rate(triton, k) or 0.0, 3),
                "local_tokens_per_s": round(_rate(local, k) or 0.0, 3),
                "triton_over_local": _ratio(_rate(triton, k), _rate(local, k)),
                "ttft_seconds_added": round(t_ttft[len(t_ttft) // 2] - l_ttft[len(l_ttft) // 2], 6)
                if t_ttft and l_ttft
                else None,
                "local_s_per_call": seconds_per_call(local, k),
                "overhead_s_per_call": _overhead_per_call(triton, local, k),
            }
        )
        if floor and rows[-1]["overhead_s_per_call"] is not None:
            rows[-1]["overhead_over_floor"] = _ratio(rows[-1]["overhead_s_per_call"], floor["median_s"])
        if floor and rows[-1]["local_s_per_call"]:
            local_call = rows[-1]["local_s_per_call"]
            rows[-1]["ceiling"] = _ratio(local_call, local_call + floor["median_s"])
    at = next((r for r in rows if r["num_draft_tokens"] == best_k), None)
    section = {"num_draft_tokens": best_k, "triton_over_local": at["triton_over_local"] if at else None, "runs": rows}
    streams = [
        {
            "num_draft_tokens": k,
            "concurrency": c,
            "triton_tokens_per_s": round(_throughput(triton, k, c) or 0.0, 3),
            "local_tokens_per_s": round(_throughput(local, k, c) or 0.0, 3),
            "triton_over_local": _ratio(_throughput(triton, k, c), _throughput(local, k, c)),
        }
        for c, k in sorted((c, k) for k, c in local.cells if c > 1 and (k, c) in triton.cells)
    ]
    if streams:
        section["streams"] = streams
    if floor is not None:
        section["floor"] = floor
        for key in ("overhead_s_per_call", "overhead_over_floor", "ceiling"):
            section[key] = at.get(key) if at else None
    return section


def _tokens_and_calls(measured: Measurements, k: int) -> tuple[int, int]:
    """One stream's tokens and model calls at K = k (a draft and a verify per step at K > 0, a verify at K = 0)."""
    results = measured.cells.get((k, 1), [])
    return sum(r.output_tokens for r in results), sum(r.steps * (2 if k else 1) for r in results)


def seconds_per_call(measured: Measurements, k: int) -> float | None:
    """Seconds per model call at K = k on one stream: the wall time per token x tokens / model calls."""
    rate, (tokens, calls) = _rate(measured, k), _tokens_and_calls(measured, k)
    return round(tokens / rate / calls, 7) if rate and tokens and calls else None


def _overhead_per_call(triton: Measurements, local: Measurements, k: int) -> float | None:
    """(Triton's seconds per token - in-process seconds per token) x Triton's tokens / its model calls."""
    t_rate, l_rate, (tokens, calls) = _rate(triton, k), _rate(local, k), _tokens_and_calls(triton, k)
    if not (t_rate and l_rate and tokens and calls):
        return None
    return round((1.0 / t_rate - 1.0 / l_rate) * tokens / calls, 7)


def plain_section(ours: Measurements, plain: Measurements, best_k: int | None) -> dict[str, Any]:
    """Target-only decoding on 1-row matmuls next to K = 0 through the engine's row blocks, and the best K's
    speedup against the faster of the two."""
    fastest = max(_rate(ours, 0) or 0.0, _rate(plain, 0) or 0.0)
    best = _rate(ours, best_k) if best_k is not None else None
    return {
        "tokens_per_s": round(_rate(plain, 0) or 0.0, 3),
        "same_tokens_as_k0": same_tokens(plain, ours),
        "speedup_vs_fastest_target_only": _ratio(best, fastest),
    }


def same_tokens(measured: Measurements, baseline: Measurements, k: int = 0) -> bool | None:
    """Whether every concurrency-1 request of `measured` at K = k gave exactly the tokens of `baseline` at K = 0
    for the same prompt (None when the transport returns no token ids)."""
    reference = {r.prompt_index: r.output_ids for r in baseline.cells.get((0, 1), [])}
    results = measured.cells.get((k, 1), [])
    if not results or any(r.output_ids is None or reference.get(r.prompt_index) is None for r in results):
        return None
    return all(r.output_ids == reference[r.prompt_index] for r in results)


def overlap_section(
    sequential: Measurements, overlapped: Measurements, auto: Measurements | None = None
) -> dict[str, Any]:
    """The overlapped schedule against the sequential one on the same models, per K, at concurrency 1; with `auto`,
    the "auto" schedule beside them (auto_over_best: its tokens/s over the better of the two fixed ones)."""
    seq_rows = {r["num_draft_tokens"]: r for r in report.cells(sequential.summaries()) if r["concurrency"] == 1}
    ovl_rows = {r["num_draft_tokens"]: r for r in report.cells(overlapped.summaries()) if r["concurrency"] == 1}
    rows = []
    for k in sorted(k for k in ovl_rows if k > 0 and k in seq_rows):
        o, q = ovl_rows[k], seq_rows[k]
        hit_model = theory.hit_rate(q["alpha"], k) if q["alpha"] is not None else None
        rows.append(
            {
                "num_draft_tokens": k,
                "sequential_tokens_per_s": q["tokens_per_s"],
                "overlapped_tokens_per_s": o["tokens_per_s"],
                "overlapped_over_sequential": _ratio(_rate(overlapped, k), _rate(sequential, k)),
                "overlapped_over_sequential_spread": _spread(_per_prompt(overlapped, k), _per_prompt(sequential, k)),
                "early_drafts": o["early_drafts"],
                "early_draft_hit_rate": o["early_draft_hit_rate"],
                "predicted_hit_rate": round(hit_model, 4) if hit_model is not None else None,
                "hidden_seconds": o["hidden_seconds"],
                "hidden_share": _ratio(o["hidden_seconds"], o["wall_seconds"]),
                "bound": q["bound"],
                "overlap_bound": o["overlap_bound"],
                "predicted_overlapped_over_sequential": _ratio(o["overlap_bound"], q["bound"]),
                "speedup": o["speedup"],
                "efficiency": o["efficiency"],
            }
        )
        if auto is not None:
            fixed_best = max(_rate(overlapped, k) or 0.0, _rate(sequential, k) or 0.0)
            rows[-1].update(
                auto_tokens_per_s=report.rounded(_rate(auto, k), 3),
                auto_over_best=_ratio(_rate(auto, k), fixed_best),
                auto_over_best_spread=_spread(
                    _per_prompt(auto, k), _per_prompt(overlapped, k), _per_prompt(sequential, k)
                ),
                auto_early_draft_share=_early_share(auto, k),
            )
    best = max(rows, key=lambda r: r["overlapped_tokens_per_s"] or 0.0) if rows else None
    seq_best = max((seq_rows[k]["tokens_per_s"] for k in seq_rows if k > 0), default=None)
    keys = (
        "overlapped_over_sequential",
        "early_draft_hit_rate",
        "hidden_share",
        "bound",
        "overlap_bound",
        "efficiency",
    )
    return {
        "num_draft_tokens": best["num_draft_tokens"] if best else None,
        "tokens_per_s": best["overlapped_tokens_per_s"] if best else None,
        **{key: best[key] if best else None for key in keys},
        "best_over_best": _ratio(best["overlapped_tokens_per_s"], seq_best) if best else None,
        "auto_over_best": min((r["auto_over_best"] for r in rows if r.get("auto_over_best")), default=None),
        "runs": rows,
    }


def timed_section(mode: str, transports: list[Any]) -> dict[str, Any] | None:
    """What a run's timed stand-ins were ($SPECBUILD_STANDIN_TIMING, reference.timing; None: untimed), and how many
    in-process calls overran their timed steps (their computation alone took longer: those figures are this
    machine's). A server is timed only when started with the same timing (`serve --timed`); its log says so."""
    from specbuild.reference import timing

    asked = timing.from_environ()
    if asked is None:
        return None
    seen: dict[int, tuple[str, Any]] = {}
    for transport in transports:
        pair = getattr(getattr(transport, "session", None), "pair", None)
        for role in ("target", "draft"):
            clock = getattr(getattr(pair, f"{role}_model", None), "clock", None)
            if clock is not None:
                seen[id(clock)] = (role, clock)
    in_process: dict[str, dict[str, int]] = {}
    for role, clock in seen.values():
        figures = in_process.setdefault(role, {"calls": 0, "overruns": 0})
        figures["calls"] += clock.calls
        figures["overruns"] += clock.overruns
    section: dict[str, Any] = {"timing": asked.text, "described": asked.describe(), "in_process": in_process}
    if mode == "triton":
        section["served"] = f"timed only if the server was started with --timed {asked.text!r} (its log says so)"
    return section


def _early_share(measured: Measurements, k: int) -> float | None:
    """Of the auto schedule's verify steps at K, the share that drafted the next step ahead."""
    results = measured.cells.get((k, 1), [])
    steps = sum(r.steps for r in results)
    early = sum(r.early_drafts for r in results)
    return round(early / steps, 3) if steps else None


def _local_transport(
    spec: Spec,
    log: Callable[[str], None],
    threads: int | None = None,
    row_block: int | None = None,
    overlap: bool | str | None = None,
):
    from specbuild.bench.local_transport import from_spec

    return from_spec(spec, log=log, threads=threads, row_block=row_block, overlap=overlap)


def _check_sweep(transport: Any, settings: Settings) -> None:
    try:
        runner.sweep_ks(transport, settings)
    except BenchError:
        if hasattr(transport, "close"):
            transport.close()
        raise


def run_bench(
    spec: Spec,
    settings: Settings,
    workload: str,
    url: str | None = None,
    protocol: str = "http",
    vs_hf: bool = False,
    vs_plain: bool = False,
    progress: bool = False,
    log: Callable[[str], None] = lambda m: None,
    threads: int | None = None,
    row_block: int | None = None,
    spec_path: str | None = None,
    overlap: bool | str | None = None,
    floor: Callable[[float, int], dict[str, Any] | None] | None = None,
    drafter: str | None = None,
    predict: str | None = None,
) -> dict[str, Any]:
    """One bench run as a JSON-ready document. row_block: the runtime's matmul row block (None = its default).
    overlap: the in-process schedule, True / False / "auto" / None (the spec's) / "compare" (both, --local).
    floor(work_s, draft_len): measures Triton's cost of a BLS call on the server's machine (triton.floor_probe), reported
    beside ours; called after the measurement, with the shape of the best K's calls (in-process seconds per model
    call as the work, the best K as the draft length). drafter: what proposes (specbuild.drafters), None: the
    deployment's; "compare": every drafter, interleaved request by request, with a "drafters" section. predict: a
    timing (reference.timing's grammar) to predict each K's speedup under from the measured acceptance
    (bench.predict), checked before anything is measured."""
    prompts = workloads.load(workload, settings.requests, Path(spec.target.checkpoint))
    predicted_times = None
    if predict is not None:
        from specbuild.bench import predict as predicting
        from specbuild.reference.timing import StandInTiming

        predict_timing = StandInTiming.parse(predict)
        predicted_times = predicting.step_times(spec, predict_timing)
    peers: list[Any] = []
    notes: list[str] = []
    if url:
        from specbuild.bench.remote import RemoteTransport

        transport = RemoteTransport.connect(url, protocol, spec_path=spec_path, spec=spec)
        _check_sweep(transport, settings)  # a sweep this deployment cannot run fails before the peers and the floor
        transport.overlap = False if overlap == "compare" else overlap
        if overlap == "compare":
            peers.extend(
                [transport.with_overlap(True, "triton-overlap"), transport.with_overlap("auto", "triton-auto")]
            )
        try:
            local = _local_transport(spec, log, threads, row_block, overlap=False)
            local.sweeps_concurrency = True  # Triton against in-process at every concurrency, batch by batch
            peers.append(local)
        except SpecbuildError as err:
            notes.append(f"serving overhead not measured: the local runtime cannot be loaded here ({err})")
        mode = "triton"
    else:
        transport = _local_transport(spec, log, threads, row_block, overlap=overlap)
        _check_sweep(transport, settings)
        mode = "local"
        peers.extend(getattr(transport, "peers", []))
        if vs_hf:
            from specbuild.bench.hf_peer import HFPeer

            log("loading the pair with transformers for --vs-hf")
            peers.append(HFPeer.from_spec(spec, end_id=transport.end_id))
        if vs_plain:
            from specbuild.bench.local_transport import plain_target

            log("loading a second copy of the target with 1-row matmuls for --vs-plain")
            peers.append(plain_target(transport))
    compare = drafter == "compare"
    runnable = drafters.runnable(spec.draft is not None)  # a target-only deployment compares its lookup drafters
    transport.drafter = runnable[0] if compare else drafter
    if compare:  # K = 0 is a plain step whoever drafts: measured once, on the first drafter's transport
        ks_of_peers = tuple(k for k in runner.sweep_ks(transport, settings)[0] if k > 0)
        for name in runnable[1:]:
            peer = transport.with_drafter(name, f"{transport.name}-{name}")
            peer.only_ks = ks_of_peers
            peers.append(peer)
    log(f"bench: {mode}, workload {prompts.name}, {settings.requests} requests per cell")
    try:
        measured = runner.run(transport, prompts, settings, peers=peers, progress=_progress(progress))
    finally:
        for t in (transport, *peers):
            if hasattr(t, "close"):
                t.close()
    ours = measured[transport.name]
    rows = report.cells(ours.summaries())
    ks, _ = runner.clamp_ks(settings.num_draft_tokens, transport.max_draft_len)
    top = report.best(rows)
    best_k = top["num_draft_tokens"] if top else None
    if getattr(transport, "fixed_k", None) is not None:
        ks, best_k = (transport.fixed_k,), transport.fixed_k
    extra: dict[str, Any] = {}
    if "hf" in measured:
        extra["hf"] = hf_section(ours, measured["hf"], best_k)
    overlapped = measured.get(f"{transport.name}-overlap")
    if "local" in measured and mode == "triton":
        floor_figures = None
        if floor is not None and best_k is not None and getattr(transport, "fixed_k", None) is None:  # BLS calls
            floor_figures = floor(seconds_per_call(measured["local"], best_k) or 0.0, best_k)
        extra["serving_overhead"] = serving_section(ours, measured["local"], best_k, floor_figures)
        if overlapped is not None:
            top_overlapped = report.best(report.cells(overlapped.summaries()))
            extra["serving_overhead"]["overlapped"] = serving_section(
                overlapped, measured["local"], top_overlapped["num_draft_tokens"] if top_overlapped else None
            )
    if "plain" in measured:
        extra["plain"] = plain_section(ours, measured["plain"], best_k)
    if settings.temperature == 0:
        for row in rows:
            if row["concurrency"] == 1:
                row["same_tokens_as_k0"] = same_tokens(ours, ours, row["num_draft_tokens"])
        equal = [row["same_tokens_as_k0"] for row in rows if row.get("same_tokens_as_k0") is not None]
        extra["greedy_equal"] = all(equal) if equal else None
    if overlapped is not None:
        extra["overlap"] = overlap_section(ours, overlapped, measured.get(f"{transport.name}-auto"))
    if predicted_times is not None:
        extra["prediction"] = predicting.prediction(rows, predicted_times, predict_timing)
    timed = timed_section(mode, [transport, *peers])
    if timed is not None:
        extra["timed_stand_in"] = timed
    if drafter is not None:
        others = {name: measured.get(f"{transport.name}-{name}") for name in runnable[1:]} if compare else {}
        extra["drafters"] = drafter_section(ours, others, prompts, transport.drafter)
    doc_settings = {
        "num_draft_tokens": list(ks),
        "concurrency": list(settings.concurrency),
        "max_tokens": settings.max_tokens,
        "requests": settings.requests,
        "temperature": settings.temperature,
        "seed": settings.seed,
        "url": url,
        "protocol": protocol if url else None,
        "overlap": "compare" if overlap == "compare" else transport.overlap,
        "drafter": drafter,
    }
    return report.document(mode, spec.name, prompts.name, doc_settings, rows, [*ours.notes, *notes], extra)
