"""Shared helpers for the session query tests: transcripts, persistence fakes and spies.

The fakes implement the `SessionPersistence` protocol by hand: `FakePersistence` serves fixed data,
`StallingPersistence` is a backend that blocks until its signal aborts (or ignores the abort and
returns data). The spies wrap the real memory-backed coordinator and backend and count every call,
so a test can prove the query only ever lists and inspects. The fixtures live in `conftest.py`.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from dsh.abort import AbortSignal
from dsh.persistence.base import DamagedSession, PersistenceObservation, Revision, SessionListing, StoredSessionInfo
from dsh.persistence.errors import OperationCancelledError, SessionNotFoundError
from dsh.persistence.memory import StoredSession
from dsh.projection import ClientView, ProjectionUnit
from dsh.session import HeaderInit, Session, SessionEvent, SessionHeader, SessionId, SessionStore

# --------------------------------------------------------------------------------------------------
# Transcripts


class Script:
    """Appends valid transcript events to one session (turns, messages, streamed replies)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._ids = itertools.count(1)
        self._turn = itertools.count(0)
        self.turn = -1

    def _id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids)}"

    def start(self) -> SessionEvent:
        """Open a turn."""
        self.turn = next(self._turn)
        return self.session.append("turn/start", {"turn": self.turn})

    def end(self) -> SessionEvent:
        """Close the open turn."""
        return self.session.append("turn/end", {"turn": self.turn, "reason": {"kind": "completed"}})

    def user(self, text: str = "hi") -> SessionEvent:
        """Append a user message to the surface."""
        message = {"id": self._id("u"), "role": "user", "content": [{"type": "text", "text": text}]}
        message["source"] = {"kind": "user"}
        return self.session.append("user/message", message)

    def chunk(self, text: str = "x") -> SessionEvent:
        """Append one streamed assistant chunk."""
        return self.session.append(
            "assistant/chunk", {"turn": self.turn, "step": 0, "chunk": {"type": "text-delta", "text": text}}
        )

    def assistant(self, text: str = "ok", *, sources: Sequence[int] | None = None) -> SessionEvent:
        """Append an assistant message assembled from `sources` (chunk seqs)."""
        message = {
            "id": self._id("a"),
            "role": "assistant",
            "content": [{"type": "text", "text": text}],
            "source": {"kind": "model", "provider": "p", "model": "m"},
        }
        return self.session.append(
            "assistant/message", {"turn": self.turn, "step": 0, "message": message}, source_event_seqs=sources
        )

    def exchange(self, *, chunks: int = 0) -> None:
        """A closed turn: user message, `chunks` chunks, the assistant message citing them."""
        self.start()
        self.user()
        seqs = [self.chunk().seq for _ in range(chunks)]
        self.assistant(sources=seqs or None)
        self.end()

    def note(self) -> SessionEvent:
        """A log-only event that is never a history message."""
        return self.session.append("request/context", {"provider": "p", "model": "m"})


def closed_log(session: Session, turns: int = 1, *, chunks: int = 0) -> Script:
    """Append `turns` closed exchanges to `session` and return its script."""
    script = Script(session)
    for _ in range(turns):
        script.exchange(chunks=chunks)
    return script


def authored(
    author: SessionStore, session_id: str, *, turns: int = 1, header: HeaderInit | None = None
) -> tuple[SessionHeader, tuple[SessionEvent, ...]]:
    """Author a closed log in `author` and detach it: `(header, events)` as persistence would hold them."""
    session = author.create(session_id, header=header)
    closed_log(session, turns)
    author.dispose(session)
    return session.header, tuple(session.events)


def observation(
    header: SessionHeader, events: Sequence[SessionEvent], cut: int = 0, *, revision: str = "r1"
) -> PersistenceObservation:
    """A cold persistence observation of `events`."""
    return PersistenceObservation(
        header=header,
        events=events,
        inherited_event_count=cut,
        revision=Revision(revision),
        live=False,
        synthetic_tail=0,
    )


# --------------------------------------------------------------------------------------------------
# Projection units and witness fields


class Passthrough:
    """A schema that accepts every value unchanged."""

    def validate_python(self, value: object, /) -> object:
        """Return `value`."""
        return value


def counter_unit(
    key: str = "counter",
    *,
    render: Callable[[Mapping[str, Any]], object] | None = None,
    apply: Callable[[Mapping[str, Any], SessionEvent], Mapping[str, Any]] | None = None,
) -> ProjectionUnit[Any, Any]:
    """A unit counting every event; its view is `{"n": count}`."""
    return ProjectionUnit(
        key=key,
        state_version=1,
        init=lambda: {"n": 0},
        apply=apply or (lambda state, _event: {"n": state["n"] + 1}),
        state_schema=Passthrough(),
        view=ClientView(render=render or (lambda state: {"n": state["n"]}), schema=Passthrough()),
    )


