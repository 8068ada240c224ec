"""The lookup's pool shared by processes (speculative.shared_pool), as the BLS's instances share it.

It keeps exactly what the in-process pool keeps (the same sequences, newest first, the same figures after every add,
evictions included), a second process sees what the first added and the reverse, the lookup finds another process's
text through it, and the file goes with its last user or its dead server.
"""

from __future__ import annotations

import multiprocessing
import random
import subprocess
import sys

import numpy as np
import pytest

from specbuild.drafters import LookupSettings
from specbuild.speculative.lookup import LookupPool, find_match
from specbuild.speculative.shared_pool import PREFIX, SharedLookupPool, pool_path


def _same(shared: SharedLookupPool, local: LookupPool) -> None:
    ours, theirs = shared.sequences(), local.sequences()
    assert [s.tolist() for s in ours] == [s.tolist() for s in theirs]
    figures = shared.figures()
    assert {k: figures[k] for k in ("sequences", "tokens", "max_tokens", "added", "evicted")} == local.figures()


def test_it_keeps_what_the_in_process_pool_keeps_after_every_add(tmp_path):
    rng = random.Random(7)
    shared = SharedLookupPool(pool_path("bls", 1, tmp_path), 64)
    local = LookupPool(64)
    try:
        for _ in range(200):
            sequence = [rng.randrange(50) for _ in range(rng.choice([0, 1, 2, 3, 9, 30, 63, 64, 90]))]
            shared.add(sequence)
            local.add(sequence)
            _same(shared, local)
        assert local.evicted > 10 and shared.figures()["evicted_here"] == local.evicted  # evictions were exercised
    finally:
        shared.close()
    assert not pool_path("bls", 1, tmp_path).exists()  # the last user removed it


def _child(path: str, max_tokens: int, inbox, outbox) -> None:
    pool = SharedLookupPool(path, max_tokens)
    pool.add([1, 2, 3, 4, 5, 6])
    outbox.put("added")
    inbox.get(timeout=60)  # the parent added its own
    outbox.put([s.tolist() for s in pool.sequences()])
    pool.close()
    outbox.put("closed")


def test_a_second_process_sees_what_the_first_added_and_the_reverse(tmp_path):
    path = pool_path("tensorrt_llm_bls", 12345, tmp_path)
    parent = SharedLookupPool(path, 32)
    context = multiprocessing.get_context("spawn")
    inbox, outbox = context.Queue(), context.Queue()
    child = context.Process(target=_child, args=(str(path), 32, inbox, outbox))
    child.start()
    try:
        assert outbox.get(timeout=120) == "added"
        assert [s.tolist() for s in parent.sequences()] == [[1, 2, 3, 4, 5, 6]]
        # the lookup finds the other process's text: "3 4" continues with "5 6"
        match = find_match([9, 3, 4], 2, LookupSettings(is_public_pool=True), parent)
        assert match is not None and (match.tokens, match.where) == ([5, 6], "pool")
        parent.add([7, 8, 9])
        inbox.put("go")
        assert outbox.get(timeout=60) == [[7, 8, 9], [1, 2, 3, 4, 5, 6]]
        assert outbox.get(timeout=60) == "closed"
        assert path.exists()  # the parent still uses it
        assert parent.figures()["added"] == 2
    finally:
        child.join(timeout=60)
        parent.close()
    assert not path.exists()


def test_a_pool_of_another_size_at_the_same_path_is_refused(tmp_path):
    first = SharedLookupPool(pool_path("bls", 2, tmp_path), 16)
    try:
        with pytest.raises(ValueError, match=r"max_tokens 16\): this one asks for max_tokens 32"):
            SharedLookupPool(pool_path("bls", 2, tmp_path), 32)
    finally:
        first.close()


def test_a_pool_left_by_a_server_that_is_gone_is_removed_and_a_running_ones_kept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = pool_path("bls", int(dead.stdout), tmp_path)
    gone.write_bytes(b"left behind")
    running = pool_path("bls", 1, tmp_path)  # pid 1 runs
    running.write_bytes(b"in use")
    other_model = pool_path("other", int(dead.stdout), tmp_path)
    other_model.write_bytes(b"not this model's")
    unrelated = tmp_path / "unrelated-123"
    unrelated.write_bytes(b"x")
    pool = SharedLookupPool(pool_path("bls", 99999999, tmp_path), 8)
    try:
        assert not gone.exists() and running.exists() and other_model.exists() and unrelated.exists()
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(PREFIX)) == sorted(
            [running.name, other_model.name, pool.path.name]
        )
    finally:
        pool.close()


def test_the_index_is_made_again_after_an_add_by_any_user_and_only_then(tmp_path):
    path = pool_path("bls", 4, tmp_path)
    pool, other = SharedLookupPool(path, 16), SharedLookupPool(path, 16)  # two instances of one server
    try:
        pool.add([1, 2, 3])
        first = pool.index()
        assert pool.index() is first and first.continuation(np.array([2]), 2, True) == [3]
        other.add([2, 9])
        assert pool.index() is not first and pool.index().continuation(np.array([2]), 2, True) == [9]
    finally:
        other.close()
        pool.close()


def test_sequences_are_a_snapshot(tmp_path):
    pool = SharedLookupPool(pool_path("bls", 3, tmp_path), 16)
    try:
        pool.add([1, 2, 3])
        before = pool.sequences()
        pool.add([4, 5])
        assert [s.tolist() for s in before] == [[1, 2, 3]]
        assert all(isinstance(s, np.ndarray) and s.dtype == np.int64 for s in pool.sequences())
    finally:
        pool.close()


