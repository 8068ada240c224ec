"""Guided (structured) output with speculation is exact: greedy guided output at any K, with any drafter, equals the
target's own constrained greedy decoding (at each position the argmax of its logits over the tokens the grammar
allows), computed here independently from the reference engine's logits and xgrammar's masks. Held-out guides of
every type NVIDIA names (json, json_schema, regex, ebnf_grammar) and prompts the pair was not built from.

Also: the reference model honours `bad_words_list` as TensorRT-LLM's ban-words layer does for what the loop sends
(one-token words, a plain request) and refuses what it cannot honour; a bad guide is refused by name."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from specbuild.decode.generation import Options
from specbuild.decode.grammar import GuideRequest
from specbuild.errors import RequestError
from specbuild.session.local import LocalSession
from specbuild.speculative.interfaces import SamplingParams

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}}},
    {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "tags": {"type": "array", "items": {"enum": ["a", "b"]}}},
        "required": ["ok", "tags"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"type": "integer", "minimum": 0}, "maxItems": 3},
    {"enum": ["red", "green", "blue"]},
]
REGEXES = [r"[0-9]{1,6}(\.[0-9]{2})?", r"(def|class) [a-z_]{1,10}\(\)", r"[A-Z][a-z]{2,8}( [a-z]{2,8}){0,3}\."]
EBNF = 'root ::= "(" item ("," item)* ")"\nitem ::= [a-z]+ | [0-9]+'
GUIDES = (
    [GuideRequest("json_schema", json.dumps(s)) for s in SCHEMAS]
    + [GuideRequest("regex", r) for r in REGEXES]
    + [GuideRequest("ebnf_grammar", EBNF), GuideRequest("json")]
)
PROMPTS = ["def add(a, b):", "The answer is ", "config = ", "# a list of numbers\nx = ", "Name:"]
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def session(tmp_path_factory, example_tiny):
    from specbuild.config import load_spec
    from specbuild.example import specfile

    text = specfile.render_spec(specfile.example_overrides(example_tiny, "tiny"), header="test spec (tiny example)")
    path = specfile.write_spec(tmp_path_factory.mktemp("guided") / "specbuild.toml", text)
    with LocalSession.from_spec(load_spec(path), device="cpu", threads=1) as local:
        yield local


def constrained_greedy(session: LocalSession, prompt: str, guide: GuideRequest, max_tokens: int) -> list[int]:
    """The target alone, one position at a time: the argmax of its logits where the grammar allows, until an end id
    or max_tokens. Nothing of the loop, the drafters or bad_words_list is used."""
    engine = session.pair.target_model.engine
    grammar = session.rules.grammars.guide(guide)
    ends = set(session.rules.end_ids)
    tokens = session.encode(prompt)
    out: list[int] = []
    while len(out) < max_tokens:
        logits = engine.logits([tokens + out], [1])[0][-1].astype(np.float64)
        logits[~grammar.allowed()] = -np.inf
        token = int(np.argmax(logits))
        if token in ends:
            break
        grammar.advance([token])
        out.append(token)
    return out


@pytest.mark.parametrize("guide", GUIDES, ids=lambda g: f"{g.type}:{g.text[:24]}")
def test_guided_greedy_equals_the_targets_constrained_greedy_at_every_k(session, guide):
    constrained = 0
    for prompt in PROMPTS[:3]:
        expected = constrained_greedy(session, prompt, guide, MAX_TOKENS)
        for k, drafter in ((0, None), (1, None), (4, None), (3, "lookup"), (4, "hybrid")):
            options = Options(
                max_tokens=MAX_TOKENS, num_draft_tokens=k, drafter=drafter, guide_type=guide.type, guide=guide.text
            )
            generation = session.generate(prompt, options)
            assert generation.output_ids == expected, (prompt, k, drafter)
            constrained += generation.stats.constrained_steps
            if generation.finish_reason == "stop" and guide.type in ("json_schema", "json"):
                json.loads(generation.text)  # a finished JSON guide parses
            if generation.finish_reason == "stop" and guide.type == "regex":
                assert re.fullmatch(guide.text, generation.text), generation.text
    assert constrained > 0  # the target's own token was refused somewhere: the constrained step was exercised


def test_the_guide_changes_the_output_so_the_equality_above_can_fail(session):
    """A negative control: the same prompts unguided differ from the guided outputs, so equal guided outputs at every
    K are the guide's doing, not the prompts'."""
    differing = 0
    for guide in GUIDES[:4]:
        for prompt in PROMPTS[:3]:
            free = session.generate(prompt, Options(max_tokens=MAX_TOKENS, num_draft_tokens=0)).output_ids
            differing += free != constrained_greedy(session, prompt, guide, MAX_TOKENS)
    assert differing >= 10


def test_a_finished_guided_output_validates(session):
    """With room to finish, the enum and the small array schemas end at the end id with text their schema takes."""
    enum = session.generate(
        "Pick one: ", Options(max_tokens=12, guide_type="json_schema", guide=json.dumps(SCHEMAS[3]))
    )
    assert enum.finish_reason == "stop" and json.loads(enum.text) in ("red", "green", "blue")
    number = session.generate("x = ", Options(max_tokens=12, num_draft_tokens=4, guide_type="regex", guide=REGEXES[0]))
    assert number.finish_reason == "stop" and re.fullmatch(REGEXES[0], number.text)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (Options(guide_type="yaml", guide="a: 1"), "guided_decoding_guide_type = 'yaml' is unknown"),
        (Options(guide_type="regex", guide=""), "guided_decoding_guide is empty"),
        (Options(guide="[0-9]+"), "without guided_decoding_guide_type"),
        (Options(guide_type="json_schema", guide="{bad"), r"\(json_schema\) does not compile: Failed to parse JSON"),
        (Options(guide_type="regex", guide="("), r"\(regex\) does not compile: Regex parsing error"),
        (Options(guide_type="ebnf_grammar", guide="root ::= foo"), r'does not compile: .*Rule "foo" is not defined'),
        (Options(guide_type="json", temperature=0.8, seed=1), "a guided request must be greedy"),
    ],
)
def test_a_bad_guided_request_is_refused_by_name(session, options, message):
    with pytest.raises(RequestError, match=message):
        session.generate("x", options)


def test_a_guided_request_must_end_at_the_deployments_end_ids(session):
    with pytest.raises(RequestError, match="cannot end a guided request"):
        session.rules.prepare(max_tokens=4, sampling=SamplingParams(), end_id=-1, guide=GuideRequest("json"))


def test_the_reference_model_bans_one_token_bad_words_on_a_plain_request(session):
    """What TensorRT-LLM's ban-words layer does with one-token words: the choice among the rest."""
    model = session.pair.target_model
    ids = session.encode("def add(a, b):")
    logits = model.engine.logits([ids], [1])[0][-1]
    order = np.argsort(-logits)
    banned = [int(t) for t in order[:3]]

    def request(**extra):
        base = {
            "input_ids": np.array(ids, np.int32),
            "input_lengths": np.array([len(ids)], np.int32),
            "request_output_len": np.array([1], np.int32),
            "runtime_top_k": np.array([1], np.int32),
        }
        return {**base, **extra}

    words = np.stack([np.array(banned, np.int32), np.arange(1, 4, dtype=np.int32)])
    out = model(request(bad_words_list=words))
    assert out["output_ids"][0, -1] == order[3]
    assert model(request())["output_ids"][0, -1] == order[0]
    with pytest.raises(RequestError, match="with 'draft_input_ids' is not supported"):
        model(request(bad_words_list=words, draft_input_ids=np.array([1], np.int32)))
    with pytest.raises(RequestError, match="a word of several tokens"):
        model(request(bad_words_list=np.array([[banned[0], banned[1]], [2, -1]], np.int32)))
