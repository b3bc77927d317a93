"""The SQLite session store's schema, connection set-up, open checks, event queries and row codecs.

Layer: persistence (private to `dsh.persistence.sqlite`, which re-exports what the SQLite fixture
writer in `dsh.testing.sqlite_writer` and tools need). Everything here is synchronous and blocking:
callers run it on a worker thread, never on the event loop. The schema is
docs/storage-format.md#sqlite-schema: a database is this store only when its application id, user
version and schema objects all match; anything else is refused as `STORE_FORMAT_UNSUPPORTED`, so an
upstream or foreign database is never written to.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import stat
import time as _time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

import orjson

from dsh.json import FrozenDict
from dsh.persistence.base import first_oversized_int
from dsh.persistence.errors import SessionCorruptionError, StoreFormatUnsupportedError, StoreMisconfiguredError

__all__ = [
    "ALL_EVENTS",
    "APPLICATION_ID",
    "INSERT_EVENT",
    "INSERT_SESSION",
    "SCHEMA",
    "USER_VERSION",
    "check_read_only_location",
    "configure",
    "connect",
    "connect_read_only",
    "corrupt",
    "decode_event_rows",
    "ensure_safe_location",
    "event_row",
    "first_unknown_type",
    "header_columns",
    "header_record",
    "open_store",
    "prepare_store",
    "reference_schema",
    "typed_rows",
    "verify_store",
]

APPLICATION_ID: Final = 0x44535059
"""`PRAGMA application_id` of a dsh session store: the ASCII bytes "DSPY"."""

USER_VERSION: Final = 1
"""`PRAGMA user_version` of the schema this build reads and writes."""

SCHEMA: Final[tuple[str, ...]] = (
    "CREATE TABLE store (singleton INTEGER PRIMARY KEY CHECK (singleton = 1), store_id TEXT NOT NULL) STRICT",
    "CREATE TABLE sessions ("
    "id TEXT PRIMARY KEY, version INTEGER NOT NULL, created_at INTEGER NOT NULL, "
    "cwd TEXT, parent_session TEXT, seed_length INTEGER NOT NULL DEFAULT 0, "
    "origin TEXT CHECK (origin IS NULL OR origin = 'subagent'), "
    "delegation_depth INTEGER NOT NULL DEFAULT 0, agent_preset TEXT, "
    "incarnation TEXT NOT NULL, revision INTEGER NOT NULL, next_seq INTEGER NOT NULL) STRICT",
    # `data` holds the exact orjson text of `event.data`; the two optional JSON columns are NULL
    # when the key is absent (so `'[]'` stays distinguishable from "no sourceEventSeqs").
    "CREATE TABLE events ("
    "session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE, "
    "seq INTEGER NOT NULL, type TEXT NOT NULL, time INTEGER NOT NULL, "
    "data TEXT NOT NULL, source_event_seqs TEXT, surface_op TEXT, "
    "ignorable INTEGER CHECK (ignorable IS NULL OR ignorable = 1), "
    "PRIMARY KEY (session_id, seq)) STRICT",
    "CREATE INDEX sessions_by_parent ON sessions(parent_session, created_at, id) WHERE parent_session IS NOT NULL",
    "CREATE INDEX events_by_type ON events(session_id, type, seq)",
)
"""The schema statements, in creation order."""

HEADER_COLUMNS: Final = "version, created_at, cwd, parent_session, seed_length, origin, delegation_depth, agent_preset"
EVENT_COLUMNS: Final = "seq, type, time, data, ignorable, source_event_seqs, surface_op"

_LONG_DIGITS: Final = re.compile(r"[0-9]{19}")

SchemaObjects = list[tuple[str, str, str, str | None]]


def connect(location: str, *, busy_timeout_ms: int, query_only: bool = False) -> sqlite3.Connection:
    """Open and configure one connection (blocking; call it on the thread that will own it).

    `isolation_level=None` hands transaction control to us: every write is an explicit
    `BEGIN IMMEDIATE ... COMMIT`, every multi-statement read an explicit `BEGIN ... COMMIT`.
    The driver's `timeout` installs the busy handler before the first statement, so even the
    `journal_mode` switch below waits for a competing writer instead of failing at once.
    """
    conn = sqlite3.connect(location, timeout=busy_timeout_ms / 1000, isolation_level=None)
    try:
        configure(conn, busy_timeout_ms=busy_timeout_ms, memory=location == ":memory:")
        if query_only:
            conn.execute("PRAGMA query_only=ON")
    except BaseException:
        conn.close()
        raise
    return conn


def connect_read_only(path: Path, *, busy_timeout_ms: int) -> sqlite3.Connection:
    """Open one connection with `mode=ro` (docs/storage-format.md#read-only-opens): it changes nothing.

    No journal-mode switch (that would write the database header), `query_only` on, and
    `trusted_schema` off. SQLite may still replay its own write-ahead log when it opens the file:
    that is its crash recovery, not a change of committed data.
    """
    uri = f"file:{quote(str(path))}?mode=ro"
    conn = sqlite3.connect(uri, uri=True, timeout=busy_timeout_ms / 1000, isolation_level=None)
    try:
        conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        conn.execute("PRAGMA trusted_schema=OFF")
        conn.execute("PRAGMA query_only=ON")
    except BaseException:
        conn.close()
        raise
    return conn


def check_read_only_location(path: Path) -> None:
    """Refuse, without creating anything, a store a read-only open cannot use.

    Raises:
        StoreMisconfiguredError: Nothing at `path`, a symbolic link, not a regular file, or an
            empty (0-byte) file, which only a writing open initialises.
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise StoreMisconfiguredError(
            f"no SQLite session store at {path}: nothing has been stored there yet "
            "(a read-only command creates no file; a writing command such as `dsh run` creates it)",
            location=str(path),
        ) from None
    if stat.S_ISLNK(info.st_mode):
        raise StoreMisconfiguredError(f"unsafe SQLite store {path}: it is a symbolic link", location=str(path))
    if not stat.S_ISREG(info.st_mode):
        raise StoreMisconfiguredError(f"the SQLite store {path} is not a regular file", location=str(path))
    if info.st_size == 0:
        raise StoreMisconfiguredError(
            f"the SQLite session store {path} is an empty file (0 bytes): it holds no store; a read-only "
            "command leaves it alone, and a writing command (such as `dsh run`) initialises it",
            location=str(path),
        )


def verify_store(conn: sqlite3.Connection, reference: SchemaObjects, *, location: str) -> str:
    """Verify an existing store without writing anything (read-only opens); return the store id.

    Raises:
        StoreMisconfiguredError: The database holds no store yet (only a writing open creates one).
        StoreFormatUnsupportedError: A foreign application id, another schema version (an older
            one names the command that would migrate it), or schema objects that differ.
    """
    conn.execute("BEGIN")
    try:
        application_id = int(conn.execute("PRAGMA application_id").fetchone()[0])
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        objects = _schema_objects(conn)
        if application_id == 0 and version == 0 and not objects:
            raise StoreMisconfiguredError(
                f"the SQLite database {location} holds no dsh session store yet; a read-only command does not "
                "create one (a writing command such as `dsh run` does)",
                location=location,
            )
        _check_existing(
            application_id=application_id, version=version, objects=objects, reference=reference, location=location
        )
        row = conn.execute("SELECT store_id FROM store WHERE singleton = 1").fetchone()
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")
    if row is None:
        raise StoreFormatUnsupportedError(
            f"SQLite store {location} has no store identity row; it was not created by this build",
            location=location,
        )
    return str(row[0])


def configure(conn: sqlite3.Connection, *, busy_timeout_ms: int, memory: bool) -> None:
    """Apply the per-connection pragmas in order (docs/storage-format.md#sqlite-pragmas).

    WAL first, outside any transaction (SQLite cannot switch journal modes inside one), and read
    back: a file system that cannot do WAL would silently keep a rollback journal, where readers
    block behind writers. `synchronous=FULL` makes a committed append survive power loss (WAL
    frames are fsynced at every commit). `trusted_schema=OFF` stops schema-embedded SQL functions
    from running with our privileges should the file be tampered with.
    """
    mode = _switch_to_wal(conn, busy_timeout_ms)
    expected = "memory" if memory else "wal"
    if str(mode).lower() != expected:
        raise StoreMisconfiguredError(
            f"the SQLite database cannot use write-ahead logging (journal_mode is {mode!r}); "
            "place it on a local file system"
        )
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
    conn.execute("PRAGMA trusted_schema=OFF")


def _switch_to_wal(conn: sqlite3.Connection, busy_timeout_ms: int) -> object:
    """`PRAGMA journal_mode=WAL`, retried while another connection holds the file during its own switch.

    Two connections converting one brand-new file at once can get "database is locked" at once:
    SQLite skips its busy handler when waiting could deadlock. The retry is bounded by the busy
    timeout and runs on the connection's worker thread, never on the event loop.
    """
    deadline = _time.monotonic() + busy_timeout_ms / 1000
    while True:
        try:
            return conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) and "busy" not in str(error):
                raise
            if _time.monotonic() >= deadline:
                raise
            _time.sleep(0.005)


