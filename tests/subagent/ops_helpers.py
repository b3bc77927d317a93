"""Helpers of the subagent operation tests: scripted runtimes, a recording model, read counters, log readers.

Every operation test runs a real `Runtime` (JSONL persistence on `tmp_path`, deterministic ids and
clock) driven by a `ScriptedModelClient`, so descriptors, turns and notices are checked in logs the
real loop wrote. Waiting is always on events (`rt.settle`, `client.wait_held`, `agent.wait_idle`)
under `HANG_GUARD_S`, a guard against hangs and never a timing assertion.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from dsh.abort import AbortSignal
from dsh.agent.ids import IdFactory, SequentialIds
from dsh.agent.loop import Agent
from dsh.agent.model import ModelChunk, ModelRequest
from dsh.agent.models import ScriptedModelClient
from dsh.agent.tools import Tool
from dsh.config import Config
from dsh.persistence.coordinator import PersistenceCoordinator
from dsh.runtime import Runtime
from dsh.session.events import SessionEvent
from dsh.subagent.providers import ContinuableSpec, ContinuableStarted
from dsh.testing.stored_logs import StepClock

__all__ = [
    "HANG_GUARD_S",
    "NOTED",
    "LifecycleLog",
    "ReadCounter",
    "RecordingModel",
    "data",
    "descriptor_events",
    "log_file",
    "ops_runtime",
    "scripted",
    "settle",
    "start_child",
    "stored_events",
    "turn_ends",
    "turn_numbers",
    "user_prompts",
    "user_sources",
]

HANG_GUARD_S = 30.0
"""How long a test waits for an awaited fact before failing: a hang guard, never a timing assertion."""

NOTED: Mapping[str, Any] = {"match": {"source": "subagent-settled"}, "text": "NOTED"}
"""A standing script entry that answers every settlement notice."""


def scripted(tracks: Mapping[str, Sequence[Mapping[str, Any]] | Mapping[str, Any]]) -> ScriptedModelClient:
    """A scripted client; a track is a list of steps or `{"steps": [...], "on": [...]}`.

    The `main` track (top-level agents) answers every settlement notice with `NOTED` unless it
    declares its own `on` entries.
    """
    agents: dict[str, Any] = {}
    for key, track in tracks.items():
        agents[key] = {"steps": list(track)} if isinstance(track, Sequence) else dict(track)
    main = agents.setdefault("main", {"steps": []})
    main.setdefault("on", [dict(NOTED)])
    return ScriptedModelClient.from_dict({"version": 1, "model": "scripted-test", "agents": agents})


class RecordingModel:
    """A model client that records every request and answers from a scripted client."""

    provider = "scripted"

    def __init__(self, inner: ScriptedModelClient) -> None:
        self.inner = inner
        self.requests: list[ModelRequest] = []

    @property
    def model(self) -> str:
        """The script's model name."""
        return self.inner.model

    def stream(self, request: ModelRequest, *, signal: AbortSignal) -> AsyncIterator[ModelChunk]:
        """Record, then stream the scripted answer."""
        self.requests.append(request)
        return self.inner.stream(request, signal=signal)

    def for_key(self, agent_key: str) -> list[ModelRequest]:
        """The requests of one script track."""
        return [request for request in self.requests if request.meta.agent_key == agent_key]

    async def aclose(self) -> None:
        """Nothing to release."""


@contextlib.asynccontextmanager
async def ops_runtime(
    home: Path,
    model: Any,
    *,
    tools: Sequence[Tool] = (),
    use_cache: bool = True,
    ids: IdFactory | None = None,
    clock: StepClock | None = None,
) -> AsyncIterator[Runtime]:
    """A runtime on `home` with deterministic ids and clock, driven by `model`.

    Pass the `ids` and `clock` of an earlier runtime on the same home to continue their streams
    across a restart (so no message id or event time repeats).
    """
    async with Runtime.open(
        Config(home=home),
        model=model,
        ids=ids if ids is not None else SequentialIds(),
        clock=clock if clock is not None else StepClock(),
        tools=tools,
        use_cache=use_cache,
    ) as rt:
        yield rt


async def settle(rt: Runtime) -> None:
    """Wait until every agent is idle and every settled child was disposed and announced."""
    await rt.settle(timeout=HANG_GUARD_S)


async def start_child(rt: Runtime, parent: Agent, label: str, prompt: str | None = None, **spec: Any) -> str:
    """`start_continuable` a child of `parent`; returns its id."""
    started: ContinuableStarted = await rt.subagents.start_continuable(
        ContinuableSpec(parent=parent, prompt=prompt if prompt is not None else f"task: {label}", label=label, **spec)
    )
    return started.child_id


