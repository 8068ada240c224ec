"""`specbuild bench`: speed and acceptance, speculation on vs off, against the closed-form bound."""

from __future__ import annotations

from pathlib import Path

import click

from specbuild import drafters
from specbuild.bench import guided
from specbuild.bench.workloads import NAMED
from specbuild.cli.common import (
    checked_timing,
    dry_run_option,
    emit_json,
    get_spec,
    json_option,
    log,
    shown_path,
    spec_option,
    timed_option,
)


@click.command("bench")
@spec_option
@click.option(
    "--url",
    default=None,
    help="A running server (http://host:8000 or host:8001 with --protocol grpc). "
    "Default: the spec's [serve] address, unless --local.",
)
@click.option("--local", "local", is_flag=True, help="Measure in-process (reference runtime) instead of a server.")
@click.option(
    "--protocol",
    type=click.Choice(["http", "grpc"]),
    default="http",
    show_default=True,
    help="Triton protocol for --url.",
)
@click.option(
    "--workload",
    default="code",
    show_default=True,
    metavar="|".join((*NAMED, guided.WORKLOAD)) + "|FILE.jsonl",
    help="Built-in prompt set (chat: prose as user messages through the target tokenizer's chat template; edit, "
    "quote, agent, mixed: prompts that hold their answer's text, where lookup pays; json-schema: JSON records "
    "guided by their schema and not, --requests prompts x 2 rounds: the speedup kept under the grammar and the "
    'outputs that validate), or a JSONL file with one {"prompt": ...} or {"messages": [...]} object per line.',
)
@click.option(
    "--num-draft-tokens",
    "ks",
    default="0,1,2,4,8",
    show_default=True,
    metavar="LIST|auto",
    help="K values to sweep (0 = speculation off, always measured); auto = 0, 1, 2, 4, .. max_draft_len. "
    "A K above the deployment's max_draft_len runs at it (the default's 8 too, without a note).",
)
@click.option(
    "--concurrency",
    default="1",
    show_default=True,
    metavar="LIST",
    help="Concurrent streams to measure, e.g. 1,2,4,8 (in-process: batched through the runtime's Batcher).",
)
@click.option("--max-tokens", type=click.IntRange(min=1), default=64, show_default=True, help="Tokens per request.")
@click.option(
    "--requests", type=click.IntRange(min=1), default=8, show_default=True, help="Requests per (K, concurrency) cell."
)
@click.option(
    "--temperature",
    type=click.FloatRange(min=0.0),
    default=0.0,
    show_default=True,
    help="0 = greedy (output identical for every K).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Sampling seed (with --temperature > 0).")
