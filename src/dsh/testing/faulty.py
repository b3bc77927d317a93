"""`FaultyBackend`: a `StorageBackend` wrapper that injects faults, gates calls and counts them.

Layer: testing (shipped). It wraps any backend and forwards every call, so a conformance test can
make the next append fail, fail every call until cleared, fail once a number of events went
through, hold a call at a gate until the test releases it, and count or time what reached the
backend. Faults *inside* a backend's write (after part of a batch was written, or at its
durability step) are installed for the one forwarded write by an `IOFaultInjector`
(`dsh.testing.io_faults`: the shipped backends have theirs, another backend passes its own), and the
backend must still leave the batch all-or-nothing (it rolls back). The wrapper declares and
implements exactly what the wrapped backend does: over a backend with `TYPED_READS` it is a
`TypedFaultyBackend`, which also forwards `load_typed`; over any other backend it has no
`load_typed` at all.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Final

from dsh.json import FrozenDict
from dsh.persistence.base import (
    Capability,
    DamagedSession,
    Fence,
    HeaderRow,
    Revision,
    StorageBackend,
    StoredLog,
    TornMarker,
    typed_reads_of,
)
from dsh.persistence.errors import PersistenceIOError
from dsh.session.events import SessionEvent
from dsh.testing.io_faults import IOFault, IOFaultInjector, IOFaultKind, IOFaultShot, io_fault_injector

__all__ = ["HANG_GUARD_S", "AppendRecord", "FaultyBackend", "TypedFaultyBackend"]

HANG_GUARD_S: Final = 30.0
"""How long a wait helper waits before failing: a guard against hangs, never a timing assertion."""


@dataclass(frozen=True, slots=True)
class AppendRecord:
    """One `append_batch` that reached the inner backend and succeeded.

    Attributes:
        at: The injected clock's reading when the call started (None without a clock).
        session_id: The session the batch belongs to.
        first_seq: The seq of the batch's first event.
        count: How many events the batch held.
        materialized: The `materialized` flag the coordinator passed.
    """

    at: int | None
    session_id: str
    first_seq: int
    count: int
    materialized: bool


def _injected(method: str) -> PersistenceIOError:
    return PersistenceIOError(f"injected fault in {method}")


class _Gate:
    """A closed gate that calls wait at until the test opens it."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()


