"""The PostgreSQL store's append transaction: fence, seq check, rows, lease extension, and retry recognition.

Layer: persistence (private to `dsh.persistence.postgres`). One append is one transaction on one
pooled connection (docs/storage-format.md#postgresql-appends):

1. lock the lease row and compare it with the writer's fence (`SESSION_LEASE_LOST` otherwise);
2. lock the session row (`FOR UPDATE`) and check the batch starts at the stored next seq;
3. insert the session row (first batch) or bump its revision and next seq, then the event rows;
4. extend the lease; commit.

A connection can drop after the server committed but before the client heard `COMMIT` succeed.
The backend then retries the same batch on another connection, under the same fence, with
`retry=True`, and this transaction first asks whether the batch is already stored: for a first
batch, a session row carrying the incarnation this very call generated; for a later batch, stored
rows over the batch's seqs equal to the batch's rows. A batch found stored is acknowledged with the
current revision, so a retry neither duplicates events nor fails on the `(session_id, seq)` key.

Tests reach the transaction's steps by replacing, on one backend's instances, `Leases.check_fence`
(step 1: hold the transaction while it has the lease row), `Writes.insert_events` (step 3: fail
after part or all of the rows) or `Writes.append` (the whole transaction: lose the acknowledgement
after `COMMIT`); see `dsh.testing.io_faults` and `dsh.testing.postgres`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from dsh.persistence.base import Fence
from dsh.persistence.errors import AppendConflictError, SessionAlreadyExistsError
from dsh.persistence.postgres._driver import quoted
from dsh.persistence.postgres._leases import Leases
from dsh.persistence.postgres._notify import commit_payload
from dsh.persistence.sqlite._schema import header_columns

if TYPE_CHECKING:
    from psycopg import AsyncConnection

__all__ = ["INSERT_EVENT", "INSERT_SESSION", "Batch", "Writes", "check_contiguous"]

INSERT_EVENT: Final = (
    "INSERT INTO {s}.events (session_id, seq, type, time, data, source_event_seqs, surface_op, ignorable) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
)
"""The event row insert; `{s}` is the quoted schema name."""

INSERT_SESSION: Final = (
    "INSERT INTO {s}.sessions (id, version, created_at, cwd, parent_session, seed_length, origin, "
    "delegation_depth, agent_preset, incarnation, revision, next_seq) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
"""The session row insert; `{s}` is the quoted schema name."""

_LOCK_SESSION: Final = "SELECT next_seq, incarnation, revision FROM {s}.sessions WHERE id = %s FOR UPDATE"
_BUMP: Final = "UPDATE {s}.sessions SET revision = %s, next_seq = %s WHERE id = %s"
_RANGE: Final = (
    "SELECT seq, type, time, data, source_event_seqs, surface_op, ignorable FROM {s}.events "
    "WHERE session_id = %s AND seq >= %s AND seq < %s ORDER BY seq"
)


@dataclass(frozen=True, slots=True)
class Batch:
    """One append: the encoded rows plus everything the transaction needs to know about it.

    Attributes:
        session_id: The session.
        header: The stored header record (used when the batch materializes the session).
        rows: The `events` rows (`event_row` of each event), in seq order.
        materialized: Whether the session is stored already.
        fence: The writer's lease.
        incarnation: The incarnation a first batch stores; generated once per call, so a retry
            can recognise its own row.
    """

    session_id: str
    header: Mapping[str, Any]
    rows: Sequence[tuple[Any, ...]]
    materialized: bool
    fence: Fence
    incarnation: str


def check_contiguous(session_id: str, rows: Sequence[tuple[Any, ...]]) -> None:
    """Refuse a batch whose seqs are not consecutive (before any database work).

    Raises:
        AppendConflictError: `APPEND_SEQ_MISMATCH`.
    """
    for offset, row in enumerate(rows):
        expected = rows[0][1] + offset
        if row[1] != expected:
            raise AppendConflictError(
                f'batch for session "{session_id}" is not contiguous: expected seq {expected}, got {row[1]}',
                session_id=session_id,
            )


class Writes:
    """The write statements of one schema, run inside the caller's connection."""

    def __init__(self, schema: str, leases: Leases, channel: str | None = None) -> None:
        s = quoted(schema)
        self._leases = leases
        self._channel = channel
        self._insert_event = INSERT_EVENT.replace("{s}", s)
        self._insert_session = INSERT_SESSION.replace("{s}", s)
        self._lock_session = _LOCK_SESSION.replace("{s}", s)
        self._bump = _BUMP.replace("{s}", s)
        self._range = _RANGE.replace("{s}", s)

    async def append(
        self,
        conn: AsyncConnection[Any],
        batch: Batch,
        *,
        retry: bool,
    ) -> tuple[str, int]:
        """Run the append transaction; return the `(incarnation, revision)` now stored.

        Raises:
            LeaseLostError: The fence no longer matches the lease row; nothing was written.
            AppendConflictError: The batch does not start at the stored next seq.
            SessionAlreadyExistsError: A first batch for an id that is already stored.
        """
        session_id, rows = batch.session_id, batch.rows
        first_seq: int | None = rows[0][1] if rows else None
        async with conn.transaction():
            # The lease row is locked from here to COMMIT: a takeover waits for this append.
            await self._leases.check_fence(conn, batch.fence)
            current = await (await conn.execute(self._lock_session, (session_id,))).fetchone()
            if retry:
                stored = await self._already_stored(conn, batch, current)
                if stored is not None:
                    return stored
            if not batch.materialized:
                if current is not None:
                    raise SessionAlreadyExistsError(
                        f'refusing to materialize "{session_id}": the session is already stored '
                        "(load/resume it instead)",
                        session_id=session_id,
                    )
                stored_next = 0
            elif current is None:
                raise AppendConflictError(
                    f'cannot append to session "{session_id}": nothing is stored for it '
                    f"(the batch starts at seq {first_seq})",
                    session_id=session_id,
                )
            else:
                stored_next = int(current[0])
            if first_seq is not None and first_seq != stored_next:
                raise AppendConflictError(
                    f'append to session "{session_id}" starts at seq {first_seq} but the stored next seq is '
                    f"{stored_next} (stale writer)",
                    session_id=session_id,
                )
            if current is None:
                incarnation, revision = batch.incarnation, 1
                await conn.execute(
                    self._insert_session,
                    (session_id, *header_columns(batch.header), incarnation, 1, len(rows)),
                )
            elif rows:
                incarnation, revision = str(current[1]), int(current[2]) + 1
                await conn.execute(self._bump, (revision, stored_next + len(rows), session_id))
            else:
                incarnation, revision = str(current[1]), int(current[2])
            await self.insert_events(conn, rows)
            await self._leases.extend(conn, batch.fence)
            if rows and self._channel is not None:
                # Delivered at COMMIT, never for a rolled-back batch: "this session is stored up to
                # this seq" (docs/server.md#replicas); never an event body.
                payload = commit_payload(session_id, rows[-1][1])
                await conn.execute("SELECT pg_notify(%s, %s)", (self._channel, payload))
        return incarnation, revision

    async def insert_events(self, conn: AsyncConnection[Any], rows: Sequence[tuple[Any, ...]]) -> None:
        """Insert a batch's event rows inside the caller's transaction (one step a test can fail)."""
        if rows:
            async with conn.cursor() as cursor:
                await cursor.executemany(self._insert_event, rows)

    async def _already_stored(
        self, conn: AsyncConnection[Any], batch: Batch, current: tuple[Any, ...] | None
    ) -> tuple[str, int] | None:
        """On a retry: the stored `(incarnation, revision)` if an earlier attempt committed this batch."""
        if current is None:
            return None
        stored = (str(current[1]), int(current[2]))
        if not batch.materialized:
            # Only this call knew this incarnation: the row is the earlier attempt's.
            return stored if stored[0] == batch.incarnation else None
        rows = batch.rows
        if not rows:
            return None
        first = rows[0][1]
        end = first + len(rows)
        if int(current[0]) < end:
            return None
        found = await (await conn.execute(self._range, (batch.session_id, first, end))).fetchall()
        expected = [(row[1], row[2], row[3], row[4], row[5], row[6], row[7]) for row in rows]
        if [tuple(row) for row in found] == expected:
            return stored
        return None
