"""`specbuild bench`: speed and acceptance, measured and compared with the bound (and the measurement
behind `check --measure`, `specbuild.bench.measure`).

    workloads   built-in code / prose / json prompt sets, or a JSONL file
    runner      the schedule: interleaved K sweep, concurrency sweep, over one transport
    local_transport  transport: the in-process session (`session.local`); --vs-plain's 1-row target
    remote      transport: a Triton server (the `tensorrt_llm_bls` model) through `session.served`
    hf_peer     transport: Hugging Face `generate(assistant_model=...)`, the peer to beat
    stats       per-request results, aggregated to median / p90 / p99 / mean / max
    theory      the closed-form bound from measured alpha and c, and c estimated for a GPU
    report      the JSON document and the terminal table
    plots       PNGs (matplotlib, imported lazily)
    run         one `specbuild bench` run: transports, schedule, report document
    results     `python -m specbuild.bench.results`: the README figures, median of N runs

Nothing here imports torch, transformers or tritonclient at module level.
"""
