"""Shared fixtures.

- The whole session uses its own example-pair cache ($SPECBUILD_CACHE_DIR is set to
  `.pytest_cache/d/specbuild-example`, kept between sessions, keyed by the recipe hash), so tests
  never touch the user's cache and the tiny pair is built once, not once per test.
- `example_tiny`: the tiny built-in example pair (an `ExamplePair`: root, target, draft, info).
- `tiny_spec_path`: a spec file for it in the test's tmp_path, written by the `init` code.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from specbuild.example import CACHE_ENV, ExamplePair


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
