"""One writer per session for file-based stores: an exclusive `flock` per session id.

Layer: persistence (private; shared by the JSONL and SQLite backends). Both take
`<root or db path>.locks/<escaped id>.lock` with a non-blocking exclusive `fcntl.flock` when a
session first materializes or is prepared, hold it while the session is live, and release it at
retirement. The kernel drops the lock when the process dies, so a crashed writer never blocks a
restart. Lock files are never unlinked: removing one while another process has it open would let
two processes lock two different inodes. Readers never lock. Calls block briefly (open + flock)
and are made from worker threads. See docs/storage-format.md#writer-locks.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import threading
from pathlib import Path

from dsh.persistence.errors import LeaseHeldError, PersistenceIOError
from dsh.session.ids import encode_segment

__all__ = ["WriterLocks", "writer_active"]


class WriterLocks:
    """Per-session exclusive writer locks under one directory (thread-safe)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._held: dict[str, int] = {}
        self._mutex = threading.Lock()
        self._me = f"{os.getpid()}@{socket.gethostname()}"

    def path_for(self, session_id: str) -> Path:
        """The lock file of `session_id`."""
        return self.directory / f"{encode_segment(session_id)}.lock"

    def holds(self, session_id: str) -> bool:
        """Whether this instance holds the session's lock."""
        with self._mutex:
            return session_id in self._held

    def acquire(self, session_id: str) -> None:
        """Take the lock (re-entrant for this instance).

        Raises:
            LeaseHeldError: Another process (or another instance in this one) holds it.
            PersistenceIOError: The lock file cannot be created.
        """
        with self._mutex:
            if session_id in self._held:
                return
            path = self.path_for(session_id)
            try:
                self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except OSError as error:
                raise PersistenceIOError(
                    f'cannot create the writer lock for session "{session_id}": {error}',
                    session_id=session_id,
                    location=str(path),
                ) from error
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise LeaseHeldError(
                    f'session "{session_id}" is being written by another process ({holder or "unknown holder"}); '
                    "only one process may append to a session",
                    session_id=session_id,
                    location=str(path),
                    holder=holder,
                ) from None
            except OSError as error:
                os.close(fd)
                raise PersistenceIOError(
                    f'cannot lock session "{session_id}": {error}', session_id=session_id, location=str(path)
                ) from error
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.pwrite(fd, self._me.encode(), 0)
            self._held[session_id] = fd

    def release(self, session_id: str) -> None:
        """Release the lock if held (closing the descriptor drops the flock)."""
        with self._mutex:
            fd = self._held.pop(session_id, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def release_all(self) -> None:
        """Release every lock this instance holds."""
        with self._mutex:
            held, self._held = self._held, {}
        for fd in held.values():
            with contextlib.suppress(OSError):
                os.close(fd)


def _read_holder(fd: int) -> str | None:
    try:
        text = os.pread(fd, 256, 0).decode("utf-8", "replace").strip()
    except OSError:
        return None
    return text or None


def writer_active(lock_path: str) -> bool:
    """Whether some process holds the writer lock at `lock_path` (probe with a non-blocking flock)."""
    try:
        fd = os.open(lock_path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the probe's own lock
    return False
