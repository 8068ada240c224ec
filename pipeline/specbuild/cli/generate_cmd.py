"""`specbuild generate`: one prompt through the draft/verify loop, streamed as tokens are accepted.

--local runs the pair in-process (`specbuild.session.local`: the reference runtime, reference engines
when built, else the Hugging Face checkpoints; on the LLM API path, `specbuild.llmapi.local_pair`: the export the llmapi
server loads, as its stand-in runs it). Without --local the prompt goes to a running server
(`specbuild.session.served`). Both return the same document.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from specbuild import backends, drafters, paths
from specbuild.cli.common import emit_json, get_spec, json_option, log, shown_path, spec_option


@click.command("generate")
@click.argument("prompt")
@spec_option
@click.option("--local", "local", is_flag=True, help="Run in-process on the reference runtime (no server).")
@click.option("--url", default=None, help="Server address host:port (server path). Default: the spec's [serve].")
@click.option(
    "--protocol",
    type=click.Choice(["http", "grpc"]),
    default="grpc",
    show_default=True,
    help="Server protocol (server path).",
)
@click.option(
    "--max-tokens", type=click.IntRange(min=1), default=64, show_default=True, help="Tokens to generate at most."
)
@click.option(
    "--num-draft-tokens",
    "num_draft_tokens",
    type=click.IntRange(min=0),
    default=None,
    help="K, draft tokens per step (0 = target only). Default: the spec's num_draft_tokens.",
)
@click.option("--temperature", type=click.FloatRange(min=0), default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True, help="0 = off.")
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True, help="1 = off.")
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=None,
    help="Seed for sampling: the same seed gives the same text (adaptive K then ignores step timings).",
)
@click.option(
    "--stop",
    "stop",
    multiple=True,
    metavar="TEXT",
    help="A stop word (repeat for several): the text ends with the first one generated; finish_reason stop, "
    "stop_reason the word. The engine path keeps the word in the text (as TensorRT-LLM's executor does), "
    "the LLM API path leaves it out (include_stop_str_in_output false).",
)
@click.option(
    "--chat",
    is_flag=True,
    help="PROMPT is a user message: the target tokenizer's chat template (transformers' "
    "apply_chat_template) is applied here, on the client, and the reply is generated.",
)
@click.option("--system", default=None, metavar="TEXT", help="--chat: a system message before the user's.")
@click.option("--stream/--no-stream", default=True, show_default=True, help="Print text as it is accepted.")
@click.option(
    "--adaptive/--no-adaptive",
    default=None,
    help="Adapt K to the running acceptance rate. Default: the spec's speculative.adaptive.",
)
@click.option(
    "--overlap/--no-overlap",
    default=None,
    help="Draft the next step while the target verifies this one (same text; faster where the two "
    "models get a core or GPU each). Default: the spec's speculative.overlap with --local (auto: on "
    "where it pays), else the server's.",
)
@click.option(
    "--drafter",
    type=click.Choice(drafters.NAMES),
    default=None,
    help="What proposes the draft tokens: model (the draft model), lookup (the continuation of the longest "
    "n-gram of the text so far that occurred before; no model), hybrid (per step the lookup where the text repeats, "
    "else the draft model). Default: the spec's speculative.drafter with --local, else the server's.",
)
@click.option(
    "--backend",
    type=click.Choice(backends.NAMES),
    default=None,
    help="--local: which weights run. llmapi: `convert --backend llmapi`'s export, as the llmapi server "
    "loads it (its output_ids are the models', which the llmapi server does not send); trtllm, "
    "reference: reference engines when built, else the Hugging Face checkpoints. " + backends.DEFAULT_HELP,
)
@click.option(
    "--json-schema",
    "json_schema",
    default=None,
    metavar="SCHEMA",
    help="Structured output: the text is JSON valid against SCHEMA (inline JSON, or @file). Greedy only; exact with "
    "speculation.",
)
@click.option("--json-object", "json_object", is_flag=True, help="Structured output: the text is one JSON value.")
@click.option("--regex", default=None, metavar="REGEX", help="Structured output: the text matches REGEX.")
@click.option(
    "--grammar",
    default=None,
    metavar="EBNF",
    help="Structured output: the text follows the EBNF grammar (xgrammar's dialect, rule `root`; inline or @file).",
)
@click.option("--device", default="auto", show_default=True, help="--local: cpu, cuda, or auto.")
@click.option(
    "--no-cache", "no_cache", is_flag=True, help="--local: disable the KV and prefix caches (slower; same output)."
)
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=None,
    help="--local on CPU: torch threads. Default: 1 for small models, else torch's default.",
)
@json_option
def command(
    prompt,
    spec_path,
    local,
    url,
    protocol,
    max_tokens,
    num_draft_tokens,
    temperature,
    top_k,
    top_p,
    seed,
    stop,
    chat,
    system,
    stream,
    adaptive,
    overlap,
    drafter,
    backend,
    json_schema,
    json_object,
    regex,
    grammar,
    device,
    no_cache,
    threads,
    as_json,
):
    """Generate text for PROMPT with speculative decoding.

    \b
    Examples:
      specbuild generate --local "def fibonacci(n):"
      specbuild generate --local --num-draft-tokens 0 "def fibonacci(n):"    # target only
      specbuild generate --local --json --temperature 0.8 --seed 1 "Once upon a time"
      specbuild generate --local --stop return "def add(a, b):"    # ends with the first "return"
      specbuild generate --local --drafter lookup "Repeat: the cat sat on the mat. Repeat: the cat"
      specbuild generate --chat --system "Be brief." "What is speculative decoding?"
      specbuild generate --local --json-schema @person.schema.json "A person as JSON: "
      specbuild generate --local --regex "[0-9]{1,3}" "The answer is "

    Text goes to stdout (streamed unless --no-stream); acceptance figures to stderr, or
    everything as one JSON document with --json.
    """
    if local and url:
        raise click.UsageError("pass either --local or --url, not both.")
    if system is not None and not chat:
        raise click.UsageError("--system goes with --chat.")
    from specbuild.decode.generation import Options

    spec = get_spec(spec_path)
    if chat:
        from specbuild.session.chat import chat_prompt, load_tokenizer

        prompt = chat_prompt(load_tokenizer(spec.target.checkpoint), prompt, system)
    options = Options(
        max_tokens=max_tokens,
        num_draft_tokens=num_draft_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        adaptive=adaptive,
        overlap=None if local else overlap,
        drafter=drafter,
        stop=tuple(stop),
        **_guide(json_schema, json_object, regex, grammar),
    )
    echo = None if as_json or not stream else _echo_stdout
    if local:
        path = paths.for_backend(backend or backends.default(spec.build.backend))
        with path.local_session(
            spec, device=device, use_cache=not no_cache, threads=threads, overlap=overlap
        ) as session:
            generation = session.generate(prompt, options, on_text=echo)
    else:
        from specbuild.session.served import ServedSession

        with ServedSession.for_spec(spec, protocol, url, spec_path=shown_path(spec.path)) as session:
            generation = session.generate(prompt, options, on_text=echo, stream=echo is not None)
    if generation.k is not None and generation.k.clamped:
        log(generation.k.note())
    doc = generation.to_dict()
    if as_json:
        emit_json(doc)
        return
    if echo is None:
        click.echo(doc["text"])
    else:
        click.echo("")
    log(summary(doc))


def _guide(json_schema: str | None, json_object: bool, regex: str | None, grammar: str | None) -> dict[str, str]:
    """The one guide the options ask for, as Options' guide_type / guide (NVIDIA's guide types)."""
    asked = {
        "json_schema": json_schema,
        "json": "" if json_object else None,
        "regex": regex,
        "ebnf_grammar": grammar,
    }
    given = {kind: text for kind, text in asked.items() if text is not None}
    if len(given) > 1:
        raise click.UsageError("pass one of --json-schema, --json-object, --regex, --grammar.")
    if not given:
        return {}
    ((kind, text),) = given.items()
    if kind in ("json_schema", "ebnf_grammar") and text.startswith("@"):
        try:
            text = Path(text[1:]).read_text()
        except OSError as err:
            option = "--json-schema" if kind == "json_schema" else "--grammar"
            raise click.BadParameter(f"cannot read {text[1:]}: {err.strerror}", param_hint=option) from None
    return {"guide_type": kind, "guide": text}


def _echo_stdout(text: str) -> None:
    click.echo(text, nl=False)
    sys.stdout.flush()


def summary(doc: dict[str, Any]) -> str:
    from specbuild.decode.generation import count_text

    count = count_text(doc["num_output_tokens"], doc["num_output_tokens_estimated"])
    parts = [f"{count}, {doc['tokens_per_s']:.1f} tokens/s, finish: {doc['finish_reason']}"]
    if doc["num_draft_tokens"] is None:
        parts.append("K: the server's default")
    elif doc["num_draft_tokens"]:
        parts.append(
            f"K = {doc['num_draft_tokens']}: acceptance {doc['acceptance_rate']:.2f} ({doc['accepted']}/{doc['drafted']} "
            f"drafted), mean accepted length {doc['mean_accepted_len']:.2f}"
        )
    else:
        parts.append("K = 0 (target only)")
    by_drafter = doc.get("by_drafter") or {}
    if doc.get("drafter") not in (None, "model") or len(by_drafter) > 1:
        parts.append(
            f"drafter {doc.get('drafter')}: "
            + ", ".join(
                f"{name} {d['proposals']}/{d['steps']} steps proposed, {d['accepted']}/{d['drafted']} accepted"
                for name, d in by_drafter.items()
            )
        )
    if doc.get("early_drafts"):
        parts.append(
            f"early drafts {doc['early_draft_hits']}/{doc['early_drafts']} used, "
            f"{doc['hidden_seconds']:.3f} s of drafting hidden"
        )
    if doc.get("engine_source"):
        parts.append(f"weights: {doc['engine_source']}")
    return "; ".join(parts)