def reference_schema() -> SchemaObjects:
    """The schema objects a correct store holds, built from `SCHEMA` in a private in-memory database."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        for statement in SCHEMA:
            conn.execute(statement)
        return _schema_objects(conn)
    finally:
        conn.close()


def _schema_objects(conn: sqlite3.Connection) -> SchemaObjects:
    # Internal objects (`sqlite_autoindex_*`, `sqlite_stat*` after an ANALYZE) follow from the
    # declared ones or are harmless; the declared SQL text is what must match exactly.
    rows = conn.execute(
        "SELECT type, name, tbl_name, sql FROM sqlite_schema WHERE name NOT LIKE 'sqlite\\_%' ESCAPE '\\' "
        "ORDER BY type, name"
    ).fetchall()
    return [(str(kind), str(name), str(table), sql) for kind, name, table, sql in rows]


def _describe_application_id(value: int) -> str:
    raw = value.to_bytes(4, "big", signed=value < 0)
    text = raw.decode("ascii", "replace") if all(32 <= b < 127 for b in raw) else None
    return f"0x{value & 0xFFFFFFFF:08X}" + (f' ("{text}")' if text else "")


def prepare_store(conn: sqlite3.Connection, reference: SchemaObjects, *, location: str) -> str:
    """Initialise a pristine database or verify an existing one; return the store id.

    Runs inside `BEGIN IMMEDIATE` so two processes opening one new file cannot both initialise it:
    the second waits for the first's commit and then finds a complete store.

    Raises:
        StoreFormatUnsupportedError: A foreign application id, an unknown user version, schema
            objects that differ from `reference`, or a missing store row.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        application_id = int(conn.execute("PRAGMA application_id").fetchone()[0])
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        objects = _schema_objects(conn)
        if application_id == 0 and version == 0 and not objects:
            for statement in SCHEMA:
                conn.execute(statement)
            conn.execute("INSERT INTO store (singleton, store_id) VALUES (1, ?)", (str(uuid.uuid4()),))
            conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version={USER_VERSION}")
        else:
            _check_existing(
                application_id=application_id, version=version, objects=objects, reference=reference, location=location
            )
        row = conn.execute("SELECT store_id FROM store WHERE singleton = 1").fetchone()
        if row is None:
            raise StoreFormatUnsupportedError(
                f"SQLite store {location} has no store identity row; it was not created by this build",
                location=location,
            )
        conn.execute("COMMIT")
        return str(row[0])
    except BaseException:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise


