"""Test support for the PostgreSQL store: the server a test run may use, throw-away schemas, the fixture writer.

Layer: testing (shipped, importable; the driver loads on first use, never at import). The tests of
the PostgreSQL store run against a real server named by `DSH_TEST_POSTGRES_URL`, each test in its
own schema that is dropped afterwards:

* `postgres_test_url()` returns the URL, or skips the calling test with the reason when the
  variable is unset or the server does not answer; under `CI` (any value but empty, `0`, `false`
  or `no`) it fails the test instead, because CI provides the server;
* `ThrowawaySchemas` hands out unique schema names and drops them all at the end of a test;
* `PostgresStoredLogWriter` is the `StoredLogWriter` of the PostgreSQL backend: with its own
  connection it writes `sessions` and `events` rows directly, with no validation, so a test can
  build exactly the state it needs (a seq gap, a row whose `data` is not JSON, a foreign version);
* `lost_acknowledgements` and `held_appends` reach what only a networked store meets: an append that
  commits and then loses its connection before the answer, and an append transaction held open
  while it has the lease row. Like `dsh.testing.io_faults`, they replace one private step of one
  backend instance for a `with` block (the append transaction, and the fence check that locks the
  lease row); the backend itself has no test methods.
"""

from __future__ import annotations

import contextlib
import functools
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import orjson

from dsh.persistence.postgres import (
    INSERT_EVENT,
    INSERT_SESSION,
    check_schema_name,
    load_driver,
    mask_url,
    migrate_store,
    quoted,
)
from dsh.persistence.sqlite import header_columns
from dsh.testing.io_faults import replaced
from dsh.testing.sqlite_writer import event_row, next_seq

if TYPE_CHECKING:
    from psycopg import AsyncConnection

    from dsh.persistence.postgres import PostgresBackend

__all__ = [
    "TEST_URL_VARIABLE",
    "LostAcknowledgements",
    "PostgresStoredLogWriter",
    "ThrowawaySchemas",
    "held_appends",
    "lost_acknowledgements",
    "postgres_test_url",
]

TEST_URL_VARIABLE: Final = "DSH_TEST_POSTGRES_URL"
"""The environment variable naming the PostgreSQL server tests may use."""

_DAMAGED_TEXT: Final = '{"damaged": '

# Statement templates; `{s}` is the quoted schema name.
_DELETE_SESSION: Final = "DELETE FROM {s}.sessions WHERE id = %s"
_NEXT_SEQ: Final = "SELECT next_seq FROM {s}.sessions WHERE id = %s"
_BUMP: Final = "UPDATE {s}.sessions SET revision = revision + 1, next_seq = %s WHERE id = %s"
_FIRST_SEQ: Final = "SELECT seq FROM {s}.events WHERE session_id = %s ORDER BY seq LIMIT 1"
_GROW: Final = "UPDATE {s}.sessions SET next_seq = next_seq + 1 WHERE id = %s"
_DAMAGE: Final = "UPDATE {s}.events SET data = %s WHERE session_id = %s AND seq = %s"
_TOUCH: Final = "UPDATE {s}.sessions SET revision = revision + 1 WHERE id = %s"
_SESSION_ROW: Final = "SELECT * FROM {s}.sessions WHERE id = %s"
_EVENT_ROWS: Final = "SELECT * FROM {s}.events WHERE session_id = %s ORDER BY seq"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in {"", "0", "false", "no"}


def _unavailable(reason: str) -> None:
    import pytest

    if _in_ci():
        pytest.fail(f"{reason} (CI is set, so the PostgreSQL tests must run)", pytrace=False)
    pytest.skip(reason)


