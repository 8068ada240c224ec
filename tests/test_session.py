"""The generation session without a model or a server: the one driver of the loop (on the numpy toy pair), the
one reader of a response stream, the one URL rule, the K rule as the session applies it (the rule itself: test_draft_len.py), NVIDIA's finish reasons."""

from __future__ import annotations

import json
import socket

import numpy as np
import pytest
from click.testing import CliRunner
from toy_model import NGramModel, ToyDrafter, ToyVerifier, random_model

from specbuild.cli import main
from specbuild.contract.bls_params import BlsParameters
from specbuild.decode.driver import drive
from specbuild.decode.generation import Options, finish_reason
from specbuild.errors import ClientError, RequestError
from specbuild.session.local import LocalSession
from specbuild.session.served import Deployment, ServedSession, read_stream, server_url
from specbuild.speculative.loop import GenerationRequest
from specbuild.speculative.stats import SpeculationStats
from specbuild.triton.client import Chunk

VOCAB = 24
TARGET = random_model(VOCAB, order=2, scale=3.0, seed=1)
DRAFT = NGramModel(TARGET.table + np.random.default_rng(2).normal(0.0, 0.5, size=TARGET.table.shape))


def toy_session(end_id=None, **kwargs) -> LocalSession:
    return LocalSession(
        ToyDrafter(DRAFT, end_id=end_id),
        ToyVerifier(TARGET, max_draft_len=4),
        encode=lambda text: [ord(ch) % VOCAB for ch in text],
        end_id=end_id,
        **kwargs,
    )


# ---- the one K rule ---------------------------------------------------------------------------------------
def test_the_loop_and_the_session_clamp_by_the_same_rule():
    session = toy_session()
    gen = session.generate("def f(x):", Options(max_tokens=12, num_draft_tokens=50))
    assert (gen.k.k, gen.k.requested) == (4, 50)
    assert max(step.k for step in gen.steps) == 4  # the loop ran with the clamped K
    assert session.generate("def f(x):", Options(max_tokens=12)).k.k == session.default_k


# ---- the driver and finish reasons ------------------------------------------------------------------------
def test_finish_reasons_are_nvidias():
    assert [finish_reason(r) for r in ("length", "eos", "stop", "cancelled", None)] == [
        "length",
        "stop",
        "stop",
        "cancelled",
        None,
    ]


def test_length_eos_and_stop_word_finish_as_the_llm_api_says():
    session = toy_session()
    free = session.generate("abc", Options(max_tokens=16, num_draft_tokens=3))
    assert (free.finish_reason, free.stop_reason, len(free.output_ids)) == ("length", None, 16)
    end_id = free.output_ids[5]
    eos = toy_session(end_id=end_id).generate("abc", Options(max_tokens=16, num_draft_tokens=3))
    assert eos.finish_reason == "stop" and eos.stop_reason is None  # end_id: "stop" with no stop reason
    assert eos.output_ids == free.output_ids[: free.output_ids.index(end_id)]
    word = free.output_ids[6:8]
    request = GenerationRequest(max_tokens=16, num_draft_tokens=3, stop_sequences=[word])
    stopped = drive(session.encode("abc"), session.drafter, session.verifier, request, stop_words={tuple(word): "xy"})
    assert (stopped.finish_reason, stopped.stop_reason) == ("stop", "xy")
    assert stopped.output_ids[-2:] == word
    unnamed = drive(session.encode("abc"), session.drafter, session.verifier, request)
    assert unnamed.stop_reason == word  # a stop sequence without text: its token ids


def test_cancellation_stops_at_the_next_step():
    session = toy_session()
    polls = []
    gen = drive(
        session.encode("abc"),
        session.drafter,
        session.verifier,
        GenerationRequest(max_tokens=40, num_draft_tokens=2),
        cancelled=lambda: polls.append(1) or len(polls) > 2,
    )
    assert gen.finish_reason == "cancelled" and 0 < len(gen.output_ids) < 40 and len(gen.steps) == 2


