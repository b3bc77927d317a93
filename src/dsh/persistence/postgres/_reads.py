"""The PostgreSQL store's read statements: listings, lookups, full and typed loads.

Layer: persistence (private to `dsh.persistence.postgres`). Each function runs on one pooled
connection handed in by the backend (which owns retries and error translation). Reads that take
several statements run in one `REPEATABLE READ, READ ONLY` transaction, so the session row and its
event rows come from one snapshot even while another host appends: a plain `READ COMMITTED` pair of
statements could see an append's rows without its `next_seq` and report corruption that is not
there. Rows are decoded with the SQLite store's codecs, since both stores hold the same columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from dsh.json import FrozenDict
from dsh.persistence.base import ParentFilter, StoredLog
from dsh.persistence.postgres._driver import quoted
from dsh.persistence.sqlite._schema import corrupt, decode_event_rows, header_record

if TYPE_CHECKING:
    from psycopg import AsyncConnection

__all__ = ["Reads", "SessionRow", "bindable", "row_revision", "stored_log"]

# Statement templates; `{s}` is the quoted schema name. Header columns come in the SQLite codecs'
# order (version through agent_preset), event columns as `decode_event_rows` reads them.
_LIST: Final = (
    "SELECT id, version, created_at, cwd, parent_session, seed_length, origin, delegation_depth, agent_preset, "
    "incarnation, revision FROM {s}.sessions"
)
_EXISTS: Final = "SELECT 1 FROM {s}.sessions WHERE id = %s"
_REVISION_ROW: Final = "SELECT incarnation, revision FROM {s}.sessions WHERE id = %s"
_SESSION: Final = (
    "SELECT version, created_at, cwd, parent_session, seed_length, origin, delegation_depth, agent_preset, "
    "incarnation, revision, next_seq FROM {s}.sessions WHERE id = %s"
)
_EVENTS: Final = (
    "SELECT seq, type, time, data, ignorable, source_event_seqs, surface_op FROM {s}.events "
    "WHERE session_id = %s AND seq >= %s ORDER BY seq"
)
# One type per statement: `type = %s` with `ORDER BY seq` is exactly the order of `events_by_type`,
# so every plan reads only the matching index entries (with `type = ANY(...)` the planner may
# prefer the primary key and filter every row of the session).
_TYPED: Final = (
    "SELECT seq, type, time, data, ignorable, source_event_seqs, surface_op FROM {s}.events "
    "WHERE session_id = %s AND type = %s AND seq >= %s ORDER BY seq"
)
_LAST: Final = "SELECT seq FROM {s}.events WHERE session_id = %s ORDER BY seq DESC LIMIT 1"
# The distinct types of one session by an index skip-scan over `events_by_type`: one probe per
# distinct type instead of a walk over every row.
_TYPES: Final = (
    "WITH RECURSIVE t(type) AS ("
    "(SELECT type FROM {s}.events WHERE session_id = %(id)s ORDER BY type LIMIT 1) "
    "UNION ALL SELECT (SELECT e.type FROM {s}.events e WHERE e.session_id = %(id)s AND e.type > t.type "
    "ORDER BY e.type LIMIT 1) FROM t WHERE t.type IS NOT NULL) "
    "SELECT type FROM t WHERE type IS NOT NULL"
)
_FIRST_OF: Final = (
    "SELECT type, seq FROM {s}.events WHERE session_id = %s AND type = ANY(%s) AND ignorable IS NULL "
    "ORDER BY seq LIMIT 1"
)

# Row layout of a session row: the eight header columns, then these three.
_INCARNATION, _REVISION, _NEXT_SEQ = 8, 9, 10

SessionRow = tuple[Any, ...]
"""A `sessions` row: the eight header columns, incarnation, revision, next seq."""


def bindable(value: str) -> bool:
    """Whether PostgreSQL can hold `value` as text: UTF-8 encodable (no lone surrogate) and no NUL.

    Nothing can be stored under an id that fails this, so lookups answer "not stored" instead of
    raising a driver error.
    """
    if "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


async def _snapshot(conn: AsyncConnection[Any]) -> None:
    """Make the enclosing transaction one read-only snapshot (must be its first statement)."""
    await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")


class Reads:
    """The read statements of one schema."""

    def __init__(self, schema: str) -> None:
        q = quoted(schema)
        self._list = _LIST.replace("{s}", q)
        self._children = _LIST.replace("{s}", q) + " WHERE parent_session = ANY(%s) OR (%s AND parent_session IS NULL)"
        self._exists = _EXISTS.replace("{s}", q)
        self._revision = _REVISION_ROW.replace("{s}", q)
        self._session = _SESSION.replace("{s}", q)
        self._events = _EVENTS.replace("{s}", q)
        self._typed = _TYPED.replace("{s}", q)
        self._last = _LAST.replace("{s}", q)
        self._types = _TYPES.replace("{s}", q)
        self._first_of = _FIRST_OF.replace("{s}", q)

    async def list_headers(
        self, conn: AsyncConnection[Any], parents: ParentFilter | None
    ) -> list[tuple[FrozenDict, tuple[str, int]]]:
        """Header records with `(incarnation, revision)`, sorted by `(created_at, id)` in code point order.

        A parent filter is one statement on the `sessions_by_parent` index (`parent_session =
        ANY(...)`); a None in `parents` adds the parentless rows.
        """
        if parents is None:
            rows = await (await conn.execute(self._list)).fetchall()
        else:
            ids = sorted(p for p in parents if p is not None and bindable(p))
            orphans = None in parents
            if not ids and not orphans:
                return []
            rows = await (await conn.execute(self._children, (ids, orphans))).fetchall()
        # Python's string order is code point order whatever the database's collation is.
        rows.sort(key=lambda row: (row[2], row[0]))
        return [(header_record(row[0], row[1:9]), (str(row[9]), int(row[10]))) for row in rows]

    async def exists(self, conn: AsyncConnection[Any], session_id: str) -> bool:
        """Whether a `sessions` row exists for the id."""
        return await (await conn.execute(self._exists, (session_id,))).fetchone() is not None

    async def revision(self, conn: AsyncConnection[Any], session_id: str) -> tuple[str, int] | None:
        """`(incarnation, revision)` of the id's row, or None."""
        row = await (await conn.execute(self._revision, (session_id,))).fetchone()
        return None if row is None else (str(row[0]), int(row[1]))

    async def load(
        self, conn: AsyncConnection[Any], session_id: str
    ) -> tuple[SessionRow, list[dict[str, Any]], int | None] | None:
        """The session row and every event record (one snapshot), or None when nothing is stored.

        A session row of a foreign version is returned without its events, so the caller reports the
        version refusal rather than a decoding error.

        Raises:
            SessionCorruptionError: A row that does not decode, a seq gap, or a row count that
                disagrees with the stored next seq.
        """
        async with conn.transaction():
            await _snapshot(conn)
            row = await (await conn.execute(self._session, (session_id,))).fetchone()
            if row is None:
                return None
            if row[0] != 0:
                return row, [], None
            rows = await (await conn.execute(self._events, (session_id, 0))).fetchall()
        events, oversized = decode_event_rows(session_id, rows, first_seq=0)
        if len(events) != row[_NEXT_SEQ]:
            raise corrupt(session_id, f"the session row expects {row[_NEXT_SEQ]} events but {len(events)} are stored")
        return row, events, oversized

    async def load_typed(
        self,
        conn: AsyncConnection[Any],
        session_id: str,
        types: frozenset[str] | None,
        from_seq: int,
        known: frozenset[str],
    ) -> tuple[SessionRow, list[dict[str, Any]], int | None, tuple[str, int] | None, int] | None:
        """Only the rows with `seq >= from_seq` and a type in `types`, plus the whole log's format facts.

        Returns `(session row, records, oversized index, first unknown (type, seq), stored next seq)`.

        Raises:
            SessionCorruptionError: A matching row does not decode, or the last stored seq
                disagrees with the stored next seq.
        """
        type_list = None if types is None else sorted(types)
        async with conn.transaction():
            await _snapshot(conn)
            row = await (await conn.execute(self._session, (session_id,))).fetchone()
            if row is None:
                return None
            if row[0] != 0:
                return row, [], None, None, int(row[_NEXT_SEQ])
            if type_list is None:
                rows = await (await conn.execute(self._events, (session_id, from_seq))).fetchall()
            else:
                rows = []
                for kind in type_list:
                    rows.extend(await (await conn.execute(self._typed, (session_id, kind, from_seq))).fetchall())
                rows.sort(key=lambda found: found[0])
            first_unknown = await self._first_unknown(conn, session_id, known)
            last = await (await conn.execute(self._last, (session_id,))).fetchone()
        stored_next = 0 if last is None else int(last[0]) + 1
        if stored_next != row[_NEXT_SEQ]:
            raise corrupt(
                session_id,
                f"the session row expects {row[_NEXT_SEQ]} events but the last stored seq is "
                f"{None if last is None else last[0]}",
            )
        first = max(from_seq, 0) if type_list is None else None
        events, oversized = decode_event_rows(session_id, rows, first_seq=first)
        return row, events, oversized, first_unknown, stored_next

    async def _first_unknown(
        self, conn: AsyncConnection[Any], session_id: str, known: frozenset[str]
    ) -> tuple[str, int] | None:
        kinds = await (await conn.execute(self._types, {"id": session_id})).fetchall()
        unknown = [str(kind[0]) for kind in kinds if kind[0] not in known]
        if not unknown:
            return None
        hit = await (await conn.execute(self._first_of, (session_id, unknown))).fetchone()
        return None if hit is None else (str(hit[0]), int(hit[1]))


def stored_log(
    session_id: str,
    row: SessionRow,
    events: Sequence[dict[str, Any]],
    oversized: int | None,
    revision: Any,
    *,
    first_unknown: tuple[str, int] | None = None,
    next_seq: int | None = None,
) -> StoredLog:
    """The backend's `StoredLog` for a session row and its decoded records."""
    return StoredLog(
        header=header_record(session_id, row),
        events=list(events),
        revision=revision,
        oversized_int_at=oversized,
        first_unknown=first_unknown,
        next_seq=next_seq,
    )


def row_revision(row: SessionRow) -> tuple[str, int]:
    """`(incarnation, revision)` of a session row."""
    return str(row[_INCARNATION]), int(row[_REVISION])