def _check_existing(
    *,
    application_id: int,
    version: int,
    objects: SchemaObjects,
    reference: SchemaObjects,
    location: str,
) -> None:
    if application_id != APPLICATION_ID:
        found = (
            "no application id" if application_id == 0 else f"application id {_describe_application_id(application_id)}"
        )
        raise StoreFormatUnsupportedError(
            f"{location} is not a dsh session store ({found}; expected {_describe_application_id(APPLICATION_ID)}); "
            "upstream and foreign databases are not read or written (exchange sessions as JSONL instead)",
            location=location,
        )
    if version != USER_VERSION:
        direction = (
            "newer than this build (upgrade dsh to open it)"
            if version > USER_VERSION
            else ("older than this build, and there is no migration path")
        )
        raise StoreFormatUnsupportedError(
            f"SQLite store {location} has schema version {version}, this build supports {USER_VERSION}: "
            f"the store is {direction}",
            location=location,
        )
    if objects != reference:
        raise StoreFormatUnsupportedError(
            f"SQLite store {location} declares schema version {USER_VERSION} but its tables or indexes differ "
            "from the schema this build expects",
            location=location,
        )


def open_store(path: Path, *, busy_timeout_ms: int) -> sqlite3.Connection:
    """A configured writing connection to the store at `path`, initialised or verified as `open` does.

    The location is checked (and created) like the backend's, then the store is initialised when
    pristine or verified otherwise. Blocking: call it on the thread that will own the connection.

    Raises:
        StoreMisconfiguredError: An unsafe location or no WAL support.
        StoreFormatUnsupportedError: A foreign or unknown database.
    """
    ensure_safe_location(path)
    conn = connect(str(path), busy_timeout_ms=busy_timeout_ms)
    try:
        prepare_store(conn, reference_schema(), location=str(path))
    except BaseException:
        conn.close()
        raise
    return conn