def test_timing_and_steps_are_recorded():
    gen = toy_session().generate("abc", Options(max_tokens=20, num_draft_tokens=3))
    assert 0 < gen.ttft_seconds <= gen.seconds and gen.tokens_per_s > 0
    assert sum(s.accepted for s in gen.steps) + len(gen.steps) >= len(gen.output_ids)
    assert gen.stats.steps == len(gen.steps)
    doc = gen.to_dict()
    assert doc["finish_reason"] == "length" and doc["num_draft_tokens"] == 3 and doc["num_output_tokens"] == 20


def test_a_request_beyond_the_engines_length_is_refused():
    with pytest.raises(RequestError, match=r"the prompt \(3 tokens\) \+ max_tokens 30 = 33 tokens exceeds"):
        toy_session(max_seq_len=32).generate("abc", Options(max_tokens=30))


# ---- the one reader of a response stream --------------------------------------------------------------------
def test_read_stream_joins_text_and_takes_the_final_outputs():
    seen = []
    final = {"finish_reason": "length", "output_ids": [1, 2, 3], "num_output_tokens": 3}
    streamed = read_stream(
        [Chunk("", False), Chunk("ab", False), Chunk("c", False), Chunk("", True, final)], on_text=seen.append
    )
    assert streamed.text == "abc" and seen == ["ab", "c"] and streamed.outputs == final
    assert streamed.ttft_seconds is not None and streamed.ttft_seconds >= 0


def test_deployment_from_the_bls_config_reads_what_the_writer_wrote():
    written = BlsParameters(
        max_draft_len=6,
        num_draft_tokens=4,
        max_input_len=64,
        max_output_len=32,
        tokenizer_dir="t",
        adaptive_draft_len=False,
    )
    config = {"parameters": {key: {"string_value": value} for key, value in written.to_parameters().items()}}
    assert Deployment.from_config(config) == Deployment(6, 4, False, False, add_special_tokens=True)
    assert Deployment.from_config({}) == Deployment(None, None, None)  # not a BLS's config: nothing known
    for word, overlap in (("auto", "auto"), ("TRUE", True), ("false", False), ("", False)):  # "": the BLS's default
        config["parameters"]["overlap"] = {"string_value": word}
        assert Deployment.from_config(config).overlap == overlap


# ---- the schedule: the session's default, a request's own ---------------------------------------------------
class RecordingDrafter(ToyDrafter):
    """A drafter that says whether a schedule used it."""

    def __init__(self, name, used):
        super().__init__(DRAFT)
        self.name, self.used = name, used

    def propose(self, tokens, k, sampling):
        self.used.add(self.name)
        return super().propose(tokens, k, sampling)


def test_the_schedule_is_the_sessions_unless_a_request_says_and_the_text_is_the_same():
    used = set()
    session = LocalSession(
        RecordingDrafter("plain", used),
        ToyVerifier(TARGET, max_draft_len=4),
        encode=lambda text: [ord(ch) % VOCAB for ch in text],
        overlap="auto",
        overlap_reason="auto: 2 cores",
        ahead_drafter=RecordingDrafter("ahead", used),
    )
    default = session.generate("abc", Options(max_tokens=24, num_draft_tokens=3, adaptive=False))
    # "auto": early drafts from the draft's own process, a step's own drafts in this one (its sequential segments
    # are the sequential schedule, without a round trip to the other process)
    assert default.overlap == "auto" and default.stats.early_drafts > 0 and used == {"ahead", "plain"}
    assert default.to_dict()["overlap"] == "auto" and default.to_dict()["overlap_reason"] == "auto: 2 cores"
    used.clear()
    sequential = session.generate("abc", Options(max_tokens=24, num_draft_tokens=3, adaptive=False, overlap=False))
    assert sequential.overlap is False and sequential.stats.early_drafts == 0 and used == {"plain"}
    assert sequential.to_dict()["overlap_reason"] == "overlap False as asked"
    used.clear()
    always = session.generate("abc", Options(max_tokens=24, num_draft_tokens=3, adaptive=False, overlap=True))
    assert always.stats.early_drafts > 0 and used == {"ahead"}
    assert (
        default.output_ids == sequential.output_ids == always.output_ids
    )  # greedy: the schedule never changes the text


