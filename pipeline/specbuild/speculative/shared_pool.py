"""The lookup's pool shared by the processes of one server: the BLS's model instances, each its own process.

`SharedLookupPool` holds what `lookup.LookupPool` holds (finished requests' token sequences, oldest first, at most
`max_tokens` tokens in all, the oldest evicted first) in one memory-mapped file that every instance maps:

    header  int64 x 8   magic, layout version, max_tokens, tokens held, sequences held, added, evicted, users
    lengths int32 x (max_tokens // 2 + 1)   each held sequence's length, oldest first (a sequence has >= 2 tokens)
    tokens  int32 x max_tokens              the held sequences, end to end, oldest first

An exclusive `fcntl.flock` on the file guards every change and a shared one every read, across processes and (with
a lock of its own per instance) across one process's threads. Readers keep their last snapshot and copy again only
after an add (the header's `added` changes), so a step's search costs one small read while nothing was added.

The file lives in /dev/shm (memory, not disk) where it exists, else the temporary folder, named after the server
process (the instances' parent) and the model: `specbuild-lookup-pool-<server pid>-<model>`. Each instance counts
itself in `users` and the last to close removes the file; a file left by a server that no longer runs (its instances
killed) is removed by the next pool of the same model that starts.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import re
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from specbuild.speculative.lookup import PoolIndex

__all__ = ["SharedLookupPool", "pool_path"]

MAGIC, LAYOUT = 0x53504C4B504F4F4C, 1  # "SPLKPOOL"
_HEADER = 8
_MAGIC, _LAYOUT, _MAX, _TOKENS, _COUNT, _ADDED, _EVICTED, _USERS = range(_HEADER)
PREFIX = "specbuild-lookup-pool-"


def pool_folder() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def pool_path(model: str, server_pid: int | None = None, folder: Path | None = None) -> Path:
    """Where the pool of `model` on the server `server_pid` (default: this process's parent) lives."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", model)
    return (folder or pool_folder()) / f"{PREFIX}{server_pid or os.getppid()}-{safe}"


def _remove_stale(path: Path) -> None:
    """Remove pools of this model whose server process is gone (files named by this module only)."""
    suffix = path.name.split("-", 4)[-1] if path.name.startswith(PREFIX) else None
    if suffix is None:
        return
    for other in path.parent.glob(f"{PREFIX}*-{suffix}"):
        pid = other.name[len(PREFIX) :].split("-", 1)[0]
        if other != path and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            other.unlink(missing_ok=True)


class SharedLookupPool:
    """`LookupPool`'s interface (add, sequences, index, figures, max_tokens) over one file shared by processes."""

    def __init__(self, path: Path, max_tokens: int):
        if max_tokens < 2:
            raise ValueError(f"pool max_tokens = {max_tokens}: must be >= 2")
        self.path, self.max_tokens = Path(path), max_tokens
        self._slots = max_tokens // 2 + 1
        size = 8 * _HEADER + 4 * self._slots + 4 * max_tokens
        _remove_stale(self.path)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        self._thread_lock = threading.Lock()
        self._closed = False
        refusal = None
        with self._locked(fcntl.LOCK_EX):
            found = os.fstat(self._fd).st_size
            if found == 0:
                os.ftruncate(self._fd, size)
            header = np.frombuffer(os.pread(self._fd, 8 * _HEADER, 0), dtype=np.int64)
            fresh = header[_MAGIC] == 0
            ours = tuple(header[[_MAGIC, _LAYOUT, _MAX]]) == (MAGIC, LAYOUT, max_tokens)
            if found not in (0, size) or not (fresh or ours):
                refusal = (
                    f"{self.path} holds another pool (layout {int(header[_LAYOUT])}, max_tokens {int(header[_MAX])}): "
                    f"this one asks for max_tokens {max_tokens}"
                )
            else:
                self._map = mmap.mmap(self._fd, size)
                self._header = np.frombuffer(self._map, dtype=np.int64, count=_HEADER)
                self._lengths = np.frombuffer(self._map, dtype=np.int32, count=self._slots, offset=8 * _HEADER)
                self._tokens = np.frombuffer(
                    self._map, dtype=np.int32, count=max_tokens, offset=8 * _HEADER + 4 * self._slots
                )
                if fresh:
                    self._header[_MAGIC], self._header[_LAYOUT], self._header[_MAX] = MAGIC, LAYOUT, max_tokens
                self._header[_USERS] += 1
        if refusal is not None:
            os.close(self._fd)
            raise ValueError(refusal)
        self.evicted_here = 0  # sequences this process's adds evicted (a counter each process may add to its own)
        self._seen = -1  # `added` when the snapshot was taken
        self._snapshot: list[np.ndarray] = []
        self._index: tuple[int, PoolIndex] | None = None  # (`added` it was made at, the snapshot's PoolIndex)
        self._index_lock = threading.Lock()

    @contextlib.contextmanager
    def _locked(self, how: int) -> Iterator[None]:
        """This process's thread lock, then the file lock `how` (LOCK_SH or LOCK_EX) across processes."""
        with self._thread_lock:
            fcntl.flock(self._fd, how)
            try:
                yield
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def add(self, tokens: Sequence[int]) -> None:
        """Keep one finished request's prompt + output (its last max_tokens tokens), evicting the oldest to fit."""
        sequence = np.asarray(list(tokens)[-self.max_tokens :], dtype=np.int32)
        if sequence.size < 2:
            return
        with self._locked(fcntl.LOCK_EX):
            h, lengths, held = self._header, self._lengths, self._tokens
            drop, gone, count = 0, 0, int(h[_COUNT])
            while drop < count and int(h[_TOKENS]) - gone + sequence.size > self.max_tokens:  # the oldest go first
                gone += int(lengths[drop])
                drop += 1
            if drop:
                kept = int(h[_TOKENS]) - gone
                held[:kept] = held[gone : gone + kept].copy()
                lengths[: count - drop] = lengths[drop:count].copy()
                h[_TOKENS], h[_COUNT], h[_EVICTED] = kept, count - drop, h[_EVICTED] + drop
                self.evicted_here += drop
            start = int(h[_TOKENS])
            held[start : start + sequence.size] = sequence
            lengths[int(h[_COUNT])] = sequence.size
            h[_TOKENS], h[_COUNT], h[_ADDED] = start + sequence.size, h[_COUNT] + 1, h[_ADDED] + 1

    def _current(self) -> tuple[list[np.ndarray], int]:
        """(the held sequences newest first, `added` when read), copied again only after an add."""
        with self._locked(fcntl.LOCK_SH):
            added = int(self._header[_ADDED])
            if added != self._seen:
                count, total = int(self._header[_COUNT]), int(self._header[_TOKENS])
                held = self._tokens[:total].astype(np.int64)
                bounds = np.cumsum(self._lengths[:count])[:-1]
                self._snapshot = list(reversed(np.split(held, bounds))) if count else []
                self._seen = added
            return self._snapshot, added

    def sequences(self) -> list[np.ndarray]:
        """The held sequences, newest first (a snapshot: adding later does not change it)."""
        return list(self._current()[0])

    def index(self) -> PoolIndex:
        """The held sequences as one lookup.PoolIndex, made again only after an add (by any process)."""
        snapshot, added = self._current()
        with self._index_lock:
            if self._index is None or self._index[0] != added:
                self._index = (added, PoolIndex(snapshot))
            return self._index[1]

    def figures(self) -> dict[str, int]:
        with self._locked(fcntl.LOCK_SH):
            h = self._header
            return {
                "sequences": int(h[_COUNT]),
                "tokens": int(h[_TOKENS]),
                "max_tokens": self.max_tokens,
                "added": int(h[_ADDED]),
                "evicted": int(h[_EVICTED]),
                "evicted_here": self.evicted_here,
            }

    def _release_map(self) -> None:
        del self._header, self._lengths, self._tokens
        self._map.close()

    def close(self) -> None:
        """This process stops using the pool; the last user removes its file."""
        if self._closed:
            return
        self._closed = True
        with self._locked(fcntl.LOCK_EX):
            self._header[_USERS] -= 1
            last = int(self._header[_USERS]) <= 0
            self._snapshot, self._index = [], None
            self._release_map()
            if last:
                self.path.unlink(missing_ok=True)
        os.close(self._fd)