def _dead_pid() -> int:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(dead.stdout)


def test_only_this_models_stale_pools_go_even_when_model_names_hold_dashes(tmp_path):
    """The model is everything after the pid: "a-b"'s pool is not "b"'s, and a pool at a path of another name
    removes nothing."""
    pid = _dead_pid()
    dashed, plain = pool_path("a-b", pid, tmp_path), pool_path("b", pid, tmp_path)
    dashed.write_bytes(b"left by a-b")
    plain.write_bytes(b"left by b")
    pool = SharedLookupPool(pool_path("a-b", 99999999, tmp_path), 8)
    pool.close()
    assert not dashed.exists() and plain.exists()
    custom = SharedLookupPool(tmp_path / "my-pool-b", 8)  # not a name this module gives: nothing else is touched
    custom.close()
    assert plain.exists()


def test_a_stale_pool_another_process_removed_first_is_no_error(tmp_path, monkeypatch):
    from pathlib import Path

    from specbuild.speculative import shared_pool

    vanished = pool_path("bls", _dead_pid(), tmp_path)  # listed, then gone before the unlink
    monkeypatch.setattr(Path, "glob", lambda self, pattern: iter([vanished]))
    shared_pool._remove_stale(pool_path("bls", 99999999, tmp_path))
    assert not vanished.exists()


def test_the_pool_folder_is_dev_shm_where_it_can_write_there(monkeypatch):
    import os
    import tempfile
    from pathlib import Path

    from specbuild.speculative import shared_pool

    writable = Path("/dev/shm").is_dir() and os.access("/dev/shm", os.W_OK)
    assert shared_pool.pool_folder() == (Path("/dev/shm") if writable else Path(tempfile.gettempdir()))
    monkeypatch.setattr(shared_pool.os, "access", lambda path, mode: False)
    assert shared_pool.pool_folder() == Path(tempfile.gettempdir())


def test_a_pool_file_is_named_after_its_server_and_model(tmp_path):
    assert pool_path("Model x/y", 5, tmp_path) == tmp_path / f"{PREFIX}5-Model_x_y"


def test_the_file_layout_as_documented(tmp_path):
    """header int64 x 8, lengths int32 x (max_tokens // 2 + 1), tokens int32 x max_tokens; owner-only."""
    import os
    import stat

    path = pool_path("bls", 4, tmp_path)
    pool = SharedLookupPool(path, 10)
    try:
        pool.add([7, 8, 9])
        pool.add([5, 6])
        raw = path.read_bytes()
        assert len(raw) == 8 * 8 + 4 * 6 + 4 * 10
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        header = np.frombuffer(raw[:64], dtype=np.int64)
        assert header[2:6].tolist() == [10, 5, 2, 2]  # max_tokens, tokens held, sequences held, added
        assert np.frombuffer(raw[64:88], dtype=np.int32)[:2].tolist() == [3, 2]
        assert np.frombuffer(raw[88:], dtype=np.int32)[:5].tolist() == [7, 8, 9, 5, 6]
    finally:
        pool.close()


def test_the_smallest_pool_and_the_most_sequences_it_can_hold(tmp_path):
    with pytest.raises(ValueError, match="^pool max_tokens = 1: must be >= 2$"):
        SharedLookupPool(pool_path("bls", 5, tmp_path), 1)
    two = SharedLookupPool(pool_path("bls", 6, tmp_path), 2)
    two.close()
    pool = SharedLookupPool(pool_path("bls", 7, tmp_path), 9)  # room for four 2-token sequences, and a length slot more
    try:
        assert pool.sequences() == []  # nothing added: no sequence, not one empty one
        for start in range(0, 10, 2):
            pool.add([start, start + 1])
        assert [s.tolist() for s in pool.sequences()] == [[8, 9], [6, 7], [4, 5], [2, 3]]
        pool.add([1, 2, 3, 4, 5, 6, 7, 8, 9])  # exactly full: everything else goes, this stays
        assert [s.tolist() for s in pool.sequences()] == [[1, 2, 3, 4, 5, 6, 7, 8, 9]]
    finally:
        pool.close()


def test_a_pool_filled_exactly_evicts_nothing(tmp_path):
    pool = SharedLookupPool(pool_path("bls", 8, tmp_path), 8)
    try:
        pool.add([1, 2, 3, 4])
        pool.add([5, 6, 7, 8])
        assert [s.tolist() for s in pool.sequences()] == [[5, 6, 7, 8], [1, 2, 3, 4]]
        assert pool.figures()["evicted"] == 0
    finally:
        pool.close()


def test_a_file_of_another_size_is_refused_even_when_blank(tmp_path):
    path = pool_path("bls", 9, tmp_path)
    path.write_bytes(bytes(100))
    with pytest.raises(ValueError, match="holds another pool"):
        SharedLookupPool(path, 8)
    assert path.read_bytes() == bytes(100)


def test_closing_twice_counts_once_and_a_file_already_gone_is_no_error(tmp_path):
    path = pool_path("bls", 10, tmp_path)
    first, second = SharedLookupPool(path, 8), SharedLookupPool(path, 8)
    first.close()
    first.close()  # still one user: the file stays
    assert path.exists()
    path.unlink()  # removed by hand while the last user still runs
    second.close()
    assert not path.exists()