@functools.cache
def _probe(url: str) -> str | None:
    """None when the server answers, else why it does not (one probe per process and URL)."""
    driver = load_driver()
    try:
        with driver.psycopg.connect(url, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except driver.psycopg.Error as error:
        first = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
        return f"the PostgreSQL server at {mask_url(url)} is unreachable: {first}"
    return None


def postgres_test_url() -> str:
    """The URL of the test server, checked once per process; skips (or, under CI, fails) the test without one."""
    url = os.environ.get(TEST_URL_VARIABLE, "").strip()
    if not url:
        _unavailable(
            f"PostgreSQL tests need a server: set {TEST_URL_VARIABLE} (for example "
            "postgresql://postgres@127.0.0.1:5432/test)"
        )
    problem = _probe(url)
    if problem is not None:
        _unavailable(problem)
    return url


class ThrowawaySchemas:
    """Unique schema names for one test, all dropped (with everything in them) by `drop_all()`.

    Asking for the first name checks the server (`postgres_test_url`), so a test that never asks
    never needs one.
    """

    def __init__(self, prefix: str = "dsh_test") -> None:
        self.prefix = check_schema_name(prefix)
        self.names: list[str] = []
        self._url: str | None = None

    @property
    def url(self) -> str:
        """The test server's URL (skips or fails the test without one)."""
        if self._url is None:
            self._url = postgres_test_url()
        return self._url

    def new(self) -> str:
        """A fresh schema name (nothing is created: the first writing open creates it)."""
        if self._url is None:
            self._url = postgres_test_url()  # skips (or fails under CI) without a server
        name = f"{self.prefix}_{uuid.uuid4().hex[:16]}"
        self.names.append(name)
        return name

    def drop_all(self) -> None:
        """Drop every schema handed out (blocking; call it after the backends using them closed)."""
        if not self.names or self._url is None:
            return
        driver = load_driver()
        with driver.psycopg.connect(self._url, autocommit=True, connect_timeout=5) as conn:
            for name in self.names:
                conn.execute("DROP SCHEMA IF EXISTS {s} CASCADE".replace("{s}", quoted(name)))
        self.names.clear()


class PostgresStoredLogWriter:
    """Writes stored facts straight into a PostgreSQL store, bypassing the backend and every check.

    Each call opens its own connection, creates the schema exactly as a writing open would if it
    does not exist yet, and commits one transaction.

    Args:
        url: The server.
        schema: The schema the backend under test uses.
    """

    def __init__(self, url: str, schema: str) -> None:
        self.url = url
        self.schema = check_schema_name(schema)
        self._s = quoted(self.schema)
        self._ready = False

    def _sql(self, template: str) -> str:
        return template.replace("{s}", self._s)

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[AsyncConnection[Any]]:
        driver = load_driver()
        conn = await driver.psycopg.AsyncConnection.connect(self.url, autocommit=True)
        try:
            if not self._ready:
                await migrate_store(driver, conn, self.schema, mask_url(self.url))
                self._ready = True
            async with conn.transaction():
                yield conn
        finally:
            await conn.close()

    async def write(self, session_id: str, header: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> None:
        """Store exactly this header and these records under `session_id`, replacing anything stored.

        Raises:
            ValueError: The header names another id (rows are keyed by session id), or a record has
                no column for one of its keys.
        """
        if "id" in header and header["id"] != session_id:
            raise ValueError(
                f"the PostgreSQL schema keys sessions by id: a header id {header['id']!r} differing from "
                f"{session_id!r} cannot be stored"
            )
        rows = [event_row(session_id, record, system="PostgreSQL") for record in records]
        async with self._transaction() as conn:
            await conn.execute(self._sql(_DELETE_SESSION), (session_id,))
            await conn.execute(
                self._sql(INSERT_SESSION),
                (session_id, *header_columns(header), uuid.uuid4().hex, 1, next_seq(rows)),
            )
            if rows:
                async with conn.cursor() as cursor:
                    await cursor.executemany(self._sql(INSERT_EVENT), rows)

    async def append(self, session_id: str, records: Sequence[Mapping[str, Any]]) -> None:
        """Append records as an external writer would: new rows, a bumped revision and next seq.

        Raises:
            ValueError: Nothing is stored under the id.
        """
        rows = [event_row(session_id, record, system="PostgreSQL") for record in records]
        async with self._transaction() as conn:
            found = await (await conn.execute(self._sql(_NEXT_SEQ), (session_id,))).fetchone()
            if found is None:
                raise ValueError(f'nothing is stored for session "{session_id}"')
            if rows:
                async with conn.cursor() as cursor:
                    await cursor.executemany(self._sql(INSERT_EVENT), rows)
            await conn.execute(
                self._sql(_BUMP),
                (next_seq(rows, int(found[0])), session_id),
            )

    async def damage_events(self, session_id: str) -> None:
        """Make the first event row's `data` undecodable (or add such a row), keeping the header listable.

        Raises:
            ValueError: Nothing is stored under the id.
        """
        async with self._transaction() as conn:
            found = await (await conn.execute(self._sql(_NEXT_SEQ), (session_id,))).fetchone()
            if found is None:
                raise ValueError(f'nothing is stored for session "{session_id}"')
            first = await (await conn.execute(self._sql(_FIRST_SEQ), (session_id,))).fetchone()
            if first is None:
                await conn.execute(
                    self._sql(INSERT_EVENT),
                    (session_id, found[0], "turn/end", 0, _DAMAGED_TEXT, None, None, None),
                )
                await conn.execute(self._sql(_GROW), (session_id,))
            else:
                await conn.execute(self._sql(_DAMAGE), (_DAMAGED_TEXT, session_id, first[0]))
            await conn.execute(self._sql(_TOUCH), (session_id,))

    async def snapshot(self, session_id: str) -> bytes:
        """Every column of the id's `sessions` row and `events` rows, as opaque JSON bytes."""
        async with self._transaction() as conn:
            session = await (await conn.execute(self._sql(_SESSION_ROW), (session_id,))).fetchone()
            events = await (await conn.execute(self._sql(_EVENT_ROWS), (session_id,))).fetchall()
        return orjson.dumps(
            {"session": None if session is None else list(session), "events": [list(row) for row in events]}
        )

    async def execute(self, sql: str, parameters: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one statement (`{s}` stands for the quoted schema) in its own transaction; return its rows."""
        async with self._transaction() as conn:
            cursor = await conn.execute(self._sql(sql), tuple(parameters))
            return [tuple(row) for row in await cursor.fetchall()] if cursor.description else []


# --------------------------------------------------------------------------------------------------
# Connection faults of one backend instance, for the length of a `with` block


class LostAcknowledgements:
    """The acknowledgements `lost_acknowledgements` still has to drop, and how many it dropped.

    Attributes:
        remaining: Appends that will still commit and then lose their connection.
        lost: Appends that did (each was then retried on another connection).
    """

    def __init__(self, count: int) -> None:
        self.remaining = count
        self.lost = 0


@contextlib.contextmanager
def lost_acknowledgements(backend: PostgresBackend, count: int = 1) -> Iterator[LostAcknowledgements]:
    """While the block runs, the next `count` append transactions of `backend` commit, then lose their connection.

    The connection is closed after `COMMIT` and before the backend hears the answer, as when a
    network drops it; the backend retries the append on another connection, where it must recognise
    the committed batch (docs/storage-format.md#postgresql-connections-and-retries).
    """
    dropped = LostAcknowledgements(count)
    psycopg = load_driver().psycopg

    def make(append: Callable[..., Awaitable[tuple[str, int]]]) -> Callable[..., Awaitable[tuple[str, int]]]:
        async def committed_then_dropped(conn: AsyncConnection[Any], batch: Any, *, retry: bool) -> tuple[str, int]:
            stored = await append(conn, batch, retry=retry)
            if dropped.remaining > 0:
                dropped.remaining -= 1
                dropped.lost += 1
                await conn.close()
                raise psycopg.OperationalError("injected: the connection dropped after COMMIT")
            return stored

        return committed_then_dropped

    with replaced(backend._writes, "append", make):  # noqa: SLF001 - the append transaction tests replace
        yield dropped


@contextlib.contextmanager
def held_appends(backend: PostgresBackend, hook: Callable[[str], Awaitable[object]]) -> Iterator[None]:
    """While the block runs, every append of `backend` awaits `hook(session_id)` inside its transaction.

    The hook runs right after the transaction locked the session's lease row and checked the fence,
    so while it waits a takeover of that session waits for the row lock, and appends of other
    sessions go on. Leaving the block lets later appends through; one already waiting in the hook
    continues when the hook returns.
    """

    def make(check: Callable[[Any, Any], Awaitable[None]]) -> Callable[[Any, Any], Awaitable[None]]:
        async def checked_then_held(conn: AsyncConnection[Any], fence: Any) -> None:
            await check(conn, fence)
            await hook(fence.session_id)

        return checked_then_held

    with replaced(backend._leases, "check_fence", make):  # noqa: SLF001 - the step that locks the lease row
        yield
