"""`CountingPersistence`: a transparent `SessionPersistence` wrapper that counts log reads per session.

A "log read" is one `inspect`, one `read_events` or one `prepare` (each reads a session's events).
Listings are judged by these counts: live children cost zero reads, unseeded cold children zero on a
cache hit and one otherwise. The wrapper changes no behaviour; the demo and the tests use it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from typing import TYPE_CHECKING

from dsh.persistence.base import (
    EventSlice,
    PersistenceObservation,
    PreparedSession,
    Revision,
    SessionListing,
    SessionPersistence,
)

if TYPE_CHECKING:
    from dsh.abort import AbortSignal
    from dsh.session.header import SessionHeader

__all__ = ["CountingPersistence"]


class CountingPersistence:
    """Counts `list` calls and log reads per session id; delegates everything to `inner`."""

    def __init__(self, inner: SessionPersistence) -> None:
        self.inner = inner
        self.reads: Counter[str] = Counter()
        self.lists = 0

    def reset(self) -> None:
        """Forget every count."""
        self.reads.clear()
        self.lists = 0

    @property
    def total_reads(self) -> int:
        """Log reads across every session."""
        return sum(self.reads.values())

    async def list(
        self,
        *,
        parent_session: str | None = None,
        parents: Collection[str | None] | None = None,
        signal: AbortSignal | None = None,
    ) -> SessionListing:
        """Delegate; counts one listing (whatever its filter)."""
        self.lists += 1
        return await self.inner.list(parent_session=parent_session, parents=parents, signal=signal)

    async def inspect(self, session_id: str, *, signal: AbortSignal | None = None) -> PersistenceObservation:
        """Delegate; counts one log read unless the live view served it (failed reads count too)."""
        try:
            observation = await self.inner.inspect(session_id, signal=signal)
        except Exception:
            self.reads[session_id] += 1
            raise
        if not observation.live:
            self.reads[session_id] += 1
        return observation

    async def read_events(
        self,
        session_id: str,
        *,
        types: Collection[str] | None = None,
        from_seq: int = 0,
        signal: AbortSignal | None = None,
    ) -> EventSlice:
        """Delegate; counts one log read."""
        self.reads[session_id] += 1
        return await self.inner.read_events(session_id, types=types, from_seq=from_seq, signal=signal)

    async def prepare(self, session_id: str, *, signal: AbortSignal | None = None) -> PreparedSession:
        """Delegate; counts one log read."""
        self.reads[session_id] += 1
        return await self.inner.prepare(session_id, signal=signal)

    async def revision(self, session_id: str, *, signal: AbortSignal | None = None) -> Revision | None:
        """Delegate (a revision probe is not a log read)."""
        return await self.inner.revision(session_id, signal=signal)

    async def drain(self, session_id: str) -> None:
        """Delegate."""
        await self.inner.drain(session_id)

    def locate(self, header: SessionHeader) -> str | None:
        """Delegate."""
        return self.inner.locate(header)

    async def close(self) -> None:
        """Delegate."""
        await self.inner.close()


# Shown under the name users import (docs/architecture.md#public-names).
CountingPersistence.__module__ = "dsh.testing"
