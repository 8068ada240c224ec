"""What the fuzz tests of the served models share (tests/test_bls_fuzz.py, tests/test_models_fuzz.py): the wire types
of the declared types, values of each type from its whole range and its edges, the stream that runs beside the
fuzzing, the tiny pair's server they fuzz, and the server log's traceback count."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import numpy as np
from hypothesis import strategies as st
from triton_helpers import make_deployment, serving

from specbuild.triton.client import SpecbuildClient

WIRE = {  # a declared type -> (Triton's wire datatype, numpy dtype); LOGITS: the repository's logits type, FP32
    "TYPE_STRING": ("BYTES", object),
    "TYPE_INT32": ("INT32", np.int32),
    "TYPE_UINT64": ("UINT64", np.uint64),
    "TYPE_UINT8": ("UINT8", np.uint8),
    "TYPE_FP32": ("FP32", np.float32),
    "TYPE_FP16": ("FP16", np.float16),
    "LOGITS": ("FP32", np.float32),
    "TYPE_BOOL": ("BOOL", np.bool_),
}
OTHER_TYPES = [("INT64", np.int64), ("FP64", np.float64), ("INT8", np.int8), ("BYTES", object), ("BOOL", np.bool_)]
PROMPT = "def add(a, b):"


def value_of(declared: str, draw):
    """A value of the declared type, drawn from its whole range and its edges (the shape is the caller's)."""
    if declared == "TYPE_STRING":
        return draw(
            st.one_of(
                st.binary(max_size=40),  # often not UTF-8
                st.text(max_size=40).map(str.encode),
                st.just(b""),
                st.just(("x" * 200_000).encode()),  # huge
            )
        )
    if declared == "TYPE_INT32":
        return draw(st.one_of(st.integers(-(2**31), 2**31 - 1), st.sampled_from([-1, 0, 1, 3, 2**31 - 1, -(2**31)])))
    if declared == "TYPE_UINT64":
        return draw(st.integers(0, 2**64 - 1))
    if declared == "TYPE_UINT8":
        return draw(st.integers(0, 255))
    if declared in ("TYPE_FP32", "LOGITS"):
        return draw(st.floats(width=32, allow_nan=True, allow_infinity=True))
    if declared == "TYPE_FP16":
        return draw(st.floats(width=16, allow_nan=True, allow_infinity=True))
    return draw(st.booleans())


@contextlib.contextmanager
def tiny_server(root: Path, example_tiny):
    """The tiny pair's repository in `root`, served (the handle) until the block ends."""
    deployment = make_deployment(root, example_tiny)
    with serving(deployment.repo, deployment.root / "server.log") as handle:
        yield handle


def stream_beside(server):
    """A greedy BLS stream started beside the fuzzing: (its thread, its outcome {"text"} or {"error"}, the text the
    same request gives alone)."""
    with SpecbuildClient(server.grpc_url) as client:
        expected, _ = client.complete(PROMPT, max_tokens=200, num_draft_tokens=2)
    outcome: dict = {}

    def run() -> None:
        try:
            with SpecbuildClient(server.grpc_url) as client:
                outcome["text"] = "".join(c.text for c in client.generate(PROMPT, max_tokens=200, num_draft_tokens=2))
        except Exception as err:  # noqa: BLE001 - asserted at the end
            outcome["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome, expected


def tracebacks(server) -> int:
    return server.log_path.read_text(errors="replace").count("Traceback")
