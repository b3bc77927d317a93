"""Shared helpers for the subagent catalog tests: authored events, a real runtime stack, hostile units.

Every stack is real: a `SessionStore`, a `PersistenceCoordinator` over a `JsonlBackend` in `tmp_path`
(read through a `CountingPersistence`), the `ProjectionRegistry`, the live-preferred `SessionQuery`,
a `SubagentRuntime` and, when asked for, a `ProjectionCache` over a SQLite file. There is no agent
registry yet, so children are built the way the runtime would build them: `Stack.live_child`
publishes a store session and appends its descriptor; `Stack.author_child` writes a log straight into
the JSONL root (continuable descriptors in the creation seed at seq == cut, one-shot ones inside the
first turn). Timers are manual, so no write-behind batch or cache interval fires unless a test flushes.
The fixtures that hand these out live in `conftest.py`; the spy doubles live in `spies.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import itertools
import os
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsh.config import SubagentConfig
from dsh.persistence.coordinator import PersistenceCoordinator
from dsh.persistence.jsonl import JsonlBackend
from dsh.projection.cache import ProjectionCache
from dsh.projection.cache_storage import CacheIdentity, CacheRecord, SqliteCacheStorage
from dsh.projection.registry import ProjectionRegistry
from dsh.projection.unit import ClientView
from dsh.query import SessionQuery
from dsh.services import Services
from dsh.session import HeaderInit, Session, SessionHeader, SessionId, SessionStore
from dsh.subagent.rows import SubagentDescendantEntry, SubagentListEntry
from dsh.subagent.runtime import SubagentRuntime
from dsh.subagent.units import subagent_identity_unit
from dsh.testing.counting import CountingPersistence
from dsh.testing.jsonl_writer import JsonlLogWriter
from dsh.testing.timer import ManualTimer
from tests.subagent.spies import HANG_GUARD_S, SpyCacheStorage

__all__ = [
    "DESCRIPTOR",
    "PARENT",
    "PassthroughSchema",
    "Record",
    "Stack",
    "ancestor_prefix",
    "build_stack",
    "child_events",
    "desc",
    "descriptor",
    "end_seed",
    "event",
    "fork_events",
    "identity_row",
    "install_hostile_subagent_unit",
    "one_shot_desc",
    "open_stack",
    "stillborn_events",
    "stored_header",
    "turn_end",
    "turn_start",
    "user_message",
    "write_family_home",
]

PARENT = "parent"
DESCRIPTOR = "subagent/descriptor"

Record = dict[str, Any]


# --------------------------------------------------------------------------------------------------
# Authored events


def desc(label: str, v: object = 2) -> Record:
    """A continuable descriptor payload `{version: v, mode, provider: "spawn", label}`."""
    return {"version": v, "mode": "continuable", "provider": "spawn", "label": label}


def one_shot_desc(label: str | None = None, *, provider: str = "spawn") -> Record:
    """A one-shot descriptor payload (label only when given)."""
    data: Record = {"version": 2, "mode": "one-shot", "provider": provider}
    if label is not None:
        data["label"] = label
    return data


def event(kind: str, seq: int, data: object, **extra: object) -> Record:
    """One stored event record (`time` = seq)."""
    return {"type": kind, "seq": seq, "time": seq, "data": data, **extra}


def turn_start(seq: int, turn: int = 0) -> Record:
    """A `turn/start` record."""
    return event("turn/start", seq, {"turn": turn})


def turn_end(seq: int, turn: int = 0, kind: str = "completed") -> Record:
    """A `turn/end` record with reason `kind` (an aborted turn names the cause `parent`)."""
    reason: Record = {"kind": kind}
    if kind == "aborted":
        reason["reason"] = {"kind": "parent"}
    return event("turn/end", seq, {"turn": turn, "reason": reason})


def user_message(seq: int, text: str = "task", *, surface: bool = True) -> Record:
    """A `user/message` record (with `surfaceOp: "append"` unless `surface` is False)."""
    data = {"id": f"u{seq}", "role": "user", "content": [{"type": "text", "text": text}], "source": {"kind": "user"}}
    record = event("user/message", seq, data)
    if surface:
        record["surfaceOp"] = "append"
    return record


def descriptor(seq: int, data: object) -> Record:
    """A `subagent/descriptor` record (log-only: no `surfaceOp`)."""
    return event(DESCRIPTOR, seq, data)


def child_events(d: object) -> list[Record]:
    """`turn/start`(0), `user/message`(1, append), `subagent/descriptor` d (2), `turn/end completed`(3)."""
    return [turn_start(0), user_message(1), descriptor(2, d), turn_end(3)]


def ancestor_prefix(label: str = "ancestor label") -> list[Record]:
    """A 4-event fork prefix whose descriptor (seq 2) belongs to the ancestor."""
    return child_events(desc(label))


def end_seed(seq: int) -> Record:
    """The `session/end-seed` construction marker."""
    return event("session/end-seed", seq, {})


def fork_events(own: object | None, *, own_seq: int = 4, ancestor: str = "ancestor label") -> list[Record]:
    """A seeded log for cut 4: the ancestor prefix (descriptor at seq 2), then the own suffix.

    `own_seq=4` stages the own descriptor at seq == cut, before the `session/end-seed` marker
    (continuable placement); `own_seq=5` puts the marker first and the own descriptor at seq 5.
    `own=None` gives an own suffix with a turn but no descriptor.
    """
    prefix = ancestor_prefix(ancestor)
    if own is None:
        return [*prefix, end_seed(4), turn_start(5, 1), user_message(6), turn_end(7, 1)]
    if own_seq == 4:
        return [*prefix, descriptor(4, own), end_seed(5), turn_start(6, 1), user_message(7), turn_end(8, 1)]
    if own_seq == 5:
        return [*prefix, end_seed(4), descriptor(5, own), turn_start(6, 1), user_message(7), turn_end(8, 1)]
    raise ValueError("own_seq must be 4 or 5")


def stillborn_events(ancestor: str = "ancestor label") -> list[Record]:
    """A fork whose whole log is the seed (cut 4) plus the construction marker: no own descriptor."""
    return [*ancestor_prefix(ancestor), end_seed(4)]


def stored_header(session_id: str, **overrides: object) -> Record:
    """A stored header record (camelCase); an override of None removes the key."""
    header: Record = {
        "type": "session",
        "version": 0,
        "id": session_id,
        "createdAt": 1,
        "parentSession": PARENT,
        "origin": "subagent",
        "delegationDepth": 1,
    }
    for key, value in overrides.items():
        if value is None:
            header.pop(key, None)
        else:
            header[key] = value
    return header


def identity_row(label: str, seq: int, *, mode: str = "continuable", as_of: int | None = None) -> dict[str, Any]:
    """A checkpoint row of the `subagent` unit holding one identity."""
    identity: Record = {"mode": mode, "label": label, "seq": seq}
    return {"ver": 2, "seq": seq if as_of is None else as_of, "val": {"identity": identity}}


# --------------------------------------------------------------------------------------------------
# The stack


@dataclass
class Stack:
    """A hand-built runtime stack (the services `Runtime` would assemble) with a live parent session `parent`.

    See docs/architecture.md#services-and-the-runtime for what each service does.
    """

    tmp_path: Path
    root: Path
    timer: ManualTimer
    store: SessionStore
    coordinator: PersistenceCoordinator
    persistence: CountingPersistence
    registry: ProjectionRegistry
    query: SessionQuery
    runtime: SubagentRuntime
    services: Services
    writer: JsonlLogWriter
    parent: Session
    cache: ProjectionCache | None = None
    cache_storage: SpyCacheStorage | None = None
    cache_path: Path | None = None
    disposers: list[Callable[[], None]] = field(default_factory=list)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    async def list_children(self, parent: str = PARENT, **kwargs: Any) -> list[SubagentListEntry]:
        """`runtime.list_children(parent, ...)`."""
        return await self.runtime.list_children(parent, **kwargs)

    async def list_descendants(self, root: str = PARENT, **kwargs: Any) -> list[SubagentDescendantEntry]:
        """`runtime.list_descendants(root, ...)`."""
        return await self.runtime.list_descendants(root, **kwargs)

    async def author_child(
        self,
        session_id: str,
        header: Mapping[str, object] | None = None,
        events: Sequence[Record] | None = None,
        cut: int = 0,
    ) -> SessionHeader:
        """Write a log straight into the JSONL root; returns its logical header.

        `header` holds stored-header overrides (camelCase; None removes a key) over the default
        `{createdAt: 1, parentSession: "parent", origin: "subagent", delegationDepth: 1}`; `events`
        defaults to `child_events(desc(session_id))`; `cut` becomes `seedLength`.
        """
        overrides = dict(header or {})
        if cut:
            overrides.setdefault("seedLength", cut)
        record = stored_header(session_id, **overrides)
        await self.writer.write(
            session_id, record, list(events) if events is not None else child_events(desc(session_id))
        )
        logical, _ = SessionHeader.from_stored(record)
        return logical

    def live_child(
        self,
        label: str | None,
        *,
        session_id: str | None = None,
        parent: str | None = PARENT,
        created_at: int | None = None,
        data: object = None,
        origin: bool = True,
    ) -> Session:
        """Publish a store session `{parent_session, origin: "subagent"}`, then `turn/start` and `desc(label)`.

        `label=None` stops after `turn/start` (the creation window); `data` replaces the descriptor payload.
        """
        session_id = session_id if session_id is not None else f"live{next(self._ids):04d}"
        header = HeaderInit(
            created_at=created_at,
            parent_session=parent,
            origin="subagent" if origin else None,
            delegation_depth=1 if origin else 0,
        )
        session = self.store.create(session_id, header=header)
        session.append("turn/start", {"turn": 0})
        if label is not None or data is not None:
            session.append(DESCRIPTOR, data if data is not None else desc(label or ""))
        return session

    def live_fork_child(
        self, session_id: str, *, own: object | None, created_at: int | None = None, parent: str = PARENT
    ) -> Session:
        """A published seeded child (cut 4): ancestor prefix, plus `own` staged at seq == cut when given."""
        seed = ancestor_prefix()
        if own is not None:
            seed.append(descriptor(4, own))
        session = self.store.prepare(
            session_id,
            header=HeaderInit(created_at=created_at, parent_session=parent, origin="subagent", delegation_depth=1),
            seed=seed,
            inherited_event_count=4,
        )
        return self.store.publish(session)

    async def settle(self, session: Session) -> None:
        """Make `session` cold: flush it, dispose it, and wait for its retirement (and cache write)."""
        await self.store.flush(session)
        written = self.cache_storage.written(session.id) if self.cache_storage is not None else None
        if written is not None:
            written.clear()
        self.store.dispose(session)
        async with asyncio.timeout(HANG_GUARD_S):
            await self.coordinator.drain(session.id)
            if written is not None:
                await written.wait()

    async def cache_put(self, session_id: str, rows: Mapping[str, Any], *, created_at: int = 1, cut: int = 0) -> None:
        """Store a cache record for `session_id` (identity `createdAt`, no cwd, `cut`)."""
        assert self.cache_storage is not None
        await self.cache_storage.inner.put(
            SessionId(session_id), CacheRecord(CacheIdentity(created_at, None, cut), dict(rows), 0)
        )

    async def file_hashes(self) -> dict[str, str]:
        """SHA-256 of every file under the JSONL root and of the cache database (and its WAL)."""
        return await asyncio.to_thread(self._file_hashes)

    def _file_hashes(self) -> dict[str, str]:
        paths: list[str] = []
        for directory, _, names in os.walk(self.root):
            paths.extend(os.path.join(directory, name) for name in names)
        if self.cache_path is not None:
            # The -shm index may record reader marks; the database and its WAL change only on writes.
            paths.extend(str(p) for p in (self.cache_path, Path(f"{self.cache_path}-wal")) if p.exists())
        out: dict[str, str] = {}
        for path in sorted(paths):
            with open(path, "rb") as handle:
                out[path] = hashlib.sha256(handle.read()).hexdigest()
        return out

    async def aclose(self) -> None:
        """Close like the runtime: subagents → sessions → cache → unit registrations → registry → persistence.

        The order is the runtime's (docs/architecture.md#open-and-close-order): the cache writes its
        last checkpoints while the units are still registered and persistence is still open.
        """
        await self.runtime.aclose()
        await self.store.aclose()
        if self.cache is not None:
            await self.cache.aclose()
        self.runtime.release_units()
        while self.disposers:  # test-registered units go with the runtime's, after the cache wrote
            self.disposers.pop()()
        self.registry.close()
        await self.coordinator.close()


async def build_stack(tmp_path: Path, *, cache: bool = False, concurrency: int | None = None) -> Stack:
    """Build and open a stack in `tmp_path` (see `Stack`); `cache=True` mounts a SQLite projection cache."""
    root = tmp_path / "sessions"
    timer = ManualTimer()
    counter = itertools.count(1)
    clock = itertools.count(1_000_000)
    store = SessionStore(clock=lambda: next(clock), id_factory=lambda: f"auto{next(counter):04d}")
    coordinator = PersistenceCoordinator(JsonlBackend(root), store, timer=timer)
    await coordinator.open()
    persistence = CountingPersistence(coordinator)
    registry = ProjectionRegistry(store)
    cache_path = tmp_path / "cache.sqlite3" if cache else None
    storage: SpyCacheStorage | None = None
    projection_cache: ProjectionCache | None = None
    if cache_path is not None:
        storage = SpyCacheStorage(await SqliteCacheStorage.open(cache_path))
        projection_cache = await ProjectionCache.open(
            storage, registry=registry, sessions=store, persistence=persistence, timer=timer
        )
    query = SessionQuery(store, persistence, projections=registry)
    services = Services(
        sessions=store,
        persistence=persistence,
        projections=registry,
        projection_cache=projection_cache,
        query=query,
    )
    config = SubagentConfig() if concurrency is None else SubagentConfig(cold_read_concurrency=concurrency)
    runtime = SubagentRuntime(services, config=config)
    services.subagents = runtime
    parent = store.create(PARENT, header=HeaderInit(created_at=0))
    return Stack(
        tmp_path=tmp_path,
        root=root,
        timer=timer,
        store=store,
        coordinator=coordinator,
        persistence=persistence,
        registry=registry,
        query=query,
        runtime=runtime,
        services=services,
        writer=JsonlLogWriter(root),
        parent=parent,
        cache=projection_cache,
        cache_storage=storage,
        cache_path=cache_path,
    )


@contextlib.asynccontextmanager
async def open_stack(tmp_path: Path, **kwargs: Any) -> AsyncIterator[Stack]:
    """`build_stack` as a context manager that closes the stack in the runtime's close order."""
    stack = await build_stack(tmp_path, **kwargs)
    try:
        yield stack
    finally:
        await stack.aclose()


