"""In-backend write faults: make a backend's next append or repair fail from the inside.

Layer: testing (shipped). A fault *inside* a write strikes after part of a batch was written, or at
its durability step, and the backend must still leave the batch all-or-nothing: its own rollback
runs before the error propagates (docs/storage-format.md#durability). Production backends hold no
fault state and no test methods for this. Each shipped backend does every write step through one
private primitive, and `io_fault` replaces that primitive on one backend instance for the length of a
`with` block (`unittest.mock.patch.object`, so nothing else in the process sees it):

| backend | write step (`partial-write`, `sync`) | rollback step (`rollback`) |
|---|---|---|
| `MemoryBackend` | `_stage`: the records join the stored list | cannot fail: acts as `partial-write` |
| `JsonlBackend` | `_write_and_sync`: write, then fsync | `_truncate_durably`: truncate, then fsync |
| `SqliteBackend` | `_insert_events`, inside the transaction | cannot fail: acts as `partial-write` |
| `PostgresBackend` | `insert_events` of its `Writes`, inside the transaction | cannot fail: acts as `partial-write` |

The replacement writes `IOFault.staged_length` of the batch's items (records, bytes or rows) through
the real primitive, then raises; `COMMIT`, the lease extension and the revision bump never run, and
the backend's own rollback undoes what was staged. A JSONL materialization removes its temporary
file rather than truncating, so there `rollback` acts as `partial-write` too.

`FaultyBackend.fail_next_append(partial=True)`, `fail_next_sync` and `fail_next_rollback` arm the
same faults for the next write they forward. A backend of your own takes part with an
`IOFaultInjector` that replaces its own primitive the same way, passed as
`FaultyBackend(..., io_faults=...)` or `ConformanceTarget(..., io_faults=...)` (CONTRIBUTING.md,
"Adding a storage backend"). The PostgreSQL connection faults (a lost acknowledgement, an append
held inside its transaction) are in `dsh.testing.postgres`.
"""

from __future__ import annotations

import contextlib
import errno
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Literal, get_args
from unittest import mock

from dsh.persistence.errors import PersistenceIOError

__all__ = [
    "IOFault",
    "IOFaultInjector",
    "IOFaultKind",
    "IOFaultShot",
    "io_fault",
    "io_fault_injector",
    "replaced",
]

IOFaultKind = Literal["partial-write", "sync", "rollback"]
"""Where an in-backend fault strikes during the next `append_batch`, `start_append` or `commit_repair`.

* `partial-write`: after part of the batch was written; the backend rolls back, then raises.
* `sync`: at the durability step (fsync, commit) after everything was written; rolled back, raised.
* `rollback`: like `partial-write`, and the rollback itself fails (the backend reports that, e.g. a
  `PersistenceIOError` naming the artifact in `location`). Backends that cannot fail a rollback
  treat it as `partial-write`.
"""


@dataclass(frozen=True, slots=True)
class IOFault:
    """One in-backend fault: where it strikes and what it raises.

    Attributes:
        kind: Where it strikes.
        error: What the failing step raises.
    """

    kind: IOFaultKind
    error: BaseException

    def staged_length(self, size: int) -> int:
        """How much of a batch of `size` items (records, bytes, rows) is written before the fault strikes.

        All of it for `sync` (the fault strikes at the durability step), else half.
        """
        return size if self.kind == "sync" else size // 2

    @property
    def fails_rollback(self) -> bool:
        """Whether the rollback that follows must fail too (`rollback`)."""
        return self.kind == "rollback"


class IOFaultShot:
    """An armed `IOFault` that strikes at most once (thread-safe: the file stores write in worker threads).

    Attributes:
        fault: What strikes.
        struck: Whether it struck (a test can assert that the fault it armed was reached).
    """

    def __init__(self, fault: IOFault) -> None:
        self.fault = fault
        self.struck = False
        self._mutex = threading.Lock()

    def take(self) -> bool:
        """Claim the strike: True for the first caller only; later writes go through untouched."""
        with self._mutex:
            if self.struck:
                return False
            self.struck = True
            return True


IOFaultInjector = Callable[[Any, IOFaultShot], AbstractContextManager[object]]
"""Installs `shot` in one backend instance while the returned context is entered.

The injector replaces the backend's private write primitive (see `replaced`) with one that calls
`shot.take()` and, when that returns True, writes `shot.fault.staged_length(n)` of its `n` items
through the real primitive and raises `shot.fault.error` (for `rollback`, the rollback step fails
too where the backend can fail it). Leaving the context restores the primitive.
"""


@contextlib.contextmanager
def replaced(owner: object, name: str, make: Callable[[Any], Any]) -> Iterator[None]:
    """While the block runs, `owner.<name>` on this one instance is `make(original)`; then it is restored.

    The building block of injectors: `make` receives the current attribute (the real primitive,
    bound) and returns its replacement.
    """
    with mock.patch.object(owner, name, make(getattr(owner, name))):
        yield


