"""Cross-replica signalling on one PostgreSQL store: the notification channel, its listener, request rows.

Layer: persistence (private to `dsh.persistence.postgres`). Several `dsh serve` replicas share one
store (docs/server.md#replicas). They wake each other with `LISTEN/NOTIFY` on one channel per schema
and keep everything that must survive a replica in tables:

* **Commit notices.** Every append transaction runs `pg_notify(channel, {"k": "e", "s": <session>,
  "q": <last seq>})` (`Writes.append`); PostgreSQL delivers it at `COMMIT` and never for a rolled
  back batch. A notice is only a wake-up: a replica reads the events it has not seen from the store.
* **The listener** is one connection of its own (not pooled), in autocommit, that runs `LISTEN`. When
  it breaks (the server restarted, `pg_terminate_backend`, a network blip) it is opened again with a
  growing pause, and `on_gap` is called once it listens again, so the caller fills the gap from the
  store: notices sent while nobody listened are lost by PostgreSQL, stored events never are.
* **Request rows** (`session_requests`, schema version 2): a prompt, interrupt or approval decision
  sent to a replica that does not hold the session's lease. The row is inserted and a
  `{"k": "r", "s": <session or null>, "r": <id>}` notice sent in one transaction; the holder claims it
  (`pending` → `accepted`, `FOR UPDATE SKIP LOCKED`, so two replicas never both take one row), writes
  its answer and notices `{"k": "a", "r": <id>}`; `done` once nothing is left to do for it.

Channel names are derived from the schema name, so stores in different schemas of one database (each
test suite's throwaway schemas) never hear each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import orjson

from dsh.persistence.postgres._driver import Driver, first_line, quoted

if TYPE_CHECKING:
    from psycopg import AsyncConnection

__all__ = [
    "MAX_PAYLOAD_BYTES",
    "Listener",
    "RequestRow",
    "Requests",
    "channel_name",
    "commit_payload",
]

_log = logging.getLogger("dsh.persistence")

MAX_PAYLOAD_BYTES: Final = 7900
"""The largest notice payload sent (PostgreSQL's limit is 8000 bytes)."""

_RETRY_FIRST_S: Final = 0.1
_RETRY_MAX_S: Final = 5.0


def channel_name(schema: str) -> str:
    """The notification channel of a store: `dsh_<schema>`, hashed when that exceeds 63 characters."""
    name = f"dsh_{schema}"
    if len(name) <= 63:
        return name
    return f"dsh_{schema[:50]}_{zlib.crc32(schema.encode()):08x}"


def commit_payload(session_id: str, last_seq: int) -> str:
    """The notice of a committed append: the session and the last seq now stored."""
    return orjson.dumps({"k": "e", "s": session_id, "q": last_seq}).decode()


class Listener:
    """One `LISTEN` connection that comes back by itself after it broke.

    Args:
        driver: The loaded driver.
        connect: Opens a configured autocommit connection (the backend's settings).
        channel: The channel to listen on.
        on_message: Called with each payload (on the event loop; must not block or raise).
        on_gap: Called each time listening starts again after a break (not at the first start).
    """

    def __init__(
        self,
        driver: Driver,
        connect: Callable[[], Awaitable[AsyncConnection[Any]]],
        channel: str,
        on_message: Callable[[str], None],
        on_gap: Callable[[], None],
    ) -> None:
        self._driver = driver
        self._connect = connect
        self._channel = channel
        self._on_message = on_message
        self._on_gap = on_gap
        self._conn: AsyncConnection[Any] | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.breaks = 0
        """How many times the connection broke and was opened again."""

    @property
    def connected(self) -> bool:
        """True while the connection listens."""
        return self._conn is not None and not self._conn.closed

    @property
    def backend_pid(self) -> int | None:
        """The server process of the listening connection (what `pg_terminate_backend` takes), or None."""
        conn = self._conn
        return None if conn is None or conn.closed else int(conn.info.backend_pid)

    async def start(self) -> None:
        """Listen now (raises the driver's error when the first connection fails), then keep listening."""
        self._conn = await self._listen()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="dsh-pg-listener")

    async def _listen(self) -> AsyncConnection[Any]:
        conn = await self._connect()
        try:
            await conn.execute(f"LISTEN {quoted(self._channel)}")
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _run(self) -> None:
        pause = _RETRY_FIRST_S
        while not self._closed:
            conn = self._conn
            if conn is None:
                try:
                    conn = self._conn = await self._listen()
                except Exception as error:
                    if not self._driver.is_driver_error(error):
                        raise
                    _log.warning("postgresql: cannot listen for notifications yet: %s", first_line(error))
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, _RETRY_MAX_S)
                    continue
                self.breaks += 1
                try:
                    self._on_gap()
                except Exception:
                    _log.exception("postgresql: the notification gap handler raised")
            try:
                async for notice in conn.notifies():
                    self._deliver(notice.payload)
                    pause = _RETRY_FIRST_S
            except Exception as error:
                if not self._driver.is_driver_error(error):
                    raise
                _log.warning("postgresql: the notification connection broke, listening again: %s", first_line(error))
            with contextlib.suppress(Exception):
                await conn.close()
            self._conn = None

    def _deliver(self, payload: str) -> None:
        try:
            self._on_message(payload)
        except Exception:
            _log.exception("postgresql: a notification handler raised")

    async def aclose(self) -> None:
        """Stop listening and close the connection (idempotent)."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()


@dataclass(frozen=True, slots=True)
class RequestRow:
    """One row of `session_requests`.

    Attributes:
        id: The row id (rising).
        session_id: The session it is for; None for an approval decision (found by its approval id).
        kind: `prompt`, `interrupt` or `approval`.
        body: The request's JSON object.
        sender: The backend instance (holder name) that inserted it.
        state: `pending`, `accepted` or `done`.
        handler: The backend instance that accepted it, or None.
        answer: The answer's JSON object once given, or None.
    """

    id: int
    session_id: str | None
    kind: str
    body: dict[str, Any]
    sender: str
    state: str
    handler: str | None
    answer: dict[str, Any] | None


_INSERT: Final = "INSERT INTO {t} (session_id, kind, body, sender) VALUES (%s, %s, %s, %s) RETURNING id"
_GET: Final = "SELECT id, session_id, kind, body, sender, state, handler, answer FROM {t} WHERE id = %s"
_CLAIM_NEXT: Final = (
    "UPDATE {t} SET state = 'accepted', handler = %s, updated_at = now() WHERE id = "
    "(SELECT id FROM {t} WHERE session_id = %s AND state = 'pending' ORDER BY id "
    "LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id, session_id, kind, body, sender, state, handler, answer"
)
_CLAIM: Final = (
    "UPDATE {t} SET state = 'accepted', handler = %s, updated_at = now() "
    "WHERE id = %s AND state = 'pending' RETURNING id, session_id, kind, body, sender, state, handler, answer"
)
_ORPHANS: Final = (
    "SELECT id, session_id, kind, body, sender, state, handler, answer FROM {t} "
    "WHERE session_id = %s AND state = 'accepted' AND handler IS DISTINCT FROM %s ORDER BY id"
)
_ADOPT: Final = (
    "UPDATE {t} SET handler = %s, updated_at = now() WHERE id = %s AND state = 'accepted' "
    "AND handler IS NOT DISTINCT FROM %s RETURNING id"
)
_ANSWER: Final = "UPDATE {t} SET answer = %s, state = %s, updated_at = now() WHERE id = %s"
_FINISH: Final = "UPDATE {t} SET state = 'done', updated_at = now() WHERE id = %s"
_WITHDRAW: Final = (
    "UPDATE {t} SET state = 'done', answer = '{\"withdrawn\":true}', updated_at = now() "
    "WHERE id = %s AND state = 'pending' RETURNING id"
)
_STRANDED: Final = (
    "SELECT DISTINCT r.session_id, l.holder, COALESCE(l.expires_at <= now(), true) "
    "FROM {t} r LEFT JOIN {l} l ON l.session_id = r.session_id "
    "WHERE r.state <> 'done' AND r.session_id IS NOT NULL AND ("
    "(r.state = 'pending' AND r.created_at <= now() - make_interval(secs => %s)) OR r.state = 'accepted')"
)


def _row(values: tuple[Any, ...]) -> RequestRow:
    answer = values[7]
    return RequestRow(
        id=int(values[0]),
        session_id=values[1],
        kind=str(values[2]),
        body=orjson.loads(values[3]),
        sender=str(values[4]),
        state=str(values[5]),
        handler=values[6],
        answer=None if answer is None else orjson.loads(answer),
    )


class Requests:
    """The statements on `session_requests`, run inside the caller's connection."""

    def __init__(self, schema: str, channel: str, me: str) -> None:
        table, leases = f"{quoted(schema)}.session_requests", f"{quoted(schema)}.session_leases"

        def sql(statement: str) -> str:
            return statement.replace("{t}", table).replace("{l}", leases)

        self._insert, self._get, self._claim_next = sql(_INSERT), sql(_GET), sql(_CLAIM_NEXT)
        self._claim, self._orphans, self._adopt = sql(_CLAIM), sql(_ORPHANS), sql(_ADOPT)
        self._answer, self._finish, self._withdraw = sql(_ANSWER), sql(_FINISH), sql(_WITHDRAW)
        self._stranded = sql(_STRANDED)
        self._channel = channel
        self._me = me

    async def _notice(self, conn: AsyncConnection[Any], payload: dict[str, Any]) -> None:
        await conn.execute("SELECT pg_notify(%s, %s)", (self._channel, orjson.dumps(payload).decode()))

    async def _one(self, conn: AsyncConnection[Any], statement: str, params: tuple[Any, ...]) -> RequestRow | None:
        found = await (await conn.execute(statement, params)).fetchone()
        return None if found is None else _row(tuple(found))

    async def submit(self, conn: AsyncConnection[Any], session_id: str | None, kind: str, body: dict[str, Any]) -> int:
        """Insert a pending request and wake every replica, in one transaction; returns its id."""
        async with conn.transaction():
            cursor = await conn.execute(self._insert, (session_id, kind, orjson.dumps(body).decode(), self._me))
            row = await cursor.fetchone()
            assert row is not None
            request_id = int(row[0])
            await self._notice(conn, {"k": "r", "s": session_id, "r": request_id})
        return request_id

    async def get(self, conn: AsyncConnection[Any], request_id: int) -> RequestRow | None:
        """One row, or None."""
        return await self._one(conn, self._get, (request_id,))

    async def claim_next(self, conn: AsyncConnection[Any], session_id: str) -> RequestRow | None:
        """Accept the oldest pending request of the session for this instance, or None."""
        return await self._one(conn, self._claim_next, (self._me, session_id))

    async def claim(self, conn: AsyncConnection[Any], request_id: int) -> RequestRow | None:
        """Accept one pending request by id for this instance, or None when it is not pending."""
        return await self._one(conn, self._claim, (self._me, request_id))

    async def orphans(self, conn: AsyncConnection[Any], session_id: str) -> list[RequestRow]:
        """Accepted, unfinished requests of the session that another instance took (it lost the session)."""
        cursor = await conn.execute(self._orphans, (session_id, self._me))
        return [_row(tuple(found)) for found in await cursor.fetchall()]

    async def adopt(self, conn: AsyncConnection[Any], row: RequestRow) -> bool:
        """Take over an orphaned accepted request; False when someone else did first."""
        cursor = await conn.execute(self._adopt, (self._me, row.id, row.handler))
        return await cursor.fetchone() is not None

    async def answer(self, conn: AsyncConnection[Any], request_id: int, answer: dict[str, Any], *, done: bool) -> None:
        """Store the answer (and `done` when nothing is left to do for it) and wake the sender."""
        state = "done" if done else "accepted"
        async with conn.transaction():
            await conn.execute(self._answer, (orjson.dumps(answer).decode(), state, request_id))
            await self._notice(conn, {"k": "a", "r": request_id})

    async def finish(self, conn: AsyncConnection[Any], request_id: int) -> None:
        """Mark an accepted request done."""
        await conn.execute(self._finish, (request_id,))

    async def withdraw(self, conn: AsyncConnection[Any], request_id: int) -> bool:
        """Give up a request nobody accepted (the sender stopped waiting); False when it was accepted first."""
        cursor = await conn.execute(self._withdraw, (request_id,))
        return await cursor.fetchone() is not None

    async def stranded(self, conn: AsyncConnection[Any], min_age_s: float) -> list[tuple[str, str | None, bool]]:
        """Sessions whose unfinished requests may need a new holder: `(session, lease holder, lease expired)`.

        Pending rows older than `min_age_s`, and accepted rows not done yet; the caller judges the
        holder (expired, released, or a dead process of this machine).
        """
        cursor = await conn.execute(self._stranded, (min_age_s,))
        return [(str(row[0]), row[1], bool(row[2])) for row in await cursor.fetchall()]


# Shown under the name users import (docs/architecture.md#public-names).
Listener.__module__ = "dsh.persistence.postgres"
RequestRow.__module__ = "dsh.persistence.postgres"
