"""The embedded SQLite storage backend (`SqliteBackend`).

Layer: persistence (private to `dsh.persistence.sqlite`). Opt-in
(`DSH_DATABASE_URL=sqlite:///<path>`). One database file holds every session: a `sessions` row per
materialized session (the stored header facts plus the incarnation, revision counter and next seq)
and one `events` row per event, with the type and parent indexes that make typed reads and child
listings cheap. The schema, the connection set-up, the open checks and the row codecs live in
`_schema`.

Threads (docs/architecture.md#threads-and-the-event-loop): `sqlite3` blocks, so no call ever runs
on the event loop. One writer connection lives on a dedicated single-thread executor, which also
serialises this process's writes; reads use two reader connections, each on its own single-thread
executor, and WAL lets them proceed while an append commits. Every driver error is translated once, at the boundary
between the event loop and those threads, into `PersistenceIOError` (`raise ... from`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal, Self, TypeVar

from dsh.errors import ConfigError
from dsh.json import FrozenDict
from dsh.persistence._locks import WriterLocks
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
    AppendConflictError,
    PersistenceClosedError,
    PersistenceIOError,
    SessionAlreadyExistsError,
    StoreMisconfiguredError,
)
from dsh.persistence.sqlite._schema import (
    ALL_EVENTS,
    INSERT_EVENT,
    INSERT_SESSION,
    check_read_only_location,
    connect,
    connect_read_only,
    corrupt,
    decode_event_rows,
    ensure_safe_location,
    event_row,
    first_unknown_type,
    header_columns,
    header_record,
    prepare_store,
    reference_schema,
    typed_rows,
    verify_store,
)
from dsh.session.events import SessionEvent

__all__ = ["SqliteBackend"]

T = TypeVar("T")

_log = logging.getLogger("dsh.persistence")

READER_CONNECTIONS: Final = 2
"""Reader connections per backend; each owns one thread (two, so one long read never queues all others)."""

_MAX_BUSY_TIMEOUT_MS: Final = 2_147_483_647

_Done = Callable[[BaseException | None], object]

_SESSION_ROW: Final = (
    "SELECT version, created_at, cwd, parent_session, seed_length, origin, delegation_depth, agent_preset, "
    "incarnation, revision, next_seq FROM sessions WHERE id = ?"
)
_LIST: Final = (
    "SELECT id, version, created_at, cwd, parent_session, seed_length, origin, delegation_depth, agent_preset, "
    "incarnation, revision FROM sessions"
)

_IN_CHUNK: Final = 500
"""Parent ids bound per `IN (...)` statement (well below every SQLite build's variable limit)."""

# Row layout of `_SESSION_ROW`: the eight header columns, then these three.
_INCARNATION, _REVISION, _NEXT_SEQ = 8, 9, 10


class _Lane:
    """One connection owned by one thread: every call for it runs on that thread, in order.

    `sqlite3` connections must stay on the thread that made them, and a single-thread executor
    gives a FIFO queue for free. The connection opens lazily on the lane's thread.
    """

    def __init__(self, name: str, connect: Callable[[], sqlite3.Connection]) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._connect = connect
        self._conn: sqlite3.Connection | None = None  # touched on the lane's thread only
        self.pending = 0  # touched on the event loop only; used to pick the idlest reader

    def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._conn is None:
            self._conn = self._connect()
        return fn(self._conn)

    def start(self, fn: Callable[[sqlite3.Connection], object], loop: asyncio.AbstractEventLoop, done: _Done) -> None:
        """Queue `fn(connection)` on the lane's thread without awaiting; `done(error)` runs on `loop` after."""
        future = self._executor.submit(self._call, fn)
        future.add_done_callback(lambda finished: _report(loop, done, finished))

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn(connection)` on the lane's thread and await its result."""
        loop = asyncio.get_running_loop()
        self.pending += 1
        try:
            return await loop.run_in_executor(self._executor, self._call, fn)
        finally:
            self.pending -= 1

    def _close_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    async def close(self) -> None:
        """Close the connection on its own thread (after queued work), then stop the thread."""
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._close_connection)
        finally:
            # The close job was the last one queued, so the thread is idle or exiting: waiting for
            # it would only block the loop.
            self._executor.shutdown(wait=False)


class SqliteBackend:
    """Sessions in one SQLite database file; declares `TYPED_READS` and `EAGER_APPENDS`.

    Args:
        path: The database file, or `":memory:"` for a private in-memory store (tests, one
            connection, no writer locks: nothing outside this object can reach it).
        busy_timeout_ms: How long a statement waits for another connection's lock before failing
            with `PERSISTENCE_IO`.
        read_only: Open every connection with `mode=ro` and create nothing: a missing or empty
            (0-byte) file is refused with `STORE_MISCONFIGURED`, a store is verified but never
            initialised or migrated, and every write, repair and writer lock is refused
            (docs/storage-format.md#read-only-opens).

    Raises:
        ConfigError: `busy_timeout_ms` is not an integer in 0..2147483647 (`CONFIG_INVALID`).
    """

    name = "sqlite"
    capabilities: frozenset[Capability] = frozenset({Capability.TYPED_READS, Capability.EAGER_APPENDS})

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout_ms: int = 5000, read_only: bool = False) -> None:
        if type(busy_timeout_ms) is not int or not 0 <= busy_timeout_ms <= _MAX_BUSY_TIMEOUT_MS:
            raise ConfigError(f"busy_timeout_ms must be an integer between 0 and {_MAX_BUSY_TIMEOUT_MS}")
        if type(read_only) is not bool:
            raise ConfigError("read_only must be a bool")
        raw = os.fspath(path)
        self._memory = raw == ":memory:"
        self.read_only = read_only and not self._memory
        self._was_empty = False
        self.path: Path | None = None if self._memory else Path(os.path.abspath(raw))
        self._location = ":memory:" if self.path is None else str(self.path)
        self.busy_timeout_ms = busy_timeout_ms
        self._locks = None if self.path is None else WriterLocks(Path(f"{self.path}.locks"))
        self._state: Literal["new", "open", "closed"] = "new"
        self._store_id = ""
        self._writer: _Lane | None = None
        self._readers: list[_Lane] = []
        self._opening = asyncio.Lock()

    # ----------------------------------------------------------------------------------------------
    # Lifecycle

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def open(self) -> None:
        """Check the location, then initialise or verify the store inside `BEGIN IMMEDIATE`.

        Raises:
            StoreFormatUnsupportedError: A foreign or unknown database (`STORE_FORMAT_UNSUPPORTED`).
            StoreMisconfiguredError: An unsafe location or no WAL support (`STORE_MISCONFIGURED`).
            PersistenceIOError: The driver or the OS failed.
            PersistenceClosedError: The backend was closed.
        """
        async with self._opening:  # concurrent opens of one instance initialise it once
            if self._state == "open":
                return
            if self._state == "closed":
                raise PersistenceClosedError("the sqlite backend is closed")
            await self._open()

    async def _open(self) -> None:
        writer = _Lane("dsh-sqlite-writer", self._connect_writer)
        readers = (
            [writer]
            if self._memory
            else [_Lane(f"dsh-sqlite-reader-{n}", self._connect_reader) for n in range(READER_CONNECTIONS)]
        )
        try:
            self._store_id = await self._translate(writer.run(self._open_store), "open the store", None)
        except BaseException:
            await self._close_lanes(writer, readers)
            raise
        self._writer, self._readers, self._state = writer, readers, "open"

    def _connect_writer(self) -> sqlite3.Connection:
        if self.path is not None:
            if self.read_only:
                # The "writer" lane of a read-only backend only verifies the store at open.
                return self._connect_reader()
            with contextlib.suppress(OSError):
                self._was_empty = os.path.getsize(self.path) == 0
            ensure_safe_location(self.path)
        return connect(self._location, busy_timeout_ms=self.busy_timeout_ms)

    def _connect_reader(self) -> sqlite3.Connection:
        if self.read_only and self.path is not None:
            check_read_only_location(self.path)
            return connect_read_only(self.path, busy_timeout_ms=self.busy_timeout_ms)
        # `query_only` makes a reader connection unable to write even by mistake.
        return connect(self._location, busy_timeout_ms=self.busy_timeout_ms, query_only=True)

    def _open_store(self, conn: sqlite3.Connection) -> str:
        if self.read_only:
            return verify_store(conn, reference_schema(), location=self._location)
        store_id = prepare_store(conn, reference_schema(), location=self._location)
        if self._was_empty:
            # A 0-byte file is not a store; a writing open initialises it, and says so.
            _log.warning(
                "sqlite: %s was an empty file (0 bytes); initialised a new session store in it", self._location
            )
            self._was_empty = False
        return store_id

    def _refuse_read_only(self, what: str) -> None:
        if self.read_only:
            raise StoreMisconfiguredError(
                f"cannot {what}: the SQLite session store {self._location} was opened read-only",
                location=self._location,
            )

    async def close(self) -> None:
        """Release every writer lock and close every connection on its own thread (idempotent)."""
        if self._state == "closed":
            return
        writer, readers = self._writer, self._readers
        self._state, self._writer, self._readers = "closed", None, []
        if self._locks is not None:
            await asyncio.to_thread(self._locks.release_all)
        if writer is not None:
            await self._translate(self._close_lanes(writer, readers), "close the store", None)

    @staticmethod
    async def _close_lanes(writer: _Lane, readers: Sequence[_Lane]) -> None:
        errors: list[BaseException] = []
        for lane in {id(lane): lane for lane in (writer, *readers)}.values():
            try:
                await lane.close()
            except Exception as error:
                errors.append(error)
        if errors:
            raise errors[0]

    # ----------------------------------------------------------------------------------------------
    # Plumbing

    def _lanes(self) -> tuple[_Lane, list[_Lane]]:
        if self._state != "open" or self._writer is None:
            raise PersistenceClosedError(
                "the sqlite backend is closed" if self._state == "closed" else "the sqlite backend is not open"
            )
        return self._writer, self._readers

    def _reader(self) -> _Lane:
        _, readers = self._lanes()
        return min(readers, key=lambda lane: lane.pending)

    async def _translate(self, work: Awaitable[T], what: str, session_id: str | None) -> T:
        """Await `work`, translating driver and OS failures into `PersistenceIOError`.

        This is the single boundary where `sqlite3` errors (including "database is locked" after
        the busy timeout) become dsh errors; everything above sees only persistence errors.
        """
        try:
            return await work
        except (sqlite3.Error, OSError, UnicodeError) as error:
            # UnicodeError: a string the driver cannot bind (a lone surrogate); lookups of such
            # ids are answered before reaching here (nothing can be stored under them).
            raise PersistenceIOError(
                f"sqlite: cannot {what}: {error}", session_id=session_id, location=self._location
            ) from error

    def _revision(self, incarnation: str, revision: int) -> Revision:
        return Revision(f"sqlite:{self._store_id}:{incarnation}:{revision}")

    # ----------------------------------------------------------------------------------------------
    # Reads

    async def list_headers(
        self, *, parents: ParentFilter | None = None
    ) -> tuple[list[HeaderRow], list[DamagedSession]]:
        """Stored header records from `sessions` rows only, sorted by `(created_at, id)`.

        A parent filter is answered by the partial `sessions_by_parent` index (`parent_session = ?`
        for one parent, `parent_session IN (...)` in chunks of `_IN_CHUNK` ids for more; a None in
        `parents` reads the parentless rows). Every row is a complete typed record (STRICT
        columns), so nothing here is ever reported as damaged; the coordinator validates the
        records.
        """
        ids = None if parents is None else sorted(p for p in parents if p is not None and _bindable(p))
        orphans = parents is not None and None in parents

        def run(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            if ids is None:
                return conn.execute(_LIST + " ORDER BY created_at, id").fetchall()
            with _read_transaction(conn):
                found: list[tuple[Any, ...]] = []
                for start in range(0, len(ids), _IN_CHUNK):
                    chunk = ids[start : start + _IN_CHUNK]
                    marks = ", ".join("?" * len(chunk))
                    where = "parent_session = ?" if len(chunk) == 1 else f"parent_session IN ({marks})"
                    found.extend(conn.execute(f"{_LIST} WHERE {where}", chunk).fetchall())
                if orphans:
                    found.extend(conn.execute(_LIST + " WHERE parent_session IS NULL").fetchall())
            found.sort(key=lambda row: (row[2], row[0]))
            return found

        if ids is not None and not ids and not orphans:
            return [], []
        rows = await self._translate(self._reader().run(run), "list sessions", None)
        return [HeaderRow(header_record(row[0], row[1:9]), self._revision(row[9], row[10])) for row in rows], []

    async def exists(self, session_id: str) -> bool:
        """Whether a `sessions` row exists for the id."""

        def run(conn: sqlite3.Connection) -> bool:
            return conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is not None

        if not _bindable(session_id):
            return False
        return await self._translate(self._reader().run(run), f'look up session "{session_id}"', session_id)

    async def read_revision(self, session_id: str) -> Revision | None:
        """The current revision from one `sessions` row, or None."""

        def run(conn: sqlite3.Connection) -> tuple[str, int] | None:
            row = conn.execute("SELECT incarnation, revision FROM sessions WHERE id = ?", (session_id,)).fetchone()
            return None if row is None else (row[0], row[1])

        if not _bindable(session_id):
            return None
        found = await self._translate(self._reader().run(run), f'read the revision of "{session_id}"', session_id)
        return None if found is None else self._revision(*found)

    async def load(self, session_id: str) -> StoredLog | None:
        """The `sessions` row and every event row, read in one read transaction (one snapshot).

        Raises:
            SessionCorruptionError: A row that does not decode, a seq that breaks contiguity, or
                a row count that disagrees with the stored next seq.
        """

        def run(conn: sqlite3.Connection) -> StoredLog | None:
            with _read_transaction(conn):
                row = conn.execute(_SESSION_ROW, (session_id,)).fetchone()
                if row is None:
                    return None
                rows = [] if row[0] != 0 else conn.execute(ALL_EVENTS, (session_id, 0)).fetchall()
            header = header_record(session_id, row)
            revision = self._revision(row[_INCARNATION], row[_REVISION])
            if row[0] != 0:
                # A foreign version may encode its rows differently: leave them unread so the
                # coordinator's version refusal is what the caller sees, never corruption.
                return StoredLog(header=header, events=[], revision=revision)
            events, oversized = decode_event_rows(session_id, rows, first_seq=0)
            if len(events) != row[_NEXT_SEQ]:
                raise corrupt(
                    session_id, f"the session row expects {row[_NEXT_SEQ]} events but {len(events)} are stored"
                )
            return StoredLog(header=header, events=events, revision=revision, oversized_int_at=oversized)

        if not _bindable(session_id):
            return None
        return await self._translate(self._reader().run(run), f'load session "{session_id}"', session_id)

    async def load_typed(
        self, session_id: str, types: frozenset[str] | None, from_seq: int, known: frozenset[str]
    ) -> StoredLog | None:
        """Only the rows with `seq >= from_seq` and a type in `types` (all types when None).

        Matching rows come through `events_by_type` (`type IN (...)`), so rows of other types are
        never read or decoded. The refusal check still covers the whole log: the distinct types of
        the session are walked with an index skip-scan (`type > ? ORDER BY type LIMIT 1`, one probe
        per distinct type) and `first_unknown` is the earliest non-ignorable row whose type is not
        in `known`.

        Raises:
            SessionCorruptionError: A matching row does not decode, or the last stored seq
                disagrees with the stored next seq.
        """
        type_list = None if types is None else sorted(types)

        def run(conn: sqlite3.Connection) -> StoredLog | None:
            with _read_transaction(conn):
                row = conn.execute(_SESSION_ROW, (session_id,)).fetchone()
                if row is None:
                    return None
                if row[0] != 0:
                    return StoredLog(
                        header=header_record(session_id, row),
                        events=[],
                        revision=self._revision(row[_INCARNATION], row[_REVISION]),
                    )
                rows = typed_rows(conn, session_id, type_list, from_seq)
                first_unknown = first_unknown_type(conn, session_id, known)
                last = conn.execute(
                    "SELECT seq FROM events WHERE session_id = ? ORDER BY seq DESC LIMIT 1", (session_id,)
                ).fetchone()
            stored_next = 0 if last is None else last[0] + 1
            if stored_next != row[_NEXT_SEQ]:
                raise corrupt(
                    session_id,
                    f"the session row expects {row[_NEXT_SEQ]} events but the last stored seq is "
                    f"{None if last is None else last[0]}",
                )
            first = max(from_seq, 0) if type_list is None else None
            events, oversized = decode_event_rows(session_id, rows, first_seq=first)
            return StoredLog(
                header=header_record(session_id, row),
                events=events,
                revision=self._revision(row[_INCARNATION], row[_REVISION]),
                first_unknown=first_unknown,
                oversized_int_at=oversized,
                next_seq=stored_next,
            )

        if not _bindable(session_id):
            return None
        return await self._translate(self._reader().run(run), f'read events of session "{session_id}"', session_id)

    # ----------------------------------------------------------------------------------------------
    # Writes

    async def append_batch(
        self, header: FrozenDict, events: Sequence[SessionEvent], *, materialized: bool, fence: Fence | None
    ) -> Revision:
        """Durably append `events` in one `BEGIN IMMEDIATE` transaction (all or nothing).

        With `materialized=False` the `sessions` row (fresh incarnation) and the batch commit
        together, so nothing is visible before the first batch. The seq check runs before any
        write. `fence` is unused: file stores guard writers with `flock` (docs/storage-format.md#writer-locks).

        Raises:
            AppendConflictError: The batch does not start at the stored next seq, or its seqs are
                not contiguous (`APPEND_SEQ_MISMATCH`); nothing was written.
            SessionAlreadyExistsError: Materializing an id that is already stored.
            PersistenceIOError: The driver failed, including a busy timeout; nothing was written.
        """
        session_id = str(header["id"])
        self._refuse_read_only(f'write session "{session_id}"')
        writer, _ = self._lanes()
        batch = tuple(events)
        return await self._translate(
            writer.run(
                lambda conn: self._append(
                    conn, session_id=session_id, header=header, events=batch, materialized=materialized
                )
            ),
            f'append to session "{session_id}"',
            session_id,
        )

    def _append(
        self,
        conn: sqlite3.Connection,
        *,
        session_id: str,
        header: Mapping[str, Any],
        events: Sequence[SessionEvent],
        materialized: bool,
    ) -> Revision:
        # Encode before taking the write lock: the lock is held only for the database work.
        rows = [event_row(session_id, event) for event in events]
        first_seq: int | None = rows[0][1] if rows else None
        for offset, row in enumerate(rows):
            expected = rows[0][1] + offset
            if row[1] != expected:
                raise AppendConflictError(
                    f'batch for session "{session_id}" is not contiguous: expected seq {expected}, got {row[1]}',
                    session_id=session_id,
                )
        # BEGIN IMMEDIATE takes the database write lock now (waiting up to busy_timeout), so the
        # next-seq check and the inserts see and change one state: no other writer can slip in.
        conn.execute("BEGIN IMMEDIATE")
        try:
            current = conn.execute(
                "SELECT next_seq, incarnation, revision FROM sessions WHERE id = ?", (session_id,)
            ).fetchone()
            if not materialized:
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
                stored_next = current[0]
            if first_seq is not None and first_seq != stored_next:
                raise AppendConflictError(
                    f'append to session "{session_id}" starts at seq {first_seq} but the stored next seq is '
                    f"{stored_next} (stale writer)",
                    session_id=session_id,
                )
            if current is None:
                incarnation, revision = uuid.uuid4().hex, 1
                conn.execute(INSERT_SESSION, (session_id, *header_columns(header), incarnation, 1, len(rows)))
            elif rows:
                incarnation, revision = current[1], current[2] + 1
                conn.execute(
                    "UPDATE sessions SET revision = ?, next_seq = ? WHERE id = ?",
                    (revision, stored_next + len(rows), session_id),
                )
            else:
                incarnation, revision = current[1], current[2]
            self._insert_events(conn, rows)
            # With synchronous=FULL the WAL is fsynced before COMMIT returns: durable on return.
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn, session_id, self._location)
            raise
        return self._revision(incarnation, revision)

    @staticmethod
    def _insert_events(conn: sqlite3.Connection, rows: Sequence[tuple[Any, ...]]) -> None:
        """The write step of every batch, inside its transaction.

        One primitive, so that a test can fail it on one instance after part (or all) of the rows
        went in, and see the transaction roll back (`dsh.testing.io_faults`).
        """
        conn.executemany(INSERT_EVENT, rows)

    def start_append(
        self,
        header: FrozenDict,
        events: Sequence[SessionEvent],
        *,
        fence: Fence | None,
        done: Callable[[BaseException | None], object],
    ) -> None:
        """`EagerAppends`: queue the append on the writer thread now; `done(error)` runs on the loop.

        The same transaction as `append_batch(..., materialized=True)`, with the same error
        translation, without a task or a future chain around it
        (docs/architecture.md#from-append-to-the-acknowledgement).

        Raises:
            PersistenceClosedError: The backend is not open.
            StoreMisconfiguredError: The backend was opened read-only.
        """
        session_id = str(header["id"])
        self._refuse_read_only(f'write session "{session_id}"')
        writer, _ = self._lanes()
        batch = tuple(events)
        location = self._location

        def append(conn: sqlite3.Connection) -> Revision:
            try:
                return self._append(conn, session_id=session_id, header=header, events=batch, materialized=True)
            except (sqlite3.Error, OSError, UnicodeError) as error:
                raise PersistenceIOError(
                    f'sqlite: cannot append to session "{session_id}": {error}',
                    session_id=session_id,
                    location=location,
                ) from error

        writer.start(append, asyncio.get_running_loop(), done)

    async def commit_repair(
        self, header: FrozenDict, torn: TornMarker | None, closers: Sequence[SessionEvent], *, fence: Fence | None
    ) -> Revision:
        """Append the closers as one batch: a transactional store never has a torn tail.

        Raises:
            ValueError: `torn` is not None (this backend never reports a torn marker).
        """
        if torn is not None:
            raise ValueError("the sqlite backend never reports torn tails, so it cannot remove one")
        return await self.append_batch(header, closers, materialized=True, fence=fence)

    async def acquire(self, session_id: str) -> Fence | None:
        """Take the session's exclusive `flock` under `<db path>.locks/` (in a worker thread).

        Raises:
            LeaseHeldError: Another process (or backend instance) writes the session.
        """
        self._lanes()
        self._refuse_read_only(f'take the writer lock of session "{session_id}"')
        if self._locks is not None:
            await asyncio.to_thread(self._locks.acquire, session_id)
        return None

    async def release(self, session_id: str) -> None:
        """Release the session's writer lock, if held."""
        if self._locks is not None:
            await asyncio.to_thread(self._locks.release, session_id)

    def locate(self, header: Mapping[str, Any]) -> str | None:
        """None: sessions are rows, not artifacts with paths."""
        return None

    # ----------------------------------------------------------------------------------------------
    # Diagnostics

    async def connection_settings(self) -> list[dict[str, object]]:
        """The pragmas each open connection reports (writer first), for `dsh doctor` and tests."""

        def run(conn: sqlite3.Connection) -> dict[str, object]:
            names = ("journal_mode", "synchronous", "foreign_keys", "busy_timeout", "trusted_schema", "query_only")
            return {name: conn.execute(f"PRAGMA {name}").fetchone()[0] for name in names}

        writer, readers = self._lanes()
        lanes = [writer, *[lane for lane in readers if lane is not writer]]
        return [await self._translate(lane.run(run), "read connection settings", None) for lane in lanes]


# --------------------------------------------------------------------------------------------------
# Helpers run on lane threads


def _report(loop: asyncio.AbstractEventLoop, done: _Done, finished: Future[object]) -> None:
    """Hand a lane job's outcome to `done` on the loop (on the lane's thread, as the job settles)."""
    error = PersistenceClosedError("the sqlite backend closed") if finished.cancelled() else finished.exception()
    # RuntimeError: the loop is closed, so nobody waits for this outcome any more.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(done, error)


def _bindable(value: str) -> bool:
    """Whether the driver can bind `value` (UTF-8); an id holding a lone surrogate never can, so
    nothing is stored under it and a lookup answers "not stored" instead of a driver error."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@contextlib.contextmanager
def _read_transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """One snapshot for several SELECTs: under WAL a read transaction never blocks the writer."""
    conn.execute("BEGIN")
    try:
        yield
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")


def _rollback(conn: sqlite3.Connection, session_id: str, location: str) -> None:
    if not conn.in_transaction:
        return
    try:
        conn.execute("ROLLBACK")
    except sqlite3.Error as failure:
        raise PersistenceIOError(
            f'sqlite: failed to roll back the append to session "{session_id}": {failure}',
            session_id=session_id,
            location=location,
        ) from failure  # the append's own error stays attached as the failure's __context__


# Shown under the name users import (docs/architecture.md#public-names).
SqliteBackend.__module__ = "dsh"
