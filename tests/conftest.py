"""Shared fixtures.

- The whole session uses its own example-pair cache ($SPECBUILD_CACHE_DIR is set to
  `.pytest_cache/d/specbuild-example`, kept between sessions, keyed by the recipe hash), so tests
  never touch the user's cache and the tiny pair is built once, not once per test.
- `example_tiny`: the tiny built-in example pair (an `ExamplePair`: root, target, draft, info).
- `tiny_spec_path`: a spec file for it in the test's tmp_path, written by the `init` code.
- The files that hold a slow test are collected first (`pytest_collection_modifyitems`).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from specbuild.example import CACHE_ENV, ExamplePair


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files that hold a test marked slow run first, each file's tests still together and in their order: with
    `make test`'s two workers (pytest-xdist, a file per worker at a time) the long files start early, and the short
    ones fill in beside them, instead of one long file running alone at the end."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)


@pytest.fixture(scope="session", autouse=True)
def example_cache_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        folder = Path(request.config.cache.mkdir("specbuild-example"))
    except (AttributeError, OSError):  # cache provider disabled or read-only checkout
        folder = tmp_path_factory.mktemp("specbuild-example")
    previous = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(folder)
    yield folder
    if previous is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = previous


@pytest.fixture(scope="session")
def example_tiny(example_cache_dir: Path) -> ExamplePair:
    from specbuild.example import ensure_example

    return ensure_example("tiny", progress=False)


@pytest.fixture
def tiny_spec_path(tmp_path: Path, example_tiny: ExamplePair) -> Path:
    from specbuild.example import specfile

    text = specfile.render_spec(specfile.example_overrides(example_tiny, "tiny"), header="test spec (tiny example)")
    return specfile.write_spec(tmp_path / "specbuild.toml", text)


@pytest.fixture
def endpoint():
    """A stand-in for a server's HTTP endpoints (tests/test_drain_decisions.py, test_supervisor_decisions.py): an
    HTTP server on 127.0.0.1 (a free port) that records each request and answers from `answers`."""
    import http.server
    import json
    import threading

    seen, answers = [], {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append((self.command, self.path, self.headers.get("admin"), body))
            status, payload = answers.get(self.path, (404, {"error": "not found"}))
            if isinstance(payload, bytes):
                data = payload
            else:
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", seen, answers
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def silent_endpoint():
    """A server that takes connections and never answers (one hung, as a stopped tritonserver's port is): a socket
    on 127.0.0.1 (a free port) that listens and accepts nothing; the kernel completes each connection into its
    backlog, so a client connects and then waits for an answer that never comes."""
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield f"127.0.0.1:{listener.getsockname()[1]}"
