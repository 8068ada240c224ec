"""The BLS's streamed responses go out from a thread of their own (triton.models.response_pipe.ResponsePipe): in
order, the final one last, is_cancelled asked after each streamed one and never after the final one, a failed send
logged and not raised into the loop."""

from __future__ import annotations

import threading

from specbuild.triton.models.response_pipe import ResponsePipe

FINAL = 1


class Sender:
    """A response sender that records what it sent and, like Triton's, refuses anything after the final response."""

    def __init__(self, fail_on: str | None = None, hold: str | None = None):
        self.sent: list[tuple[str, int]] = []
        self.fail_on, self.hold = fail_on, hold
        self.finished = False
        self.threads: set[str] = set()
        self.go = threading.Event()  # sends wait for it
        self.go.set()
        self.holding = threading.Event()  # set when the send of `hold` has begun; it then waits for `go` again

    def send(self, response, flags=0):
        self.threads.add(threading.current_thread().name)
        if response == self.hold:
            self.go.clear()
            self.holding.set()
        self.go.wait()
        assert not self.finished, "a response after the final one"
        if response == self.fail_on:
            raise RuntimeError("the client is gone")
        self.sent.append((response, flags))
        self.finished = bool(flags & FINAL)


class Request:
    def __init__(self, sender: Sender, cancel_after: int | None = None):
        self.sender, self.cancel_after, self.asked = sender, cancel_after, 0

    def is_cancelled(self) -> bool:
        assert not self.sender.finished, "is_cancelled asked after the final response (crashes tritonserver 2.51)"
        self.asked += 1
        return self.cancel_after is not None and len(self.sender.sent) >= self.cancel_after


def test_responses_go_out_in_order_from_another_thread_and_the_final_one_last():
    sender = Sender()
    sender.go.clear()  # every send blocks until released
    request = Request(sender)
    pipe = ResponsePipe(sender, FINAL, request.is_cancelled, log_error=lambda m: None)
    for i in range(10):
        pipe.send(f"piece {i}")  # returns although no send can finish
    assert sender.sent == []
    sender.go.set()
    pipe.close("final")
    assert sender.sent == [(f"piece {i}", 0) for i in range(10)] + [("final", FINAL)]
    assert threading.current_thread().name not in sender.threads  # the loop's thread never sends
    assert request.asked == 10  # once after each streamed response, never after the final one


def test_a_cancel_is_seen_after_the_send_that_found_it_and_without_sends_by_asking_the_request():
    sender = Sender()
    early = Request(sender, cancel_after=0)  # cancelled while queued: nothing has been sent yet
    pipe = ResponsePipe(sender, FINAL, early.is_cancelled, log_error=lambda m: None)
    assert pipe.cancelled() is True
    pipe.close("final")

    sender = Sender(hold="c")
    request = Request(sender, cancel_after=2)
    pipe = ResponsePipe(sender, FINAL, request.is_cancelled, log_error=lambda m: None)
    assert pipe.cancelled() is False and request.asked == 1  # nothing sent yet: the request itself was asked
    for piece in ("a", "b", "c"):
        pipe.send(piece)
    sender.holding.wait()  # the thread is sending "c": "a" and "b" are out, and it asked after each
    assert pipe.cancelled() is True and request.asked == 3  # the thread's answer after "b", not asked again
    sender.go.set()
    pipe.close("cancelled")
    assert sender.sent == [("a", 0), ("b", 0), ("c", 0), ("cancelled", FINAL)]

    sender = Sender()  # steps whose tokens add no text yet: nothing sent, so each look asks the request
    request = Request(sender)
    pipe = ResponsePipe(sender, FINAL, request.is_cancelled, log_error=lambda m: None)
    assert [pipe.cancelled(), pipe.cancelled()] == [False, False] and request.asked == 2
    request.cancel_after = 0
    assert pipe.cancelled() is True
    pipe.close("cancelled")


def test_a_failed_send_is_logged_and_the_rest_still_go_out():
    sender = Sender(fail_on="b")
    request = Request(sender)
    logged: list[str] = []
    pipe = ResponsePipe(sender, FINAL, request.is_cancelled, log_error=logged.append)
    for piece in ("a", "b", "c"):
        pipe.send(piece)
    pipe.close("final")
    assert sender.sent == [("a", 0), ("c", 0), ("final", FINAL)]
    assert logged == ["a response could not be sent: the client is gone"]