# For each of the nine lifecycle-witness fields (wire name): a header change that differs only there.
# See docs/glossary.md#witness.
WITNESS_CHANGES: dict[str, dict[str, object]] = {
    "version": {"version": 1},
    "id": {"id": SessionId("other")},
    "createdAt": {"created_at": 424242},
    "cwd": {"cwd": "/elsewhere"},
    "parentSession": {"parent_session": SessionId("someone")},
    "isSeeded": {"is_seeded": True},
    "delegationDepth": {"delegation_depth": 2},
    "origin": {"origin": "subagent"},
    "agentPreset": {"agent_preset": "other-preset"},
}


# --------------------------------------------------------------------------------------------------
# Hand-written persistence fakes (the SessionPersistence protocol)


class ForbiddenCallError(AssertionError):
    """The query called a persistence method it must never call."""


@dataclass
class FakePersistence:
    """A `SessionPersistence` over fixed data that counts calls and records the signals it got.

    Attributes:
        rows: Headers `list()` returns (in this order; duplicates allowed).
        logs: Observations `inspect()` returns, by id; other ids are not found.
        damaged: Entries `list()` reports as damaged (whatever its filter).
        parents: The `parents` argument of every `list()` call, in call order.
        list_error: Raised by `list()` instead of returning.
        inspect_error: Raised by `inspect()` instead of returning.
        on_inspect: Awaited inside `inspect()` before it returns or raises (a test hook).
    """

    rows: list[SessionHeader] = field(default_factory=list)
    logs: dict[str, PersistenceObservation] = field(default_factory=dict)
    damaged: list[DamagedSession] = field(default_factory=list)
    parents: list[Collection[str | None] | None] = field(default_factory=list)
    list_error: BaseException | None = None
    inspect_error: BaseException | None = None
    on_inspect: Callable[[], Awaitable[None]] | None = None
    calls: Counter[str] = field(default_factory=Counter)
    signals: list[AbortSignal | None] = field(default_factory=list)

    async def list(
        self,
        *,
        parent_session: str | None = None,
        parents: Collection[str | None] | None = None,
        signal: AbortSignal | None = None,
    ) -> SessionListing:
        """Return the fixed rows, those under `parents` when given (or raise `list_error`)."""
        self.calls["list"] += 1
        self.signals.append(signal)
        self.parents.append(parents)
        if self.list_error is not None:
            raise self.list_error
        return SessionListing(
            [
                StoredSessionInfo(header, Revision("r1"))
                for header in self.rows
                if parents is None or header.parent_session in parents
            ],
            list(self.damaged),
        )

    async def inspect(self, session_id: str, *, signal: AbortSignal | None = None) -> PersistenceObservation:
        """Return the fixed observation (or raise)."""
        self.calls["inspect"] += 1
        self.signals.append(signal)
        if self.on_inspect is not None:
            await self.on_inspect()
        if self.inspect_error is not None:
            raise self.inspect_error
        found = self.logs.get(session_id)
        if found is None:
            raise SessionNotFoundError(f'session "{session_id}" not found', session_id=session_id)
        return found

    def _forbidden(self, name: str) -> ForbiddenCallError:
        self.calls[name] += 1
        return ForbiddenCallError(f"the query must not call persistence.{name}")

    async def read_events(self, session_id: str, **_: object) -> Any:
        """Forbidden for the query."""
        raise self._forbidden("read_events")

    async def prepare(self, session_id: str, **_: object) -> Any:
        """Forbidden for the query."""
        raise self._forbidden("prepare")

    async def revision(self, session_id: str, **_: object) -> Any:
        """Forbidden for the query."""
        raise self._forbidden("revision")

    async def drain(self, session_id: str) -> None:
        """Forbidden for the query."""
        raise self._forbidden("drain")

    def locate(self, header: SessionHeader) -> str | None:
        """No artifact paths."""
        return None

    async def close(self) -> None:
        """Forbidden for the query."""
        raise self._forbidden("close")


class RaisingPersistence(FakePersistence):
    """Every method raises (proves a live observation never consults persistence)."""

    def __init__(self) -> None:
        super().__init__(list_error=OSError("backend down"), inspect_error=OSError("backend down"))


