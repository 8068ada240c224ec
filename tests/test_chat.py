"""Chat prompts (session.chat): the tokenizer's template applied by transformers on the client, the BOS a template
writes kept once, a tokenizer without a template refused by name, `generate --chat` on a local pair, and the same
prompt ids from trtllm-serve's chat endpoint on the LLM API path's export."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from convert_helpers import CHAT_TEMPLATE, make_tokenizer
from family_models import make_family

from specbuild.cli import main
from specbuild.errors import RequestError
from specbuild.session.chat import chat_prompt, load_tokenizer

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "brown fox"}]


@pytest.mark.parametrize("adds_bos", [True, False])
def test_the_prompt_tokenizes_to_exactly_the_templates_ids(tmp_path, adds_bos):
    make_tokenizer(tmp_path, 256, chat_template=CHAT_TEMPLATE, adds_bos=adds_bos)
    tokenizer = load_tokenizer(tmp_path)
    text = chat_prompt(tokenizer, "brown fox", system="Be brief.")
    want = list(tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False))
    assert tokenizer(text)["input_ids"] == want  # what the BLS and preprocessing encode (add_special_tokens)
    assert want.count(tokenizer.bos_token_id) == 1
    assert text.startswith("<s>") is not adds_bos  # left to the tokenizer when it adds BOS itself


def test_a_tokenizer_without_a_template_is_refused_by_name(tmp_path):
    make_tokenizer(tmp_path, 256)
    with pytest.raises(RequestError, match="has no chat template .* without --chat"):
        chat_prompt(load_tokenizer(tmp_path), "hi")


def chat_pair(tmp_path):
    folder = make_family(tmp_path / "m", "llama", chat=True)
    spec = tmp_path / "specbuild.toml"
    spec.write_text(
        f'name = "chat"\noutput_dir = "{tmp_path / "engines"}"\n[target]\ncheckpoint = "{folder}"\n'
        f'[draft]\ncheckpoint = "{folder}"\n[build]\nmax_seq_len = 252\nmax_input_len = 128\n'
        "[speculative]\nmax_draft_len = 4\nnum_draft_tokens = 2\n"
    )
    return folder, spec


def test_generate_chat_locally_sends_the_template(tmp_path):
    folder, spec = chat_pair(tmp_path)
    result = CliRunner().invoke(
        main,
        [
            "generate",
            "-c",
            str(spec),
            "--local",
            "--json",
            "--max-tokens",
            "6",
            "--chat",
            "--system",
            "Be brief.",
            "brown fox",
        ],
    )
    assert result.exit_code == 0, result.output
    tokenizer = load_tokenizer(folder)
    want = list(tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False))
    assert json.loads(result.stdout)["prompt_ids"] == want
    refused = CliRunner().invoke(main, ["generate", "-c", str(spec), "--local", "--system", "x", "hi"])
    assert refused.exit_code == 2 and "--system goes with --chat" in refused.output


def test_the_chat_workload_and_messages_records_go_through_the_template(tmp_path):
    from specbuild.bench import workloads
    from specbuild.errors import BenchError

    make_tokenizer(tmp_path / "tok", 256, chat_template=CHAT_TEMPLATE, adds_bos=True)
    tokenizer = load_tokenizer(tmp_path / "tok")
    chat = workloads.load("chat", 2, tmp_path / "tok").prompts
    prose = workloads.load("prose", 2).prompts
    for asked, plain in zip(chat, prose):
        assert asked.text == chat_prompt(tokenizer, plain.text)
    lines = tmp_path / "w.jsonl"
    lines.write_text(json.dumps({"messages": MESSAGES, "max_tokens": 5}) + "\n" + json.dumps({"prompt": "x"}) + "\n")
    first, second = workloads.load(str(lines), 2, tmp_path / "tok").prompts
    assert (first.text, first.max_tokens, second.text) == (chat_prompt(tokenizer, "brown fox", "Be brief."), 5, "x")
    make_tokenizer(tmp_path / "plain", 256)
    with pytest.raises(BenchError, match="the chat workload: the target's tokenizer has no chat template"):
        workloads.load("chat", 2, tmp_path / "plain")


def test_trtllm_serves_chat_endpoint_reads_the_same_template_from_the_llm_api_export(tmp_path):
    """trtllm-serve's /v1/chat/completions renders the messages with the chat template of the tokenizer in its model
    folder (tensorrt_llm/serve/openai_server.py `openai_chat`, through tensorrt_llm/inputs/utils.py
    `apply_chat_template`, tokenize=False) and encodes the text without adding special tokens (openai_protocol.py
    ChatCompletionRequest.add_special_tokens defaults to False; both as on TensorRT-LLM's main, 2026). On the export
    `convert --backend llmapi` writes, that gives the prompt ids `generate --chat` sends. trtllm-serve itself cannot
    run here; this holds the part specbuild writes: the tokenizer files and their template."""
    from specbuild.config import load_spec
    from specbuild.llmapi.checkpoint import checkpoint_dir

    folder, spec = chat_pair(tmp_path)
    result = CliRunner().invoke(main, ["convert", "-c", str(spec), "--backend", "llmapi"])
    assert result.exit_code == 0, result.output
    exported = load_tokenizer(checkpoint_dir(load_spec(spec), "target"))
    text = exported.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    served = exported.encode(text, add_special_tokens=False)
    source = load_tokenizer(folder)
    assert served == list(
        source.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False)
    )
    assert served == source(chat_prompt(source, "brown fox", system="Be brief."))["input_ids"]  # generate --chat's
