"""Benchmark homes for the catalog benchmark: one measured family beside N other stored sessions.

Each home holds exactly one measured family and `stored` other sessions, for one storage system:

* the family: a parent with 20 subagent children, the first four of which have two subagent children
  of their own (28 descendants). Its kind decides how the catalog will serve it: `live` (unseeded;
  made live by each measurement, rung 1), `cached` (unseeded, with projection-cache rows, rung 2) or
  `cold` (seeded forks, one observation each, rung 3). Every child transcript has `length` events.
* the other sessions ("background"): groups of ten — one top-level parent, four of its subagent
  children and five ordinary sessions, 20-22 events each — spread over 50 project folders, the family
  sharing the first folder with its background neighbours.

Sessions are written by fast fixture writers that produce exactly what the backends write: for JSONL
the backend's own codec (`encode_header`, `encode_batch`, `relative_path`) in checksummed zstd frames,
one frame per turn as a live session flushes; for SQLite the backend's own statements
(`INSERT_SESSION`, `INSERT_EVENT`, `header_columns`) and row encoding. Headers come from
`HeaderInit.build(...).to_stored(...)` and descriptors from `snapshot_descriptor`, as a runtime
writes them. Then each home gets one writing `Runtime.open` — as every home a user runs dsh on has
had — which is where the cache rows of the `cached` family are written (by the projection cache's
own cold read) and where a backend builds whatever derived data its writing open builds.

`Homes` builds each home once per run under one temporary folder and hands out its path.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson
import zstandard

from bench.p6_append import _turn_events

__all__ = [
    "FAMILY",
    "KINDS",
    "SYSTEMS",
    "Family",
    "HomeSpec",
    "Homes",
    "backend_for",
    "child_batches",
    "config_for",
    "publish_family",
    "stored_sessions",
]

SYSTEMS: Final = ("jsonl", "sqlite")
KINDS: Final = ("live", "cached", "cold")
PROJECTS: Final = 50
CHILDREN: Final = 20
GRANDPARENTS: Final = 4
GRANDCHILDREN_EACH: Final = 2
BASE_TIME: Final = 1_789_000_000_000
FAMILY_CWD: Final = "/home/bench/project-00"
SETTLE_S: Final = 0.1
"""Pause between writing a home and its writing open: a home is written well before it is reopened,
so its folders' modification times are never in the clock tick of the open that follows."""


@dataclass(frozen=True, slots=True)
class HomeSpec:
    """One benchmark home: a storage system, the family's kind and transcript length, other sessions."""

    system: str
    kind: str
    length: int
    stored: int

    @property
    def name(self) -> str:
        """A folder name for the home."""
        return f"{self.system}-{self.kind}-{self.length}ev-{self.stored}"

    @property
    def seeded(self) -> bool:
        """Cold families are forks (seeded), so the projection cache never answers them."""
        return self.kind == "cold"


@dataclass(frozen=True, slots=True)
class Family:
    """The measured family's ids."""

    parent: str
    children: tuple[str, ...]
    grandchildren: tuple[tuple[str, str], ...]
    """(parent child, grandchild) pairs."""

    @property
    def descendants(self) -> int:
        """Rows of `list_descendants(parent)`."""
        return len(self.children) + len(self.grandchildren)

    def sessions(self) -> list[str]:
        """Every id of the family, parents first."""
        return [self.parent, *self.children, *(grandchild for _, grandchild in self.grandchildren)]


FAMILY: Final = Family(
    parent="family-parent",
    children=tuple(f"family-child-{index:02d}" for index in range(CHILDREN)),
    grandchildren=tuple(
        (f"family-child-{index:02d}", f"family-grandchild-{index:02d}-{sub}")
        for index in range(GRANDPARENTS)
        for sub in range(GRANDCHILDREN_EACH)
    ),
)


# ---------------------------------------------------------------- stored records


def _header(
    session_id: str, created_at: int, cwd: str, *, parent: str | None = None, depth: int = 0, seed: int = 0
) -> Mapping[str, Any]:
    from dsh.session.header import HeaderInit

    init = HeaderInit(
        cwd=cwd,
        parent_session=parent,
        delegation_depth=depth,
        origin="subagent" if parent is not None else None,
    )
    return init.build(session_id, created_at=created_at, is_seeded=seed > 0).to_stored(seed)


def _record(kind: str, seq: int, data: Any, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "seq": seq, "time": BASE_TIME + seq, "data": data, **extra}


