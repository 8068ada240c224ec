"""Client helpers without a server: output parsing, error messages, argument checks."""

from __future__ import annotations

import io
import json
import re
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
    assert stats == {
        "acceptance_rate": 0.5,
        "total_draft_tokens": 4,
        "output_ids": [1, 2, 3],
        "speculation_stats": {"drafted": 4, "accepted": 2},
    }
    assert c._text(outputs["text_output"]) == "abc" and c._text(None) == "" and c._text(np.array([])) == ""


@pytest.mark.parametrize(
    "body,expected",
    [
        (b'{"error":"bad max_tokens"}', "bad max_tokens"),
        (
            b'data: {"error":"in ensemble: streaming needs a decoupled model"}\n\n',
            "in ensemble: streaming needs a decoupled model",
        ),
        (b"<html>oops</html>", "oops"),
    ],
)
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
    monkeypatch.setattr(
        c.SpecbuildClient,
        "_generate_grpc",
        lambda self, prompt, fields, stop, parameters: iter(sent.append(fields) or []),
    )
    client = c.SpecbuildClient("127.0.0.1:1")
    list(client.generate("x", temperature=0.7))
    list(client.generate("x", temperature=0.7, top_k=5))
    list(client.generate("x", exclude_input_in_output=False))
    assert sent[0]["top_p"] == 1.0 and sent[0]["exclude_input_in_output"] is True
    assert "top_p" not in sent[1] and sent[1]["top_k"] == 5
    assert "temperature" not in sent[2] and sent[2]["exclude_input_in_output"] is False
    list(c.SpecbuildClient("127.0.0.1:1", model="ensemble").generate("x"))
    assert "exclude_input_in_output" not in sent[3]  # the ensemble returns what the target model returns


def test_overlap_travels_as_a_request_parameter_to_the_bls_only(monkeypatch):
    sent = []
    monkeypatch.setattr(
        c.SpecbuildClient,
        "_generate_grpc",
        lambda self, prompt, fields, stop, parameters: iter(sent.append((fields, parameters)) or []),
    )
    client = c.SpecbuildClient("127.0.0.1:1")
    list(client.generate("x", max_tokens=4))
    list(client.generate("x", max_tokens=4, overlap=True))
    list(client.generate("x", max_tokens=4, overlap="auto"))
    assert [p for _, p in sent] == [{}, {"overlap": True}, {"overlap": "auto"}]
    assert all("overlap" not in fields for fields, _ in sent)  # never a tensor: the BLS's inputs stay NVIDIA's
    with pytest.raises(ClientError, match="overlap is a setting of the speculative BLS; ensemble has no such"):
        list(c.SpecbuildClient("127.0.0.1:1", model="ensemble").generate("x", overlap=True))


LLMAPI_CONFIG = {"input": [{"name": "text_input"}, {"name": "sampling_param_max_tokens"}, {"name": "streaming"}]}


def test_the_client_finds_the_llmapi_model_only_where_there_is_no_bls(monkeypatch):
    served = {}
    monkeypatch.setattr(c.SpecbuildClient, "_config", lambda self, model: served.get(model))
    served.update({"tensorrt_llm": LLMAPI_CONFIG})
    client = c.SpecbuildClient("127.0.0.1:1")
    assert client.is_llmapi() and client.model == "tensorrt_llm"
    served["tensorrt_llm_bls"] = {"input": [{"name": "text_input"}, {"name": "max_tokens"}]}
    client = c.SpecbuildClient("127.0.0.1:1")
    assert not client.is_llmapi() and client.model == "tensorrt_llm_bls"
    served["tensorrt_llm"] = {"input": [{"name": "input_ids"}]}  # the engine path's target model
    assert not c.SpecbuildClient("127.0.0.1:1", model="tensorrt_llm").is_llmapi()
    assert not c.SpecbuildClient("127.0.0.1:1", model="ensemble").is_llmapi()


def test_an_llmapi_request_uses_nvidias_input_names_without_a_batch_dimension(monkeypatch):
    sent = []
    monkeypatch.setattr(
        c.SpecbuildClient, "_config", lambda self, model: LLMAPI_CONFIG if model == "tensorrt_llm" else None
    )
    monkeypatch.setattr(
        c.SpecbuildClient,
        "_generate_grpc",
        lambda self, prompt, fields, stop, parameters: iter(sent.append(self._request(fields, stop)) or []),
    )
    client = c.SpecbuildClient("127.0.0.1:1")
    list(client.generate("x", max_tokens=8, num_draft_tokens=3, temperature=0.5, seed=7, stop_words=["\n\n"]))
    request = sent[0]
    assert not request.batched
    assert {name: value for name, (value, _, _) in request.inputs.items()} == {
        "sampling_param_max_tokens": 8,
        "sampling_param_temperature": 0.5,
        "sampling_param_top_p": 1.0,
        "sampling_param_seed": 7,
        "streaming": True,
        "sampling_param_exclude_input_from_output": True,
        "return_finish_reason": True,
        "return_stop_reason": True,
        "sampling_param_return_perf_metrics": True,
        "sampling_param_stop": ["\n\n"],
    }  # num_draft_tokens: the LLM API drafts its own max_draft_len
    assert request.inputs["sampling_param_seed"][1:] == ("UINT64", np.uint64)
    with pytest.raises(ClientError, match=r"request field\(s\) \['end_id'\] have no input in Triton's llmapi model"):
        list(client.generate("x", end_id=2))