@click.option(
    "--vs-hf",
    is_flag=True,
    help="Also run the pair through Hugging Face generate(assistant_model=...) "
    "(with --local), interleaved, and report our speedup over it.",
)
@click.option(
    "--vs-plain",
    is_flag=True,
    help="Also run target-only decoding on a copy of the target with 1-row "
    "matmuls (with --local), interleaved: the fastest plain decoding, without the row blocks exact "
    "greedy equality needs; report the speedup against the faster target-only.",
)
@click.option(
    "--plot",
    "plot_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Write PNG plots into this folder.",
)
@click.option("--no-warmup", is_flag=True, help="Skip the unmeasured warm-up request per K.")
@click.option(
    "--overlap",
    type=click.Choice(["auto", "on", "off", "compare"]),
    default=None,
    help="The schedule. on/off: draft the next step while the target verifies (or not); auto: where it "
    "pays; compare: both, interleaved, with the gain, hit rate and bounds. Default: the spec's "
    "speculative.overlap with --local, the server's own with --url (asked per request).",
)
@click.option(
    "--drafter",
    type=click.Choice([*drafters.NAMES, "compare"]),
    default=None,
    help="What proposes the draft tokens: model, lookup (n-grams of the text so far, no model), hybrid (per step "
    "the lookup where the text repeats, else the model); compare: every drafter, interleaved, with each one's "
    "speedup over K = 0. Default: the spec's speculative.drafter with --local, the server's with --url.",
)
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=None,
    help="torch CPU threads for in-process models (default: 1 for small models, else torch's "
    "choice). More threads than free cores makes a busy machine many times slower.",
)
@click.option(
    "--predict",
    metavar="TIMING",
    default=None,
    callback=checked_timing,
    help="Also predict each K's speedup, sequential and overlapped, where steps take TIMING (the --timed grammar: "
    "gpu=H100-80GB[,target=8B][,draft=1B] for that GPU's cost model of the spec's models, or "
    "target=20ms,draft=2ms), from the acceptance this run measures; with the best K and the bound.",
)
@timed_option
@json_option
@dry_run_option
def command(
    spec_path,
    url,
    local,
    protocol,
    workload,
    ks,
    concurrency,
    max_tokens,
    requests,
    temperature,
    seed,
    vs_hf,
    vs_plain,
    plot_dir,
    no_warmup,
    overlap,
    drafter,
    threads,
    predict,
    timed,
    as_json,
    dry_run,
):
    """Measure tokens/s, latency and acceptance with speculation on and off, in one run.

    \b
    Per request: time to first token, time per output token, tokens/s, acceptance.
    Per K: speedup over K = 0 (same deployment, requests interleaved), alpha, c,
    the bound (1 - alpha^(K+1)) / (1 - alpha) / (K c + 1) and efficiency = speedup / bound
    (cells that drafted ahead use the overlapped schedule's bound).
    With --url, when the pair also loads here: Triton against in-process on one stream,
    the seconds Triton adds per model call, and (a server on this machine) Triton's own
    floor for such a call and the most one stream could get at that floor (`ceiling`).

    \b
    Examples:
      specbuild bench --local --json
      specbuild bench --local --vs-hf --num-draft-tokens 0,2,4 --plot bench-plots
      specbuild bench --local --workload json --overlap compare
      specbuild bench --local --workload edit --drafter compare --num-draft-tokens 0,4
      specbuild bench --url http://127.0.0.1:8000 --concurrency 1,2,4 --workload json
      specbuild bench --url http://127.0.0.1:8000 --workload json --overlap compare
      specbuild bench --local --timed target=20ms,draft=2ms --concurrency 1,8
      specbuild bench --local --predict gpu=H100-80GB --num-draft-tokens 0,2,4,8
    """
    from specbuild.bench import runner

    if url and local:
        raise click.UsageError("pass either --url or --local, not both.")
    if vs_hf and not local:
        raise click.UsageError("--vs-hf runs Hugging Face in-process next to the local runtime: add --local.")
    if vs_hf and temperature > 0:
        raise click.UsageError("--vs-hf compares greedy decoding: drop --temperature.")
    if vs_plain and not local:
        raise click.UsageError("--vs-plain runs a second target in-process next to the local runtime: add --local.")
    if overlap == "compare" and drafter == "compare":
        raise click.UsageError("compare one thing per run: --overlap compare or --drafter compare.")
    schedule = {"on": True, "off": False}.get(overlap, overlap)
    from specbuild.errors import BenchError

    try:
        k_list = None if ks.strip() == "auto" else runner.parse_int_list(ks, "--num-draft-tokens", 0)
        levels = runner.parse_int_list(concurrency, "--concurrency", 1)
    except BenchError as err:
        raise click.UsageError(str(err)) from None
    settings = runner.Settings(
        num_draft_tokens=k_list,
        concurrency=levels,
        max_tokens=max_tokens,
        requests=requests,
        temperature=temperature,
        seed=seed,
        warmup=not no_warmup,
    )
    spec = get_spec(spec_path)
    if not local:
        from specbuild.session.served import server_url

        url = server_url(spec, protocol, url)
    if dry_run:
        plan = {
            "mode": "local" if local else "triton",
            "url": url,
            "protocol": protocol if url else None,
            "workload": workload,
            "num_draft_tokens": list(k_list) if k_list else "auto",
            "concurrency": list(settings.concurrency),
            "max_tokens": max_tokens,
            "requests": requests,
            "vs_hf": vs_hf,
            "vs_plain": vs_plain,
            "overlap": overlap,
            "drafter": drafter,
            "timed": timed,
            "predict": predict,
            "files": [str(plot_dir / n) for n in _plot_names()] if plot_dir else [],
        }
        if as_json:
            emit_json({"dry_run": True, **plan})
        else:
            for key, value in plan.items():
                click.echo(f"{key}: {value}")
        return

    if workload == guided.WORKLOAD:
        return _bench_guided(spec, local, url, protocol, k_list, settings, threads, as_json)
    from specbuild.bench.run import run_bench

    floor = (lambda work_s, draft_len: _floor(url, work_s, draft_len)) if url else None  # after the measurement
    doc = run_bench(
        spec,
        settings,
        workload,
        url=url,
        protocol=protocol,
        vs_hf=vs_hf,
        vs_plain=vs_plain,
        progress=True,
        log=log,
        threads=threads,  # a bar on a terminal, else progress lines
        spec_path=shown_path(spec.path),
        overlap=schedule,
        floor=floor,
        drafter=drafter,
        predict=predict,
    )
    if plot_dir is not None:
        from specbuild.bench.plots import write_plots

        doc["plots"] = [str(p) for p in write_plots(doc, plot_dir)]
    if as_json:
        emit_json(doc)
    else:
        from specbuild.bench.report import table

        click.echo(table(doc))
        for path in doc.get("plots", []):
            log(f"wrote {path}")