# --------------------------------------------------------------------------------------------------
# Hostile units


def _hostile_render(state: Mapping[str, Any]) -> object:
    identity = state.get("identity")
    if isinstance(identity, Mapping) and identity.get("label") == "poison me":
        raise RuntimeError("hostile view refuses to render 'poison me'")
    return identity if isinstance(identity, Mapping) else None


def install_hostile_subagent_unit(stack: Stack) -> Callable[[], None]:
    """Register, instead of the real `subagent` unit, one that folds alike but whose view raises on `poison me`.

    The runtime's registrations are dropped first: the next listing registers again and, as key and
    version match, shares the hostile unit that now holds the key. Returns the hostile disposer.
    """
    real = subagent_identity_unit()
    assert real.view is not None
    hostile = dataclasses.replace(real, view=ClientView(render=_hostile_render, schema=real.view.schema))
    stack.runtime.release_units()
    return stack.registry.register(hostile)


class PassthroughSchema:
    """A schema stand-in that accepts every value unchanged (for test-only units)."""

    def validate_python(self, value: object, /) -> object:
        return value


async def write_family_home(home: Path, children: Sequence[str]) -> None:
    """A real home: a parent `P` with one settled, cold continuable child per id (label = the id)."""
    from dsh.config import Config
    from dsh.runtime import Runtime
    from dsh.session.header import HeaderInit
    from dsh.subagent.descriptor import snapshot_descriptor

    async with Runtime.open(Config(home=home)) as rt:
        parent = rt.sessions.create("P")
        parent.append("turn/start", {"turn": 1})
        parent.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        sessions = [parent]
        for index, child_id in enumerate(children):
            descriptor = snapshot_descriptor("continuable", provider="spawn", label=child_id)
            child = rt.sessions.create(
                child_id,
                header=HeaderInit(parent_session="P", origin="subagent", delegation_depth=1, created_at=10 + index),
                seed=[{"type": "subagent/descriptor", "seq": 0, "time": 1, "data": descriptor}],
            )
            child.append("turn/start", {"turn": 1})
            child.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
            sessions.append(child)
        for session in sessions:
            await rt.sessions.flush(session)