def ensure_safe_location(path: Path) -> None:
    """Check (and create if missing) the database's directory and file, refusing unsafe ones.

    The directory must belong to the user and be writable by nobody else (new directories are
    created 0700): anyone who can write it can swap the database or its `-wal` file. A directory
    others may only read or enter (such as a 0755 home folder) is accepted, because the database
    files themselves are private. The database must be a regular file, not a
    symlink, owned by the user and readable by nobody else; a new one is created 0600 before
    SQLite touches it (SQLite gives its `-wal`/`-shm` files the database's mode).

    Raises:
        StoreMisconfiguredError: The location is unsafe or not a regular file.
        OSError: The directory or file cannot be created or examined.
    """
    parent = path.parent
    if not parent.exists():
        parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = parent.stat()
    uid = os.geteuid()
    if not stat.S_ISDIR(info.st_mode):
        raise StoreMisconfiguredError(f"the SQLite store's directory {parent} is not a directory", location=str(path))
    if info.st_uid != uid or info.st_mode & 0o022:
        raise StoreMisconfiguredError(
            f"unsafe SQLite store directory {parent}: it must belong to you and be writable by nobody else "
            f"(found owner uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):04o})",
            location=str(path),
        )
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        pass
    else:
        try:
            os.fchmod(fd, 0o600)
            os.fsync(fd)
        finally:
            os.close(fd)
        # Durable creation: the directory entry must survive a crash too.
        dir_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise StoreMisconfiguredError(f"unsafe SQLite store {path}: it is a symbolic link", location=str(path))
    if not stat.S_ISREG(info.st_mode):
        raise StoreMisconfiguredError(f"the SQLite store {path} is not a regular file", location=str(path))
    if info.st_uid != uid or info.st_mode & 0o077:
        raise StoreMisconfiguredError(
            f"unsafe SQLite store {path}: it must belong to you and have mode 0600 "
            f"(found owner uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):04o})",
            location=str(path),
        )


# --------------------------------------------------------------------------------------------------
# Event queries (typed reads use the `events_by_type` index)

