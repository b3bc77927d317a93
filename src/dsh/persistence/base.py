"""The persistence contract: what the rest of dsh sees, and the hooks a storage backend implements.

Layer: persistence. `SessionPersistence` is the service (`Services.persistence`), implemented by
`PersistenceCoordinator` on top of one `StorageBackend`. Backends see stored facts only — the
stored header record, seqs, types, times and JSON payloads — and implement storage; the coordinator
owns orchestration (write-behind batching, per-id serialization, crash repair, the prepared LRU)
and every logical validation, so each rule is written once, above the backends. An optional
ability is a declared `Capability` plus, where it needs a hook of its own, a small protocol that
only the backends declaring it implement (`TypedReads` for `Capability.TYPED_READS`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Final, NewType, Protocol, runtime_checkable

from dsh.errors import ConfigError
from dsh.json import FrozenDict
from dsh.session.events import SessionEvent
from dsh.session.header import SessionHeader

if TYPE_CHECKING:
    from dsh.abort import AbortSignal
    from dsh.session.session import Session

__all__ = [
    "Capability",
    "DamagedSession",
    "EagerAppends",
    "EventSlice",
    "Fence",
    "HeaderRow",
    "ParentFilter",
    "PersistenceObservation",
    "PreparedSession",
    "Revision",
    "SessionListing",
    "SessionPersistence",
    "StorageBackend",
    "StoredLog",
    "StoredSessionInfo",
    "TornMarker",
    "TypedReads",
    "check_parents",
    "eager_appends_of",
    "first_oversized_int",
    "typed_reads_of",
]

Revision = NewType("Revision", str)
"""An opaque token: equal while a log and its store are unchanged; compare with `==` only."""


class Capability(StrEnum):
    """Optional abilities a backend declares explicitly (never guessed from its methods)."""

    TYPED_READS = "typed-reads"
    LEASES = "leases"
    ARTIFACT_PATHS = "artifact-paths"
    EAGER_APPENDS = "eager-appends"


@dataclass(frozen=True, slots=True)
class StoredSessionInfo:
    """One `list()` row: stored header facts only (logical header, never the integer cut)."""

    header: SessionHeader
    revision: Revision


@dataclass(frozen=True, slots=True)
class DamagedSession:
    """A stored entry left out of a listing because it cannot be read or trusted.

    Attributes:
        location: The artifact or folder path (file stores), else the session id.
        code: The error code of the failure (`SESSION_CORRUPT`, `PERSISTENCE_IO`, ...).
        message: What is wrong, for people.
        session_id: The session id when the backend knows it (the header's, or the one a folder
            name encodes), else None.
    """

    location: str
    code: str
    message: str
    session_id: str | None = None


@dataclass(frozen=True, slots=True)
class HeaderRow:
    """One `list_headers` row: the stored header record and its revision, plus the parsed header.

    Attributes:
        record: The stored header record, as stored (not yet validated unless `header` is set).
        revision: The log's revision.
        header: The logical header, when the backend already parsed and validated `record` while
            listing (the JSONL backend does, to report an invalid header as damaged at its path),
            so the coordinator does not validate the same record a second time; None asks the
            coordinator to validate `record`.
    """

    record: FrozenDict
    revision: Revision
    header: SessionHeader | None = None


ParentFilter = frozenset[str | None]
"""A parent filter: the `parentSession` values to keep (None keeps the sessions without a parent)."""


def check_parents(parents: object) -> ParentFilter:
    """A `parents=` argument validated and copied: a collection (not a string) of ids or None.

    An empty collection is valid and keeps nothing (and so does an id nothing is stored under).

    Raises:
        ConfigError: `CONFIG_INVALID` when `parents` is a string or a mapping, is not a
            collection, or holds something else.
    """
    if isinstance(parents, str | bytes | Mapping) or not isinstance(parents, Collection):
        raise ConfigError(f"parents must be a collection of session ids, got {type(parents).__name__}")
    copied: set[str | None] = set()
    for parent in list(parents):
        if parent is not None and type(parent) is not str:
            raise ConfigError(f"parents must hold session ids (str) or None, got {parent!r}")
        copied.add(parent)
    return frozenset(copied)


@dataclass(frozen=True, slots=True)
class SessionListing:
    """The result of `list()`: rows sorted by `(created_at, id)` plus the damaged sessions.

    Iterating it gives the rows.
    """

    rows: list[StoredSessionInfo] = field(default_factory=list)
    damaged: list[DamagedSession] = field(default_factory=list)

    def __iter__(self) -> Iterator[StoredSessionInfo]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)


@dataclass(frozen=True, slots=True)
class PersistenceObservation:
    """What `inspect()` returns: a balanced, deeply immutable logical log and its exact cut."""

    header: SessionHeader
    events: Sequence[SessionEvent]
    inherited_event_count: int
    revision: Revision | None
    live: bool
    synthetic_tail: int
    torn_tail: bool = False
    """A torn tail was found after the stored events (it stays on disk until `prepare` repairs it)."""

    def is_own_seq(self, seq: int) -> bool:
        """True when `seq` lies in the own suffix."""
        return seq >= self.inherited_event_count


@dataclass(frozen=True, slots=True)
class EventSlice:
    """What `read_events()` returns: stored events with `seq >= from_seq` (optionally typed)."""

    header: SessionHeader
    inherited_event_count: int
    revision: Revision
    next_seq: int
    events: Sequence[SessionEvent]


@dataclass(frozen=True, slots=True)
class Fence:
    """A writer token: a lease holder and its generation (PostgreSQL)."""

    session_id: str
    holder: str
    generation: int


@dataclass(frozen=True, slots=True)
class TornMarker:
    """Where a torn tail starts and the complete records recovered from a torn final frame.

    Attributes:
        truncate_to: The byte offset the repair truncates the log to.
        recovered_events: Complete records of a torn final frame, rewritten by the repair.
        removed_bytes: How many bytes the truncation removes.
        removed_records: How many complete, parseable records the removed bytes hold that are not
            recovered; when nonzero the repair keeps a copy of the removed bytes beside the log
            (docs/storage-format.md#torn-tails-and-repair).
    """

    truncate_to: int
    recovered_events: tuple[Mapping[str, Any], ...] = ()
    removed_bytes: int = 0
    removed_records: int = 0


@dataclass(frozen=True, slots=True)
class StoredLog:
    """A backend's `load` result: the stored header record and the parsed records of the valid prefix.

    Attributes:
        header: The stored header record (backends check `version` first).
        events: Parsed records, not yet logically validated; the coordinator validates them.
        revision: The revision of exactly this prefix.
        torn: Present iff a torn tail must be removed before the next write.
        first_unknown: Typed reads: the first unknown non-ignorable `(type, seq)` anywhere in the log.
        oversized_int_at: Index (into `events`) of the first record holding an integer outside
            signed 64 bits; such a log is format-unsupported (`orjson` would turn it into a float).
        location: The artifact path, when the backend has one.
        next_seq: Typed reads: the stored next seq (the whole log's length), since `events` then
            holds only the selected records. None means `len(events)` (a full load).
        verdicts: `dsh.session.fastcheck` verdicts of `events` by position, when the backend took
            them while reading a full load (validation then judges only the uncertain records).
        viewable: The records are fresh parses the read rules accept unchanged (no integer beyond
            64 bits, no `-0.0`) and nobody else holds them, so the read path may hand their payloads
            out as lazily frozen views instead of copying them whole.
    """

    header: Mapping[str, Any]
    events: Sequence[dict[str, Any]]
    revision: Revision
    torn: TornMarker | None = None
    first_unknown: tuple[str, int] | None = None
    oversized_int_at: int | None = None
    location: str | None = None
    next_seq: int | None = None
    verdicts: bytearray | None = None
    viewable: bool = False


class StorageBackend(Protocol):
    """Storage hooks; every method but `locate` is async and blocking work runs off the loop.

    Every backend implements all of them. Optional abilities are declared in `capabilities`; the
    one with a hook of its own, `TYPED_READS`, adds the `TypedReads` protocol.
    """

    name: str
    capabilities: frozenset[Capability]

    async def open(self) -> None:
        """Prepare the store (create or check the schema, sweep stale temp files)."""

    async def list_headers(
        self, *, parents: ParentFilter | None = None
    ) -> tuple[list[HeaderRow], list[DamagedSession]]:
        """Stored header records with their revisions, never reading event bodies.

        `parents` (already validated, see `check_parents`) asks for the records whose
        `parentSession` is in it; None asks for every record. A backend answers the filter from
        its own data (an index) where it can; it may return more rows than asked for, because the
        coordinator filters the validated headers again, but never fewer. The damaged entries are
        always those of the whole store: an entry that cannot be read has no trustworthy parent.
        A row carries the parsed header when the backend already validated its record.
        """

    async def exists(self, session_id: str) -> bool:
        """Whether anything is stored under the id."""

    async def load(self, session_id: str) -> StoredLog | None:
        """The whole stored log, or None when nothing is stored."""

    async def read_revision(self, session_id: str) -> Revision | None:
        """The current revision (one stat plus the last 4 KiB, or one row), or None."""

    async def append_batch(
        self, header: FrozenDict, events: Sequence[SessionEvent], *, materialized: bool, fence: Fence | None
    ) -> Revision:
        """Durably append `events` (all or nothing); materialize header + batch when not yet stored."""

    async def commit_repair(
        self, header: FrozenDict, torn: TornMarker | None, closers: Sequence[SessionEvent], *, fence: Fence | None
    ) -> Revision:
        """Remove the torn tail (if any) and append `closers` as one batch."""

    async def acquire(self, session_id: str) -> Fence | None:
        """Take the session's writer lock or lease (`SESSION_LEASE_HELD` if another holds it)."""

    async def release(self, session_id: str) -> None:
        """Release the writer lock or lease taken by `acquire`."""

    def locate(self, header: Mapping[str, Any]) -> str | None:
        """The artifact path of a stored header without I/O, or None."""

    async def close(self) -> None:
        """Release every resource."""


@runtime_checkable
class TypedReads(Protocol):
    """The hook behind `Capability.TYPED_READS`: read only some event types of a log.

    Implemented exactly by the backends that declare `TYPED_READS` (a test checks that declared
    capabilities and implemented protocols agree); any other backend has no `load_typed` at all,
    and the coordinator answers a typed `read_events` with a full `load` and a filter.
    """

    async def load_typed(
        self, session_id: str, types: frozenset[str] | None, from_seq: int, known: frozenset[str]
    ) -> StoredLog | None:
        """Only the records with `seq >= from_seq` and a type in `types` (all types when None).

        The format facts still cover the whole log: `first_unknown` is the first record whose type
        is not in `known` and is not ignorable, and `next_seq` is the whole log's length. None when
        nothing is stored.
        """


def typed_reads_of(backend: StorageBackend) -> TypedReads | None:
    """The backend's typed reads when it declares `TYPED_READS` and implements `TypedReads`, else None."""
    if Capability.TYPED_READS in backend.capabilities and isinstance(backend, TypedReads):
        return backend
    return None


@runtime_checkable
class EagerAppends(Protocol):
    """The hook behind `Capability.EAGER_APPENDS`: start an append without awaiting it.

    The coordinator uses it for the ordinary appends of a materialized session whose writer lock it
    holds: a flush hands its batch to the backend's writer thread before it suspends and learns the
    outcome from one callback, with no task and no future chain per write
    (docs/architecture.md#from-append-to-the-acknowledgement). Everything else (materialization,
    leases, a busy id) goes through `append_batch`. The shipped backends implement it exactly when
    they declare `EAGER_APPENDS` (JSONL, SQLite), and the coordinator uses it only when both hold, so
    a wrapper that declares what it wraps without forwarding `start_append`
    (`dsh.testing.FaultyBackend`) is written through `append_batch`.
    """

    def start_append(
        self,
        header: FrozenDict,
        events: Sequence[SessionEvent],
        *,
        fence: Fence | None,
        done: Callable[[BaseException | None], object],
    ) -> None:
        """Hand the batch to the backend's writer thread now; `done(error)` runs later on the loop's thread.

        The batch is appended to a materialized log exactly as `append_batch(..., materialized=True)`
        would append it (all or nothing, seq-checked). `done(None)` means it is durable; otherwise the
        error is what `append_batch` would have raised. Must be called on the event loop's thread.

        Raises:
            PersistenceClosedError, StoreMisconfiguredError: The batch was not handed over (`done`
                will not be called).
        """


def eager_appends_of(backend: StorageBackend) -> EagerAppends | None:
    """The backend's eager appends when it declares `EAGER_APPENDS` and implements `EagerAppends`, else None."""
    if Capability.EAGER_APPENDS in backend.capabilities and isinstance(backend, EagerAppends):
        return backend
    return None


class PreparedSession(Protocol):
    """A stored session reserved for resume: holds the writer, the unpublished session and its read.

    An async context manager; `close()` is idempotent and, if the session was never published,
    retires it, returns the observation to the prepared LRU and releases the writer.
    """

    @property
    def session(self) -> Session:
        """The unpublished session built from the repaired log."""

    @property
    def observation(self) -> PersistenceObservation:
        """The (repaired) observation the session was built from, with its exact cut."""

    def publish(self) -> Session:
        """Publish the session in its store (persistence attaches it)."""

    async def close(self) -> None:
        """Release the reservation (see class docs)."""

    async def __aenter__(self) -> PreparedSession:
        """Enter the reservation."""

    async def __aexit__(self, *exc: object) -> None:
        """`close()`."""


class SessionPersistence(Protocol):
    """The persistence service the rest of dsh sees (`Services.persistence`)."""

    async def list(
        self,
        *,
        parent_session: str | None = None,
        parents: Collection[str | None] | None = None,
        signal: AbortSignal | None = None,
    ) -> SessionListing:
        """Stored sessions from header facts only.

        `parent_session` keeps the direct children of one session; `parents` keeps the sessions
        whose `parentSession` is in the collection (None in it keeps parentless sessions; an empty
        collection keeps nothing). At most one of the two may be given. `damaged` always covers
        the whole store.
        """

    async def inspect(self, session_id: str, *, signal: AbortSignal | None = None) -> PersistenceObservation:
        """A non-mutating full read (the live view for a live id)."""

    async def read_events(
        self,
        session_id: str,
        *,
        types: Collection[str] | None = None,
        from_seq: int = 0,
        signal: AbortSignal | None = None,
    ) -> EventSlice:
        """A physical storage read: no closers, no live view, no caching."""

    async def prepare(self, session_id: str, *, signal: AbortSignal | None = None) -> PreparedSession:
        """The only resume path: lock, repair durably, and build an unpublished session."""

    async def revision(self, session_id: str, *, signal: AbortSignal | None = None) -> Revision | None:
        """The current stored revision, or None."""

    async def drain(self, session_id: str) -> None:
        """Wait until every event handed over for the id is durable or has failed."""

    def locate(self, header: SessionHeader) -> str | None:
        """The artifact path for a header, without I/O."""

    async def close(self) -> None:
        """Drain, release writers and close the backend."""


_LONG_DIGIT_RUN: Final = re.compile(rb"\d{19}")
_I64_MIN: Final = -(2**63)
_I64_MAX: Final = 2**63 - 1


class _IntOutOfRangeError(ValueError):
    pass


def _check_int(text: str) -> int:
    value = int(text)
    if not _I64_MIN <= value <= _I64_MAX:
        raise _IntOutOfRangeError(text)
    return value


def first_oversized_int(lines: Sequence[bytes]) -> int | None:
    """Index of the first JSON line holding an integer outside signed 64 bits, else None.

    `orjson` silently turns such integers into floats, which would change stored data. A digit run of
    19+ characters is the only way to spell one, so a fast byte scan finds candidates and the
    standard library parser (whose `parse_int` hook sees every integer token) decides precisely.
    """
    for index, line in enumerate(lines):
        if _LONG_DIGIT_RUN.search(line) is None:
            continue
        try:
            json.loads(line, parse_int=_check_int)
        except _IntOutOfRangeError:
            return index
        except ValueError:
            continue
    return None


# Shown under the name users import (docs/architecture.md#public-names).
SessionPersistence.__module__ = "dsh"
Capability.__module__ = "dsh.persistence"
DamagedSession.__module__ = "dsh.persistence"
EventSlice.__module__ = "dsh.persistence"
PersistenceObservation.__module__ = "dsh.persistence"
PreparedSession.__module__ = "dsh.persistence"
SessionListing.__module__ = "dsh.persistence"
StorageBackend.__module__ = "dsh.persistence"
StoredSessionInfo.__module__ = "dsh.persistence"
TypedReads.__module__ = "dsh.persistence"
