"""The harness behind the persistence conformance suite: coordinators over one target, cleaned up.

Layer: testing (shipped, importable). `ConformanceHarness` opens `PersistenceCoordinator`s over new
instances of the backend under test (each wrapped in a counting `FaultyBackend`), with one
`SessionStore` and one `ManualTimer`, and closes everything at teardown; `eventually` waits for a
condition no event signals, with a guard that only catches hangs.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable
from typing import Any

from dsh.json import dumps
from dsh.persistence.base import StorageBackend
from dsh.persistence.coordinator import PersistenceCoordinator
from dsh.session.session import Session
from dsh.session.store import SessionStore
from dsh.testing.faulty import HANG_GUARD_S, FaultyBackend
from dsh.testing.stored_logs import (
    ConformanceTarget,
    StepClock,
    StoredLogWriter,
    append_closed_turn,
    append_note,
    build_records,
)
from dsh.testing.timer import ManualTimer

__all__ = ["ConformanceHarness", "closed_turn_records", "encoded", "eventually", "note_records"]


async def eventually(predicate: Callable[[], bool]) -> None:
    """Yield to the loop until `predicate()` holds; the guard only catches hangs."""

    async def reached() -> None:
        # No event signals these conditions (a log record, a task outcome): yield until they hold.
        while not predicate():  # noqa: ASYNC110 - polled: nothing signals these conditions
            await asyncio.sleep(0)

    await asyncio.wait_for(reached(), HANG_GUARD_S)


def note_records(count: int) -> list[dict[str, Any]]:
    """`count` valid `session/title` records (seqs 0..count-1)."""

    def build(session: Session) -> None:
        for index in range(count):
            append_note(session, index)

    return build_records(build)


def closed_turn_records() -> list[dict[str, Any]]:
    """One complete turn as six valid raw records."""
    return build_records(lambda session: append_closed_turn(session, 1))


def encoded(events: Any) -> list[bytes]:
    """The compact JSON bytes of each event (byte-exact comparisons)."""
    return [dumps(event) for event in events]


class ConformanceHarness:
    """Coordinators over one target, a store, a manual timer, and cleanup of everything opened.

    Attributes:
        target: The backend under test.
        timer: The manual timer every coordinator uses.
        store: The current session store.
        backend: The counting wrapper of the most recently opened coordinator's backend.
        coordinator: The most recently opened coordinator.
    """

    def __init__(self, target: ConformanceTarget) -> None:
        self.target = target
        self.timer = ManualTimer()
        self.store = self.new_store()
        self._opened: list[tuple[SessionStore, PersistenceCoordinator, FaultyBackend]] = []
        self._raw: list[StorageBackend] = []
        self.backend: FaultyBackend
        self.coordinator: PersistenceCoordinator

    @property
    def writer(self) -> StoredLogWriter:
        """The target's fixture writer."""
        return self.target.writer

    @staticmethod
    def new_store(clock: Callable[[], int] | None = None) -> SessionStore:
        """A session store with a deterministic clock and ids."""
        counter = itertools.count(1)
        return SessionStore(clock=clock or StepClock(), id_factory=lambda: f"auto{next(counter):04d}")

    async def open(self, *, store: SessionStore | None = None, **options: Any) -> PersistenceCoordinator:
        """Open a coordinator over a new backend instance (wrapped in a `FaultyBackend`)."""
        if store is not None:
            self.store = store
        backend = FaultyBackend(
            self.target.make_backend(), clock=lambda: self.timer.now_ms, io_faults=self.target.io_faults
        )
        coordinator = PersistenceCoordinator(backend, self.store, timer=self.timer, **options)
        await coordinator.open()
        self._opened.append((self.store, coordinator, backend))
        self.backend = backend
        self.coordinator = coordinator
        return coordinator

    async def reopen(self, **options: Any) -> PersistenceCoordinator:
        """Close the store and coordinator, then open fresh ones over the same storage."""
        await self.store.aclose()
        await self.coordinator.close()
        return await self.open(store=self.new_store(), **options)

    async def raw(self) -> StorageBackend:
        """A separate, opened backend instance over the same storage (closed at teardown)."""
        backend = self.target.make_backend()
        await backend.open()
        self._raw.append(backend)
        return backend

    async def cold(self, session: Session) -> None:
        """Dispose a live session and wait until its events are durable."""
        self.store.dispose(session)
        await self.coordinator.drain(session.id)

    async def aclose(self) -> None:
        """Clear faults and gates, close stores and coordinators (teardown; failures are expected)."""
        for store, coordinator, backend in reversed(self._opened):
            backend.clear()
            for method in list(backend.calls):
                backend.release_calls(method)
            with contextlib.suppress(Exception):
                await store.aclose()
            with contextlib.suppress(Exception):
                await coordinator.close()
        for raw in self._raw:
            with contextlib.suppress(Exception):
                await raw.close()