class BlsClient:
    """Streams as SpecbuildClient does against the BLS: the figures with the schedule the BLS ran."""

    def __init__(self):
        self.sent = []

    def is_llmapi(self):
        return False

    def model_config(self):
        written = BlsParameters(
            max_draft_len=4, num_draft_tokens=3, max_input_len=64, max_output_len=64, tokenizer_dir="t", overlap="auto"
        ).to_parameters()
        return {"parameters": {key: {"string_value": value} for key, value in written.items()}}

    def close(self):
        pass

    def generate(self, prompt, **fields):
        self.sent.append(fields)
        figures = SpeculationStats(
            drafted=6,
            accepted=4,
            steps=3,
            per_position_drafted=[3, 2, 1],
            per_position_accepted=[2, 1, 1],
            draft_seconds=0.1,
            target_seconds=0.2,
            early_drafts=2,
            early_draft_hits=1,
            hidden_seconds=0.05,
        ).to_dict()
        if fields.get("overlap") is not None:
            figures["overlap"] = fields["overlap"]
        yield Chunk(
            "ab", True, {"finish_reason": "length", "output_ids": [1, 2, 3, 4, 5, 6, 7], "speculation_stats": figures}
        )


def test_a_served_request_sends_its_schedule_and_reads_the_early_draft_figures():
    session = ServedSession("127.0.0.1:1")
    session.client = BlsClient()
    asked = session.generate("hi", Options(max_tokens=7, overlap=True))
    default = session.generate("hi", Options(max_tokens=7))
    assert [sent["overlap"] for sent in session.client.sent] == [True, None]
    assert asked.overlap is True and default.overlap == "auto"  # the BLS's answer, else its configured setting
    assert (asked.stats.early_drafts, asked.stats.early_draft_hits, asked.stats.hidden_seconds) == (2, 1, 0.05)
    doc = asked.to_dict()
    assert doc["early_draft_hit_rate"] == 0.5 and doc["overlap"] is True


class LlmapiClient:
    """Streams as SpecbuildClient does against Triton's llmapi model: text pieces, the final figures as numbers,
    a finish reason, no token ids."""

    def __init__(self, finish: str):
        self.finish, self.sent = finish, []

    def is_llmapi(self):
        return True

    def close(self):
        pass

    def generate(self, prompt, **fields):
        self.sent.append(fields)
        yield Chunk("Hello", False)
        yield Chunk(
            " world",
            True,
            {
                "finish_reason": self.finish,
                "stop_reason": None if self.finish == "length" else "\n",
                "total_draft_tokens": 12,
                "total_accepted_draft_tokens": 5,
            },
        )


class WordTokenizer:
    """One id per word: its length; a BOS (1) first when special tokens are added."""

    def encode(self, text, add_special_tokens=False):
        return [1] * add_special_tokens + [len(word) for word in text.split()]

    def count(self, text):
        return len(self.encode(text))