INSERT_EVENT: Final = (
    "INSERT INTO events (session_id, seq, type, time, data, source_event_seqs, surface_op, ignorable) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
INSERT_SESSION: Final = (
    "INSERT INTO sessions (id, version, created_at, cwd, parent_session, seed_length, origin, delegation_depth, "
    "agent_preset, incarnation, revision, next_seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
ALL_EVENTS: Final = (
    "SELECT seq, type, time, data, ignorable, source_event_seqs, surface_op "
    "FROM events WHERE session_id = ? AND seq >= ? ORDER BY seq"
)
TYPED_EVENTS: Final = (
    "SELECT seq, type, time, data, ignorable, source_event_seqs, surface_op "
    "FROM events INDEXED BY events_by_type WHERE session_id = ? AND type IN ({marks}) AND seq >= ? ORDER BY seq"
)


def typed_rows(
    conn: sqlite3.Connection, session_id: str, types: list[str] | None, from_seq: int
) -> list[tuple[Any, ...]]:
    """The event rows with `seq >= from_seq` whose type is in `types` (all when None), by seq."""
    if types is None:
        return conn.execute(ALL_EVENTS, (session_id, from_seq)).fetchall()
    if not types:
        return []
    marks = ", ".join("?" * len(types))
    # INDEXED BY pins the plan: with several types the planner may otherwise walk the primary key
    # from `from_seq` and filter, reading every row; this reads only matching index entries.
    sql = TYPED_EVENTS.format(marks=marks)  # only "?" placeholders are spliced in; values stay bound
    return conn.execute(sql, (session_id, *types, from_seq)).fetchall()


def first_unknown_type(conn: sqlite3.Connection, session_id: str, known: frozenset[str]) -> tuple[str, int] | None:
    """The earliest non-ignorable row of a type outside `known`, by an index skip-scan over types."""
    best: tuple[str, int] | None = None
    found = conn.execute("SELECT type FROM events WHERE session_id = ? ORDER BY type LIMIT 1", (session_id,)).fetchone()
    while found is not None:
        kind: str = found[0]
        if kind not in known:
            hit = conn.execute(
                "SELECT seq FROM events WHERE session_id = ? AND type = ? AND ignorable IS NULL ORDER BY seq LIMIT 1",
                (session_id, kind),
            ).fetchone()
            if hit is not None and (best is None or hit[0] < best[1]):
                best = (kind, hit[0])
        found = conn.execute(
            "SELECT type FROM events WHERE session_id = ? AND type > ? ORDER BY type LIMIT 1", (session_id, kind)
        ).fetchone()
    return best


# --------------------------------------------------------------------------------------------------
# Row codecs


def header_columns(header: Mapping[str, Any]) -> tuple[Any, ...]:
    """The `sessions` header column values, in table order (version through agent_preset)."""
    return (
        header.get("version"),
        header.get("createdAt"),
        header.get("cwd"),
        header.get("parentSession"),
        header.get("seedLength", 0),
        header.get("origin"),
        header.get("delegationDepth", 0),
        header.get("agentPreset"),
    )


def header_record(session_id: str, row: Sequence[Any]) -> FrozenDict:
    """Rebuild the stored header record from `sessions` columns, in the upstream key order.

    `seedLength` appears only when nonzero (an unseeded header omits it, as on disk in JSONL);
    a nonzero negative value is kept so the read pipeline reports it instead of hiding it.
    """
    version, created_at, cwd, parent_session, seed_length, origin, delegation_depth, agent_preset = row[:8]
    out: dict[str, Any] = {"type": "session", "version": version, "id": session_id, "createdAt": created_at}
    if cwd is not None:
        out["cwd"] = cwd
    if parent_session is not None:
        out["parentSession"] = parent_session
    if seed_length != 0:
        out["seedLength"] = seed_length
    if origin is not None:
        out["origin"] = origin
    out["delegationDepth"] = delegation_depth
    if agent_preset is not None:
        out["agentPreset"] = agent_preset
    return FrozenDict(out)


def event_row(session_id: str, event: Mapping[str, Any]) -> tuple[Any, ...]:
    """The `events` row of one event: `data` is the exact `orjson` text of `event["data"]`."""
    sources = event.get("sourceEventSeqs")
    surface = event.get("surfaceOp")
    return (
        session_id,
        event["seq"],
        event["type"],
        event["time"],
        orjson.dumps(event["data"]).decode(),
        None if sources is None else orjson.dumps(sources).decode(),
        None if surface is None else orjson.dumps(surface).decode(),
        1 if event.get("ignorable") is True else None,
    )


def corrupt(session_id: str, problem: str) -> SessionCorruptionError:
    """The corruption verdict for a stored session, worded like the read pipeline's."""
    return SessionCorruptionError(f'stored session "{session_id}" failed validation: {problem}', session_id=session_id)


def _oversized(texts: Sequence[str | None]) -> bool:
    for text in texts:
        if text is not None and _LONG_DIGITS.search(text) is not None and first_oversized_int([text.encode()]) == 0:
            return True
    return False


def decode_event_rows(
    session_id: str, rows: Sequence[tuple[Any, ...]], *, first_seq: int | None
) -> tuple[list[dict[str, Any]], int | None]:
    """Rebuild records in canonical key order; check contiguity from `first_seq` when given.

    Returns the records and the index of the first one holding an integer outside signed 64 bits
    (which `orjson` would silently turn into a float).
    """
    records: list[dict[str, Any]] = []
    oversized: int | None = None
    for index, (seq, kind, time, data, ignorable, sources, surface) in enumerate(rows):
        if first_seq is not None and seq != first_seq + index:
            raise corrupt(session_id, f"seq gap in the stored events (expected {first_seq + index}, got {seq})")
        try:
            record: dict[str, Any] = {"type": kind, "seq": seq, "time": time, "data": orjson.loads(data)}
            if ignorable is not None:
                record["ignorable"] = True
            if sources is not None:
                record["sourceEventSeqs"] = orjson.loads(sources)
            if surface is not None:
                record["surfaceOp"] = orjson.loads(surface)
        except orjson.JSONDecodeError as error:
            raise corrupt(session_id, f"event row at seq {seq} does not decode as JSON ({error})") from error
        if oversized is None and _oversized((data, sources, surface)):
            oversized = index
        records.append(record)
    return records, oversized
