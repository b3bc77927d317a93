"""Helpers of the HTTP API tests: a scripted runtime served in-process, seeded sessions, read counting.

Every test talks to a real uvicorn server on 127.0.0.1:0 running on the test's own event loop
(`dsh.testing.server.running_server`), so disconnects and streams behave as they do in production,
while the test can still drive the runtime directly. Waiting is always on an event under
`HANG_GUARD_S` (a hang guard, never a timing assertion).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from dsh.abort import AbortSignal
from dsh.agent.ids import SequentialIds
from dsh.agent.model import ModelClient
from dsh.agent.models import ScriptedModelClient
from dsh.config import AgentConfig, Config
from dsh.persistence.base import PersistenceObservation
from dsh.persistence.errors import OperationCancelledError
from dsh.query.service import SessionQuery
from dsh.runtime import Runtime
from dsh.session.header import HeaderInit
from dsh.session.session import Session
from dsh.subagent.descriptor import snapshot_descriptor
from dsh.testing.counting import CountingPersistence
from dsh.testing.server import LiveServer, running_server
from dsh.testing.stored_logs import StepClock, append_closed_turn

__all__ = [
    "CHILD_LABEL",
    "HANG_GUARD_S",
    "Api",
    "Family",
    "HeldPersistence",
    "ThreadedServer",
    "api",
    "assert_error",
    "child_header",
    "continuable_child",
    "count_reads",
    "one_shot_child",
    "orphan_child",
    "scripted",
    "seed_family",
    "stored_session",
]

HANG_GUARD_S = 30.0
"""How long a test waits for an awaited fact before failing: a hang guard, never a timing assertion."""

CHILD_LABEL = "Collect sources"
"""The label of the continuable child `seed_family` builds (also its script track)."""


def scripted(**tracks: Sequence[Mapping[str, Any]]) -> ScriptedModelClient:
    """A scripted client: a named track replays its steps (and answers settlement notices); an unnamed
    track (`main`, the continuable child's label and `compaction` by default) answers every request with `OK`."""
    agents: dict[str, Any] = {}
    for key in {"main", CHILD_LABEL, "compaction", *tracks}:
        steps = list(tracks.get(key, ()))
        standing = {"match": {"source": "subagent-settled"}, "text": "NOTED"} if steps else {"text": "OK"}
        agents[key] = {"steps": steps, "on": [standing]}
    return ScriptedModelClient.from_dict({"version": 1, "model": "scripted-test", "agents": agents})


@dataclass
class Api:
    """A served runtime: the runtime, the live server, a client with the token, and the read counter."""

    rt: Runtime
    server: LiveServer
    http: httpx.AsyncClient
    reads: CountingPersistence

    def anonymous(self, **options: Any) -> httpx.AsyncClient:
        """A client without a token."""
        return self.server.client(token="", **options)


def count_reads(rt: Runtime) -> CountingPersistence:
    """Route the runtime's query service through a read counter (history and the catalog read through it)."""
    counting = CountingPersistence(rt.persistence)
    rt.services.query = SessionQuery(rt.sessions, counting, projections=rt.projections)
    return counting


@contextlib.asynccontextmanager
async def api(
    home: Path,
    *,
    model: ModelClient | None = None,
    database_url: str | None = None,
    use_cache: bool = False,
    **server: Any,
) -> AsyncIterator[Api]:
    """A runtime on `home` (JSONL unless `database_url`) with deterministic ids and clock, served in-process."""
    values: dict[str, Any] = {"home": home, "agent": AgentConfig(cancel_grace_s=5.0)}
    if database_url is not None:
        values["database_url"] = database_url
    runtime = Runtime.open(
        Config(**values),
        model=model if model is not None else scripted(),
        ids=SequentialIds(),
        clock=StepClock(),
        use_cache=use_cache,
    )
    async with runtime as rt, running_server(rt, **server) as live, live.client() as http:
        yield Api(rt, live, http, count_reads(rt))


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The response is `{error: {code, message, details}}` with this status and code; returns `details`."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"code", "message", "details"}, error
    assert error["code"] == code, error
    assert isinstance(error["message"], str)
    assert error["message"]
    assert isinstance(error["details"], dict)
    return error["details"]


# ---------------------------------------------------------------- seeded sessions


def child_header(parent_id: str, depth: int = 1) -> HeaderInit:
    """The header of a subagent child of `parent_id`."""
    return HeaderInit(parent_session=parent_id, origin="subagent", delegation_depth=depth)


async def _store(rt: Runtime, session: Session, *, live: bool) -> Session:
    await rt.sessions.flush(session)
    if not live:
        rt.sessions.dispose(session)
    return session


async def stored_session(
    rt: Runtime, session_id: str, *, header: HeaderInit | None = None, turns: int = 1, live: bool = False
) -> Session:
    """A session with `turns` closed turns, flushed; disposed (stored, cold) unless `live`."""
    session = rt.sessions.create(session_id, header=header)
    for turn in range(1, turns + 1):
        append_closed_turn(session, turn)
    return await _store(rt, session, live=live)


async def continuable_child(
    rt: Runtime, parent_id: str, child_id: str, *, label: str = CHILD_LABEL, live: bool = False
) -> Session:
    """A continuable child: descriptor in its creation seed, then one closed turn; stored (resumable) unless `live`."""
    descriptor = {
        "type": "subagent/descriptor",
        "seq": 0,
        "time": rt.sessions.clock(),
        "data": snapshot_descriptor("continuable", provider="spawn", label=label),
    }
    session = rt.sessions.create(child_id, header=child_header(parent_id), seed=[descriptor])
    append_closed_turn(session, 1)
    return await _store(rt, session, live=live)


async def one_shot_child(rt: Runtime, parent_id: str, child_id: str, *, live: bool = False) -> Session:
    """A one-shot child: its descriptor appended inside its first turn."""
    session = rt.sessions.create(child_id, header=child_header(parent_id))
    session.append("turn/start", {"turn": 1})
    session.append("subagent/descriptor", snapshot_descriptor("one-shot", provider="spawn", label="Summarize notes"))
    session.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
    return await _store(rt, session, live=live)


async def orphan_child(rt: Runtime, parent_id: str, child_id: str) -> Session:
    """A stored subagent child without a descriptor: the catalog lists it as a `corrupt` diagnostic row."""
    return await stored_session(rt, child_id, header=child_header(parent_id))


@dataclass
class Family:
    """A parent with one continuable, one one-shot and one diagnostic child (all stored)."""

    parent: str = "parent"
    continuable: str = "child-continuable"
    one_shot: str = "child-one-shot"
    diagnostic: str = "child-diagnostic"
    ids: list[str] = field(default_factory=list)


async def seed_family(rt: Runtime, *, live_parent: bool = False) -> Family:
    """Store the family (children in creation order); the parent's agent is live when `live_parent`."""
    family = Family()
    await stored_session(rt, family.parent)
    await continuable_child(rt, family.parent, family.continuable)
    await one_shot_child(rt, family.parent, family.one_shot)
    await orphan_child(rt, family.parent, family.diagnostic)
    family.ids = [family.continuable, family.one_shot, family.diagnostic]
    if live_parent:
        await rt.resume_agent(family.parent)
    return family


class HeldPersistence(CountingPersistence):
    """A read counter whose cold observations wait for `release` (or the caller's signal) before reading."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def inspect(self, session_id: str, *, signal: AbortSignal | None = None) -> PersistenceObservation:
        """Wait for the release; an aborted signal ends the wait with `OPERATION_CANCELLED`."""
        self.entered.set()
        waiters = [asyncio.ensure_future(self.release.wait())]
        if signal is not None:
            waiters.append(asyncio.ensure_future(signal.wait()))
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
        if signal is not None and signal.aborted:
            self.reads[session_id] += 1
            raise OperationCancelledError(f'reading session "{session_id}" was cancelled')
        return await super().inspect(session_id, signal=signal)


class ThreadedServer:
    """`api(home)` on its own event loop in a background thread, for clients that block (schemathesis, requests).

    `seed(api)` runs on that loop before the server is announced ready; its result is `self.seeded`.
    """

    def __init__(self, home: Path, seed: Callable[[Api], Awaitable[Any]], **options: Any) -> None:
        self._home = home
        self._seed = seed
        self._options = options
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="api-under-test", daemon=True)
        self._failure: BaseException | None = None
        self.base_url = ""
        self.token = ""
        self.seeded: Any = None

    def __enter__(self) -> ThreadedServer:
        self._thread.start()
        if not self._ready.wait(HANG_GUARD_S):
            raise RuntimeError("the threaded API server did not start")
        if self._failure is not None:
            raise self._failure
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(HANG_GUARD_S * 2)
        if self._failure is not None:
            raise self._failure

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as error:
            self._failure = error
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with api(self._home, **self._options) as served:
            self.seeded = await self._seed(served)
            self.base_url = served.server.base_url
            self.token = served.server.token
            self._ready.set()
            await self._stop.wait()
            await served.rt.settle(HANG_GUARD_S)