class FaultyBackend:
    """Wraps `inner`, forwarding every call, with faults, gates and counters.

    Constructing one over a backend that declares `TYPED_READS` returns a `TypedFaultyBackend`
    (which forwards `load_typed` as well), so the wrapper's capabilities and protocols always match
    the wrapped backend's.

    Args:
        inner: The backend to wrap.
        clock: Read at each successful append for `appends[i].at` (e.g. `ManualTimer.now_ms`).
        io_faults: How to fail `inner`'s writes from the inside (default: the shipped backend's
            injector, `dsh.testing.io_faults`); without one, only faults before the call exist.

    Attributes:
        calls: How many times each method was called (faulted calls included).
        appends: The successful `append_batch` calls, in order.
    """

    def __new__(
        cls,
        inner: StorageBackend,
        *,
        clock: Callable[[], int] | None = None,
        io_faults: IOFaultInjector | None = None,
    ) -> FaultyBackend:
        """Pick the class that matches `inner`: `TypedFaultyBackend` when it has typed reads."""
        if cls is FaultyBackend and typed_reads_of(inner) is not None:
            return super().__new__(TypedFaultyBackend)
        return super().__new__(cls)

    def __init__(
        self,
        inner: StorageBackend,
        *,
        clock: Callable[[], int] | None = None,
        io_faults: IOFaultInjector | None = None,
    ) -> None:
        self.inner = inner
        self.name: str = inner.name
        self.capabilities: frozenset[Capability] = inner.capabilities
        self.calls: Counter[str] = Counter()
        self.appends: list[AppendRecord] = []
        self._clock = clock
        self._next: dict[str, list[BaseException]] = {}
        self._always: dict[str, BaseException] = {}
        self._after_events: tuple[int, BaseException] | None = None
        self._events_through = 0
        self._gates: dict[str, _Gate] = {}
        self._changed = asyncio.Condition()
        self._injector = io_faults if io_faults is not None else io_fault_injector(inner)
        self._in_backend: IOFault | None = None

    # ---------------------------------------------------------------- fault control

    def fail_next(self, method: str = "append_batch", error: BaseException | None = None) -> None:
        """Make the next call of `method` raise `error` before reaching the inner backend."""
        self._next.setdefault(method, []).append(error if error is not None else _injected(method))

    @property
    def has_io_faults(self) -> bool:
        """Whether faults inside the wrapped backend's writes can be armed (it has an `IOFaultInjector`)."""
        return self._injector is not None

    def fail_next_append(self, error: BaseException | None = None, *, partial: bool = False) -> None:
        """Fail the next append: before anything is written, or (`partial`) after part of it was.

        A partial fault needs an `IOFaultInjector` for the inner backend; the batch stays
        all-or-nothing because the backend rolls back before raising.

        Raises:
            TypeError: `partial` was asked over a backend without an injector.
        """
        if partial:
            self._arm_in_backend("partial-write", error)
        else:
            self.fail_next("append_batch", error)

    def fail_next_sync(self, error: BaseException | None = None) -> None:
        """Fail the next append at its durability step (fsync or commit); needs an `IOFaultInjector`."""
        self._arm_in_backend("sync", error)

    def fail_next_rollback(self, error: BaseException | None = None) -> None:
        """Fail the next append part-way and make its rollback fail too; needs an `IOFaultInjector`."""
        self._arm_in_backend("rollback", error)

    def _arm_in_backend(self, kind: IOFaultKind, error: BaseException | None) -> None:
        """Arm a fault for the next `append_batch` or `commit_repair` forwarded (replacing one not yet used)."""
        if self._injector is None:
            raise TypeError(
                f"backend {self.inner.name!r} has no in-backend fault injector; pass io_faults= to FaultyBackend"
            )
        self._in_backend = IOFault(kind, error if error is not None else _injected(kind))

    def _in_backend_fault(self) -> AbstractContextManager[object]:
        """The armed in-backend fault, installed in the inner backend for the one call about to be forwarded."""
        fault, self._in_backend = self._in_backend, None
        if fault is None or self._injector is None:
            return contextlib.nullcontext()
        return self._injector(self.inner, IOFaultShot(fault))

    def fail_after_events(self, count: int, error: BaseException | None = None) -> None:
        """Let `count` more events through `append_batch`; the batch that would exceed them fails once.

        The failing batch is refused before it reaches the inner backend (nothing of it is written).
        """
        self._after_events = (self._events_through + count, error if error is not None else _injected("append_batch"))

    def fail_always(self, method: str = "append_batch", error: BaseException | None = None) -> None:
        """Make every call of `method` raise until `clear()`."""
        self._always[method] = error if error is not None else _injected(method)

    def clear(self) -> None:
        """Remove every pending and permanent fault, in-backend ones too (gates stay as they are)."""
        self._next.clear()
        self._always.clear()
        self._after_events = None
        self._in_backend = None

    def hold_calls(self, method: str) -> None:
        """Close a gate: calls of `method` wait (after being counted) until `release_calls(method)`."""
        self._gates.setdefault(method, _Gate())

    def release_calls(self, method: str) -> None:
        """Open the gate of `method`, letting waiting and later calls proceed."""
        gate = self._gates.pop(method, None)
        if gate is not None:
            gate.opened.set()

    async def wait_calls(self, method: str, count: int) -> None:
        """Wait until `method` was called at least `count` times (a generous guard only catches hangs)."""

        async def reached() -> None:
            async with self._changed:
                await self._changed.wait_for(lambda: self.calls[method] >= count)

        await asyncio.wait_for(reached(), HANG_GUARD_S)

    async def wait_appends(self, count: int) -> None:
        """Wait until `count` appends succeeded (a generous guard only catches hangs)."""

        async def reached() -> None:
            async with self._changed:
                await self._changed.wait_for(lambda: len(self.appends) >= count)

        await asyncio.wait_for(reached(), HANG_GUARD_S)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _enter(self, method: str) -> None:
        self.calls[method] += 1
        await self._notify()
        gate = self._gates.get(method)
        if gate is not None:
            await gate.opened.wait()
        queued = self._next.get(method)
        if queued:
            raise queued.pop(0)
        error = self._always.get(method)
        if error is not None:
            raise error

    # ---------------------------------------------------------------- StorageBackend

    async def open(self) -> None:
        """Forward `open`."""
        await self._enter("open")
        await self.inner.open()

    async def list_headers(
        self, *, parents: frozenset[str | None] | None = None
    ) -> tuple[list[HeaderRow], list[DamagedSession]]:
        """Forward `list_headers`."""
        await self._enter("list_headers")
        return await self.inner.list_headers(parents=parents)

    async def exists(self, session_id: str) -> bool:
        """Forward `exists`."""
        await self._enter("exists")
        return await self.inner.exists(session_id)

    async def load(self, session_id: str) -> StoredLog | None:
        """Forward `load`."""
        await self._enter("load")
        return await self.inner.load(session_id)

    async def read_revision(self, session_id: str) -> Revision | None:
        """Forward `read_revision`."""
        await self._enter("read_revision")
        return await self.inner.read_revision(session_id)

    async def append_batch(
        self, header: FrozenDict, events: Sequence[SessionEvent], *, materialized: bool, fence: Fence | None
    ) -> Revision:
        """Forward `append_batch`, applying the event-count fault and recording successes."""
        await self._enter("append_batch")
        if self._after_events is not None:
            limit, error = self._after_events
            if self._events_through + len(events) > limit:
                self._after_events = None
                raise error
        at = self._clock() if self._clock is not None else None
        with self._in_backend_fault():
            revision = await self.inner.append_batch(header, events, materialized=materialized, fence=fence)
        self._events_through += len(events)
        session_id = str(header["id"])
        first = events[0].seq if events else -1
        self.appends.append(AppendRecord(at, session_id, first, len(events), materialized))
        await self._notify()
        return revision

    async def commit_repair(
        self, header: FrozenDict, torn: TornMarker | None, closers: Sequence[SessionEvent], *, fence: Fence | None
    ) -> Revision:
        """Forward `commit_repair` (with the armed in-backend fault, if any)."""
        await self._enter("commit_repair")
        with self._in_backend_fault():
            return await self.inner.commit_repair(header, torn, closers, fence=fence)

    async def acquire(self, session_id: str) -> Fence | None:
        """Forward `acquire`."""
        await self._enter("acquire")
        return await self.inner.acquire(session_id)

    async def release(self, session_id: str) -> None:
        """Forward `release`."""
        await self._enter("release")
        await self.inner.release(session_id)

    def locate(self, header: Mapping[str, Any]) -> str | None:
        """Forward `locate` (not counted: it does no I/O)."""
        return self.inner.locate(header)

    async def close(self) -> None:
        """Forward `close`."""
        await self._enter("close")
        await self.inner.close()

    # ---------------------------------------------------------------- reading the counters

    @property
    def reads(self) -> int:
        """Backend log reads so far (`load` plus `load_typed`)."""
        return self.calls["load"] + self.calls["load_typed"]


class TypedFaultyBackend(FaultyBackend):
    """A `FaultyBackend` over a backend with `TYPED_READS`: it also forwards (and counts) `load_typed`.

    `FaultyBackend(inner)` returns one of these by itself when `inner` has typed reads.
    """

    async def load_typed(
        self, session_id: str, types: frozenset[str] | None, from_seq: int, known: frozenset[str]
    ) -> StoredLog | None:
        """Forward `load_typed`."""
        await self._enter("load_typed")
        typed = typed_reads_of(self.inner)
        assert typed is not None, "a TypedFaultyBackend wraps a backend with typed reads"
        return await typed.load_typed(session_id, types, from_seq, known)


# Shown under the name users import (docs/architecture.md#public-names).
FaultyBackend.__module__ = "dsh.testing"