@contextlib.contextmanager
def io_fault(
    backend: object,
    kind: IOFaultKind,
    error: BaseException | None = None,
    *,
    injector: IOFaultInjector | None = None,
) -> Iterator[IOFaultShot]:
    """While the block runs, the next write of `backend` fails from the inside at `kind`, once.

    Args:
        backend: A shipped backend (or a subclass of one), or any backend when `injector` is given.
        kind: Where the fault strikes.
        error: What the failing step raises (default: a `PersistenceIOError` naming the kind).
        injector: How to install the fault in `backend` (default: the shipped backend's).

    Yields:
        The armed shot; `shot.struck` tells whether a write reached it.

    Raises:
        TypeError: `backend` is not a shipped backend and no `injector` was given.
        ValueError: `kind` is not an `IOFaultKind`.
    """
    if kind not in get_args(IOFaultKind):
        raise ValueError(f"unknown in-backend fault kind {kind!r}; expected one of {get_args(IOFaultKind)}")
    inject = injector if injector is not None else io_fault_injector(backend)
    if inject is None:
        raise TypeError(f"no in-backend fault injector for {type(backend).__name__}; pass injector=")
    shot = IOFaultShot(IOFault(kind, error if error is not None else PersistenceIOError(f"injected {kind} fault")))
    with inject(backend, shot):
        yield shot


def io_fault_injector(backend: object) -> IOFaultInjector | None:
    """The injector of a shipped backend (memory, JSONL, SQLite, PostgreSQL, or a subclass), else None."""
    # An instance exists only once its backend's package was imported, so a package not loaded yet
    # cannot be the answer: looking in `sys.modules` keeps a memory-only test from loading the others.
    for package, name, injector in _SHIPPED:
        module = sys.modules.get(package)
        if module is not None and isinstance(backend, getattr(module, name)):
            return injector
    return None


# --------------------------------------------------------------------------------------------------
# The shipped backends' injectors


def _failing_step(shot: IOFaultShot) -> Callable[[Callable[[Any, Any], None]], Callable[[Any, Any], None]]:
    """A replacement for a write step `step(target, items)` that stages part of `items`, then raises."""

    def make(step: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
        def failing(target: Any, items: Any) -> None:
            if not shot.take():
                step(target, items)
                return
            step(target, items[: shot.fault.staged_length(len(items))])
            raise shot.fault.error

        return failing

    return make


def _memory_faults(backend: Any, shot: IOFaultShot) -> AbstractContextManager[object]:
    return replaced(backend, "_stage", _failing_step(shot))


def _sqlite_faults(backend: Any, shot: IOFaultShot) -> AbstractContextManager[object]:
    return replaced(backend, "_insert_events", _failing_step(shot))


@contextlib.contextmanager
def _jsonl_faults(backend: Any, shot: IOFaultShot) -> Iterator[None]:
    def make_truncate(truncate: Callable[[int, int], None]) -> Callable[[int, int], None]:
        # The rollback fails only after this fault's write failed, and only once.
        rollback = IOFaultShot(IOFault("rollback", OSError(errno.EIO, "injected rollback failure")))

        def failing(fd: int, size: int) -> None:
            if shot.struck and rollback.take():
                raise rollback.fault.error
            truncate(fd, size)

        return failing

    with replaced(backend, "_write_and_sync", _failing_step(shot)), contextlib.ExitStack() as stack:
        if shot.fault.fails_rollback:
            stack.enter_context(replaced(backend, "_truncate_durably", make_truncate))
        yield


def _postgres_faults(backend: Any, shot: IOFaultShot) -> AbstractContextManager[object]:
    def make(step: Callable[[Any, Any], Awaitable[None]]) -> Callable[[Any, Any], Awaitable[None]]:
        async def failing(conn: Any, rows: Any) -> None:
            if not shot.take():
                await step(conn, rows)
                return
            await step(conn, rows[: shot.fault.staged_length(len(rows))])
            raise shot.fault.error

        return failing

    # The rows go in through the backend's `Writes`; leaving its transaction block rolls it back.
    return replaced(backend._writes, "insert_events", make)  # noqa: SLF001 - the write step tests replace


_SHIPPED: tuple[tuple[str, str, IOFaultInjector], ...] = (
    ("dsh.persistence.memory", "MemoryBackend", _memory_faults),
    ("dsh.persistence.jsonl", "JsonlBackend", _jsonl_faults),
    ("dsh.persistence.sqlite", "SqliteBackend", _sqlite_faults),
    ("dsh.persistence.postgres", "PostgresBackend", _postgres_faults),
)
"""The shipped backends: where each class is exported, and its injector."""


# Shown under the name users import (docs/architecture.md#public-names).
IOFault.__module__ = "dsh.testing"
IOFaultShot.__module__ = "dsh.testing"
