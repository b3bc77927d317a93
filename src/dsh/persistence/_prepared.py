"""The prepared-observation LRU and the `PreparedSession` handle (docs/glossary.md#prepared-session).

Layer: persistence (private to the coordinator). Cold reads leave their validated, lazily frozen log
in a small LRU so that the common `inspect` → `prepare` sequence costs one backend load plus one
revision read. Only *ready* entries live in the LRU and count toward its capacity; a preparation in
progress or a reserved (prepared, unpublished) session is a `Reservation`, kept apart, which vetoes
a fresh publication of the same id. Retained memory is therefore bounded by `capacity` cold logs per
coordinator.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Literal

from dsh.persistence._validation import ValidatedLog
from dsh.persistence.base import Fence, PersistenceObservation

if TYPE_CHECKING:
    from dsh.session.session import Session

__all__ = ["CoordinatorPreparedSession", "PreparedLRU", "Reservation", "observation_of"]


def observation_of(validated: ValidatedLog) -> PersistenceObservation:
    """The cold observation of a validated log: stored events plus in-memory closers."""
    return PersistenceObservation(
        header=validated.header,
        events=validated.events,
        inherited_event_count=validated.inherited_event_count,
        revision=validated.revision,
        live=False,
        synthetic_tail=validated.synthetic_tail,
        torn_tail=validated.torn is not None,
    )


class PreparedLRU:
    """Ready validated logs by id, least recently used first; bounded by `capacity`."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[str, ValidatedLog] = OrderedDict()

    def get(self, session_id: str) -> ValidatedLog | None:
        """The entry for the id (marked most recently used), or None."""
        entry = self._entries.get(session_id)
        if entry is not None:
            self._entries.move_to_end(session_id)
        return entry

    def put(self, session_id: str, entry: ValidatedLog) -> None:
        """Insert or replace the id's entry, evicting least recently used entries over capacity."""
        self._entries[session_id] = entry
        self._entries.move_to_end(session_id)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def pop(self, session_id: str) -> ValidatedLog | None:
        """Remove and return the id's entry (an append or a repair invalidates it)."""
        return self._entries.pop(session_id, None)

    def clear(self) -> None:
        """Drop every entry."""
        self._entries.clear()

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[str]:
        """Ids from least to most recently used."""
        return list(self._entries)


# Mutable state, not a record: a plain slotted class (docs/architecture.md#import-cost).
class Reservation:
    """A preparation of one id: `committing` while `prepare` runs, then `reserved` until released.

    Attributes:
        session_id: The prepared id.
        phase: `committing` (lock, load, repair in progress) or `reserved` (session built).
        session: The unpublished session, once built.
        validated: The (repaired) validated log the session was built from.
        cursor: The stored length the session starts from (its `first_live_seq`).
        fence: The writer fence, when the backend hands one out.
        lock_held: Whether `acquire` succeeded (the lock must then be released or handed over).
        acquiring: The `acquire` call while it runs (a cancelled prepare waits for it to learn
            whether the lock must be released).
        attached: Set when publication attached the session to a live writer.
        released: Set once the reservation ends (published, closed or failed).
    """

    __slots__ = (
        "acquiring",
        "attached",
        "cursor",
        "fence",
        "lock_held",
        "phase",
        "released",
        "session",
        "session_id",
        "validated",
    )

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.phase: Literal["committing", "reserved"] = "committing"
        self.session: Session | None = None
        self.validated: ValidatedLog | None = None
        self.cursor = 0
        self.fence: Fence | None = None
        self.lock_held = False
        self.acquiring: asyncio.Future[None] | None = None
        self.attached = False
        self.released = asyncio.Event()


class CoordinatorPreparedSession:
    """The coordinator's `PreparedSession`: an unpublished session holding the writer lock.

    An async context manager. `publish()` publishes the session in its store, where the
    coordinator attaches it to a live writer; `close()` is idempotent and, if the session was never
    published, retires it, returns the observation to the LRU and releases the writer.
    """

    def __init__(
        self,
        reservation: Reservation,
        observation: PersistenceObservation,
        *,
        publish: Callable[[Session], Session],
        release: Callable[[Reservation], Awaitable[None]],
    ) -> None:
        assert reservation.session is not None
        self._reservation = reservation
        self._session: Session = reservation.session
        self._observation = observation
        self._publish = publish
        self._release = release
        self._closed = False

    @property
    def session(self) -> Session:
        """The unpublished session built from the repaired log."""
        return self._session

    @property
    def observation(self) -> PersistenceObservation:
        """The (repaired) observation the session was built from, with its exact cut."""
        return self._observation

    def publish(self) -> Session:
        """Publish the session in its store (persistence attaches it to a live writer)."""
        return self._publish(self._session)

    async def close(self) -> None:
        """Release the reservation unless the session was published (idempotent)."""
        if self._closed:
            return
        self._closed = True
        await self._release(self._reservation)

    async def __aenter__(self) -> CoordinatorPreparedSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"PreparedSession(id={self._session.id!r}, attached={self._reservation.attached})"