def _descriptor(label: str) -> Any:
    from dsh.subagent.descriptor import snapshot_descriptor

    return snapshot_descriptor("continuable", provider="spawn", label=label)


def _one_turn(first_seq: int, turn: int) -> list[dict[str, Any]]:
    """The 20 events of one ordinary turn (user message, chunks, tool call and result, turn end)."""
    out = []
    for offset, (kind, data) in enumerate(_turn_events(turn)):
        extra = {"surfaceOp": "append"} if kind in ("user/message", "assistant/message", "tool/result") else {}
        out.append(_record(kind, first_seq + offset, data, **extra))
    return out


def child_batches(length: int, *, seed: int) -> list[list[dict[str, Any]]]:
    """A child transcript of about `length` events, as the flush batches a live child writes.

    `seed` inherited events (a fork's copy of its parent's turns), the descriptor at seq == cut and
    the end-seed marker form the first batch; then one batch per turn (a user message, 16 chunks, a
    turn end).
    """
    first: list[dict[str, Any]] = []
    turn = 0
    while len(first) < seed:
        turn += 1
        first.append(_record("turn/start", len(first), {"turn": turn}))
        while len(first) < seed - 1:
            chunk = {"turn": turn, "step": 1, "chunk": {"type": "text-delta", "text": "inherited"}}
            first.append(_record("assistant/chunk", len(first), chunk))
        first.append(_record("turn/end", len(first), {"turn": turn, "reason": {"kind": "completed"}}))
    first.append(_record("subagent/descriptor", len(first), _descriptor("worker")))
    first.append(_record("session/end-seed", len(first), {}))
    batches = [first]
    seq = len(first)
    while seq < length:
        turn += 1
        message = {"id": f"u{turn}", "role": "user", "content": [{"type": "text", "text": "go"}]}
        batch = [
            _record("turn/start", seq, {"turn": turn}),
            _record("user/message", seq + 1, {**message, "source": {"kind": "user"}}, surfaceOp="append"),
        ]
        for _ in range(16):
            chunk = {"turn": turn, "step": 1, "chunk": {"type": "text-delta", "text": "working on it"}}
            batch.append(_record("assistant/chunk", seq + len(batch), chunk))
        batch.append(_record("turn/end", seq + len(batch), {"turn": turn, "reason": {"kind": "completed"}}))
        batches.append(batch)
        seq += len(batch)
    return batches


@dataclass(frozen=True, slots=True)
class _Session:
    """One stored session to write: its header record and its batches (shared between sessions)."""

    id: str
    header: Mapping[str, Any]
    batches: Sequence[Sequence[Mapping[str, Any]]]
    body_key: str
    """Sessions with the same key share their batches (and so their encoded event frames)."""


def _sessions(spec: HomeSpec) -> Iterator[_Session]:
    """The background sessions, then the family, in writing order."""
    top = [_one_turn(0, 1)]
    child = [[_record("subagent/descriptor", 0, _descriptor("background worker")), _record("session/end-seed", 1, {})]]
    child.append(_one_turn(2, 1))
    middle = BASE_TIME + spec.stored // 2 * 1000
    group_parent = ""
    for index in range(spec.stored):
        cwd = f"/home/bench/project-{index // 10 % PROJECTS:02d}"
        session_id = f"bg-{index:05d}"
        created = BASE_TIME + index * 1000
        role = index % 10
        if role == 0:
            group_parent = session_id
        if 1 <= role <= 4:
            header = _header(session_id, created, cwd, parent=group_parent, depth=1)
            yield _Session(session_id, header, child, "background-child")
        else:
            yield _Session(session_id, _header(session_id, created, cwd), top, "background")
    seed = max(1, spec.length // 10) if spec.seeded else 0
    body = child_batches(spec.length, seed=seed)
    yield _Session(FAMILY.parent, _header(FAMILY.parent, middle, FAMILY_CWD), top, "background")
    for index, child_id in enumerate(FAMILY.children):
        header = _header(child_id, middle + 1 + index, FAMILY_CWD, parent=FAMILY.parent, depth=1, seed=seed)
        yield _Session(child_id, header, body, "family")
    for index, (parent_id, grandchild_id) in enumerate(FAMILY.grandchildren):
        created = middle + 100 + index
        header = _header(grandchild_id, created, FAMILY_CWD, parent=parent_id, depth=2, seed=seed)
        yield _Session(grandchild_id, header, body, "family")


# ---------------------------------------------------------------- fixture writers


def _write_jsonl(root: Path, sessions: Iterator[_Session]) -> None:
    """Exactly the files `JsonlBackend` writes: header frame, then one checksummed frame per batch."""
    from dsh.persistence.jsonl import encode_batch, encode_header, relative_path

    compressor = zstandard.ZstdCompressor(level=3, write_checksum=True)
    bodies: dict[str, bytes] = {}
    made: set[Path] = set()
    for session in sessions:
        body = bodies.get(session.body_key)
        if body is None:
            body = b"".join(compressor.compress(encode_batch(batch)) for batch in session.batches)
            bodies[session.body_key] = body
        path = root / relative_path(session.id, session.header.get("cwd"), "zstd")
        for folder in (path.parent.parent, path.parent):
            if folder not in made:
                folder.mkdir(mode=0o700, parents=True, exist_ok=True)
                made.add(folder)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, compressor.compress(encode_header(session.header)) + body)
        finally:
            os.close(fd)


