"""One writer per session across hosts: the lease table, fencing, renewal and release.

Layer: persistence (private to `dsh.persistence.postgres`). A lease row names the session's writer
(`holder`, one per backend instance: `<random>@<host>:<pid>`), a fencing `generation` and an expiry
on the database clock (docs/storage-format.md#postgresql-leases-and-fencing):

* **acquire** inserts the row with generation 1, or takes it over (generation + 1) when it expired
  or is already ours, or at once when its holder is a process of this machine that no longer runs
  (`_holder.gone_pid`: same boot id and pid namespace, pid gone or reused; logged as a WARNING);
  a lease of a live holder, or of another host, is `SESSION_LEASE_HELD` until it expires, naming
  the holder and the expiry;
* **fence check**: every append and repair transaction first locks the lease row
  (`SELECT ... FOR UPDATE`) and compares holder and generation with its `Fence`; a mismatch is
  `SESSION_LEASE_LOST` and the transaction writes nothing. A takeover updates the same row, so a
  takeover and a late write of the old holder serialize on that row lock: once the new generation
  commits, the old holder cannot append a single event;
* **renewal**: one statement per heartbeat extends every lease this instance holds; an id missing
  from its result was taken over (or broken) and is marked lost, so later appends fail at once;
* **release** deletes the row only if it is still this holder's generation.

Expiry compares against `now()`, the database's clock, so clock skew between hosts does not matter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

from dsh.persistence.base import Fence
from dsh.persistence.errors import LeaseHeldError, LeaseLostError
from dsh.persistence.postgres._driver import quoted
from dsh.persistence.postgres._holder import gone_pid, new_holder, same_machine

if TYPE_CHECKING:
    from psycopg import AsyncConnection

__all__ = ["Heartbeat", "LeaseRow", "Leases", "new_holder"]

_log = logging.getLogger("dsh.persistence")

_ACQUIRE_TRIES: Final = 3

# Statement templates; `{s}` is the quoted schema name.
_ACQUIRE: Final = (
    "INSERT INTO {s}.session_leases AS l (session_id, holder, generation, expires_at) "
    "VALUES (%(id)s, %(me)s, 1, now() + make_interval(secs => %(ttl)s)) "
    "ON CONFLICT (session_id) DO UPDATE SET holder = %(me)s, generation = l.generation + 1, "
    "expires_at = now() + make_interval(secs => %(ttl)s) "
    "WHERE l.expires_at <= now() OR l.holder = %(me)s RETURNING generation"
)
_CURRENT: Final = (
    "SELECT holder, expires_at, expires_at <= now(), generation FROM {s}.session_leases WHERE session_id = %s"
)
_TAKE_OVER: Final = (
    "UPDATE {s}.session_leases SET holder = %(me)s, generation = generation + 1, "
    "expires_at = now() + make_interval(secs => %(ttl)s) "
    "WHERE session_id = %(id)s AND holder = %(dead)s AND generation = %(generation)s RETURNING generation"
)
_LOCK: Final = "SELECT holder, generation FROM {s}.session_leases WHERE session_id = %s FOR UPDATE"
_EXTEND: Final = "UPDATE {s}.session_leases SET expires_at = now() + make_interval(secs => %s) WHERE session_id = %s"
_RELEASE: Final = "DELETE FROM {s}.session_leases WHERE session_id = %s AND holder = %s AND generation = %s"
_RELEASE_ALL: Final = "DELETE FROM {s}.session_leases WHERE holder = %s"
_RENEW: Final = (
    "UPDATE {s}.session_leases SET expires_at = now() + make_interval(secs => %s) "
    "WHERE holder = %s AND (session_id, generation) IN (SELECT * FROM unnest(%s::text[], %s::bigint[])) "
    "RETURNING session_id"
)
_LIST: Final = (
    "SELECT session_id, holder, generation, expires_at, expires_at <= now() FROM {s}.session_leases "
    'ORDER BY session_id COLLATE "C"'
)


@dataclass(frozen=True, slots=True)
class LeaseRow:
    """One row of the lease table, as `dsh doctor` reports it."""

    session_id: str
    holder: str
    generation: int
    expires_at: datetime
    expired: bool


class Leases:
    """The lease statements of one store and the fences this backend instance holds.

    Args:
        schema: The checked schema name.
        holder: This instance's holder name.
        ttl_s: How long a lease lasts without renewal.
    """

    def __init__(self, schema: str, holder: str, ttl_s: float) -> None:
        self.holder = holder
        self.ttl_s = ttl_s
        self.held: dict[str, Fence] = {}
        self.lost: set[str] = set()
        q = quoted(schema)
        self._acquire = _ACQUIRE.replace("{s}", q)
        self._current = _CURRENT.replace("{s}", q)
        self._take_over = _TAKE_OVER.replace("{s}", q)
        self._lock = _LOCK.replace("{s}", q)
        self._extend = _EXTEND.replace("{s}", q)
        self._release = _RELEASE.replace("{s}", q)
        self._release_all = _RELEASE_ALL.replace("{s}", q)
        self._renew = _RENEW.replace("{s}", q)
        self._list = _LIST.replace("{s}", q)

    async def acquire(self, conn: AsyncConnection[Any], session_id: str) -> Fence:
        """Take the lease (a new row, a takeover of an expired one, or a renewal of our own).

        Raises:
            LeaseHeldError: Another holder's lease is still valid.
        """
        for _ in range(_ACQUIRE_TRIES):
            params = {"id": session_id, "me": self.holder, "ttl": self.ttl_s}
            row = await (await conn.execute(self._acquire, params)).fetchone()
            if row is not None:
                fence = Fence(session_id, self.holder, int(row[0]))
                self.held[session_id] = fence
                self.lost.discard(session_id)
                return fence
            current = await (await conn.execute(self._current, (session_id,))).fetchone()
            if current is None or current[2]:
                continue  # released or expired since the insert looked: try again
            holder, expires_at, generation = str(current[0]), current[1], int(current[3])
            gone = gone_pid(holder)
            if gone is not None:
                taken = await self._take_over_from(conn, session_id, holder, generation, gone)
                if taken is None:
                    continue  # the row changed since it was read: look again
                return taken
            where = "a live process of this host" if same_machine(holder) else "another host"
            raise LeaseHeldError(
                f'session "{session_id}" is being written by {where} ({holder}); its lease expires at '
                f"{expires_at.isoformat()} unless renewed; only one writer may append to a session",
                session_id=session_id,
                holder=holder,
                expires_at=expires_at,
            )
        raise LeaseHeldError(
            f'session "{session_id}" changed writers while this host tried to take it; try again',
            session_id=session_id,
        )

    async def _take_over_from(
        self, conn: AsyncConnection[Any], session_id: str, holder: str, generation: int, pid: int
    ) -> Fence | None:
        """Take the lease of a holder that is a process of this machine that no longer runs.

        The update only succeeds while the row still names that holder at that generation, so a
        takeover by anyone else in between wins and this one looks again.
        """
        params = {"id": session_id, "me": self.holder, "ttl": self.ttl_s, "dead": holder, "generation": generation}
        row = await (await conn.execute(self._take_over, params)).fetchone()
        if row is None:
            return None
        fence = Fence(session_id, self.holder, int(row[0]))
        self.held[session_id] = fence
        self.lost.discard(session_id)
        _log.warning(
            'postgresql: took over the lease of session "%s" at once (generation %d): its holder %s was process '
            "%d of this host, which no longer runs",
            session_id,
            fence.generation,
            holder,
            pid,
        )
        return fence

    def check_local(self, fence: Fence | None, session_id: str) -> Fence:
        """The fence to write under, refusing at once a write without one or a lease known lost.

        Raises:
            LeaseLostError: No fence, or the heartbeat found the lease taken over.
        """
        if fence is None:
            raise LeaseLostError(
                f'cannot write session "{session_id}": this host holds no lease for it', session_id=session_id
            )
        if session_id in self.lost and self.held.get(session_id) == fence:
            raise LeaseLostError(
                f'session "{session_id}" was taken over by another host (this host held lease generation '
                f"{fence.generation}); nothing more is written by this host",
                session_id=session_id,
            )
        return fence

    async def check_fence(self, conn: AsyncConnection[Any], fence: Fence) -> None:
        """Inside the write transaction: lock the lease row and compare it with `fence`.

        Raises:
            LeaseLostError: The row is gone or names another holder or generation; the caller's
                transaction rolls back, so nothing is written.
        """
        row = await (await conn.execute(self._lock, (fence.session_id,))).fetchone()
        if row is not None and str(row[0]) == fence.holder and int(row[1]) == fence.generation:
            return
        if self.held.get(fence.session_id) == fence:
            self.lost.add(fence.session_id)
        found = "its lease was released or broken" if row is None else f"lease generation {row[1]} is held by {row[0]}"
        raise LeaseLostError(
            f'session "{fence.session_id}" was taken over by another writer ({found}; this host held generation '
            f"{fence.generation}); nothing of this batch was written",
            session_id=fence.session_id,
        )

    async def extend(self, conn: AsyncConnection[Any], fence: Fence) -> None:
        """Inside the write transaction, after the fence check: an append renews the lease too."""
        await conn.execute(self._extend, (self.ttl_s, fence.session_id))

    async def release(self, conn: AsyncConnection[Any], session_id: str) -> None:
        """Delete the lease row if it is still ours, at the generation we took."""
        fence = self.held.pop(session_id, None)
        self.lost.discard(session_id)
        if fence is not None:
            await conn.execute(self._release, (session_id, self.holder, fence.generation))

    async def release_all(self, conn: AsyncConnection[Any]) -> None:
        """Delete every row this holder still has (at close)."""
        self.held.clear()
        self.lost.clear()
        await conn.execute(self._release_all, (self.holder,))

    async def renew(self, conn: AsyncConnection[Any]) -> list[str]:
        """Extend every held lease in one statement; return (and mark) the ids found lost."""
        fences = [fence for session_id, fence in self.held.items() if session_id not in self.lost]
        if not fences:
            return []
        ids = [fence.session_id for fence in fences]
        generations = [fence.generation for fence in fences]
        rows = await (await conn.execute(self._renew, (self.ttl_s, self.holder, ids, generations))).fetchall()
        renewed = {str(row[0]) for row in rows}
        lost = [fence.session_id for fence in fences if fence.session_id not in renewed]
        for session_id in lost:
            # Released concurrently by this instance? Then it is no longer held and not lost.
            if self.held.get(session_id) in fences:
                self.lost.add(session_id)
                _log.error(
                    'postgresql: the lease of session "%s" was lost (taken over by another host); its '
                    "writer fails with SESSION_LEASE_LOST from now on",
                    session_id,
                )
        return lost

    async def rows(self, conn: AsyncConnection[Any]) -> list[LeaseRow]:
        """Every lease row, by session id (for `dsh doctor`)."""
        found = await (await conn.execute(self._list)).fetchall()
        return [LeaseRow(str(r[0]), str(r[1]), int(r[2]), r[3], bool(r[4])) for r in found]


class Heartbeat:
    """Calls `beat` every `interval_s` seconds until stopped; a failed beat is logged and retried next period.

    A failed renewal changes nothing: the fence still protects every write, and a lease that
    expires meanwhile is only lost if another host actually takes it over.
    """

    def __init__(self, interval_s: float, beat: Callable[[], Awaitable[object]]) -> None:
        self.interval_s = interval_s
        self._beat = beat
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the periodic task on the running loop (idempotent)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="dsh-postgres-heartbeat")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self._beat()
            except Exception as error:
                _log.warning("postgresql: lease renewal failed (retried in %.1f s): %s", self.interval_s, error)

    async def stop(self) -> None:
        """Cancel the task and wait for it to end."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


# Shown under the name users import (docs/architecture.md#public-names).
LeaseRow.__module__ = "dsh.persistence.postgres"
