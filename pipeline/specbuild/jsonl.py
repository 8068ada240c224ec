"""JSON Lines as specbuild reads them (bench workloads, calibration files): one JSON value per line, blank lines
skipped, every error naming the file and line."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def records(text: str, path: Path, error: Callable[[str], Exception], example: str) -> Iterator[tuple[str, str, Any]]:
    """(where, as "<path>:<line number>", the line, its value) for each non-blank line of `text`, read from `path`;
    a line that is not JSON raises error("<where>: not valid JSON (<why>). <example>")."""
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            raise error(f"{where}: not valid JSON ({err.msg}). {example}") from None
        yield where, line, value
