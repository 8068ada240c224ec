"""A streaming request's responses, sent in order by a thread of their own while the loop runs its next step.

Sending a streamed response from a Python-backend model and asking `is_cancelled` cost a noticeable part of a step
on the CPU reference engines (docs/bench/results.md), paid while the models wait. `ResponsePipe` takes them off the
loop's thread: `send` queues a response and
returns; one thread per request sends them in order, asks `is_cancelled` after each, and sends the final response
last (`close`), after every streamed one, as Triton requires. The loop reads the answer `is_cancelled` gave after
the latest send (`cancelled`), so a cancel is seen one step later than before at most; when nothing was sent since
its last look (before the first response, or steps whose tokens add no text yet) it asks the request itself, as
before. `is_cancelled` is never asked once the final response is out (a request
whose final response is out crashes tritonserver 2.51 when asked). NVIDIA's llmapi model.py does the same with one
response thread for all requests (`_response_loop`, triton_backend/all_models/llmapi/tensorrt_llm/1/model.py).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any


class ResponsePipe:
    def __init__(
        self, sender: Any, final_flag: int, is_cancelled: Callable[[], bool], log_error: Callable[[str], None]
    ):
        self._sender, self._final, self._is_cancelled, self._log_error = sender, final_flag, is_cancelled, log_error
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._seen_cancel = False
        self._sent = 0  # streamed responses the thread has sent (and asked is_cancelled after)
        self._sent_at_last_look = 0
        self._thread = threading.Thread(target=self._run, name="bls-responses", daemon=True)
        self._thread.start()

    def send(self, response: Any) -> None:
        """Queue one streamed (non-final) response."""
        self._queue.put((response, 0))

    def close(self, response: Any, timeout: float | None = None) -> None:
        """Queue the final response and wait until it is out."""
        self._queue.put((response, self._final))
        self._thread.join(timeout)

    def cancelled(self) -> bool:
        """Whether the client cancelled: the thread's answer after a send since the last look, else the request's."""
        if self._seen_cancel:
            return True
        sent = self._sent
        if sent != self._sent_at_last_look:
            self._sent_at_last_look = sent
            return False
        return bool(self._is_cancelled())

    def _run(self) -> None:
        while True:
            response, flags = self._queue.get()
            try:
                self._sender.send(response, flags=flags)
            except Exception as err:  # noqa: BLE001 - e.g. the client went away; the loop ends by the cancel check
                self._log_error(f"a response could not be sent: {err}")
            if flags & self._final:
                return
            if not self._seen_cancel:
                self._seen_cancel = bool(self._is_cancelled())
            self._sent += 1  # after the answer, so a loop that sees the count sees the answer
