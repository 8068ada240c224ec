"""The Triton transport's bookkeeping, against a fake client that serves the numpy toy pair.

(The real-server path is exercised by tests/test_bench_server.py when the BLS model is served.)
"""

import json

import numpy as np
import pytest

from specbuild.bench import remote, session
from specbuild.bench.runner import Settings
from specbuild.config import spec_from_dict
from specbuild.speculative.loop import GenerationRequest, generate
from specbuild.speculative.toy import NGramModel, ToyDrafter, ToyVerifier, random_model
from specbuild.triton.client import Chunk

VOCAB = 24
TARGET = random_model(VOCAB, order=2, scale=3.0, seed=1)
DRAFT = NGramModel(TARGET.table + np.random.default_rng(2).normal(0.0, 0.5, size=TARGET.table.shape))


class FakeClient:
    """Streams like SpecbuildClient: one chunk per verify step, stats on the final chunk."""

    instances = []

    def __init__(self, url, protocol="grpc", model="tensorrt_llm_bls", timeout=300.0):
        self.url, self.protocol, self.model = url, protocol, model
        self.closed = False
        FakeClient.instances.append(self)

    def is_ready(self):
        return self.url != "down:1"

    def close(self):
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def is_llmapi(self):  # the BLS, not Triton's llmapi model (bench.session asks first)
        return False

    def generate(self, prompt, max_tokens=64, num_draft_tokens=None, stream=True, **extra):
        ids = [ord(ch) % VOCAB for ch in prompt]
        request = GenerationRequest(max_tokens=max_tokens, num_draft_tokens=num_draft_tokens)
        output = []
        for step in generate(ids, ToyDrafter(DRAFT), ToyVerifier(TARGET, max_draft_len=4), request):
            output += step.tokens
            text = "".join(chr(97 + t) for t in step.tokens)
            if step.stats is None:
                yield Chunk(text, False)
            else:
                yield Chunk(text, False)
                yield Chunk("", True, {"acceptance_rate": step.stats.acceptance_rate,
                                       "num_output_tokens": len(output), "output_ids": output,
                                       "speculation_stats": step.stats.to_dict()})


@pytest.fixture
def fake_server(monkeypatch):
    import specbuild.triton.client as client_module

    FakeClient.instances = []
    monkeypatch.setattr(client_module, "SpecbuildClient", FakeClient)
    monkeypatch.setattr(remote.RemoteTransport, "_model_config",
                        lambda self: {"parameters": {"max_draft_len": {"string_value": "4"}}})


def _spec(tmp_path):
    return spec_from_dict({"name": "remote", "target": {"checkpoint": "missing-t"},
                           "draft": {"checkpoint": "missing-d"}}, tmp_path)


def test_remote_request_reads_the_final_stats(fake_server):
    t = remote.RemoteTransport.connect("127.0.0.1:8001", "grpc")
    assert t.max_draft_len == 4
    from specbuild.bench.workloads import Prompt

    r = t.request(Prompt("def f(x):"), 3, 20, Settings())
    assert r.output_tokens == 20 and r.steps > 0 and r.drafted > 0
    assert r.accepted + r.steps == 20
    assert 0 < r.ttft_seconds <= r.seconds
    assert len(r.per_position_drafted) == 3


def test_server_not_ready_is_a_clear_error(fake_server):
    from specbuild.errors import BenchError

    with pytest.raises(BenchError, match=r"no ready Triton server at down:1 \(grpc\): start one with `specbuild up`"):
        remote.RemoteTransport.connect("down:1", "grpc")


def test_url_bench_with_concurrency_and_no_local_pair(fake_server, tmp_path):
    settings = Settings(num_draft_tokens=(1, 2, 8), concurrency=(1, 2), max_tokens=12, requests=2)
    doc = session.run_bench(_spec(tmp_path), settings, "code", url="127.0.0.1:8001", protocol="grpc")
    json.dumps(doc)
    assert doc["mode"] == "triton"
    assert {(r["concurrency"], r["num_draft_tokens"]) for r in doc["runs"]} == {(c, k) for c in (1, 2) for k in (0, 1, 2)}
    assert any("K = 8 skipped" in n for n in doc["notes"])
    assert any("serving overhead not measured" in n for n in doc["notes"])
    for r in doc["runs"]:
        if r["num_draft_tokens"]:
            assert 0 <= r["alpha"] <= 1 and r["speedup"] > 0
    assert len(FakeClient.instances) >= 2  # one client per concurrent stream
    assert all(c.closed for c in FakeClient.instances)
