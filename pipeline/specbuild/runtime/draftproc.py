"""The draft model in a child process: what makes the overlapped schedule overlap in-process.

The reference runtime's forward pass is hundreds of small torch calls, and between two calls Python
holds the GIL. Two models on two threads of one process hand the GIL to each other at every call
and mostly wait for it: on the example pair (docs/speculative.md, "In-process") two threads verify
no faster than one. In a child process the drafter has an interpreter of its own; the parent's
worker thread only sends the request and waits on the pipe (with the GIL released) while the
parent's main thread verifies, as Triton keeps the two models in separate processes.

    call = DraftProcess.start(source, device="cpu", threads=1, row_block=4)  # loads while you do other work
    drafter = ContractDrafter(call, end_id=...)     # call(request) -> response, like a ContractModel
    ...
    call.close()

The child loads the same weights with the same thread count and row block as the parent's draft
model (so the same numbers: seeded sampling gives the same text either way), serves one request at
a time, and sends exceptions back to be raised in the caller. It is a fresh interpreter
(`python -m specbuild.runtime.draftproc FD`, talking over a socket pair): a fork would copy the
parent's OpenMP and MKL thread state, and multiprocessing's "spawn" would re-run the caller's main
script, which a script without an `if __name__ == "__main__"` guard does not survive. It exits when
the socket closes, so it never outlives its parent.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any

from specbuild.errors import GenerationError

_READY = "ready"


def _serve(conn: Any) -> None:
    """The child: load the model, then answer requests until the parent closes the socket."""
    try:
        source, device, threads, row_block, use_cache = conn.recv()
        import dataclasses

        import torch

        from specbuild.runtime.loading import load_contract_model

        source = dataclasses.replace(source, role=f"{source.role} (own process, drafts ahead)")

        if threads is not None:
            torch.set_num_threads(threads)
        model = load_contract_model(source, device, use_cache, row_block)
    except Exception as err:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(err)
        return
    conn.send((_READY, model.engine.model.row_block))
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        try:
            conn.send(model(request))
        except Exception as err:  # noqa: BLE001 - one bad request fails that call, not the process
            conn.send(err)


class DraftProcess:
    """call(request) -> response on a ContractModel living in a child process."""

    def __init__(self, process: subprocess.Popen, conn: Connection, start_args: tuple[Any, ...]):
        self._process, self._conn, self._start_args = process, conn, start_args
        self._lock = threading.Lock()  # one request on the pipe at a time
        self.row_block: int | None = None  # the child's, once it is ready

    @classmethod
    def start(cls, source: Any, device: str = "cpu", threads: int | None = None, row_block: int | None = None,
              use_cache: bool = True) -> DraftProcess:
        """Start loading `source` (a loading.ModelSource) in a child process; the first call waits for it."""
        ours, theirs = socket.socketpair()
        with theirs:
            process = subprocess.Popen([sys.executable, "-m", "specbuild.runtime.draftproc", str(theirs.fileno())],
                                       pass_fds=[theirs.fileno()])
        conn = Connection(ours.detach())
        args = (source, device, threads, row_block, use_cache)
        conn.send(args)
        return cls(process, conn, args)

    def matching(self, row_block: int) -> DraftProcess:
        """This process once ready, if its model runs `row_block` rows per block like the parent's draft model;
        else a new one told to (a different block could give different numbers, so different sampled text)."""
        with self._lock:
            self._wait_ready()
        if self.row_block == row_block:
            return self
        self.close()
        source, device, threads, _, use_cache = self._start_args
        again = DraftProcess.start(source, device, threads, row_block, use_cache)
        with again._lock:
            again._wait_ready()
        return again

    def _wait_ready(self) -> None:
        if self.row_block is not None:
            return
        message = self._receive()
        if isinstance(message, Exception):
            raise message
        self.row_block = int(message[1])

    def _receive(self) -> Any:
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            code = self._process.poll()
            raise GenerationError(f"the draft model's process ended (exit code {code}): its error is on stderr. "
                                  "Run with --no-overlap to keep the draft model in this process.") from None

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self._wait_ready()
            try:
                self._conn.send(request)
            except (OSError, ValueError):
                raise GenerationError("the draft model's process is gone: run with --no-overlap.") from None
            response = self._receive()
        if isinstance(response, Exception):
            raise response
        return response

    def close(self) -> None:
        """Close the pipe (the child exits) and wait for the child a moment; kill it if it does not go."""
        with self._lock:
            self._conn.close()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    @property
    def pid(self) -> int:
        return self._process.pid


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1])))
