"""Housekeeping around a tritonserver start: ports already in use, the previous log, leftover /dev/shm regions.

Rules: a busy port is refused with the PID holding it (tritonserver would load every model first and
only then fail to bind: server src/http_server.cc and src/grpc/grpc_server.cc); a log is rotated, never
truncated; only regions named with specbuild's per-start prefix are removed, and only those owned by
this user (the Python backend names a stub's region `<prefix><uuid>`, python_backend src/stub_launcher.cc).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from specbuild.errors import ServeError
from specbuild.triton import procfs

SHM_ROOT = Path("/dev/shm")
SHM_PREFIX_START = "specbuild_"
LOGS_KEPT = 3  # previous server logs kept beside the current one (.1 newest)


def refuse_busy_ports(host: str, ports: dict[str, int]) -> None:
    """Raise ServeError naming the holder when a fixed port (e.g. {"http_port": 8000}) is already in use."""
    names = {"http_port": "HTTP", "grpc_port": "gRPC", "metrics_port": "metrics"}
    for key, port in ports.items():
        if not port:
            continue
        listening, holders = procfs.port_holders(host, port)
        if listening:
            who = (
                "; ".join(f"PID {pid} ({procfs.describe(pid)})" for pid in sorted(holders))
                or "a process not visible here"
            )
            raise ServeError(
                f"the {names.get(key, key)} port {host}:{port} is already in use by {who}. Stop that "
                f"process, or pass --{key.replace('_', '-')} 0 for a free port."
            )


def rotate_log(path: Path, keep: int = LOGS_KEPT) -> None:
    """log -> log.1 -> log.2 ...; the oldest beyond `keep` is dropped (all of them are this server's logs)."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    for index in range(keep - 1, 0, -1):
        older = path.with_name(f"{path.name}.{index}")
        if older.exists():
            os.replace(older, path.with_name(f"{path.name}.{index + 1}"))
    os.replace(path, path.with_name(f"{path.name}.1"))


def remove_regions(prefix: str) -> list[str]:
    """Delete the /dev/shm regions named `<prefix>*` that are ours; only specbuild's per-start prefixes."""
    if not prefix.startswith(SHM_PREFIX_START) or len(prefix) < len(SHM_PREFIX_START) + 8 or "/" in prefix:
        raise ValueError(f"not a specbuild shm prefix: {prefix!r}")
    removed = []
    for entry in SHM_ROOT.glob(prefix + "*"):
        try:
            info = entry.lstat()
            if stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid():
                entry.unlink()
                removed.append(entry.name)
        except OSError:
            continue
    return removed
