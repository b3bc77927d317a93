"""The PostgreSQL storage backend (`PostgresBackend`): several hosts share one store.

Layer: persistence (private to `dsh.persistence.postgres`). Selected by a `postgresql://` (or
`postgres://`) database URL. Every operation is one transaction on a connection borrowed from a
`psycopg_pool.AsyncConnectionPool`; no connection is pinned to a session, so a live session costs a
lease row, not a connection. The modules beside this one hold the parts: `_driver` (lazy imports,
URL masking, transient errors), `_schema` (migrations, open checks), `_leases` (writer leases and
the heartbeat), `_reads` and `_writes` (the statements).

Failures (docs/storage-format.md#postgresql-connections-and-retries): driver errors are translated
here, once, into `PersistenceIOError` whose message is one line with the password masked. An
operation that fails because its connection broke (or the server rolled it back to break a
deadlock) is retried on another connection a few times; an append is retried under the same fence
and recognises a batch that an earlier attempt committed before its acknowledgement was lost. Only
a lost lease fails a writer for good.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Literal, Self, TypeVar
from urllib.parse import urlsplit

from dsh.errors import ConfigError
from dsh.json import FrozenDict
from dsh.persistence.base import (
    Capability,
    DamagedSession,
    Fence,
    HeaderRow,
    ParentFilter,
    Revision,
    StoredLog,
    TornMarker,
)
from dsh.persistence.errors import (
    PersistenceClosedError,
    PersistenceIOError,
    SessionPersistenceError,
    StoreMisconfiguredError,
)
from dsh.persistence.postgres._driver import (
    SCHEMES,
    Driver,
    check_schema_name,
    first_line,
    load_driver,
    mask_url,
    quoted,
)
from dsh.persistence.postgres._holder import gone_pid
from dsh.persistence.postgres._leases import Heartbeat, LeaseRow, Leases, new_holder
from dsh.persistence.postgres._notify import MAX_PAYLOAD_BYTES, Listener, RequestRow, Requests, channel_name
from dsh.persistence.postgres._reads import Reads, bindable, row_revision, stored_log
from dsh.persistence.postgres._schema import StoreInfo, migrate_store, read_store
from dsh.persistence.postgres._writes import Batch, Writes, check_contiguous
from dsh.persistence.sqlite._schema import decode_event_rows, event_row
from dsh.session.events import SessionEvent

if TYPE_CHECKING:
    from psycopg import AsyncConnection
    from psycopg_pool import AsyncConnectionPool

__all__ = ["PostgresBackend"]

T = TypeVar("T")

_log = logging.getLogger("dsh.persistence")

RETRIES: Final = 5
"""Extra attempts of an operation whose connection broke (each on another connection)."""

_BACKOFF_S: Final = 0.05

_NEXT_SEQ: Final = "SELECT next_seq FROM {s}.sessions WHERE id = %s"
_HOLDER: Final = "SELECT holder FROM {s}.session_leases WHERE session_id = %s AND expires_at > now()"
_EVENTS_AFTER: Final = (
    "SELECT seq, type, time, data, ignorable, source_event_seqs, surface_op FROM {s}.events "
    "WHERE session_id = %s AND seq > %s ORDER BY seq LIMIT %s"
)


class PostgresBackend:
    """Sessions in one PostgreSQL schema, shared by several hosts; declares `TYPED_READS` and `LEASES`.

    Args:
        url: A `postgresql://` (or `postgres://`) URL; the password, if any, is never shown.
        schema: The schema holding the tables (created by the first writing open).
        lease_ttl_s: How long a writer lease lasts without renewal (30 s).
        lease_renew_s: The heartbeat period (10 s), shorter than the TTL; None runs no heartbeat
            (tests that let a lease expire on purpose).
        pool_min_size: Connections the pool keeps open.
        pool_max_size: The most connections the pool opens.
        statement_timeout_ms: Server-side limit of one statement and of an idle transaction (0: none).
        connect_timeout_s: How long opening a connection, or waiting for a pooled one, may take.
        read_only: Create, migrate and lock nothing: a missing schema is an empty store, every
            connection is read-only, and writes, repairs and leases are refused.

    Raises:
        ConfigError: `CONFIG_INVALID` for a URL of another scheme, a bad schema name or setting,
            or when the `postgres` extra (psycopg) is not installed.
    """

    name = "postgresql"
    capabilities: frozenset[Capability] = frozenset({Capability.TYPED_READS, Capability.LEASES})

    def __init__(
        self,
        url: str,
        *,
        schema: str = "dsh",
        lease_ttl_s: float = 30.0,
        lease_renew_s: float | None = 10.0,
        pool_min_size: int = 1,
        pool_max_size: int = 10,
        statement_timeout_ms: int = 30_000,
        connect_timeout_s: float = 10.0,
        read_only: bool = False,
    ) -> None:
        if type(url) is not str or urlsplit(url).scheme not in SCHEMES:
            raise ConfigError("PostgresBackend needs a postgresql:// URL")
        self.schema = check_schema_name(schema)
        if not (isinstance(lease_ttl_s, int | float) and 0 < lease_ttl_s <= 86_400):
            raise ConfigError("lease_ttl_s must be a number of seconds in (0, 86400]")
        renew_ok = lease_renew_s is None or (isinstance(lease_renew_s, int | float) and 0 < lease_renew_s < lease_ttl_s)
        if not renew_ok:
            raise ConfigError("lease_renew_s must be a positive number of seconds shorter than lease_ttl_s")
        if not (type(pool_min_size) is int and type(pool_max_size) is int and 1 <= pool_min_size <= pool_max_size):
            raise ConfigError("pool sizes must be integers with 1 <= pool_min_size <= pool_max_size")
        if not (type(statement_timeout_ms) is int and statement_timeout_ms >= 0):
            raise ConfigError("statement_timeout_ms must be a non-negative integer")
        if not (isinstance(connect_timeout_s, int | float) and connect_timeout_s > 0):
            raise ConfigError("connect_timeout_s must be a positive number of seconds")
        if type(read_only) is not bool:
            raise ConfigError("read_only must be a bool")
        self._driver: Driver = load_driver()
        self._url = url
        self._password = urlsplit(url).password
        self.location = mask_url(url)
        self.read_only = read_only
        self.holder = new_holder()
        self.lease_ttl_s = float(lease_ttl_s)
        self.lease_renew_s = None if lease_renew_s is None else float(lease_renew_s)
        self._pool_sizes = (pool_min_size, pool_max_size)
        self._statement_timeout_ms = statement_timeout_ms
        self._connect_timeout_s = float(connect_timeout_s)
        self._leases = Leases(self.schema, self.holder, self.lease_ttl_s)
        self._reads = Reads(self.schema)
        self.channel = channel_name(self.schema)
        """The notification channel of this store (docs/server.md#replicas)."""
        self._writes = Writes(self.schema, self._leases, None if read_only else self.channel)
        self._requests = Requests(self.schema, self.channel, self.holder)
        self._heartbeat = None if lease_renew_s is None else Heartbeat(float(lease_renew_s), self.renew_leases)
        self._state: Literal["new", "open", "closed"] = "new"
        self._store: StoreInfo | None = None
        self._pool: AsyncConnectionPool[Any] | None = None
        self._opening = asyncio.Lock()

    # ---------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def open(self) -> None:
        """Connect, create or migrate the schema (writing opens only), then open the pool.

        Raises:
            PersistenceIOError: The server is unreachable or refused the credentials (one line,
                password masked), or a statement failed.
            StoreFormatUnsupportedError: A foreign schema, or a schema newer than this build (or,
                read-only, older than it).
            PersistenceClosedError: The backend was closed.
        """
        async with self._opening:  # concurrent opens of one instance open it once
            if self._state == "open":
                return
            if self._state == "closed":
                raise PersistenceClosedError("the postgresql backend is closed")
            self._store = await self._open_store()
            pool = self._new_pool()
            try:
                await pool.open(wait=True, timeout=self._connect_timeout_s)
            except BaseException as error:
                await pool.close()
                if isinstance(error, Exception) and self._driver.is_driver_error(error):
                    raise self._io_error("open the connection pool", error, None) from error
                raise
            self._pool, self._state = pool, "open"
            if self._heartbeat is not None and not self.read_only:
                self._heartbeat.start()

    async def _open_store(self) -> StoreInfo | None:
        psycopg = self._driver.psycopg
        try:
            conn = await psycopg.AsyncConnection.connect(self._url, **self._connect_kwargs())
        except psycopg.Error as error:
            raise PersistenceIOError(
                f"postgresql: cannot connect to {self.location}: {first_line(error, secret=self._password)}",
                location=self.location,
            ) from error
        try:
            await self._configure(conn)
            if self.read_only:
                return await read_store(self._driver, conn, self.schema, self.location)
            info = await migrate_store(self._driver, conn, self.schema, self.location)
            setting = await (await conn.execute("SHOW synchronous_commit")).fetchone()
            if setting is not None and str(setting[0]).lower() == "off":
                _log.warning(
                    "postgresql: synchronous_commit is off on %s: a committed append can be lost if the server "
                    "crashes; turn it on for this database or role",
                    self.location,
                )
            return info
        except psycopg.Error as error:
            raise self._io_error("open the store", error, None) from error
        finally:
            await conn.close()

    def _connect_kwargs(self) -> dict[str, Any]:
        return {
            "autocommit": True,
            "connect_timeout": max(1, round(self._connect_timeout_s)),
            "application_name": f"dsh {self.holder}"[:63],
        }

    async def _configure(self, conn: AsyncConnection[Any]) -> None:
        """Per-connection settings: statement and idle-transaction timeouts, read-only when asked.

        An idle-transaction timeout matters for leases: a host frozen inside an append transaction
        would otherwise hold the lease row lock, and block every takeover, for as long as it sleeps.
        """
        timeout = str(self._statement_timeout_ms)
        await conn.execute("SELECT set_config('statement_timeout', %s, false)", (timeout,))
        await conn.execute("SELECT set_config('idle_in_transaction_session_timeout', %s, false)", (timeout,))
        if self.read_only:
            await conn.execute("SET default_transaction_read_only = on")

    def _new_pool(self) -> AsyncConnectionPool[Any]:
        minimum, maximum = self._pool_sizes
        pool: AsyncConnectionPool[Any] = self._driver.pool.AsyncConnectionPool(
            self._url,
            open=False,
            min_size=minimum,
            max_size=maximum,
            kwargs=self._connect_kwargs(),
            configure=self._configure,
            timeout=self._connect_timeout_s,
            name="dsh",
        )
        return pool

    async def close(self) -> None:
        """Stop the heartbeat, release every lease this instance holds, close the pool (idempotent)."""
        if self._state == "closed":
            return
        pool, was_open = self._pool, self._state == "open"
        self._state, self._pool = "closed", None
        if self._heartbeat is not None:
            await self._heartbeat.stop()
        if pool is None:
            return
        try:
            # By holder, not by what `held` lists: an acquire that committed while close began is
            # released too, so a restarted host never waits out its own lease.
            if was_open and not self.read_only:
                await self._run_on(pool, self._leases.release_all, "release the leases", None)
        finally:
            await pool.close()

    # ---------------------------------------------------------------- plumbing

    def _open_pool(self) -> AsyncConnectionPool[Any]:
        if self._state != "open" or self._pool is None:
            raise PersistenceClosedError(
                "the postgresql backend is closed" if self._state == "closed" else "the postgresql backend is not open"
            )
        return self._pool

    def _io_error(self, what: str, error: BaseException, session_id: str | None) -> PersistenceIOError:
        return PersistenceIOError(
            f"postgresql: cannot {what}: {first_line(error, secret=self._password)}",
            session_id=session_id,
            location=self.location,
        )

    async def run(
        self, work: Callable[[AsyncConnection[Any]], Awaitable[T]], what: str, session_id: str | None = None
    ) -> T:
        """Run `work(connection)` on a pooled connection, retrying on another when the connection breaks.

        This is the one boundary where driver errors become `PersistenceIOError` (one line,
        password masked); persistence errors raised by `work` pass through. The projection cache
        shares the pool through this method.

        Raises:
            PersistenceIOError: The driver failed (after the retries, for a broken connection).
            PersistenceClosedError: The backend is not open.
        """
        return await self._run_on(self._open_pool(), work, what, session_id)

    async def _run_on(
        self,
        pool: AsyncConnectionPool[Any],
        work: Callable[[AsyncConnection[Any]], Awaitable[T]],
        what: str,
        session_id: str | None,
        *,
        attempts: list[int] | None = None,
    ) -> T:
        attempt = 0
        while True:
            if attempts is not None:
                attempts.append(attempt)
            try:
                async with pool.connection() as conn:
                    return await work(conn)
            except SessionPersistenceError:
                raise
            except UnicodeError as error:
                # A string the driver cannot send (a lone surrogate); lookups of such ids answer
                # "not stored" before reaching here.
                raise self._io_error(what, error, session_id) from error
            except Exception as error:
                if not self._driver.is_driver_error(error):
                    raise
                if not self._driver.is_transient(error) or attempt >= RETRIES:
                    raise self._io_error(what, error, session_id) from error
                attempt += 1
                _log.info(
                    "postgresql: %s failed on a broken connection (attempt %d of %d, retrying): %s",
                    what,
                    attempt,
                    RETRIES + 1,
                    first_line(error, secret=self._password),
                )
                # Drop the pool's other broken connections (they died together), then wait a little.
                await pool.check()
                await asyncio.sleep(_BACKOFF_S * 2 ** (attempt - 1))

    async def _store_info(self, conn: AsyncConnection[Any]) -> StoreInfo | None:
        """The store, re-checked by read-only instances until it exists (a missing schema is an empty store)."""
        if self._store is None and self.read_only:
            self._store = await read_store(self._driver, conn, self.schema, self.location)
        return self._store

    def _revision(self, incarnation: str, revision: int) -> Revision:
        assert self._store is not None
        return Revision(f"pg:{self._store.store_id}:{incarnation}:{revision}")

    def _refuse_read_only(self, what: str) -> None:
        if self.read_only:
            raise StoreMisconfiguredError(
                f"cannot {what}: the PostgreSQL store {self.location} was opened read-only", location=self.location
            )

    # ---------------------------------------------------------------- reads

    async def list_headers(
        self, *, parents: ParentFilter | None = None
    ) -> tuple[list[HeaderRow], list[DamagedSession]]:
        """Header records from `sessions` rows only, sorted by `(created_at, id)`; the parent filter runs in SQL."""

        async def work(conn: AsyncConnection[Any]) -> list[HeaderRow]:
            if await self._store_info(conn) is None:
                return []
            rows = await self._reads.list_headers(conn, parents)
            return [HeaderRow(record, self._revision(*revision)) for record, revision in rows]

        return await self.run(work, "list sessions"), []

    async def exists(self, session_id: str) -> bool:
        """Whether a `sessions` row exists for the id."""

        async def work(conn: AsyncConnection[Any]) -> bool:
            return await self._store_info(conn) is not None and await self._reads.exists(conn, session_id)

        if not bindable(session_id):
            return False
        return await self.run(work, f'look up session "{session_id}"', session_id)

    async def read_revision(self, session_id: str) -> Revision | None:
        """The current revision from one `sessions` row, or None."""

        async def work(conn: AsyncConnection[Any]) -> Revision | None:
            if await self._store_info(conn) is None:
                return None
            found = await self._reads.revision(conn, session_id)
            return None if found is None else self._revision(*found)

        if not bindable(session_id):
            return None
        return await self.run(work, f'read the revision of "{session_id}"', session_id)

    async def load(self, session_id: str) -> StoredLog | None:
        """The session row and every event row from one snapshot, or None."""

        async def work(conn: AsyncConnection[Any]) -> StoredLog | None:
            if await self._store_info(conn) is None:
                return None
            found = await self._reads.load(conn, session_id)
            if found is None:
                return None
            row, events, oversized = found
            return stored_log(session_id, row, events, oversized, self._revision(*row_revision(row)))

        if not bindable(session_id):
            return None
        return await self.run(work, f'load session "{session_id}"', session_id)

    async def load_typed(
        self, session_id: str, types: frozenset[str] | None, from_seq: int, known: frozenset[str]
    ) -> StoredLog | None:
        """Only the rows with `seq >= from_seq` and a type in `types`, through the type index."""

        async def work(conn: AsyncConnection[Any]) -> StoredLog | None:
            if await self._store_info(conn) is None:
                return None
            found = await self._reads.load_typed(conn, session_id, types, from_seq, known)
            if found is None:
                return None
            row, events, oversized, first_unknown, next_seq = found
            revision = self._revision(*row_revision(row))
            return stored_log(
                session_id, row, events, oversized, revision, first_unknown=first_unknown, next_seq=next_seq
            )

        if not bindable(session_id):
            return None
        return await self.run(work, f'read events of session "{session_id}"', session_id)

    # ---------------------------------------------------------------- writes

    async def append_batch(
        self, header: FrozenDict, events: Sequence[SessionEvent], *, materialized: bool, fence: Fence | None
    ) -> Revision:
        """Durably append `events` in one transaction checked against `fence` (all or nothing).

        Raises:
            LeaseLostError: No fence, or another writer took the session over; nothing was written.
            AppendConflictError: The batch does not start at the stored next seq, or is not contiguous.
            SessionAlreadyExistsError: Materializing an id that is already stored.
            PersistenceIOError: The driver failed (after retries on other connections).
        """
        session_id = str(header["id"])
        self._refuse_read_only(f'write session "{session_id}"')
        pool = self._open_pool()
        batch = Batch(
            session_id=session_id,
            header=header,
            rows=[event_row(session_id, event) for event in events],
            materialized=materialized,
            fence=self._leases.check_local(fence, session_id),
            incarnation=uuid.uuid4().hex,
        )
        check_contiguous(session_id, batch.rows)
        attempts: list[int] = []

        async def work(conn: AsyncConnection[Any]) -> tuple[str, int]:
            # A retry (the connection broke, perhaps after COMMIT) first looks for its batch
            # (docs/storage-format.md#postgresql-connections-and-retries).
            return await self._writes.append(conn, batch, retry=len(attempts) > 1)

        incarnation, revision = await self._run_on(
            pool, work, f'append to session "{session_id}"', session_id, attempts=attempts
        )
        return self._revision(incarnation, revision)

    async def commit_repair(
        self, header: FrozenDict, torn: TornMarker | None, closers: Sequence[SessionEvent], *, fence: Fence | None
    ) -> Revision:
        """Append the closers as one batch under the fence: a transactional store never has a torn tail.

        Raises:
            ValueError: `torn` is not None (this backend never reports a torn marker).
        """
        if torn is not None:
            raise ValueError("the postgresql backend never reports torn tails, so it cannot remove one")
        return await self.append_batch(header, closers, materialized=True, fence=fence)

    # ---------------------------------------------------------------- leases

    async def acquire(self, session_id: str) -> Fence | None:
        """Take the session's writer lease: generation 1 for a new id, the next one on takeover.

        Raises:
            LeaseHeldError: Another host's lease is still valid (names the holder and the expiry).
        """
        self._open_pool()
        self._refuse_read_only(f'take the writer lease of session "{session_id}"')
        return await self.run(lambda conn: self._leases.acquire(conn, session_id), "take a lease", session_id)

    async def release(self, session_id: str) -> None:
        """Delete the session's lease row if it is still this instance's generation."""
        if self._state != "open" or session_id not in self._leases.held:
            self._leases.held.pop(session_id, None)
            return
        await self.run(lambda conn: self._leases.release(conn, session_id), "release a lease", session_id)

    async def renew_leases(self) -> list[str]:
        """Renew every lease this instance holds now (the heartbeat calls it); return the ids found lost."""
        if self._state != "open" or not self._leases.held:
            return []
        return await self.run(self._leases.renew, "renew leases")

    def holds_lease(self, session_id: str) -> bool:
        """Whether this instance holds the session's lease and has not found it lost."""
        return session_id in self._leases.held and session_id not in self._leases.lost

    def locate(self, header: Mapping[str, Any]) -> str | None:
        """None: sessions are rows, not artifacts with paths."""
        return None

    # ---------------------------------------------------------------- replicas (docs/server.md#replicas)

    async def listen(self, on_message: Callable[[str], None], on_gap: Callable[[], None]) -> Listener:
        """Start listening on the store's channel on a connection of its own (reopened when it breaks).

        Raises:
            PersistenceIOError: The first connection could not be opened.
        """
        self._open_pool()
        psycopg = self._driver.psycopg

        async def connect() -> AsyncConnection[Any]:
            kwargs = self._connect_kwargs()
            kwargs["application_name"] = f"dsh listen {self.holder}"[:63]
            conn: AsyncConnection[Any] = await psycopg.AsyncConnection.connect(self._url, **kwargs)
            try:
                await conn.execute("SELECT set_config('statement_timeout', '0', false)")
            except BaseException:
                await conn.close()
                raise
            return conn

        listener = Listener(self._driver, connect, self.channel, on_message, on_gap)
        try:
            await listener.start()
        except Exception as error:
            if self._driver.is_driver_error(error):
                raise self._io_error("listen for notifications", error, None) from error
            raise
        return listener

    async def notify(self, payload: str) -> bool:
        """Send one notice on the store's channel; False (nothing sent) when it is over the size limit."""
        if len(payload.encode()) > MAX_PAYLOAD_BYTES:
            return False
        channel = self.channel

        async def work(conn: AsyncConnection[Any]) -> None:
            await conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))

        await self.run(work, "send a notification")
        return True

    async def events_after(self, session_id: str, after_seq: int, limit: int = 1000) -> tuple[int, list[SessionEvent]]:
        """`(last stored seq, events with seq > after_seq)`, at most `limit` of them, from one snapshot.

        The replicas' feed reads only what it has not seen; -1 is the last seq of a session with no
        events (or none stored).

        Raises:
            SessionCorruptionError: A row does not decode.
        """
        head = _NEXT_SEQ.replace("{s}", quoted(self.schema))
        rows_sql = _EVENTS_AFTER.replace("{s}", quoted(self.schema))

        async def work(conn: AsyncConnection[Any]) -> tuple[int, list[SessionEvent]]:
            if await self._store_info(conn) is None:
                return -1, []
            async with conn.transaction():
                await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                found = await (await conn.execute(head, (session_id,))).fetchone()
                if found is None:
                    return -1, []
                rows = await (await conn.execute(rows_sql, (session_id, after_seq, limit))).fetchall()
            records, _ = decode_event_rows(session_id, rows, first_seq=after_seq + 1 if rows else None)
            return int(found[0]) - 1, [SessionEvent(record) for record in records]

        if not bindable(session_id):
            return -1, []
        return await self.run(work, f'read new events of session "{session_id}"', session_id)

    async def ping(self) -> None:
        """One round trip to the database on a pooled connection (readiness checks)."""

        async def work(conn: AsyncConnection[Any]) -> None:
            await conn.execute("SELECT 1")

        await self.run(work, "reach the database")

    async def lease_holder(self, session_id: str) -> str | None:
        """Who holds the session's lease now (an unexpired row), or None."""
        statement = _HOLDER.replace("{s}", quoted(self.schema))

        async def work(conn: AsyncConnection[Any]) -> str | None:
            found = await (await conn.execute(statement, (session_id,))).fetchone()
            return None if found is None else str(found[0])

        if not bindable(session_id):
            return None
        return await self.run(work, "read a lease", session_id)

    def holder_gone(self, holder: str) -> bool:
        """Whether a lease holder is certainly a dead process of this machine (docs above, dead writers)."""
        return gone_pid(holder) is not None

    async def submit_request(self, session_id: str | None, kind: str, body: dict[str, Any]) -> int:
        """Insert a pending request row and wake every replica; returns the row id."""
        requests = self._requests
        return await self.run(lambda conn: requests.submit(conn, session_id, kind, body), "submit a request")

    async def get_request(self, request_id: int) -> RequestRow | None:
        """One request row, or None."""
        requests = self._requests
        return await self.run(lambda conn: requests.get(conn, request_id), "read a request")

    async def claim_next_request(self, session_id: str) -> RequestRow | None:
        """Accept the session's oldest pending request for this instance, or None."""
        requests = self._requests
        return await self.run(lambda conn: requests.claim_next(conn, session_id), "claim a request", session_id)

    async def claim_request(self, request_id: int) -> RequestRow | None:
        """Accept one pending request by id, or None when it is not pending."""
        requests = self._requests
        return await self.run(lambda conn: requests.claim(conn, request_id), "claim a request")

    async def orphan_requests(self, session_id: str) -> list[RequestRow]:
        """The session's accepted, unfinished requests that another instance took."""
        requests = self._requests
        return await self.run(lambda conn: requests.orphans(conn, session_id), "read requests", session_id)

    async def adopt_request(self, row: RequestRow) -> bool:
        """Take over an orphaned accepted request; False when another instance did first."""
        requests = self._requests
        return await self.run(lambda conn: requests.adopt(conn, row), "adopt a request")

    async def answer_request(self, request_id: int, answer: dict[str, Any], *, done: bool) -> None:
        """Store a request's answer (and mark it done) and wake its sender."""
        requests = self._requests
        await self.run(lambda conn: requests.answer(conn, request_id, answer, done=done), "answer a request")

    async def finish_request(self, request_id: int) -> None:
        """Mark an accepted request done."""
        requests = self._requests
        await self.run(lambda conn: requests.finish(conn, request_id), "finish a request")

    async def withdraw_request(self, request_id: int) -> bool:
        """Give up a request nobody accepted; False when it was accepted first."""
        requests = self._requests
        return await self.run(lambda conn: requests.withdraw(conn, request_id), "withdraw a request")

    async def stranded_requests(self, min_age_s: float) -> list[tuple[str, str | None, bool]]:
        """Sessions whose unfinished requests nobody works on: `(session, lease holder, expired)`."""
        requests = self._requests
        return await self.run(lambda conn: requests.stranded(conn, min_age_s), "look for stranded requests")

    # ---------------------------------------------------------------- diagnostics

    async def diagnostics(self) -> dict[str, Any]:
        """What `dsh doctor` reports: server version, schema and version, `synchronous_commit`, lease rows."""

        async def work(conn: AsyncConnection[Any]) -> dict[str, Any]:
            version = await (await conn.execute("SHOW server_version")).fetchone()
            commit = await (await conn.execute("SHOW synchronous_commit")).fetchone()
            store = await self._store_info(conn)
            leases: list[LeaseRow] = [] if store is None else await self._leases.rows(conn)
            return {
                "server_version": None if version is None else str(version[0]),
                "synchronous_commit": None if commit is None else str(commit[0]),
                "schema": self.schema,
                "schema_version": None if store is None else store.schema_version,
                "leases": leases,
            }

        return await self.run(work, "read diagnostics")


# Shown under the name users import (docs/architecture.md#public-names).
PostgresBackend.__module__ = "dsh.persistence.postgres"
