"""The serving gate's pieces without a server: the gate model's config, `gated`'s set-up (the model name its gauge
carries, the arguments the wrapped class gets, the gauge's family), a Python backend whose TritonError has no
UNAVAILABLE code, and the watched request's sender (flags passed by position, by keyword or not at all). The gate's
behaviour end to end is in tests/test_triton_lifecycle_units.py and, on a real server, tests/test_triton_drain.py."""

from __future__ import annotations

import json
import sys

import pytest
from backend_utils_fake import FINAL, BackendUtils, Request

from specbuild.contract import serving_gate
from specbuild.contract.watched_request import WatchedRequest


def test_the_gate_models_config():
    from specbuild.contract.pbtxt import config_proto

    pb = config_proto()
    config = serving_gate.model_config()
    assert (config.name, config.backend, config.max_batch_size) == ("serving_gate", "python", 0)
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [("OPEN", pb.TYPE_BOOL, [1])]
    assert [(g.count, g.kind) for g in config.instance_group] == [(1, pb.ModelInstanceGroup.KIND_CPU)]
    assert not config.input


class Recording:
    def initialize(self, args):
        self.args = args

    def execute(self, requests):
        self.seen = list(requests)


def _gated(monkeypatch, ready: bool, args: dict):
    utils = BackendUtils({"serving_gate": ready}, unavailable=False)  # an old backend's TritonError: no UNAVAILABLE
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", utils)
    model = serving_gate.gated(Recording)()
    model.initialize(args)
    return model, utils


def test_gated_sets_up_the_gauge_under_the_models_name_and_hands_on_its_arguments(monkeypatch):
    config = {"name": "from_config", "parameters": {serving_gate.GATE_PARAMETER: {"string_value": "serving_gate"}}}
    args = {"model_config": json.dumps(config)}  # no model_name: the config's name
    model, utils = _gated(monkeypatch, True, args)
    assert model.args is args
    assert utils.families == [
        (serving_gate.RUNNING_GAUGE, serving_gate.RUNNING_HELP, "gauge"),
        {"model": "from_config"},
    ]
    assert utils.values == [0]
    assert serving_gate.gated(Recording).__module__ == Recording.__module__
    first, second = Request(), Request()
    model.execute([None, first, second])  # a None in the batch is skipped, not the end of it
    assert [r._request for r in model.seen] == [first, second] and utils.values[-1] == 2
    _, utils = _gated(monkeypatch, True, {"model_name": "given", "model_config": json.dumps(config)})
    assert utils.families[-1] == {"model": "given"}
    _, utils = _gated(monkeypatch, True, {"model_config": json.dumps({})})  # no name anywhere: an empty label
    assert utils.families[-1] == {"model": ""}


def test_a_backend_without_unavailable_refuses_with_unknown(monkeypatch):
    config = {"parameters": {serving_gate.GATE_PARAMETER: {"string_value": "serving_gate"}}}
    model, utils = _gated(monkeypatch, True, {"model_name": "m", "model_config": json.dumps(config)})
    model.execute([Request()])  # seen open: armed
    utils.ready["serving_gate"] = False
    refused = Request()
    model.execute([refused])
    ((response, flags),) = refused.sent
    assert flags == FINAL and response.error.code == "UNKNOWN" and response.error.message == serving_gate.REFUSAL


@pytest.mark.parametrize(
    ("send", "final"),
    [
        (lambda sender: sender.send("r"), False),
        (lambda sender: sender.send("r", 0), False),
        (lambda sender: sender.send("r", FINAL), True),
        (lambda sender: sender.send("r", flags=FINAL), True),
    ],
    ids=["no flags", "flags 0 by position", "final by position", "final by keyword"],
)
def test_a_watched_request_is_answered_once_its_final_response_went_out(send, final):
    request = Request()
    finals = []
    watched = WatchedRequest(request, FINAL, on_final=lambda: finals.append(1))
    assert watched.answered is False
    sender = watched.get_response_sender()
    assert sender is watched.get_response_sender()  # the same sender each time
    send(sender)
    assert watched.answered is final and finals == ([1] if final else [])
    assert sender.is_cancelled() == "asked the real sender"  # everything else is the real sender's
    assert watched.get_response_sender.__self__ is watched and watched.sent == request.sent  # and the request's