@dataclass
class StallingPersistence(FakePersistence):
    """`list`/`inspect` wait until their signal aborts, then raise ("blocking") or return ("ignoring").

    The call does not settle on the abort alone: it also waits for `release`, so a test can prove the
    query is still awaiting the backend after the abort and raises only once the call settled.

    Attributes:
        ignore_abort: Return data after the abort instead of raising (the "ignoring backend").
        entered: Set once a call started waiting.
        saw_abort: Set once the call observed the abort.
        release: The test sets it to let the call settle.
        settled: How many calls settled (returned or raised).
        cancelled: How many calls received task cancellation.
    """

    ignore_abort: bool = False
    entered: asyncio.Event = field(default_factory=asyncio.Event)
    saw_abort: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    settled: int = 0
    cancelled: int = 0

    async def _stall(self, signal: AbortSignal | None) -> None:
        assert signal is not None, "the query must forward the caller's signal"
        self.entered.set()
        try:
            await signal.wait()
            self.saw_abort.set()
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.settled += 1
        if not self.ignore_abort:
            raise OperationCancelledError("persistence read cancelled", reason=signal.reason)

    async def list(
        self,
        *,
        parent_session: str | None = None,
        parents: Collection[str | None] | None = None,
        signal: AbortSignal | None = None,
    ) -> SessionListing:
        """Stall until aborted and released."""
        self.calls["list"] += 1
        self.signals.append(signal)
        self.parents.append(parents)
        await self._stall(signal)
        return SessionListing([StoredSessionInfo(header, Revision("r1")) for header in self.rows])

    async def inspect(self, session_id: str, *, signal: AbortSignal | None = None) -> PersistenceObservation:
        """Stall until aborted and released."""
        self.calls["inspect"] += 1
        self.signals.append(signal)
        await self._stall(signal)
        return self.logs[session_id]


# --------------------------------------------------------------------------------------------------
# Spies around the real coordinator and backend


_BACKEND_MUTATIONS = ("append_batch", "commit_repair", "acquire", "release")
_PERSISTENCE_METHODS = ("list", "inspect", "read_events", "prepare", "revision", "drain")


class SpyPersistence:
    """Wraps a real `SessionPersistence` and counts every method call (by name)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()
        self.signals: list[object] = []

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.inner, name)
        if name not in _PERSISTENCE_METHODS:
            return target

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            self.signals.append(kwargs.get("signal"))
            return await target(*args, **kwargs)

        return counted

    def locate(self, header: SessionHeader) -> str | None:
        """Forwarded (no I/O)."""
        return self.inner.locate(header)  # type: ignore[no-any-return]


class SpyBackend:
    """Wraps a real `StorageBackend` and counts every call; `mutations()` lists the writes the query never makes."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()
        self.name = inner.name
        self.capabilities = inner.capabilities

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.inner, name)
        if not callable(target):
            return target
        if asyncio.iscoroutinefunction(target):

            async def counted_async(*args: Any, **kwargs: Any) -> Any:
                self.calls[name] += 1
                return await target(*args, **kwargs)

            return counted_async

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return target(*args, **kwargs)

        return counted

    def mutations(self) -> dict[str, int]:
        """Counts of every mutating backend call (should stay empty under the query)."""
        return {name: self.calls[name] for name in _BACKEND_MUTATIONS if self.calls[name]}


def store_ids(store: SessionStore) -> list[str]:
    """Ids of the store's live sessions."""
    return [session.id for session in store.list()]


def headers_of(records: Iterable[Any]) -> list[str]:
    """Ids of corpus records, in order."""
    return [record.header.id for record in records]


def stored_header(**fields: Mapping[str, object] | object) -> SessionHeader:
    """A logical header parsed from a stored header record (normalising absent fields)."""
    record: dict[str, object] = {"type": "session", "version": 0, "id": "s", "createdAt": 1}
    record.update(fields)
    header, _ = SessionHeader.from_stored(record)
    return header


# --------------------------------------------------------------------------------------------------
# The real stack: memory backend + coordinator, wrapped in spies


@dataclass
class Stack:
    """A store with real memory-backed persistence; `persistence` and `backend` count every call.

    Attributes:
        store: The session store (shared with the coordinator).
        coordinator: The real `PersistenceCoordinator`.
        persistence: The spy the query under test is given.
        backend: The spy around the memory backend.
        storage: The memory storage (fixture writers edit it directly).
    """

    store: SessionStore
    coordinator: Any
    persistence: SpyPersistence
    backend: SpyBackend
    storage: Any

    async def persist(self, session: Session) -> None:
        """Make `session` durable, dispose it and wait for its retirement (it becomes cold)."""
        await self.store.flush(session)
        self.store.dispose(session)
        await self.coordinator.drain(session.id)

    def author(self, session_id: str, header: Mapping[str, object], records: Sequence[Mapping[str, Any]]) -> None:
        """Store a raw header record and event records directly, bypassing every check."""
        self.storage.sessions[session_id] = StoredSession(
            orjson.dumps(dict(header)), [orjson.dumps(dict(record)) for record in records]
        )

    def reset_counts(self) -> None:
        """Forget every call counted so far (after a test's setup)."""
        self.persistence.calls.clear()
        self.persistence.signals.clear()
        self.backend.calls.clear()
