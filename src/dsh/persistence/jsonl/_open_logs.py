"""Write descriptors the JSONL backend keeps open for the logs this process writes.

Layer: persistence (private to `dsh.persistence.jsonl`; used from the backend's worker threads).
Opening, checking and closing a log for every batch costs more system calls than the write itself,
so after a successful write the backend keeps the descriptor together with what it knows about the
file: the stat identity after its own write, the last 4 KiB (the revision's tail) and the next seq.
The next append only has to prove that the file at the path is still exactly that one — one
`stat` of the path and one 4 KiB `pread`, the same facts the revision is made of — and then writes
(docs/architecture.md#write-path). Anything else (another writer, a truncation, a replaced or
deleted file, a failed write) drops the entry, and the backend falls back to opening and scanning.

Entries live while the session's writer lock is held: the backend drops an entry when it releases
the lock, repairs the log, or closes. They are never evicted by another thread, because one
session's appends and lock changes are serialized by the coordinator while different sessions'
appends run in parallel threads: evicting a descriptor another thread is writing through could
reuse its number for another file.
"""

from __future__ import annotations

import os
import threading

from dsh.persistence.base import Revision
from dsh.persistence.jsonl._files import TAIL_BYTES

__all__ = ["OpenLog", "OpenLogs", "stat_key"]


def stat_key(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """The identity and state of a file: device, inode, size, modification and change times."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class OpenLog:
    """One log this process writes: its open descriptor and its state after the last write."""

    __slots__ = ("fd", "key", "next_seq", "path", "revision", "tail")

    def __init__(
        self, path: str, fd: int, *, st: os.stat_result, next_seq: int, tail: bytes, revision: Revision
    ) -> None:
        self.path = path
        self.fd = fd
        self.key = stat_key(st)
        self.next_seq = next_seq
        self.tail = tail[-TAIL_BYTES:]
        self.revision = revision

    @property
    def size(self) -> int:
        """The file size after the last write."""
        return self.key[2]

    def unchanged(self) -> bool:
        """Whether the file at `path` is still exactly the one this entry describes.

        Compares the stat identity of the path and the last 4 KiB read through the descriptor: the
        facts the revision is computed from, so a change the revision would show is never missed.
        """
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        if stat_key(st) != self.key:
            return False
        return os.pread(self.fd, TAIL_BYTES, max(self.size - TAIL_BYTES, 0)) == self.tail

    def advance(self, st: os.stat_result, count: int, written: bytes, revision: Revision) -> None:
        """Record a successful write of `written` holding `count` records."""
        self.key = stat_key(st)
        self.next_seq += count
        self.tail = (self.tail + written)[-TAIL_BYTES:]
        self.revision = revision


class OpenLogs:
    """The open logs by session id (thread-safe bookkeeping; see the module docs for the rules)."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._logs: dict[str, OpenLog] = {}

    def get(self, session_id: str) -> OpenLog | None:
        """The entry of the id, or None."""
        with self._mutex:
            return self._logs.get(session_id)

    def put(self, session_id: str, log: OpenLog) -> None:
        """Keep `log` for the id (closing an entry it replaces)."""
        with self._mutex:
            old = self._logs.get(session_id)
            self._logs[session_id] = log
        if old is not None and old.fd != log.fd:
            os.close(old.fd)

    def pop(self, session_id: str) -> OpenLog | None:
        """Forget the id's entry and close its descriptor; returns the entry (its state stays readable)."""
        with self._mutex:
            log = self._logs.pop(session_id, None)
        if log is not None:
            os.close(log.fd)
        return log

    def pop_all(self) -> list[OpenLog]:
        """Forget and close every entry."""
        with self._mutex:
            logs = list(self._logs.values())
            self._logs.clear()
        for log in logs:
            os.close(log.fd)
        return logs

    def __len__(self) -> int:
        with self._mutex:
            return len(self._logs)
