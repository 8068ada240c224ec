"""A Triton request as a wrapped model sees it: everything is the request's own, except that its response sender
(the same one each time) notes the request's final response.

Used to wrap a model class that is not ours (NVIDIA's llmapi model.py) without changing it: `serving_gate.gated`
counts a request until its final response, `llmapi.answered.every_request_answered` sends the final response a
request ended without. python_backend's helpers read a request only through its methods
(triton_python_backend_utils.get_input_tensor_by_name calls request.inputs()), so a proxy passes for the request.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class WatchedSender:
    """A response sender that calls `on_final` once a final response went out (not when the send failed: Triton
    refuses a second final response, and a failed one may be retried)."""

    def __init__(self, sender: Any, final_flag: int, on_final: Callable[[], None]):
        self._sender, self._final, self._on_final = sender, final_flag, on_final

    def send(self, *args: Any, **kwargs: Any) -> Any:
        flags = kwargs.get("flags", args[1] if len(args) > 1 else 0)
        answer = self._sender.send(*args, **kwargs)
        if flags & self._final:
            self._on_final()
        return answer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sender, name)


class WatchedRequest:
    """`request` with `answered` (its final response went out) and an optional `on_final` callback."""

    def __init__(self, request: Any, final_flag: int, on_final: Callable[[], None] | None = None):
        self._request, self._final, self._on_final = request, final_flag, on_final
        self._sender, self._lock = None, threading.Lock()
        self.answered = False

    def _note_final(self) -> None:
        self.answered = True
        if self._on_final is not None:
            self._on_final()

    def get_response_sender(self) -> WatchedSender:
        with self._lock:
            if self._sender is None:
                self._sender = WatchedSender(self._request.get_response_sender(), self._final, self._note_final)
            return self._sender

    def __getattr__(self, name: str) -> Any:
        return getattr(self._request, name)
