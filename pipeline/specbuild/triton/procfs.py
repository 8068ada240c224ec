"""What Linux's /proc says about a tritonserver: its descendants, its Python backend stubs, who holds a port.

The Python backend starts each model instance's stub as `bash -c "exec <stub> <model_path> <shm_region>
<shm_default_size> <shm_growth_size> <parent_pid> <python_lib_dir> <ipc_handle> <instance_name> <model_dir>"`
(triton-inference-server/python_backend r24.10, src/stub_launcher.cc, the Linux branch of Launch), so after
the exec a stub's argv[1] is `<repo>/<model>/<version>/model.py`, argv[2] its /dev/shm region and argv[8]
its instance name (e.g. `tensorrt_llm_draft_0_0`).

A killed stub stays a zombie child of tritonserver until the server terminates that instance
(stub_launcher.cc, KillStubProcess / WaitForStubProcess), so `kill(pid, 0)` still succeeds on it: liveness
is read from the state field of /proc/<pid>/stat (`Z` = dead), and a zombie's cmdline is empty.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
STUB_NAME = "triton_python_backend_stub"


def state(pid: int) -> str | None:
    """The one-letter process state (R, S, D, T, Z, ...), None when there is no such process."""
    try:
        return (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    """True while pid exists and is not a zombie (nor dead)."""
    return state(pid) not in (None, "Z", "X")


def stopped(pid: int) -> bool:
    """True while pid is stopped (SIGSTOP, state T) or stopped by a tracer (t): it runs no code until continued,
    so it answers nothing, yet it is alive."""
    return state(pid) in ("T", "t")


def age_seconds(pid: int) -> float | None:
    """Seconds since pid started (/proc/<pid>/stat field 22, starttime, against /proc/uptime); None if gone."""
    try:
        started = int(_stat_fields(PROC / str(pid))[19]) / os.sysconf("SC_CLK_TCK")
        uptime = float((PROC / "uptime").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    return max(0.0, uptime - started)


def cmdline(pid: int) -> list[str]:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0")[:-1]]


def describe(pid: int, width: int = 120) -> str:
    text = " ".join(cmdline(pid)) or "?"
    return text if len(text) <= width else text[: width - 3] + "..."


def _stat_fields(entry: Path) -> list[str]:
    return (entry / "stat").read_text().rsplit(")", 1)[1].split()  # [state, ppid, pgrp, ...]


def group_members(pgid: int) -> list[int]:
    """Live processes in process group pgid (a server started in its own session leads its group)."""
    members = []
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            try:
                fields = _stat_fields(entry)
            except (OSError, IndexError):
                continue
            if fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
                members.append(int(entry.name))
    return members


def stubs_with_region_prefix(prefix: str) -> list[int]:
    """Live stubs whose /dev/shm region starts with prefix: one server start's stubs, orphans included."""
    if not prefix.startswith("specbuild_"):
        return []  # only specbuild's per-start prefixes single out one server's stubs
    found = []
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            argv = cmdline(int(entry.name))
            if len(argv) > 2 and argv[0].endswith("/" + STUB_NAME) and argv[2].startswith(prefix):
                found.append(int(entry.name))
    return [pid for pid in found if alive(pid)]


def descendants(pid: int) -> list[int]:
    """Every descendant of pid, zombies included (e.g. the Python backend stubs)."""
    parents: dict[int, int] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parents[int(entry.name)] = int(_stat_fields(entry)[1])
        except (OSError, IndexError, ValueError):
            continue
    found, frontier = [], [pid]
    while frontier:
        current = frontier.pop()
        kids = [p for p, parent in parents.items() if parent == current]
        found += kids
        frontier += kids
    return found


@dataclass(frozen=True)
class Stub:
    pid: int
    instance: str  # the model instance name, e.g. tensorrt_llm_draft_0_0
    model: str  # the model's folder name in the repository
    region: str  # its /dev/shm region


def python_stubs(server_pid: int) -> list[Stub]:
    """The live Python backend stubs under server_pid (zombies have no cmdline and are left out)."""
    stubs = []
    for pid in descendants(server_pid):
        argv = cmdline(pid)
        if len(argv) < 9 or not argv[0].endswith("/" + STUB_NAME) or not alive(pid):
            continue
        model_path = Path(argv[1])  # <repo>/<model>/<version>/model.py
        stubs.append(Stub(pid, argv[8], model_path.parent.parent.name, argv[2]))
    return stubs


# ---- sockets -----------------------------------------------------------------------------------------
_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column
_ANY = {"0.0.0.0", "::"}


def _address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))  # four host-order 32-bit words
    address = socket.inet_ntop(socket.AF_INET6, words)
    return address.removeprefix("::ffff:") if address.startswith("::ffff:") and "." in address else address


def listening_inodes(host: str, port: int) -> set[int]:
    """Inodes of TCP sockets listening on port at an address that clashes with host (same, or a wildcard)."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            address, port_hex = fields[1].rsplit(":", 1)
            if int(port_hex, 16) != port:
                continue
            bound = _address(address)
            if bound == host or bound in _ANY or host in _ANY:
                inodes.add(int(fields[9]))
    return inodes


def socket_owners(inodes: set[int]) -> set[int]:
    """PIDs holding any of these socket inodes (only processes whose fds we may read)."""
    if not inodes:
        return set()
    wanted = {f"socket:[{inode}]" for inode in inodes}
    owners = set()
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) in wanted:
                    owners.add(int(entry.name))
                    break
        except OSError:
            continue
    return owners


def port_holders(host: str, port: int) -> tuple[bool, set[int]]:
    """(someone listens on host:port, the PIDs we can see holding it)."""
    inodes = listening_inodes(host, port)
    listening = bool(inodes)
    if not listening:  # another network namespace's view, or /proc/net hidden: ask the port itself
        probe = "127.0.0.1" if host in _ANY else host
        try:
            with socket.create_connection((probe, port), timeout=0.5):
                listening = True
        except OSError:
            pass
    return listening, socket_owners(inodes)
