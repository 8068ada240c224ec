"""`specbuild generate --local` on the tiny example pair: streamed text, --json figures, errors."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from runtime_models import single_thread  # noqa: F401 (autouse fixture)

from specbuild.cli import main

PROMPT = 'def read_config(path):\n    """Read'


def generate(*args):
    return CliRunner().invoke(main, ["generate", *map(str, args)])


def as_doc(result):
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_json_document_has_the_figures(tiny_spec_path):
    doc = as_doc(generate("--local", "-c", tiny_spec_path, "--json", "--max-tokens", 12, "--no-adaptive", PROMPT))
    for key in (
        "text",
        "output_ids",
        "num_draft_tokens",
        "acceptance_rate",
        "mean_accepted_len",
        "tokens_per_s",
        "finish_reason",
        "engine_source",
        "drafted",
        "accepted",
        "per_position_acceptance",
        "draft_seconds",
        "target_seconds",
    ):
        assert key in doc, key
    assert doc["engine_source"] == "hf-checkpoint"  # nothing built for this spec yet
    from specbuild.config import load_spec

    assert doc["num_draft_tokens"] == load_spec(tiny_spec_path).speculative.num_draft_tokens  # the spec's K
    assert 1 <= len(doc["output_ids"]) <= 12
    # NVIDIA's LLM API finish reasons: "length" at max_tokens, else "stop" (end_id: no stop_reason)
    assert (doc["finish_reason"], doc["stop_reason"]) == (
        ("length", None) if len(doc["output_ids"]) == 12 else ("stop", None)
    )
    assert doc["drafted"] > 0 and 0 <= doc["accepted"] <= doc["drafted"]
    assert doc["acceptance_rate"] == pytest.approx(doc["accepted"] / doc["drafted"])
    assert doc["mean_accepted_len"] >= 1.0 and doc["tokens_per_s"] > 0


def test_streamed_text_equals_the_json_text_and_target_only_output(tiny_spec_path):
    common = ("--local", "-c", tiny_spec_path, "--max-tokens", 16, "--no-adaptive")
    doc = as_doc(generate(*common, "--json", PROMPT))
    target_only = as_doc(generate(*common, "--json", "--num-draft-tokens", 0, PROMPT))
    assert target_only["output_ids"] == doc["output_ids"]  # exact greedy equality through the CLI
    assert target_only["drafted"] == 0 and target_only["num_draft_tokens"] == 0
    streamed = generate(*common, PROMPT)
    assert streamed.exit_code == 0, streamed.output
    assert streamed.stdout == doc["text"] + "\n"
    assert "acceptance" in streamed.stderr and "tokens/s" in streamed.stderr


def test_num_draft_tokens_is_clamped_to_max_draft_len(tiny_spec_path):
    result = generate("--local", "-c", tiny_spec_path, "--json", "--max-tokens", 4, "--num-draft-tokens", 50, PROMPT)
    doc = as_doc(result)
    assert "num_draft_tokens = 50 exceeds the target engine's max_draft_len = 6: using 6" in result.stderr
    assert doc["num_draft_tokens"] == 6 and doc["requested_num_draft_tokens"] == 50


@pytest.mark.parametrize("adaptive", ["--no-adaptive", "--adaptive"])
def test_sampling_with_a_seed_is_reproducible(tiny_spec_path, adaptive):
    # With a seed, adaptive K uses a fixed cost ratio: measured timings must not change the random draws.
    args = (
        "--local",
        "-c",
        tiny_spec_path,
        "--json",
        "--max-tokens",
        10,
        "--temperature",
        0.8,
        "--top-p",
        0.9,
        "--seed",
        3,
        adaptive,
        PROMPT,
    )
    assert as_doc(generate(*args))["output_ids"] == as_doc(generate(*args))["output_ids"]


def test_overlap_gives_the_same_text_and_reports_its_early_drafts(tiny_spec_path):
    common = ("--local", "-c", tiny_spec_path, "--max-tokens", 24, "--no-adaptive", "--num-draft-tokens", 2)
    on = as_doc(generate(*common, "--json", "--overlap", PROMPT))
    off = as_doc(generate(*common, "--json", "--no-overlap", PROMPT))
    assert on["output_ids"] == off["output_ids"]  # greedy: the schedule never changes the text
    assert (on["overlap"], off["overlap"]) == (True, False)
    assert on["early_drafts"] > 0 and 0 <= on["early_draft_hits"] <= on["early_drafts"]
    assert off["early_drafts"] == off["early_draft_hits"] == 0 and off["hidden_seconds"] == 0.0
    assert on["early_draft_hit_rate"] == pytest.approx(on["early_draft_hits"] / on["early_drafts"])
    by_spec = as_doc(generate(*common, "--json", PROMPT))  # the spec says "auto": resolved for this machine
    assert by_spec["overlap"] in ("auto", False) and by_spec["overlap_reason"].startswith("auto")
    shown = generate(*common, "--overlap", PROMPT)
    assert shown.exit_code == 0 and "early drafts " in shown.stderr and "of drafting hidden" in shown.stderr


