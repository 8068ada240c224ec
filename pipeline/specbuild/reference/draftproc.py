"""The draft model in a child process: what makes the overlapped schedule overlap in-process.

The reference runtime's forward pass is hundreds of small torch calls, and between two calls Python
holds the GIL. Two models on two threads of one process hand the GIL to each other at every call
and mostly wait for it: on the example pair (docs/speculative.md, "In-process: a second process")
drafting ahead on a thread makes generation slower, not faster. In a child process the drafter has
an interpreter of its own, and this process only sends a request and later reads the answer:

    drafter = DraftProcess.start(source, "cpu", threads=1, end_id=2)   # loads while you load the target
    drafter = drafter.matching(row_block)       # ready, with the parent's draft model's row block
    pending = drafter.propose_ahead(tokens, k, sampling)   # returns at once: the child drafts
    ...                                         # verify here meanwhile
    ahead = pending.result()                    # interfaces.Ahead
    drafter.propose(tokens, k, sampling)        # a Drafter too; drafter(request) is a contract call
    drafter.close()

The child wraps its model in the same ContractDrafter and `overlap.propose_ahead` as this process
would, with the same weights, thread count and row block as the parent's draft model (so the same
numbers: seeded sampling gives the same text either way). It answers requests one at a time, in
order; an answer nobody waits for any more (a missed early draft) is read and dropped before the
next. Exceptions come back and are raised in the caller. It is a fresh interpreter
(`python -m specbuild.reference.draftchild FD`, over a socket pair; the child's side is in draftchild.py): a fork would copy the parent's
OpenMP and MKL thread state, and multiprocessing's "spawn" would re-run the caller's main script,
which a script without an `if __name__ == "__main__"` guard does not survive. It exits when the
socket closes, so it never outlives its parent.
"""

from __future__ import annotations

import collections
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any

from specbuild.errors import GenerationError
from specbuild.speculative.interfaces import Draft, SamplingParams

_UNSET = object()


class _Reply:
    """An answer the child will send (interfaces.Pending)."""

    def __init__(self, owner: DraftProcess):
        self.owner, self.value = owner, _UNSET

    def result(self) -> Any:
        return self.owner._wait(self)

    def cancel(self) -> bool:
        return False  # the child has it already: its answer is read and dropped when the next one is wanted


class DraftProcess:
    """A Drafter (and AheadDrafter) whose model lives in a child process; calling it is a contract call."""

    def __init__(self, process: subprocess.Popen, conn: Connection, start_args: tuple[Any, ...]):
        self._process, self._conn, self._start_args = process, conn, start_args
        self._lock = threading.Lock()  # one sender / reader on the socket at a time
        self._outstanding: collections.deque[_Reply] = collections.deque()  # sent, not yet read, in order
        self.row_block: int | None = None  # the child's, once it is ready

    @classmethod
    def start(
        cls,
        source: Any,
        device: str = "cpu",
        threads: int | None = None,
        row_block: int | None = None,
        use_cache: bool = True,
        end_id: int | None = None,
        use_logits: bool = True,
    ) -> DraftProcess:
        """Start loading `source` (a loading.ModelSource) in a child process; its first answer waits for it.
        end_id, use_logits: as ContractDrafter's."""
        ours, theirs = socket.socketpair()
        with theirs:
            process = subprocess.Popen(
                [sys.executable, "-m", "specbuild.reference.draftchild", str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
            )
        conn = Connection(ours.detach())
        args = (source, device, threads, row_block, use_cache, end_id, use_logits)
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
        source, device, threads, _, use_cache, end_id, use_logits = self._start_args
        again = DraftProcess.start(source, device, threads, row_block, use_cache, end_id, use_logits)
        with again._lock:
            again._wait_ready()
        return again

    # -- the Drafter, the AheadDrafter and the contract call --------------------------------------

    def propose(self, tokens: list[int], k: int, sampling: SamplingParams) -> Draft:
        return self._send(("propose", list(tokens), k, sampling)).result()

    def propose_ahead(self, tokens: list[int], k: int, sampling: SamplingParams) -> _Reply:
        """Returns at once; result() is the interfaces.Ahead (overlap.propose_ahead, run in the child)."""
        return self._send(("ahead", list(tokens), k, sampling))

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        return self._send(("call", request)).result()

    # -- the socket -----------------------------------------------------------------------------

    def _send(self, message: tuple[Any, ...]) -> _Reply:
        with self._lock:
            self._wait_ready()
            try:
                self._conn.send(message)
            except (OSError, ValueError):
                raise GenerationError("the draft model's process is gone: run with --no-overlap.") from None
            reply = _Reply(self)
            self._outstanding.append(reply)
            return reply

    def _wait(self, reply: _Reply) -> Any:
        with self._lock:
            while reply.value is _UNSET:
                self._outstanding.popleft().value = self._receive()  # earlier answers first, in order
        if isinstance(reply.value, Exception):
            raise reply.value
        return reply.value

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
            raise GenerationError(
                f"the draft model's process ended (exit code {code}): its error is on stderr. "
                "Run with --no-overlap to keep the draft model in this process."
            ) from None

    def close(self) -> None:
        """Close the socket (the child exits) and wait for the child a moment; kill it if it does not go."""
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
