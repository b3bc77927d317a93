"""Shared helpers of the persistence tests (plain functions and classes; the fixtures live in `conftest.py`).

* JSONL backend tests: builders of valid stored records, a backend and fixture writer per root, a
  coordinator stack closed in the runtime's order, file digests that prove a read path changed
  nothing, and an `opener` that counts the bytes a listing reads.
* Crash and writer-lock tests: the parent's half of the report protocol of `crash_child.py` (the
  program those tests start as a subprocess), the backend kinds it understands and where each kind
  keeps its store.
* SQLite tests: a private connection on a worker thread, for looking at (or changing) the database
  behind the backend's back without calling `sqlite3` on the event loop.
* TypeScript-harness logs: `upstream_session` builds one session the way the harness writes it by
  default (packed delta runs, several flush batches, older shapes on request) with the events a
  reader must see; `plain` turns read events back into plain records for exact comparisons.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import sqlite3
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

import orjson

from dsh.json import thaw
from dsh.persistence.coordinator import PersistenceCoordinator
from dsh.persistence.jsonl import JsonlBackend
from dsh.session import SessionStore
from dsh.testing.jsonl_writer import JsonlLogWriter
from dsh.testing.stored_logs import (
    StepClock,
    append_closed_turn,
    append_every_core_type,
    append_open_step,
    build_records,
)
from dsh.testing.upstream_logs import UpstreamLog, UpstreamLogBuilder
from tests.persistence.crash_child import open_backend

__all__ = [
    "CHILD",
    "CHILD_BACKENDS",
    "GUARD_S",
    "CountingOpener",
    "Reports",
    "closed_records",
    "digest",
    "event_sha256",
    "every_type_records",
    "make_backend",
    "make_writer",
    "raw_sql",
    "open_backend",
    "open_step_records",
    "plain",
    "running",
    "store_path",
    "upstream_session",
]

T = TypeVar("T")

# ---------------------------------------------------------------- JSONL backend tests


def closed_records(turns: int = 2) -> list[dict[str, Any]]:
    """Valid records of `turns` complete turns."""

    def build(session: Any) -> None:
        for turn in range(turns):
            append_closed_turn(session, turn)

    return build_records(build)


def open_step_records(
    *, closed: int = 1, calls: tuple[str, ...] = ("call-1",), started: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    """Valid records: `closed` complete turns, then a turn left open inside a step."""

    def build(session: Any) -> None:
        for turn in range(closed):
            append_closed_turn(session, turn)
        append_open_step(session, closed, calls=calls, started=started)

    return build_records(build)


def every_type_records() -> list[dict[str, Any]]:
    """One complete turn holding every appendable core type."""
    return build_records(append_every_core_type)


def make_backend(root: str | os.PathLike[str], compression: str, **kwargs: Any) -> JsonlBackend:
    """A JSONL backend over `root` with the given encoding (`zstd` or `none`)."""
    return JsonlBackend(root, compression=compression, **kwargs)  # type: ignore[arg-type]


def make_writer(root: str | os.PathLike[str], compression: str) -> JsonlLogWriter:
    """The fixture writer for the same root and encoding."""
    return JsonlLogWriter(root, compression=compression)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def running(
    backend: Any, *, clock: Callable[[], int] | None = None
) -> AsyncIterator[tuple[PersistenceCoordinator, SessionStore]]:
    """An opened coordinator over `backend` with its own store, closed in the runtime's order.

    The store closes first so its live sessions drain through the coordinator before the backend
    goes away (docs/architecture.md#open-and-close-order).
    """
    store = SessionStore(clock=clock or StepClock())
    coordinator = PersistenceCoordinator(backend, store)
    await coordinator.open()
    try:
        yield coordinator, store
    finally:
        await store.aclose()
        await coordinator.close()


def digest(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a file's bytes."""
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


class _CountedFile:
    """A read-only file wrapper that reports every byte it hands out."""

    def __init__(self, handle: IO[bytes], owner: CountingOpener, path: str) -> None:
        self._handle = handle
        self._owner = owner
        self._path = path

    def read(self, size: int = -1) -> bytes:
        data = self._handle.read(size)
        self._owner.bytes_read[self._path] += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._handle.seek(offset, whence)

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> _CountedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CountingOpener:
    """An `opener` for `JsonlBackend` counting opens and bytes read per path."""

    def __init__(self) -> None:
        self.opens: Counter[str] = Counter()
        self.bytes_read: Counter[str] = Counter()

    def __call__(self, path: str, mode: str) -> Any:
        self.opens[path] += 1
        return _CountedFile(open(path, mode), self, path)  # the wrapper closes it


# ---------------------------------------------------------------- crash and writer-lock tests

CHILD = Path(__file__).with_name("crash_child.py")
"""The child program, run by path (`python crash_child.py ...`) so it needs no `tests` package."""

GUARD_S = 60.0
"""Only guards the parent against a hung child; every wait ends on a report long before."""

CHILD_BACKENDS = ["jsonl-zstd", "jsonl-raw", "sqlite"]
"""The backend kinds `crash_child.py` understands (see `open_backend`)."""


def store_path(directory: Path, kind: str) -> str:
    """Where a backend of `kind` keeps its store inside `directory`: a database file or a JSONL root."""
    return str(directory / ("sessions.sqlite3" if kind == "sqlite" else "sessions"))


def event_sha256(event: Any) -> str:
    """SHA-256 of an event's JSON bytes, the digest the child reports for every event it appends."""
    return hashlib.sha256(orjson.dumps(event)).hexdigest()


@dataclass
class Reports:
    """What one child reported before it died: event digests by seq and the highest flushed seq."""

    events: dict[int, str] = field(default_factory=dict)
    flushed: int = 0

    def parse(self, line: bytes) -> None:
        """Record one complete report line (`E <seq> <sha256>` or `F <n>`; other lines are ignored)."""
        parts = line.decode().split()
        if not parts:
            return
        if parts[0] == "E":
            self.events[int(parts[1])] = parts[2]
        elif parts[0] == "F":
            self.flushed = max(self.flushed, int(parts[1]))


# ---------------------------------------------------------------- SQLite tests


async def raw_sql(path: Path, work: Callable[[sqlite3.Connection], T]) -> T:
    """Run `work` on a private autocommit connection in a worker thread, never on the event loop."""

    def run() -> T:
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            return work(conn)
        finally:
            conn.close()

    return await asyncio.to_thread(run)


# ---------------------------------------------------------------- TypeScript-harness logs


def plain(events: Any) -> list[dict[str, Any]]:
    """Read events (frozen or raw) as plain records, for exact comparisons with expected records."""
    return [thaw(event) if not isinstance(event, dict) else event for event in events]


def upstream_session(
    session_id: str = "up1", *, legacy: bool = False, open_turn: bool = False, turns: int = 2
) -> UpstreamLog:
    """One session as the harness writes it by default: every kind of delta run, in several flush batches.

    Each turn streams reasoning (a long run between block boundaries), text of exactly three
    deltas whose block continues across a flush, tool-call arguments with the name on every delta
    and with the name only on the first, and a run whose clock steps back. `legacy` stores the
    messages, turn starts, turn ends and one user message in older shapes; `open_turn` leaves the
    last turn open inside a step (a crash).
    """
    b = UpstreamLogBuilder(session_id)
    for turn in range(1, turns + 1):
        b.turn_start(turn, trigger={"kind": "message"} if legacy else None)
        b.user(f"question {turn}", legacy="identity" if legacy else None)
        b.step_start(turn, 1)
        b.chunk(turn, 1, {"type": "reasoning-start", "index": 0})
        b.deltas(turn, 1, ["Let", " me", " think", " about", " it"], kind="reasoning")
        b.chunk(turn, 1, {"type": "reasoning-end", "index": 0})
        b.deltas(turn, 1, ["I", "'ll", " look"], index=1)
        b.flush()
        b.deltas(turn, 1, [" at", " the", " files", "."], index=1)
        b.call_deltas(turn, 1, "call-1", ['{"pa', 'th":', ' "."', "}"], name="ls", index=2)
        b.call_deltas(turn, 1, "call-2", ['{"q', '":', " 1", "}"], name="grep", name_on="first", index=3)
        b.chunk(turn, 1, {"type": "finish", "reason": "tool-calls"})
        b.assistant(turn, 1, "I'll look at the files.", legacy=legacy)
        b.tool_call(turn, 1, "call-1", "ls", '{"path": "."}')
        b.tool_result(turn, 1, "call-1", "a.txt b.txt", legacy=legacy)
        b.step_end(turn, 1)
        b.flush()
        if legacy:
            b.user("also the docs", turn=turn, legacy="steering" if turn % 2 else "steering-wrapped")
        b.step_start(turn, 2)
        now = b.time
        b.deltas(turn, 2, ["Two", " files", " here", "."], times=[now, now - 5, now + 3, now + 2])
        if open_turn and turn == turns:
            b.flush()
            return b.build()
        b.assistant(turn, 2, "Two files here.", legacy=legacy)
        b.step_end(turn, 2)
        b.turn_end(turn, legacy=("disposed" if turn % 2 else "error-message") if legacy else None)
        b.flush()
    return b.build()