def _event_row(session_id: str, record: Mapping[str, Any]) -> tuple[Any, ...]:
    """An `events` row encoded as the SQLite backend encodes it (the exact `orjson` text of `data`)."""
    surface = record.get("surfaceOp")
    return (
        session_id,
        record["seq"],
        record["type"],
        record["time"],
        orjson.dumps(record["data"]).decode(),
        None,
        None if surface is None else orjson.dumps(surface).decode(),
        None,
    )


def _write_sqlite(path: Path, sessions: Iterator[_Session]) -> None:
    """Exactly the rows `SqliteBackend` writes, in one transaction."""
    from dsh.persistence.sqlite import INSERT_EVENT, INSERT_SESSION, header_columns, open_store

    conn = open_store(path, busy_timeout_ms=5000)
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            for session in sessions:
                records = [record for batch in session.batches for record in batch]
                conn.execute(
                    INSERT_SESSION,
                    (session.id, *header_columns(session.header), uuid.uuid4().hex, 1, len(records)),
                )
                conn.executemany(INSERT_EVENT, [_event_row(session.id, record) for record in records])
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    finally:
        conn.close()


# ---------------------------------------------------------------- opening a home


def config_for(spec: HomeSpec, home: Path) -> Any:
    """The `Config` of a benchmark home (JSONL under `home/sessions`, or `home/sessions.sqlite3`)."""
    from dsh.config import Config

    return Config(home=home, database_url="sqlite://" if spec.system == "sqlite" else None)


def backend_for(spec: HomeSpec, home: Path, *, read_only: bool) -> Any:
    """The storage backend a runtime on the home uses (what `Runtime.open` would build itself)."""
    from dsh.runtime import backend_for as runtime_backend

    return runtime_backend(config_for(spec, home), read_only=read_only)


async def publish_family(rt: Any) -> None:
    """Make every session of the family live in `rt` (the resume path: prepare, then publish)."""
    for session_id in FAMILY.sessions():
        prepared = await rt.persistence.prepare(session_id)
        prepared.publish()


async def _settle(spec: HomeSpec, home: Path) -> None:
    """One writing open of the home; for the `cached` family, the cache's own cold reads write its rows."""
    from dsh.runtime import Runtime

    async with Runtime.open(config_for(spec, home)) as rt:
        await rt.subagents.list_children(FAMILY.parent)  # registers the catalog's projection units
        if spec.kind == "cached":
            assert rt.cache is not None, "the projection cache did not open"
            for session_id in FAMILY.sessions()[1:]:
                await rt.cache.cold_snapshot(session_id)


class Homes:
    """Builds each benchmark home once under `root` and remembers what it cost.

    Attributes:
        build_seconds: Seconds spent building each home (writing, then the writing open).
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.build_seconds: dict[str, float] = {}
        self._built: dict[HomeSpec, Path] = {}

    async def get(self, spec: HomeSpec) -> Path:
        """The home of `spec`, built on first use."""
        home = self._built.get(spec)
        if home is None:
            started = time.perf_counter()
            home = self.root / spec.name
            home.mkdir(mode=0o700, parents=True)
            if spec.system == "jsonl":
                await asyncio.to_thread(_write_jsonl, home / "sessions", _sessions(spec))
            else:
                await asyncio.to_thread(_write_sqlite, home / "sessions.sqlite3", _sessions(spec))
            await asyncio.sleep(SETTLE_S)
            await _settle(spec, home)
            self._built[spec] = home
            self.build_seconds[spec.name] = time.perf_counter() - started
        return home


def stored_sessions(spec: HomeSpec) -> int:
    """Every stored session of the home: the background and the family."""
    return spec.stored + 1 + FAMILY.descendants
