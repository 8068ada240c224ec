"""Merge contract calls from concurrent threads into one batched `execute` (in-process dynamic batching).

Triton batches requests for the served models itself (dynamic batching hands `execute` several
requests). In-process, concurrent generations (e.g. `bench --local` at concurrency > 1) call the
model from several threads; `Batcher` queues those calls and runs whatever is waiting as one
`ContractModel.execute`, so their sequences share forward passes instead of taking turns. Each
caller gets its own response, or its own RequestError.

    batched = Batcher(contract_model)        # a drop-in `call` for ContractDrafter / ContractVerifier
    ...
    batched.close()
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Any

_STOP = object()


class Batcher:
    def __init__(self, model: Any, max_batch_size: int | None = None, max_wait_s: float = 0.001):
        self.model = model  # has execute(requests, errors="return") -> list of responses / RequestErrors
        self.max_batch_size = max_batch_size or getattr(getattr(model, "limits", None), "max_batch_size", 8)
        self.max_wait_s = max_wait_s  # how long the first waiting call holds the batch open for others
        self.batches = 0  # execute() calls made (for tests and stats)
        self._queue: queue.Queue = queue.Queue()
        self._worker = threading.Thread(target=self._run, name="specbuild-batcher", daemon=True)
        self._worker.start()

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        if not self._worker.is_alive():
            raise RuntimeError("the Batcher is closed")
        future: Future = Future()
        self._queue.put((request, future))
        return future.result()

    def close(self) -> None:
        self._queue.put(_STOP)
        self._worker.join()

    def __enter__(self) -> Batcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            batch = [item]
            stop = False
            while len(batch) < self.max_batch_size:
                try:
                    item = self._queue.get(timeout=self.max_wait_s)
                except queue.Empty:
                    break
                if item is _STOP:
                    stop = True
                    break
                batch.append(item)
            self._execute(batch)
            if stop:
                return

    def _execute(self, batch: list[tuple[dict[str, Any], Future]]) -> None:
        self.batches += 1
        try:
            responses = self.model.execute([request for request, _ in batch], errors="return")
        except Exception as err:  # noqa: BLE001 - handed to every waiting caller, who re-raises it
            for _, future in batch:
                future.set_exception(err)
            return
        for (_, future), response in zip(batch, responses):
            if isinstance(response, Exception):
                future.set_exception(response)
            else:
                future.set_result(response)
