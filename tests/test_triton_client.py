"""Client helpers without a server: output parsing, error messages, argument checks."""

from __future__ import annotations

import io
import json
import urllib.error

import numpy as np
import pytest

from specbuild.errors import ClientError
from specbuild.triton import client as c


def test_stats_are_read_from_the_bls_outputs():
    outputs = {
        "text_output": np.array([b"abc"], dtype=object),
        "acceptance_rate": np.array([[0.5]], np.float32),
        "total_draft_tokens": np.array([[4]], np.int32),
        "output_ids": np.array([[1, 2, 3]], np.int32),
        "speculation_stats": np.array([json.dumps({"drafted": 4, "accepted": 2}).encode()], dtype=object),
    }
    stats = c._stats(outputs)
    assert stats == {"acceptance_rate": 0.5, "total_draft_tokens": 4, "output_ids": [1, 2, 3],
                     "speculation_stats": {"drafted": 4, "accepted": 2}}
    assert c._text(outputs["text_output"]) == "abc" and c._text(None) == "" and c._text(np.array([])) == ""


@pytest.mark.parametrize("body,expected", [
    (b'{"error":"bad max_tokens"}', "bad max_tokens"),
    (b'data: {"error":"in ensemble: streaming needs a decoupled model"}\n\n', "in ensemble: streaming needs a decoupled model"),
    (b"<html>oops</html>", "oops"),
])
def test_http_errors_carry_the_servers_message(body, expected):
    err = urllib.error.HTTPError("http://x", 400, "Bad Request", {}, io.BytesIO(body))
    assert expected in c._http_error(err)


def test_argument_errors(tmp_path):
    with pytest.raises(ClientError, match="protocol 'udp'"):
        c.SpecbuildClient("127.0.0.1:1", protocol="udp")
    client = c.SpecbuildClient("http://127.0.0.1:1", protocol="http")
    assert client.url == "127.0.0.1:1"
    with pytest.raises(ClientError, match="unknown request field"):
        list(client.generate("x", colour="red"))
    with pytest.raises(ClientError, match="cannot reach 127.0.0.1:1"):
        list(client.generate("x", max_tokens=1))
    assert client.is_ready() is False



def test_client_keeps_its_meaning_under_tensorrt_llms_sampling_rules(monkeypatch):
    """TensorRT-LLM is greedy when neither top_k nor top_p is set, and NVIDIA's models return the prompt too."""
    sent = []
    monkeypatch.setattr(c.SpecbuildClient, "_generate_grpc", lambda self, prompt, fields, stop: iter(sent.append(fields) or []))
    client = c.SpecbuildClient("127.0.0.1:1")
    list(client.generate("x", temperature=0.7))
    list(client.generate("x", temperature=0.7, top_k=5))
    list(client.generate("x", exclude_input_in_output=False))
    assert sent[0]["top_p"] == 1.0 and sent[0]["exclude_input_in_output"] is True
    assert "top_p" not in sent[1] and sent[1]["top_k"] == 5
    assert "temperature" not in sent[2] and sent[2]["exclude_input_in_output"] is False
    list(c.SpecbuildClient("127.0.0.1:1", model="ensemble").generate("x"))
    assert "exclude_input_in_output" not in sent[3]  # the ensemble returns what the target model returns
