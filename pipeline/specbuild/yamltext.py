"""Block-style YAML, written without a YAML library, for the files specbuild writes: the chart's values.yaml and
Chart.yaml (a comment above a key where one is given), model.yaml and trtllm-serve's options (`llmapi.args`).

Only what those files hold: mappings, lists, strings, numbers, booleans, multi-line strings (as `|` blocks).
Strings are written as JSON strings, which YAML reads as double-quoted strings, so no value is misread
(`"no"`, `"1.0"`, `"*"`, `"947313551256"` stay strings).
"""

from __future__ import annotations

import json
from typing import Any


def scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if value is None:
        return "null"
    raise TypeError(f"no YAML scalar for {value!r}")


def dump(
    data: dict[str, Any], comments: dict[str, str] | None = None, path: str = "", indent: int = 0, header: str = ""
) -> str:
    """`data` as YAML; `comments` maps a dotted key path ("gpu.count") to the comment written above it; `header` is
    written first, as comment lines."""
    comments = comments or {}
    pad = " " * indent
    lines: list[str] = [f"# {line}" if line else "#" for line in header.splitlines()]
    for key, value in data.items():
        dotted = f"{path}.{key}" if path else key
        if dotted in comments:
            if indent == 0 and lines:
                lines.append("")
            lines += [f"{pad}# {line}" if line else f"{pad}#" for line in comments[dotted].splitlines()]
        if isinstance(value, dict) and value:
            lines.append(f"{pad}{key}:")
            lines.append(dump(value, comments, dotted, indent + 2).rstrip("\n"))
        elif isinstance(value, (list, tuple)) and value:
            lines.append(f"{pad}{key}:")
            for item in value:
                if isinstance(item, dict):
                    first, *rest = dump(item, {}, "", indent + 4).rstrip("\n").splitlines()
                    lines.append(f"{pad}  - {first.lstrip()}")
                    lines += rest
                else:
                    lines.append(f"{pad}  - {scalar(item)}")
        elif isinstance(value, dict):
            lines.append(f"{pad}{key}: {{}}")
        elif isinstance(value, (list, tuple)):
            lines.append(f"{pad}{key}: []")
        elif isinstance(value, str) and "\n" in value:
            lines.append(f"{pad}{key}: |")
            lines += [f"{pad}  {line}" if line else "" for line in value.rstrip("\n").splitlines()]
        else:
            lines.append(f"{pad}{key}: {scalar(value)}")
    return "\n".join(lines) + "\n"
