"""The in-memory storage backend: the reference implementation every backend is compared with.

Layer: persistence. `MemoryStorage` holds the stored facts (`id -> header record, encoded event
records, incarnation, revision counter`); any number of `MemoryBackend` instances can open the same
storage, the way two processes would open one directory. Records are kept as encoded JSON bytes and
parsed on every load, so the memory backend exercises the same round trip as the durable ones.
Revisions are `mem:<store uuid>:<incarnation>:<n>`; it declares `TYPED_READS`, never has torn tails,
and needs no writer lock (it is single-process by nature, docs/storage-format.md#writer-locks). Used
by unit tests and by runtimes configured without durable storage.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

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
    first_oversized_int,
)
from dsh.persistence.errors import (
    AppendConflictError,
    PersistenceClosedError,
    SessionAlreadyExistsError,
    SessionCorruptionError,
)
from dsh.session.events import SessionEvent

__all__ = ["MemoryBackend", "MemoryStorage", "StoredSession"]

_CAPABILITIES: Final = frozenset({Capability.TYPED_READS})


@dataclass(slots=True)
class StoredSession:
    """Everything stored for one id.

    Attributes:
        header: The encoded stored header record.
        lines: One encoded record per event, in seq order.
        incarnation: A uuid minted when the id was (re)written from scratch.
        counter: Bumped by every append and repair; part of the revision.
    """

    header: bytes
    lines: list[bytes] = field(default_factory=list)
    incarnation: str = field(default_factory=lambda: uuid.uuid4().hex)
    counter: int = 1


class MemoryStorage:
    """The shared stored state behind one or more `MemoryBackend` instances.

    Attributes:
        store_id: A uuid that makes revisions of independent stores differ.
        sessions: Stored sessions by id (fixture writers edit this directly).
    """

    def __init__(self) -> None:
        self.store_id = uuid.uuid4().hex
        self.sessions: dict[str, StoredSession] = {}

    def revision(self, stored: StoredSession) -> Revision:
        """The revision token of `stored` in this storage."""
        return Revision(f"mem:{self.store_id}:{stored.incarnation}:{stored.counter}")


def _decode_header(raw: bytes) -> dict[str, Any] | None:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


class MemoryBackend:
    """A `StorageBackend` over a `MemoryStorage` (a fresh one when none is given); declares `TYPED_READS`.

    It implements `TypedReads` (`load_typed`). Every append and repair stages its records through
    `_stage` and rolls them back if staging fails, so a batch stays all-or-nothing; tests fail that
    step from the inside by replacing `_stage` on one instance (`dsh.testing.io_faults`).
    """

    name = "memory"

    def __init__(self, storage: MemoryStorage | None = None) -> None:
        self.storage = storage if storage is not None else MemoryStorage()
        self.capabilities: frozenset[Capability] = _CAPABILITIES
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise PersistenceClosedError("the memory backend is closed")

    # ---------------------------------------------------------------- lifecycle

    async def open(self) -> None:
        """Nothing to prepare; reopening after `close` is allowed."""
        self._closed = False

    async def close(self) -> None:
        """Refuse further calls (the storage itself stays for other instances)."""
        self._closed = True

    # ---------------------------------------------------------------- reads

    async def list_headers(
        self, *, parents: ParentFilter | None = None
    ) -> tuple[list[HeaderRow], list[DamagedSession]]:
        """Every stored header record (with `parents`, only those whose `parentSession` is in it).

        The damaged entries are the whole storage's, whatever the filter.
        """
        self._check_open()
        rows: list[HeaderRow] = []
        damaged: list[DamagedSession] = []
        for session_id, stored in list(self.storage.sessions.items()):
            header = _decode_header(stored.header)
            if header is None:
                damaged.append(
                    DamagedSession(
                        session_id, "SESSION_CORRUPT", f'session "{session_id}": header is not a JSON object'
                    )
                )
                continue
            if header.get("id") != session_id:
                damaged.append(
                    DamagedSession(
                        session_id,
                        "SESSION_CORRUPT",
                        f'stored session identity mismatch: requested "{session_id}", '
                        f"header contains {orjson.dumps(header.get('id')).decode()}",
                    )
                )
                continue
            if parents is not None and header.get("parentSession") not in parents:
                continue
            rows.append(HeaderRow(FrozenDict(header), self.storage.revision(stored)))
        return rows, damaged

    async def exists(self, session_id: str) -> bool:
        """Whether anything is stored under the id."""
        self._check_open()
        return session_id in self.storage.sessions

    async def read_revision(self, session_id: str) -> Revision | None:
        """The current revision, or None."""
        self._check_open()
        stored = self.storage.sessions.get(session_id)
        return None if stored is None else self.storage.revision(stored)

    async def load(self, session_id: str) -> StoredLog | None:
        """Parse the whole stored log; an unparsable record is corruption (memory has no torn tails)."""
        self._check_open()
        stored = self.storage.sessions.get(session_id)
        if stored is None:
            return None
        header, events = self._parse(session_id, stored)
        return StoredLog(
            header=header,
            events=events,
            revision=self.storage.revision(stored),
            oversized_int_at=first_oversized_int(stored.lines),
        )

    async def load_typed(
        self, session_id: str, types: frozenset[str] | None, from_seq: int, known: frozenset[str]
    ) -> StoredLog | None:
        """Only records with `seq >= from_seq` whose type is in `types`; refusals over the whole log."""
        self._check_open()
        stored = self.storage.sessions.get(session_id)
        if stored is None:
            return None
        header, events = self._parse(session_id, stored)
        first_unknown: tuple[str, int] | None = None
        for index, record in enumerate(events):
            kind = record.get("type")
            if type(kind) is str and kind not in known and record.get("ignorable") is not True:
                first_unknown = (kind, index)
                break
        selected_lines: list[bytes] = []
        selected: list[dict[str, Any]] = []
        for index, record in enumerate(events):
            if index >= from_seq and (types is None or record.get("type") in types):
                selected.append(record)
                selected_lines.append(stored.lines[index])
        return StoredLog(
            header=header,
            events=selected,
            revision=self.storage.revision(stored),
            first_unknown=first_unknown,
            oversized_int_at=first_oversized_int(selected_lines),
            next_seq=len(events),
        )

    def _parse(self, session_id: str, stored: StoredSession) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        header = _decode_header(stored.header)
        if header is None:
            raise SessionCorruptionError(
                f'stored session "{session_id}" failed validation: header is not a JSON object', session_id=session_id
            )
        events: list[dict[str, Any]] = []
        for index, line in enumerate(stored.lines):
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError as error:
                raise SessionCorruptionError(
                    f'stored session "{session_id}" failed validation: unparsable event record at index {index}',
                    session_id=session_id,
                ) from error
            if not isinstance(record, dict):
                raise SessionCorruptionError(
                    f'stored session "{session_id}" failed validation: event record at index {index} is not an object',
                    session_id=session_id,
                )
            events.append(record)
        return header, events

    # ---------------------------------------------------------------- writes

    async def append_batch(
        self, header: FrozenDict, events: Sequence[SessionEvent], *, materialized: bool, fence: Fence | None
    ) -> Revision:
        """Append all of `events` or nothing; materialize header + batch when `materialized` is False."""
        self._check_open()
        session_id = str(header["id"])
        stored = self.storage.sessions.get(session_id)
        if not materialized and stored is not None:
            raise SessionAlreadyExistsError(
                f'refusing to materialize "{session_id}": a log already exists in memory storage (resume it instead)',
                session_id=session_id,
            )
        if materialized and stored is None:
            raise AppendConflictError(
                f'cannot append to session "{session_id}": nothing is stored (stale writer)', session_id=session_id
            )
        next_seq = 0 if stored is None else len(stored.lines)
        self._check_contiguous(session_id, events, next_seq)
        lines = [orjson.dumps(event) for event in events]
        target = stored if stored is not None else StoredSession(orjson.dumps(header))
        self._write(target, lines)
        if stored is None:
            self.storage.sessions[session_id] = target
        return self.storage.revision(target)

    async def commit_repair(
        self, header: FrozenDict, torn: TornMarker | None, closers: Sequence[SessionEvent], *, fence: Fence | None
    ) -> Revision:
        """Append `closers` as one batch (memory logs are never torn, so `torn` is always None)."""
        self._check_open()
        session_id = str(header["id"])
        stored = self.storage.sessions.get(session_id)
        if stored is None:
            raise AppendConflictError(
                f'cannot repair session "{session_id}": nothing is stored (stale writer)', session_id=session_id
            )
        if not closers:
            return self.storage.revision(stored)
        self._check_contiguous(session_id, closers, len(stored.lines))
        self._write(stored, [orjson.dumps(event) for event in closers])
        return self.storage.revision(stored)

    @staticmethod
    def _check_contiguous(session_id: str, events: Sequence[Mapping[str, Any]], next_seq: int) -> None:
        for offset, event in enumerate(events):
            if event["seq"] != next_seq + offset:
                raise AppendConflictError(
                    f'batch for session "{session_id}" must continue at seq {next_seq + offset}, '
                    f"got seq {event['seq']}",
                    session_id=session_id,
                )

    def _write(self, stored: StoredSession, lines: list[bytes]) -> None:
        """Stage the lines, then commit (bump the revision); a failed staging is rolled back first."""
        size = len(stored.lines)
        try:
            self._stage(stored.lines, lines)
        except BaseException:
            # The in-memory "durability step" failed: roll back to the previous length so the batch
            # is all-or-nothing, exactly as a durable backend truncates or aborts its transaction.
            del stored.lines[size:]
            raise
        stored.counter += 1

    @staticmethod
    def _stage(target: list[bytes], lines: list[bytes]) -> None:
        """The write step of every batch (one primitive, so a test can fail it: `dsh.testing.io_faults`)."""
        target.extend(lines)

    # ---------------------------------------------------------------- writer lock, location

    async def acquire(self, session_id: str) -> Fence | None:
        """No lock: a memory store lives in one process."""
        self._check_open()
        return None

    async def release(self, session_id: str) -> None:
        """Nothing to release."""

    def locate(self, header: Mapping[str, Any]) -> str | None:
        """Memory sessions have no artifact path."""
        return None


# Shown under the name users import (docs/architecture.md#public-names).
MemoryBackend.__module__ = "dsh"
