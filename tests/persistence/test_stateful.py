"""A stateful model test: every backend, driven through the coordinator, behaves like the memory backend.

Hypothesis drives two identical stacks (store + coordinator) side by side: one over the backend under
test, one over the in-memory reference backend (the model). Every operation — create, append, fork,
flush, dispose, prepare/resume, inspect, read_events, list, revision, restart — runs on both and the
observable outcomes must agree: the same events byte for byte, the same headers and cuts, the same
error classes, and revisions that change exactly when the model's change. The batching window is
never advanced, so writes happen only at flush, retirement and close, which keeps runs deterministic.

A backend joins by adding one entry to `BACKENDS` (a factory given a fresh temporary directory).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import shutil
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule, run_state_machine_as_test

from dsh.json import dumps
from dsh.persistence.base import StorageBackend
from dsh.persistence.coordinator import PersistenceCoordinator
from dsh.persistence.memory import MemoryBackend, MemoryStorage
from dsh.session.header import HeaderInit
from dsh.session.repair import interrupted_turn_closers
from dsh.session.session import Session
from dsh.session.store import SessionStore
from dsh.testing.postgres import ThrowawaySchemas
from dsh.testing.stored_logs import StepClock, append_closed_turn, append_note, append_open_step
from dsh.testing.timer import ManualTimer
from tests.helpers import examples

T = TypeVar("T")

BackendFactory = Callable[[Path], Callable[[], StorageBackend]]


def _memory(_root: Path) -> Callable[[], StorageBackend]:
    storage = MemoryStorage()
    return lambda: MemoryBackend(storage)


def _module(name: str) -> Any:
    """Import a backend module, skipping only when it does not exist yet (never hiding its errors)."""
    if importlib.util.find_spec(name) is None:
        pytest.skip(f"{name} is not available in this build")
    return importlib.import_module(name)


def _jsonl(compression: str) -> BackendFactory:
    def factory(root: Path) -> Callable[[], StorageBackend]:
        jsonl = _module("dsh.persistence.jsonl")
        return lambda: jsonl.JsonlBackend(root / "sessions", compression=compression)

    return factory


def _sqlite(root: Path) -> Callable[[], StorageBackend]:
    sqlite = _module("dsh.persistence.sqlite")
    return lambda: sqlite.SqliteBackend(root / "sessions.sqlite3")


_PG_SCHEMAS = ThrowawaySchemas(prefix="dsh_stateful")
"""The schemas the PostgreSQL runs create (one per example), dropped when the test ends."""


def _postgres(_root: Path) -> Callable[[], StorageBackend]:
    postgres = _module("dsh.persistence.postgres")
    url, schema = _PG_SCHEMAS.url, _PG_SCHEMAS.new()  # skips (or fails under CI) without a server
    return lambda: postgres.PostgresBackend(url, schema=schema)


BACKENDS: dict[str, tuple[BackendFactory, int]] = {
    "memory": (_memory, 50),
    "jsonl-zstd": (_jsonl("zstd"), 20),
    "jsonl-raw": (_jsonl("none"), 20),
    "sqlite": (_sqlite, 20),
    "postgresql": (_postgres, 20),
}
"""Backend name -> (factory given a fresh directory, full number of hypothesis examples, see `examples`)."""

_TYPES = ("turn/start", "turn/end", "session/title", "session/end-seed", "user/message", "step/end")


class _Stack:
    """One store + coordinator over one backend factory, with a manual timer that never advances."""

    def __init__(self, make_backend: Callable[[], StorageBackend]) -> None:
        self.make_backend = make_backend
        self.store = SessionStore(clock=StepClock())
        self.coordinator = PersistenceCoordinator(make_backend(), self.store, timer=ManualTimer())

    async def restart(self) -> None:
        await self.close()
        self.store = SessionStore(clock=StepClock(start=self.store.clock()))
        self.coordinator = PersistenceCoordinator(self.make_backend(), self.store, timer=ManualTimer())
        await self.coordinator.open()

    async def close(self) -> None:
        await self.store.aclose()
        await self.coordinator.close()


async def _outcome(work: Coroutine[Any, Any, T]) -> T | type[BaseException]:
    try:
        return await work
    except Exception as error:
        return type(error)


def _observed(value: Any) -> Any:
    """A comparable digest of an observation, slice, listing or error class."""
    if isinstance(value, type):
        return value
    if hasattr(value, "synthetic_tail"):
        return (value.header, value.inherited_event_count, value.live, value.synthetic_tail, _bytes(value.events))
    if hasattr(value, "next_seq"):
        return (value.header, value.inherited_event_count, value.next_seq, _bytes(value.events))
    return value


def _bytes(events: Any) -> list[bytes]:
    return [dumps(event) for event in events]


class PersistenceModel(RuleBasedStateMachine):
    """Drives the backend under test and the memory model through identical operations."""

    factory: BackendFactory = _memory

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="dsh-stateful-"))
        self.loop = asyncio.new_event_loop()
        self.ids = iter(f"s{index}" for index in range(1_000_000))
        self.used: list[str] = []
        self.turns: dict[str, int] = {}
        self.revisions: dict[str, tuple[Any, Any]] = {}
        self.sut = self.run(self._stack(type(self).factory(self.root)))
        self.model = self.run(self._stack(_memory(self.root)))

    @staticmethod
    async def _stack(make_backend: Callable[[], StorageBackend]) -> _Stack:
        stack = _Stack(make_backend)
        await stack.coordinator.open()
        return stack

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def both(self, operation: Callable[[_Stack], Coroutine[Any, Any, Any]]) -> tuple[Any, Any]:
        """Run `operation` on the system under test and on the model; return both outcomes."""
        sut = self.run(_outcome(operation(self.sut)))
        model = self.run(_outcome(operation(self.model)))
        return sut, model

    def agree(self, operation: Callable[[_Stack], Coroutine[Any, Any, Any]]) -> Any:
        sut, model = self.both(operation)
        assert _observed(sut) == _observed(model)
        return model

    def live_pair(self, session_id: str) -> tuple[Session, Session] | None:
        sut, model = self.sut.store.get(session_id), self.model.store.get(session_id)
        assert (sut is None) == (model is None)
        return None if sut is None or model is None else (sut, model)

    def live_ids(self) -> list[str]:
        return [session.id for session in self.model.store.list()]

    def teardown(self) -> None:
        try:
            for stack in (self.sut, self.model):
                with contextlib.suppress(Exception):
                    self.run(stack.close())
            self.run(self.loop.shutdown_asyncgens())
            self.run(self.loop.shutdown_default_executor())
        finally:
            self.loop.close()
            shutil.rmtree(self.root, ignore_errors=True)

    # ---------------------------------------------------------------- session lifecycle

    @rule(cwd=st.sampled_from([None, "/srv/a", "/srv/b c"]), depth=st.integers(0, 2))
    def create(self, cwd: str | None, depth: int) -> None:
        """Create and publish a fresh session in both stores."""
        session_id = next(self.ids)
        self.used.append(session_id)
        header = HeaderInit(cwd=cwd, delegation_depth=depth)
        self.agree(lambda stack: self._sync(lambda: stack.store.create(session_id, header=header).id))

    @staticmethod
    async def _sync(work: Callable[[], T]) -> T:
        return work()

    @precondition(lambda self: bool(self.model.store.list()))
    @rule(data=st.data(), kind=st.sampled_from(["closed", "open", "note"]))
    def append(self, data: st.DataObject, kind: str) -> None:
        """Append a closed turn, an open step or a note to one live session in both stores."""
        session_id = data.draw(st.sampled_from(self.live_ids()))
        pair = self.live_pair(session_id)
        assert pair is not None
        turn = self.turns.get(session_id, 0) + 1
        self.turns[session_id] = turn
        for session in pair:
            if kind == "closed":
                append_closed_turn(session, turn)
            elif kind == "open":
                append_open_step(session, turn, calls=["c1"], started=["c1"])
            else:
                append_note(session, turn)

    @precondition(lambda self: bool(self.model.store.list()))
    @rule(data=st.data())
    def flush(self, data: st.DataObject) -> None:
        """Flush one live session in both stores."""
        session_id = data.draw(st.sampled_from(self.live_ids()))
        self.check_revision(session_id)
        self.agree(lambda stack: self._flush(stack, session_id))
        self.check_revision(session_id)

    @staticmethod
    async def _flush(stack: _Stack, session_id: str) -> bool:
        session = stack.store.get(session_id)
        assert session is not None
        return await stack.store.flush(session)

    @precondition(lambda self: bool(self.model.store.list()))
    @rule(data=st.data())
    def dispose(self, data: st.DataObject) -> None:
        """Dispose one live session in both stores and drain it."""
        session_id = data.draw(st.sampled_from(self.live_ids()))
        self.agree(lambda stack: self._dispose(stack, session_id))
        self.check_revision(session_id)

    @staticmethod
    async def _dispose(stack: _Stack, session_id: str) -> None:
        session = stack.store.get(session_id)
        assert session is not None
        stack.store.dispose(session)
        await stack.coordinator.drain(session_id)

    @precondition(lambda self: bool(self.model.store.list()))
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        """Fork one live session (when its tail turn is closed) in both stores."""
        parent = data.draw(st.sampled_from(self.live_ids()))
        model_parent = self.model.store.get(parent)
        assert model_parent is not None
        if not model_parent.events or interrupted_turn_closers(model_parent.events):
            return
        child = next(self.ids)
        self.used.append(child)
        self.turns[child] = self.turns.get(parent, 0)
        self.agree(lambda stack: self._sync(lambda: stack.store.fork(parent, child_id=child).id))

    @precondition(lambda self: bool(self.used))
    @rule(data=st.data(), publish=st.booleans())
    def prepare(self, data: st.DataObject, publish: bool) -> None:
        """Prepare one id in both stacks; publish it (resume) or close the preparation unpublished."""
        session_id = data.draw(st.sampled_from(self.used))
        self.check_revision(session_id)
        self.agree(lambda stack: self._prepare(stack, session_id, publish))
        self.check_revision(session_id)

    @staticmethod
    async def _prepare(stack: _Stack, session_id: str, publish: bool) -> Any:
        prepared = await stack.coordinator.prepare(session_id)
        observed = _observed(prepared.observation)
        if publish:
            prepared.publish()
        else:
            await prepared.close()
        return (observed, prepared.session.first_live_seq, prepared.session.state)

    # ---------------------------------------------------------------- reads

    @rule(data=st.data())
    def inspect(self, data: st.DataObject) -> None:
        """Inspect one known (or unknown) id in both stacks."""
        session_id = data.draw(st.sampled_from([*self.used, "unknown"]))
        self.agree(lambda stack: stack.coordinator.inspect(session_id))

    @rule(
        data=st.data(),
        types=st.one_of(st.none(), st.sets(st.sampled_from(_TYPES), max_size=3)),
        from_seq=st.integers(0, 8),
    )
    def read_events(self, data: st.DataObject, types: set[str] | None, from_seq: int) -> None:
        """Read stored events (optionally typed, from a seq) of one id in both stacks."""
        session_id = data.draw(st.sampled_from([*self.used, "unknown"]))
        self.agree(lambda stack: stack.coordinator.read_events(session_id, types=types, from_seq=from_seq))

    @rule()
    def list_sessions(self) -> None:
        """List stored sessions in both stacks: same headers in the same order, nothing damaged."""
        sut, model = self.both(lambda stack: stack.coordinator.list())
        assert [row.header for row in sut] == [row.header for row in model]
        assert sut.damaged == model.damaged == []

    @precondition(lambda self: bool(self.used))
    @rule(data=st.data())
    def revision(self, data: st.DataObject) -> None:
        """Revisions change in the backend under test exactly when they change in the model."""
        self.check_revision(data.draw(st.sampled_from(self.used)))

    def check_revision(self, session_id: str) -> None:
        """Compare the revision of the id with its previous reading, on both sides."""
        current = self.both(lambda stack: stack.coordinator.revision(session_id))
        sut, model = current
        assert (sut is None) == (model is None)
        previous = self.revisions.get(session_id)
        if previous is not None:
            assert (sut == previous[0]) == (model == previous[1])
        self.revisions[session_id] = current

    @rule()
    def restart(self) -> None:
        """Close both stacks (draining every live session) and reopen them over the same storage."""
        self.both(lambda stack: stack.restart())
        self.revisions.clear()


@pytest.mark.parametrize("name", list(BACKENDS))
def test_backend_matches_the_memory_model(name: str) -> None:
    """Random operation sequences on the backend agree with the in-memory reference backend."""
    factory, full_examples = BACKENDS[name]
    if name != "memory":
        factory(Path(tempfile.gettempdir()))  # skips cleanly when the backend module does not exist yet
    machine = type(f"Model_{name.replace('-', '_')}", (PersistenceModel,), {"factory": staticmethod(factory)})
    try:
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=examples(full_examples),
                stateful_step_count=25,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
    finally:
        _PG_SCHEMAS.drop_all()
