"""Who holds a lease: a holder name that says which host and which process, and whether it still runs.

Layer: persistence (private to `dsh.persistence.postgres`). A lease row names its writer in
`holder` (docs/storage-format.md#postgresql-leases-and-fencing). The name is
`<12 hex>@<hostname>:<pid>`, unique to one backend instance, and on Linux it goes on with three
facts that let another process of the same machine decide, without any doubt, that the holder is
gone:

    3f2a9c0e1b7d@build-7:41233 boot=6c0f...-...-9b2e pidns=4:4026531836 start=8812733

* `boot` is the kernel's boot id (`/proc/sys/kernel/random/boot_id`), a random UUID drawn at every
  boot. A host name can repeat and a pid is only meaningful within one running kernel.
* `pidns` is the pid namespace (device and inode of `/proc/self/ns/pid`). Two containers on one
  kernel share the boot id but number their processes independently; only the same namespace
  means the same pids.
* `start` is the process's start time in clock ticks since boot (field 22 of `/proc/<pid>/stat`).
  A pid is reused after its process ends; the start time tells the reuse apart.

`gone_pid(holder)` says a holder is gone only when its boot id and pid namespace are this
process's and its pid now names no process (`kill(pid, 0)` finds none), a process that has
already exited (a zombie), or one with another start time. Everything else (another host, another
namespace, a name without these facts, a system without `/proc`, a pid `/proc` hides) is never
judged: such a lease waits for its expiry as before.
"""

from __future__ import annotations

import functools
import os
import re
import socket
import uuid
from typing import Final

__all__ = ["gone_pid", "new_holder", "same_machine"]

_PROC: Final = "/proc"
_FACTS: Final = re.compile(
    r":(?P<pid>[0-9]+) boot=(?P<boot>[0-9a-f-]{36}) pidns=(?P<ns>[0-9]+:[0-9]+) start=(?P<start>[0-9]+)$"
)
_EXITED_STATES: Final = frozenset("ZX")
"""`/proc/<pid>/stat` states of a process that has ended but was not reaped yet (zombie, dead)."""


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def _process(pid: int) -> tuple[str, int] | None:
    """`(state, start time in ticks)` of `pid` from `/proc/<pid>/stat`, or None when there is none."""
    text = _read(f"{_PROC}/{pid}/stat")
    if text is None:
        return None
    # The command name (field 2) is in parentheses and may hold spaces and parentheses itself:
    # the fields after it start after its last ")".
    fields = text[text.rfind(")") + 2 :].split()
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


@functools.cache
def _machine() -> tuple[str, str] | None:
    """`(boot id, pid namespace)` of this process, or None where the system does not tell them."""
    boot = _read(f"{_PROC}/sys/kernel/random/boot_id")
    try:
        ns = os.stat(f"{_PROC}/self/ns/pid")
    except OSError:
        return None
    if boot is None or not re.fullmatch(r"[0-9a-f-]{36}", boot.strip()):
        return None
    return boot.strip(), f"{ns.st_dev}:{ns.st_ino}"


def _facts() -> str:
    """The identity facts of this process (` boot=... pidns=... start=...`), or "" without them."""
    machine = _machine()
    found = _process(os.getpid()) if machine is not None else None
    if machine is None or found is None:
        return ""
    return f" boot={machine[0]} pidns={machine[1]} start={found[1]}"


def new_holder() -> str:
    """A holder name unique to one backend instance: `<random>@<host>:<pid>` and, on Linux, its identity facts."""
    return f"{uuid.uuid4().hex[:12]}@{socket.gethostname()}:{os.getpid()}{_facts()}"


def same_machine(holder: str) -> bool:
    """Whether the holder names this machine's process table (same boot id and pid namespace)."""
    match = _FACTS.search(holder)
    machine = _machine()
    return match is not None and machine is not None and (match["boot"], match["ns"]) == machine


def gone_pid(holder: str) -> int | None:
    """The holder's pid when it is certainly a process of this machine that no longer runs, else None."""
    match = _FACTS.search(holder)
    if match is None or not same_machine(holder):
        return None
    pid = int(match["pid"])
    if pid < 1:
        return None
    try:
        os.kill(pid, 0)  # signal 0 sends nothing: it only asks whether the pid exists
    except ProcessLookupError:
        return pid
    except OSError:
        pass  # it exists, but belongs to another user
    found = _process(pid)
    if found is None:
        return None  # it exists, but /proc does not show it here (hidepid): cannot tell
    state, start = found
    if state in _EXITED_STATES or start != int(match["start"]):
        return pid
    return None