def test_local_and_url_together_is_a_usage_error(tiny_spec_path):
    result = generate("--local", "--url", "localhost:8001", "-c", tiny_spec_path, PROMPT)
    assert result.exit_code == 2 and "pass either --local or --url, not both" in result.output


def test_bad_options_are_usage_errors(tiny_spec_path):
    assert generate("--local", "-c", tiny_spec_path, "--max-tokens", 0, PROMPT).exit_code == 2
    assert generate("--local", "-c", tiny_spec_path, "--top-p", 0, PROMPT).exit_code == 2
    assert generate("--local", "-c", tiny_spec_path, "--temperature", -1, PROMPT).exit_code == 2


def test_missing_spec_is_an_error(tmp_path):
    result = generate("--local", "-c", tmp_path / "nope.toml", PROMPT)
    assert result.exit_code == 1
    assert "Error: spec file" in result.output and "not found" in result.output


def test_too_long_a_request_is_refused_before_generating(tiny_spec_path):
    result = generate("--local", "-c", tiny_spec_path, "--max-tokens", 600, PROMPT)
    assert result.exit_code == 1
    assert "+ max_tokens 600 = " in result.output and "exceeds the engines' max_seq_len = 512" in result.output


def test_after_convert_and_build_the_reference_engines_run(tiny_spec_path):
    runner = CliRunner()
    for stage in (["convert"], ["build", "--backend", "reference"]):
        result = runner.invoke(main, [*stage, "-c", str(tiny_spec_path)])
        assert result.exit_code == 0, result.output
    common = ("--local", "-c", tiny_spec_path, "--json", "--max-tokens", 12, "--no-adaptive")
    speculative = as_doc(generate(*common, PROMPT))
    assert speculative["engine_source"] == "reference-engine" == speculative["draft_engine_source"]
    assert as_doc(generate(*common, "--num-draft-tokens", 0, PROMPT))["output_ids"] == speculative["output_ids"]


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_no_server_at_the_address_says_so_and_what_to_do(tmp_path, monkeypatch, protocol):
    import socket

    with socket.socket() as sock:  # a port on which nothing listens
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.toml").write_text('name = "p"\n[target]\ncheckpoint = "t"\n[draft]\ncheckpoint = "d"\n')
    result = generate("-c", "s.toml", "--url", f"127.0.0.1:{port}", "--protocol", protocol, "--json", "hello")
    assert result.exit_code == 1
    other = "http" if protocol == "grpc" else "grpc"
    message = (
        f"no Triton server answers at 127.0.0.1:{port} ({protocol}). Start one with `specbuild serve -c "
        f"s.toml` (or `specbuild up -c s.toml`), pass --url with its address (with --protocol {other} if it "
        f"is Triton's {other} port), or run in-process with `specbuild generate -c s.toml --local ...`."
    )
    assert result.stderr == f"Error: {message}\n"
    assert json.loads(result.stdout)["error"] == message


def test_an_address_that_answers_but_not_over_http_is_the_same_clear_error(tmp_path, monkeypatch):
    """Triton's gRPC port given with --protocol http: it answers with HTTP/2 frames, which urllib reads as a bad
    status line (http.client.BadStatusLine, not an OSError): the no-server error with the hint, not a traceback."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]

    def answer() -> None:  # after the request, an HTTP/2 SETTINGS frame (a gRPC server's first frame)
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(b"\x00\x00\x06\x04\x00\x00\x00\x00\x00\x00\x04\x00\x40\x00\x00")

    threading.Thread(target=answer, daemon=True).start()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.toml").write_text('name = "p"\n[target]\ncheckpoint = "t"\n[draft]\ncheckpoint = "d"\n')
    try:
        result = generate("-c", "s.toml", "--url", f"127.0.0.1:{port}", "--protocol", "http", "hello")
    finally:
        server.close()
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.stderr.startswith(f"Error: no Triton server answers at 127.0.0.1:{port} (http).")
    assert "(with --protocol grpc if it is Triton's grpc port)" in result.stderr