@pytest.mark.parametrize("finish", ["length", "stop"])
def test_a_generation_on_an_llmapi_deployment_gets_the_specs_k_and_its_token_count(finish):
    session = ServedSession("127.0.0.1:1", llmapi_k=4, tokenizer=WordTokenizer())
    session.client = LlmapiClient(finish)
    gen = session.generate("hi", Options(max_tokens=9, num_draft_tokens=2), on_text=None)
    assert session.deployment() == Deployment(llmapi=True, add_special_tokens=True)
    assert (gen.k.k, gen.k.requested) == (4, 2) and gen.text == "Hello world" and gen.finish_reason == finish
    tokens = 9 if finish == "length" else 2  # max_tokens on "length" (the LLM API's meaning), else counted
    assert gen.output_tokens == tokens and gen.count_estimated == (finish != "length")
    assert gen.count_text() == (
        "9 tokens" if finish == "length" else "~2 tokens (estimated from the text: the server sends no token ids)"
    )
    doc = gen.to_dict()  # no ids made up from the text (a text tokenized again is not the model's ids)
    assert gen.output_ids is None and doc["output_ids"] is None and doc["token_ids"].startswith("not sent")
    assert doc["num_output_tokens_estimated"] is (finish != "length") and gen.prompt_ids == [1, 2]  # BOS: LLM API's
    assert (gen.stats.drafted, gen.stats.accepted, gen.stats.steps) == (12, 5, max(tokens - 5, 1))
    assert session.client.sent[0]["num_draft_tokens"] == 4


# ---- the one URL rule: generate and bench -------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_url_rule(tmp_path):
    from specbuild.config import spec_from_dict

    spec = spec_from_dict(
        {
            "name": "p",
            "target": {"checkpoint": "t"},
            "draft": {"checkpoint": "d"},
            "serve": {"host": "0.0.0.0", "grpc_port": 9001, "http_port": 9000},
        },
        tmp_path,
    )
    assert server_url(spec, "grpc") == "127.0.0.1:9001" and server_url(spec, "http") == "127.0.0.1:9000"
    assert server_url(spec, "http", "http://10.0.0.2:8000/") == "10.0.0.2:8000"


@pytest.mark.parametrize("command", [["generate", "hello"], ["bench", "--requests", "1"]])
def test_generate_and_bench_reach_a_wildcard_host_on_loopback(tmp_path, monkeypatch, command):
    port = _free_port()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.toml").write_text(
        'name = "p"\n[target]\ncheckpoint = "t"\n[draft]\ncheckpoint = "d"\n'
        f'[serve]\nhost = "0.0.0.0"\nhttp_port = {port}\ngrpc_port = {port}\n'
    )
    result = CliRunner().invoke(main, [command[0], "-c", "s.toml", "--protocol", "http", "--json", *command[1:]])
    assert result.exit_code == 1
    message = json.loads(result.stdout)["error"]
    assert message.startswith(
        f"no Triton server answers at 127.0.0.1:{port} (http). Start one with `specbuild serve -c s.toml`"
    ), message


def test_the_pinned_llmapi_outputs_carry_no_ids_and_no_count():
    """Why a served llmapi generation has output_ids None: NVIDIA's model has no output for them."""
    from specbuild.contract import llmapi

    names = [t.name for t in llmapi.OUTPUTS]
    assert "text_output" in names and not [n for n in names if "ids" in n or n.startswith("num_")]


class _Health:
    """A stand-in for Triton's health endpoints on loopback: live always, ready after `not_ready` asks."""

    def __init__(self, not_ready: int):
        import http.server
        import threading

        health = self
        self.asked = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                if self.path == "/v2/health/ready":
                    health.asked += 1
                    ready = health.asked > not_ready
                    self.send_response(200 if ready else 400)
                else:
                    self.send_response(200 if self.path == "/v2/health/live" else 404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_a_server_that_answers_but_is_not_ready_is_waited_for_then_said_to_be_reloading():
    """A model being reloaded makes Triton not ready but live: check_ready waits for it, and where it stays so the
    error says what is happening, not that no server answers."""
    from specbuild.session.served import ServedSession

    health = _Health(not_ready=2)
    try:
        ServedSession(health.url, "http").check_ready(wait_s=30)
        assert health.asked == 3  # ready at the third look
        health.asked = -(10**6)  # not ready for as long as the test looks
        with pytest.raises(ClientError) as err:
            ServedSession(health.url, "http").check_ready(wait_s=1)
        assert str(err.value).startswith(
            f"the Triton server at {health.url} answers but is not ready: a model is loading, or being reloaded"
        )
    finally:
        health.close()