def test_llmapi_responses_become_text_pieces_and_numbers():
    responses = c._LlmapiResponses()
    text = lambda t: np.array([t.encode()], dtype=object)  # noqa: E731
    assert responses.chunk({"text_output": text("def")}, False).text == "def"
    assert responses.chunk({"text_output": text("def")}, False) is None  # nothing new
    assert not responses.reads("acceptance_rate", False) and responses.reads("acceptance_rate", True)
    final = responses.chunk(
        {
            "text_output": text("def add"),
            "finish_reason": text("length"),
            "stop_reason": text("None"),
            "acceptance_rate": text("0.5"),
            "total_draft_tokens": text("8"),
            "total_accepted_draft_tokens": text("4"),
            "first_token_time_ns": text("None"),
        },
        True,
    )
    assert final.final and final.text == " add"
    assert final.stats == {
        "finish_reason": "length",
        "stop_reason": None,
        "acceptance_rate": 0.5,
        "total_draft_tokens": 8,
        "total_accepted_draft_tokens": 4,
        "first_token_time_ns": None,
    }


@pytest.mark.parametrize(
    "field, value, message",
    [
        (
            "max_tokens",
            2**32 + 5,
            "request field 'max_tokens' = 4294967301: outside the range of its input type INT32 "
            "(-2147483648..2147483647)",
        ),
        ("max_tokens", 2**31, "outside the range of its input type INT32"),
        ("end_id", -(2**31) - 1, "outside the range of its input type INT32"),
        ("seed", -1, "request field 'seed' = -1: outside the range of its input type UINT64 (0..18446744073709551615)"),
        ("seed", 2**64, "outside the range of its input type UINT64"),
        ("max_tokens", 4.5, "request field 'max_tokens' = 4.5: expected an integer (INT32)"),
        ("top_k", True, "expected an integer (INT32)"),
        ("temperature", "hot", "expected a number (FP32)"),
    ],
)
def test_fields_outside_their_input_type_are_refused_before_sending(monkeypatch, field, value, message):
    """Over HTTP generate Triton casts a JSON integer to the input's type (2^32 + 5 becomes 5): the client sends
    only values of the input's type, on both protocols."""
    sent = []
    for transport in ("_generate_grpc", "_generate_http"):
        monkeypatch.setattr(
            c.SpecbuildClient, transport, lambda self, prompt, fields, stop, parameters: iter(sent.append(fields) or [])
        )
    for protocol in ("grpc", "http"):
        client = c.SpecbuildClient("127.0.0.1:1", protocol=protocol, model="ensemble")
        with pytest.raises(ClientError, match=re.escape(message)):
            list(client.generate("x", **{field: value}))
    assert sent == []
    list(
        c.SpecbuildClient("127.0.0.1:1", protocol="http", model="ensemble").generate(
            "x", max_tokens=np.int64(2**31 - 1), seed=2**64 - 1, temperature=1
        )
    )
    assert sent[-1]["max_tokens"] == 2**31 - 1 and type(sent[-1]["max_tokens"]) is int
    assert sent[-1]["seed"] == 2**64 - 1 and sent[-1]["temperature"] == 1.0


class _BrokenTransport:
    """gRPC's response iterator for a stream whose server went away before anything was sent: it raises what grpc
    raises then (UNAVAILABLE, "Socket closed") and is no longer active."""

    def __iter__(self):
        return self

    def __next__(self):
        import grpc

        class Closed(grpc.RpcError):
            def code(self):
                return grpc.StatusCode.UNAVAILABLE

            def details(self):
                return "Socket closed"

            def debug_error_string(self):
                return "Socket closed"

        raise Closed()

    def is_active(self):
        return False

    def cancel(self):
        pass


def _broken_before_send(monkeypatch):
    """tritonclient's own stream (tritonclient/grpc/_infer_stream.py), its transport broken before the request is
    sent: its reader marks it inactive and reports why through the callback, then async_stream_infer refuses with
    "The stream is no longer in valid state ..."; start_stream waits for the reader so that order is certain."""
    import tritonclient.grpc as grpcclient

    real_start = grpcclient.InferenceServerClient.start_stream

    def start_stream(self, callback, **kwargs):
        self._client_stub.ModelStreamInfer = lambda *args, **kw: _BrokenTransport()
        real_start(self, callback, **kwargs)
        self._stream._handler.join()

    monkeypatch.setattr(grpcclient.InferenceServerClient, "start_stream", start_stream)
    monkeypatch.setattr(c.SpecbuildClient, "_config", lambda self, model: None)


def test_a_stream_broken_before_its_request_is_sent_is_a_cut(monkeypatch):
    """Found by the chaos soak: the server went away between two requests on one client; the next send is refused
    by tritonclient, and the reason its reader reported (the transport's) decides: a cut, resumed like any other."""
    _broken_before_send(monkeypatch)
    with pytest.raises(c.StreamCut, match="tensorrt_llm_bls: Socket closed"):
        list(c.SpecbuildClient("127.0.0.1:1", resume_s=0).generate("x", max_tokens=4))
    waited = []
    monkeypatch.setattr(c.SpecbuildClient, "_wait_until_serving", lambda self, deadline: waited.append(deadline))
    with pytest.raises(c.StreamCut, match="did not serve again within 9 s"):
        list(c.SpecbuildClient("127.0.0.1:1", resume_s=9).generate("x", max_tokens=4))
    assert len(waited) == 1  # waited for the server once, as for a stream cut in the middle
