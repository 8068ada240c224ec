"""trtllm-serve's CPU stand-in (`serve --server trtllm-serve --trtllm-serve stand-in`, llmapi.openai_server) with the
`openai` Python client: completions and chat completions, streamed or not, usage, and `response_format` as
TensorRT-LLM's `_response_format_to_guided_decoding_params` maps it, exact with the stand-in LLM's speculation (the
engine path's guided text, token for token). A real server process on a free loopback port, always stopped."""

from __future__ import annotations

import json
import re

import pytest
from triton_helpers import make_llmapi_deployment

from specbuild.decode.generation import Options
from specbuild.llmapi import openai_server, trtllm_serve
from specbuild.triton.server import free_port

pytestmark = [pytest.mark.server, pytest.mark.slow]
openai = pytest.importorskip("openai")
TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}<assistant>"
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, example_tiny):
    deployment = make_llmapi_deployment(tmp_path_factory.mktemp("openai-standin"), example_tiny)
    from specbuild.llmapi.checkpoint import checkpoint_dir

    config = checkpoint_dir(deployment.spec, "target") / "tokenizer_config.json"  # this test's copy: a chat template
    config.write_text(json.dumps({**json.loads(config.read_text()), "chat_template": TEMPLATE}))
    return deployment


@pytest.fixture(scope="module")
def server(deployment):
    command = trtllm_serve.plan(deployment.spec, trtllm_serve.stand_in_command(), "127.0.0.1", free_port())
    handle = trtllm_serve.TrtllmServeHandle(command, deployment.root / "standin.log", stop_timeout=20)
    handle.start(timeout=300)
    try:
        yield command
    finally:
        handle.stop()
        assert handle.process is None


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.health_url.removesuffix("/health") + "/v1", api_key="none") as client:
        yield client


@pytest.fixture(scope="module")
def local(deployment):
    """The engine path's pair in-process: greedy and guided references."""
    from specbuild.session.local import LocalSession

    return LocalSession.from_spec(deployment.spec, device="cpu", threads=1)


def test_the_model_is_listed_and_a_greedy_completion_is_the_target_alone(client, local, server):
    model = client.models.list().data[0].id
    assert model == server.argv[server.argv.index("specbuild.llmapi.openai_server") + 1]
    for prompt in ("def add(a, b):", "# Copyright"):
        response = client.completions.create(model=model, prompt=prompt, max_tokens=16, temperature=0)
        expected = local.generate(prompt, Options(max_tokens=16, num_draft_tokens=0))
        assert response.choices[0].text == expected.text
        assert response.choices[0].finish_reason == "length"
        assert response.usage.completion_tokens == 16 and response.usage.prompt_tokens > 0


def test_streamed_text_and_usage_equal_the_whole(client):
    model = client.models.list().data[0].id
    whole = client.completions.create(model=model, prompt="def add(a, b):", max_tokens=20, temperature=0)
    stream = client.completions.create(
        model=model,
        prompt="def add(a, b):",
        max_tokens=20,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert len([c for c in chunks if c.choices and c.choices[0].text]) > 1  # several steps, several chunks
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


@pytest.mark.parametrize(
    ("response_format", "guide_type", "guide"),
    [
        ({"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}}, "json_schema", json.dumps(SCHEMA)),
        ({"type": "json", "schema": SCHEMA}, "json_schema", json.dumps(SCHEMA)),
        ({"type": "json_object"}, "json", ""),
        ({"type": "regex", "regex": "(yes|no), [a-z]{2,10}\\."}, "regex", "(yes|no), [a-z]{2,10}\\."),
        ({"type": "ebnf", "ebnf": 'root ::= "(" [a-z]+ ")"'}, "ebnf_grammar", 'root ::= "(" [a-z]+ ")"'),
    ],
)
def test_response_format_is_the_guide_exact_with_speculation(client, local, response_format, guide_type, guide):
    model = client.models.list().data[0].id
    for prompt in ("Answer: ", "def add(a, b):"):
        response = client.completions.create(
            model=model, prompt=prompt, max_tokens=24, temperature=0, extra_body={"response_format": response_format}
        )
        expected = local.generate(
            prompt, Options(max_tokens=24, num_draft_tokens=0, guide_type=guide_type, guide=guide)
        )
        assert response.choices[0].text == expected.text, (response_format, prompt)
        if response_format["type"] == "regex" and response.choices[0].finish_reason == "stop":
            assert re.fullmatch(response_format["regex"], response.choices[0].text)


def test_a_chat_completion_applies_the_template_and_takes_a_json_schema(client, local, deployment):
    from specbuild.llmapi.checkpoint import checkpoint_dir
    from specbuild.session.chat import chat_text, load_tokenizer

    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "A number, as JSON."}]
    response = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=24,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}},
    )
    prompt = chat_text(load_tokenizer(checkpoint_dir(deployment.spec, "target")), messages)
    expected = local.generate(
        prompt, Options(max_tokens=24, num_draft_tokens=0, guide_type="json_schema", guide=json.dumps(SCHEMA))
    )
    assert response.choices[0].message.content == expected.text


def test_what_the_stand_in_refuses_is_a_bad_request_and_it_keeps_serving(client):
    model = client.models.list().data[0].id
    with pytest.raises(openai.BadRequestError, match="a guided request must be greedy"):
        client.completions.create(  # temperature unset: 1.0, as trtllm-serve's to_sampling_params sets it
            model=model, prompt="x", max_tokens=4, extra_body={"response_format": {"type": "json_object"}}
        )
    with pytest.raises(openai.BadRequestError, match="response_format.regex is required"):
        client.completions.create(
            model=model, prompt="x", max_tokens=4, temperature=0, extra_body={"response_format": {"type": "regex"}}
        )
    with pytest.raises(openai.BadRequestError, match="Unsupported response format: yaml"):
        client.completions.create(
            model=model, prompt="x", max_tokens=4, temperature=0, extra_body={"response_format": {"type": "yaml"}}
        )
    assert client.completions.create(model=model, prompt="x", max_tokens=4, temperature=0).usage.completion_tokens == 4


def test_response_format_maps_as_tensorrt_llms_function_does():
    assert openai_server.guided_decoding(None) is None
    assert openai_server.guided_decoding({"type": "text"}) is None
    assert openai_server.guided_decoding({"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}) == {
        "json": SCHEMA
    }
    assert openai_server.guided_decoding({"type": "json_schema", "json_schema": SCHEMA}) == {"json": SCHEMA}
    assert openai_server.guided_decoding({"type": "ebnf", "ebnf": 'root ::= "a"'}) == {"grammar": 'root ::= "a"'}


def test_serve_starts_the_stand_in_where_trtllm_serve_cannot_run(deployment):
    """`serve --server trtllm-serve --trtllm-serve stand-in --once`: ready (GET /health), then stopped."""
    from click.testing import CliRunner

    from specbuild.cli import main

    port = free_port()
    args = ["serve", "-c", str(deployment.spec_path), "--backend", "llmapi", "--server", "trtllm-serve"]
    result = CliRunner().invoke(
        main, [*args, "--trtllm-serve", "stand-in", "--http-port", str(port), "--once", "--json"]
    )
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["status"] == "ready" and document["endpoints"]["http"] == f"http://127.0.0.1:{port}"
    dry = CliRunner().invoke(main, [*args, "--trtllm-serve", "stand-in", "--dry-run", "--json"])
    assert json.loads(dry.stdout)["argv"][1:3] == ["-m", "specbuild.llmapi.openai_server"]