def _bench_guided(spec, local, url, protocol, k_list, settings, threads, as_json) -> None:
    """--workload json-schema: the same prompts guided and not, at K = 0 and each K (bench.guided)."""
    from specbuild.bench.run import _progress

    ks = list(k_list) if k_list else [0, 4]
    total = settings.requests * guided.ROUNDS * len(guided.run_cells(ks))  # prompts x rounds x cells
    tick = _progress(True)(total)
    from specbuild.session.local import LocalSession
    from specbuild.session.served import ServedSession

    session = LocalSession.from_spec(spec, threads=threads) if local else ServedSession.for_spec(spec, protocol, url)
    with session:
        doc = guided.run(session, ks, settings.requests, guided.ROUNDS, settings.max_tokens, tick)
    doc = {"mode": "local" if local else "triton", "url": url, **doc}
    if as_json:
        emit_json(doc)
    else:
        click.echo(guided.table(doc))


def _floor(url: str, work_s: float, draft_len: int) -> dict | None:
    """Triton's floor for a BLS call of the deployment's shape (specbuild.triton.floor_probe), measured here when the server
    runs here (a loopback address) and tritonserver can be started; None otherwise, with a log line saying why."""
    host = url.rsplit(":", 1)[0].removeprefix("http://").removeprefix("https://")
    if host not in ("127.0.0.1", "localhost", "::1", "[::1]"):
        log(f"bench: Triton's floor not measured: the server at {url} is not on this machine")
        return None
    from specbuild.errors import SpecbuildError
    from specbuild.triton.floor_probe import measure_floor

    log(
        f"bench: measuring Triton's floor here (a BLS call to an identity Python model: a verify call at K = "
        f"{draft_len} that works {work_s * 1e3:.2f} ms, the in-process call's time)"
    )
    try:
        return measure_floor(draft_len=draft_len, work_s=work_s)
    except (SpecbuildError, OSError) as err:
        log(f"bench: Triton's floor not measured: {err}")
        return None


def _plot_names() -> list[str]:
    return ["speedup_vs_k.png", "acceptance_by_position.png", "throughput_vs_concurrency.png"]
