"""Helpers of the PostgreSQL tests: hosts (a store, a coordinator and a backend), SQL for assertions.

A `Host` stands for one machine pointing at the shared database: its own `SessionStore`, its own
`PostgresBackend` (so its own pool and lease holder name) and a `PersistenceCoordinator` driven by a
manual timer. `sql` runs one statement on a fresh connection, outside every backend, so assertions
see exactly what is committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from dsh.persistence.coordinator import PersistenceCoordinator
from dsh.persistence.postgres import PostgresBackend, quoted
from dsh.session.store import SessionStore
from dsh.testing.faulty import HANG_GUARD_S
from dsh.testing.stored_logs import StepClock
from dsh.testing.timer import ManualTimer


async def sql(url: str, statement: str, parameters: Sequence[Any] = (), *, schema: str | None = None) -> list[Any]:
    """Run one statement on its own autocommit connection; `{s}` stands for the quoted schema."""
    if schema is not None:
        statement = statement.replace("{s}", quoted(schema))
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cursor = await conn.execute(statement, tuple(parameters))
        return [tuple(row) for row in await cursor.fetchall()] if cursor.description else []


@dataclass
class Host:
    """One host on the shared database."""

    backend: PostgresBackend
    store: SessionStore
    coordinator: PersistenceCoordinator
    timer: ManualTimer

    async def close(self) -> None:
        """Close the store, then the coordinator (failures are expected in some tests and ignored)."""
        with contextlib.suppress(Exception):
            await self.store.aclose()
        with contextlib.suppress(BaseException):
            await self.coordinator.close()


async def open_host(url: str, schema: str, prefix: str, **backend: Any) -> Host:
    """A host with its own store, backend and coordinator over `schema` (opened)."""
    counter = itertools.count(1)
    store = SessionStore(clock=StepClock(), id_factory=lambda: f"{prefix}{next(counter):04d}")
    timer = ManualTimer()
    pg = PostgresBackend(url, schema=schema, **backend)
    coordinator = PersistenceCoordinator(pg, store, timer=timer)
    await coordinator.open()
    return Host(pg, store, coordinator, timer)


async def until(predicate: Callable[[], Any]) -> None:
    """Poll an async or sync predicate until it holds; the guard only catches hangs."""

    async def wait() -> None:
        while True:
            value = predicate()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return
            await asyncio.sleep(0.01)

    await asyncio.wait_for(wait(), HANG_GUARD_S)


async def lease_row(url: str, schema: str, session_id: str) -> tuple[str, int] | None:
    """`(holder, generation)` of the session's lease row, or None."""
    rows = await sql(
        url, "SELECT holder, generation FROM {s}.session_leases WHERE session_id = %s", [session_id], schema=schema
    )
    return None if not rows else (str(rows[0][0]), int(rows[0][1]))


async def expire_lease(url: str, schema: str, session_id: str) -> None:
    """Make the session's lease look expired (as if its holder stopped renewing a while ago)."""
    await sql(
        url,
        "UPDATE {s}.session_leases SET expires_at = now() - interval '1 second' WHERE session_id = %s",
        [session_id],
        schema=schema,
    )


async def stored_seqs(url: str, schema: str, session_id: str) -> list[int]:
    """The seqs of the stored event rows, in order (duplicates would show)."""
    rows = await sql(url, "SELECT seq FROM {s}.events WHERE session_id = %s ORDER BY seq", [session_id], schema=schema)
    return [int(row[0]) for row in rows]


async def terminate(url: str, holder: str, *, state: str | None = None) -> int:
    """`pg_terminate_backend` every connection of the backend whose holder is `holder`; return how many."""
    condition = "" if state is None else " AND state = %s"
    params: list[Any] = [f"dsh {holder}"[:63]]
    if state is not None:
        params.append(state)
    rows = await sql(
        url,
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        f"WHERE application_name = %s AND pid <> pg_backend_pid(){condition}",
        params,
    )
    return int(rows[0][0])