class LifecycleLog:
    """Records the runtime's lifecycle notifications."""

    def __init__(self, rt: Runtime) -> None:
        self.events: list[Mapping[str, Any]] = []
        self._arrived = asyncio.Event()
        self.unsubscribe = rt.subagents.on_event(self._record)

    def _record(self, event: Mapping[str, Any]) -> None:
        self.events.append(event)
        arrived, self._arrived = self._arrived, asyncio.Event()
        arrived.set()

    async def wait_end(self, child_id: str) -> None:
        """Wait (under the hang guard) until `child_id` emitted `subagent/end`."""

        async def ended() -> None:
            while not self.ends_for(child_id):
                await self._arrived.wait()

        await asyncio.wait_for(ended(), HANG_GUARD_S)

    def of(self, kind: str) -> list[Mapping[str, Any]]:
        """The notifications of one type (`subagent/start`, `subagent/end`, ...)."""
        return [event for event in self.events if event["type"] == kind]

    def ends_for(self, child_id: str) -> list[Mapping[str, Any]]:
        """The `subagent/end` notifications of one child."""
        return [event for event in self.of("subagent/end") if event["childSessionId"] == child_id]


class ReadCounter:
    """Counts `prepare`, `inspect` and `read_events` per session id on one persistence coordinator.

    The wrappers are instance attributes, so every caller of the coordinator (the query service, the
    subagent runtime, resume) is counted; `restore()` removes them.
    """

    def __init__(self, coordinator: PersistenceCoordinator) -> None:
        self.coordinator = coordinator
        self.calls: Counter[tuple[str, str]] = Counter()
        for name in ("prepare", "inspect", "read_events"):
            setattr(coordinator, name, self._wrap(name, getattr(coordinator, name)))

    def _wrap(self, name: str, method: Any) -> Any:
        async def counted(session_id: str, *args: Any, **kwargs: Any) -> Any:
            self.calls[(name, session_id)] += 1
            return await method(session_id, *args, **kwargs)

        return counted

    def count(self, name: str, session_id: str) -> int:
        """Calls of `name` for one id."""
        return self.calls[(name, session_id)]

    def reads(self, session_id: str) -> int:
        """Every log read of one id."""
        return sum(count for (_, sid), count in self.calls.items() if sid == session_id)

    def restore(self) -> None:
        """Remove the wrappers."""
        for name in ("prepare", "inspect", "read_events"):
            with contextlib.suppress(AttributeError):
                delattr(self.coordinator, name)


def data(event: SessionEvent | Mapping[str, Any]) -> Mapping[str, Any]:
    """An event's data as a mapping."""
    value = event["data"]
    assert isinstance(value, Mapping)
    return value


def descriptor_events(events: Sequence[SessionEvent]) -> list[SessionEvent]:
    """The `subagent/descriptor` events."""
    return [event for event in events if event.type == "subagent/descriptor"]


def turn_numbers(events: Sequence[SessionEvent]) -> list[int]:
    """The numbers of the `turn/start` events, in order."""
    return [data(event)["turn"] for event in events if event.type == "turn/start"]


def turn_ends(events: Sequence[SessionEvent]) -> list[Mapping[str, Any]]:
    """The reasons of the `turn/end` events, in order."""
    return [data(event)["reason"] for event in events if event.type == "turn/end"]


def _user_messages(events: Sequence[SessionEvent]) -> Iterator[Mapping[str, Any]]:
    for event in events:
        if event.type == "user/message" and data(event)["source"].get("kind") != "plugin":
            yield data(event)


def user_prompts(events: Sequence[SessionEvent]) -> list[str]:
    """The text of every `user/message` but the per-turn context messages, in order."""
    return ["".join(block.get("text", "") for block in message["content"]) for message in _user_messages(events)]


def user_sources(events: Sequence[SessionEvent]) -> list[Mapping[str, Any]]:
    """The source of every `user/message` but the per-turn context messages, in order."""
    return [message["source"] for message in _user_messages(events)]


async def stored_events(rt: Runtime, session_id: str) -> list[SessionEvent]:
    """The events of a session as the query service observes them (live view or one stored read)."""
    observation = await asyncio.wait_for(rt.query.observe_session(session_id), HANG_GUARD_S)
    return list(observation.events)


def log_file(home: Path, session_id: str) -> Path:
    """The JSONL log file of a session under `home`."""
    (found,) = [path for path in (home / "sessions").rglob("session.jsonl*") if path.parent.name == session_id]
    return found
