"""`specbuild generate`: one prompt through the draft/verify loop, streamed as tokens are accepted.

--local runs the pair in-process on the reference runtime (reference engines when built, else the
Hugging Face checkpoints). Without --local the prompt goes to a running server through
`specbuild.triton.client.generate` (the server path).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from specbuild.cli.common import emit_json, get_spec, json_option, log, shown_path, spec_option


@click.command("generate")
@click.argument("prompt")
@spec_option
@click.option("--local", "local", is_flag=True, help="Run in-process on the reference runtime (no server).")
@click.option("--url", default=None, help="Server address host:port (server path). Default: the spec's [serve].")
@click.option("--protocol", type=click.Choice(["http", "grpc"]), default="grpc", show_default=True,
              help="Server protocol (server path).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=64, show_default=True, help="Tokens to generate at most.")
@click.option("--num-draft-tokens", "num_draft_tokens", type=click.IntRange(min=0), default=None,
              help="K, draft tokens per step (0 = target only). Default: the spec's num_draft_tokens.")
@click.option("--temperature", type=click.FloatRange(min=0), default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True, help="0 = off.")
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True, help="1 = off.")
@click.option("--seed", type=click.IntRange(min=0), default=None,
              help="Seed for sampling: the same seed gives the same text (adaptive K then ignores step timings).")
@click.option("--stream/--no-stream", default=True, show_default=True, help="Print text as it is accepted.")
@click.option("--adaptive/--no-adaptive", default=None,
              help="Adapt K to the running acceptance rate. Default: the spec's speculative.adaptive.")
@click.option("--overlap/--no-overlap", default=None,
              help="--local: draft the next step while the target verifies this one (same text, faster with "
              "2 free cores). Default: the spec's speculative.overlap (auto: on where it pays).")
@click.option("--device", default="auto", show_default=True, help="--local: cpu, cuda, or auto.")
@click.option("--no-cache", "no_cache", is_flag=True, help="--local: disable the KV and prefix caches (slower; same output).")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="--local on CPU: torch threads. Default: 1 for small models, else torch's default.")
@json_option
def command(prompt, spec_path, local, url, protocol, max_tokens, num_draft_tokens, temperature, top_k, top_p, seed,
            stream, adaptive, overlap, device, no_cache, threads, as_json):
    """Generate text for PROMPT with speculative decoding.

    \b
    Examples:
      specbuild generate --local "def fibonacci(n):"
      specbuild generate --local --num-draft-tokens 0 "def fibonacci(n):"    # target only
      specbuild generate --local --json --temperature 0.8 --seed 1 "Once upon a time"

    Text goes to stdout (streamed unless --no-stream); acceptance figures to stderr, or
    everything as one JSON document with --json.
    """
    if local and url:
        raise click.UsageError("pass either --local or --url, not both.")
    if overlap is not None and not local:
        raise click.UsageError("--overlap/--no-overlap applies to --local: the server path runs the sequential "
                               "schedule. Add --local, or drop the option.")
    spec = get_spec(spec_path)
    options = dict(max_tokens=max_tokens, num_draft_tokens=num_draft_tokens, temperature=temperature, top_k=top_k,
                   top_p=top_p, seed=seed, adaptive=adaptive)
    echo = None if as_json or not stream else _echo_stdout
    if local:
        doc = generate_local(spec, prompt, device=device, use_cache=not no_cache, threads=threads, on_text=echo,
                             overlap=overlap, **options)
    else:
        doc = _generate_served(spec, prompt, url=url, protocol=protocol, on_text=echo,
                               spec_path=shown_path(spec.path), **options)
    if as_json:
        emit_json(doc)
        return
    if echo is None:
        click.echo(doc["text"])
    else:
        click.echo("")
    log(summary(doc))


def _echo_stdout(text: str) -> None:
    click.echo(text, nl=False)
    sys.stdout.flush()


def _generate_served(spec, prompt, url, protocol, on_text, spec_path, **options) -> dict[str, Any]:
    from specbuild.errors import ClientError
    from specbuild.triton.client import SpecbuildClient
    from specbuild.triton.served_generate import default_url, generate as served_generate

    url = url or default_url(spec, protocol)
    try:
        return served_generate(spec, prompt, url=url, protocol=protocol, on_text=on_text, **options)
    except ClientError:
        import importlib.util

        if protocol == "grpc" and importlib.util.find_spec("tritonclient") is None:
            raise  # its message says how to install the client
        with SpecbuildClient(url, protocol=protocol) as client:
            if client.is_ready():
                raise  # the server answers: its own message says what went wrong
        raise ClientError(
            f"no Triton server answers at {url} ({protocol}). Start one with `specbuild serve -c {spec_path}` "
            f"(or `specbuild up -c {spec_path}`), pass --url with its address, or run in-process with "
            f"`specbuild generate -c {spec_path} --local ...`."
        ) from None


def summary(doc: dict[str, Any]) -> str:
    parts = [f"{doc['num_output_tokens']} tokens, {doc['tokens_per_s']:.1f} tokens/s, finish: {doc['finish_reason']}"]
    if doc["num_draft_tokens"]:
        parts.append(
            f"K = {doc['num_draft_tokens']}: acceptance {doc['acceptance_rate']:.2f} ({doc['accepted']}/{doc['drafted']} "
            f"drafted), mean accepted length {doc['mean_accepted_len']:.2f}"
        )
    else:
        parts.append("K = 0 (target only)")
    if doc.get("early_drafts"):
        parts.append(f"early drafts {doc['early_draft_hits']}/{doc['early_drafts']} used, "
                     f"{doc['hidden_seconds']:.3f} s of drafting hidden")
    if doc.get("engine_source"):
        parts.append(f"weights: {doc['engine_source']}")
    return "; ".join(parts)


def generate_local(spec, prompt: str, *, max_tokens: int, num_draft_tokens: int | None, temperature: float,
                   top_k: int, top_p: float, seed: int | None, adaptive: bool | None, device: str = "auto",
                   use_cache: bool = True, threads: int | None = None, on_text=None, pair=None,
                   overlap: bool | None = None) -> dict[str, Any]:
    """Run one prompt in-process; return the --json document. on_text(delta) receives streamed text.
    overlap: None = the spec's speculative.overlap ("auto" resolved by runtime.loading.resolve_overlap); a given
    `pair` keeps the schedule it was loaded with."""
    from specbuild.runtime.loading import load_pair

    owned = pair is None
    pair = pair or load_pair(spec, device=None if device == "auto" else device, use_cache=use_cache, threads=threads,
                             overlap=spec.speculative.overlap if overlap is None else overlap)
    try:
        return _generate(pair, spec, prompt, max_tokens, num_draft_tokens, temperature, top_k, top_p, seed, adaptive,
                         on_text)
    finally:
        if owned:
            pair.close()


def _generate(pair, spec, prompt, max_tokens, num_draft_tokens, temperature, top_k, top_p, seed, adaptive,
              on_text) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from specbuild.runtime.textstream import TextStream
    from specbuild.speculative.interfaces import SamplingParams
    from specbuild.speculative.loop import GenerationRequest, generate

    tokenizer = AutoTokenizer.from_pretrained(str(pair.tokenizer_dir), local_files_only=True)
    k = spec.speculative.num_draft_tokens if num_draft_tokens is None else num_draft_tokens
    if k > pair.max_draft_len:
        log(f"--num-draft-tokens {k} exceeds the target engine's max_draft_len = {pair.max_draft_len}: using "
            f"{pair.max_draft_len}. Rebuild with a larger speculative.max_draft_len to draft more.")
        k = pair.max_draft_len
    request = GenerationRequest(
        max_tokens=max_tokens,
        num_draft_tokens=k,
        sampling=SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed),
        end_id=pair.end_id,
        adaptive=spec.speculative.adaptive if adaptive is None else adaptive,
        overlap=pair.overlap,
    )
    prompt_ids = list(tokenizer(prompt)["input_ids"])
    limit = min(pair.draft_model.limits.max_seq_len, pair.target_model.limits.max_seq_len - pair.max_draft_len)
    if len(prompt_ids) + max_tokens > limit:
        from specbuild.errors import RequestError

        raise RequestError(
            f"the prompt ({len(prompt_ids)} tokens) + --max-tokens {max_tokens} = {len(prompt_ids) + max_tokens} tokens "
            f"exceeds the engines' max_seq_len = {limit}: lower --max-tokens or shorten the prompt "
            "(or raise build.max_seq_len and rebuild)."
        )
    stream = TextStream(tokenizer, prompt_ids)
    output: list[int] = []
    stats = finish = None
    start = time.perf_counter()
    for step in generate(prompt_ids, pair.drafter_for(pair.overlap), pair.verifier, request):
        output.extend(step.tokens)
        delta = stream.push(step.tokens)
        if delta and on_text:
            on_text(delta)
        if step.finish_reason:
            finish, stats = step.finish_reason, step.stats
    seconds = time.perf_counter() - start
    tail = stream.finish()
    if tail and on_text:
        on_text(tail)
    return {
        "text": stream.text,
        "output_ids": output,
        "prompt_ids": prompt_ids,
        "num_output_tokens": len(output),
        "finish_reason": finish,
        "num_draft_tokens": k,
        "adaptive": request.adaptive,
        "overlap": pair.overlap,
        "overlap_reason": pair.overlap_reason,
        **stats.report_fields(),
        "tokens_per_s": len(output) / seconds if seconds > 0 else 0.0,
        "seconds": seconds,
        "engine_source": pair.target.kind,
        "draft_engine_source": pair.draft.kind,
        "row_block": pair.target_model.engine.model.row_block,
        "exactness": {role: m.engine.model.exactness.as_dict()
                      for role, m in (("target", pair.target_model), ("draft", pair.draft_model))},
        "sampling": {"temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed},
    }
