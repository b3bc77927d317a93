"""Helpers of the push-stream tests: a scripted runtime with a hub, and frame collectors.

Waiting is always on an event (a frame arriving, an agent going idle) under `HANG_GUARD_S`, a guard
against hangs and never a timing assertion.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from dsh.agent.ids import SequentialIds
from dsh.agent.models import ScriptedModelClient
from dsh.config import AgentConfig, Config
from dsh.persistence.memory import MemoryBackend
from dsh.runtime import Runtime
from dsh.server.stream import Frame, PushHub, Subscription
from dsh.testing.server import LiveServer, running_server
from dsh.testing.stored_logs import StepClock
from dsh.timer import Timer

__all__ = [
    "HANG_GUARD_S",
    "NOTED",
    "EventSource",
    "Received",
    "collect",
    "hub_runtime",
    "scripted",
    "served_hub",
    "take",
]

HANG_GUARD_S = 30.0
"""How long a test waits for an awaited fact before failing: a hang guard, never a timing assertion."""

NOTED: Mapping[str, Any] = {"match": {"source": "subagent-settled"}, "text": "NOTED"}
"""A standing script entry that answers every settlement notice."""


def scripted(tracks: Mapping[str, Sequence[Mapping[str, Any]] | Mapping[str, Any]]) -> ScriptedModelClient:
    """A scripted client; a track is a list of steps or `{"steps": [...], "on": [...]}`; `main` answers notices."""
    agents: dict[str, Any] = {}
    for key, track in tracks.items():
        agents[key] = {"steps": list(track)} if isinstance(track, Sequence) else dict(track)
    main = agents.setdefault("main", {"steps": []})
    main.setdefault("on", [dict(NOTED)])
    return ScriptedModelClient.from_dict({"version": 1, "model": "scripted-test", "agents": agents})


@contextlib.asynccontextmanager
async def hub_runtime(
    home: Path,
    model: Any = None,
    *,
    log_chunks: bool = False,
    buffer_size: int = 1024,
    queue_size: int = 1000,
    coalesce_ms: int = 0,
    timer: Timer | None = None,
    delta_ms: int = 50,
) -> AsyncIterator[tuple[Runtime, PushHub]]:
    """An open in-memory runtime (deterministic ids and clock) with a started hub, closed in the server's order."""
    config = Config(home=home, agent=AgentConfig(log_chunks=log_chunks))
    runtime = Runtime.open(
        config,
        model=model if model is not None else scripted({}),
        ids=SequentialIds(),
        clock=StepClock(),
        backend=MemoryBackend(),
        use_cache=False,
    )
    async with runtime as rt:
        hub = PushHub(
            rt, buffer_size=buffer_size, queue_size=queue_size, coalesce_ms=coalesce_ms, timer=timer, delta_ms=delta_ms
        )
        hub.start()
        try:
            yield rt, hub
        finally:
            await hub.aclose()


async def take(subscription: Subscription, count: int) -> list[Frame]:
    """The next `count` frames of `subscription` (under the hang guard); fewer only if the stream ends."""
    return await collect(subscription, lambda frames: len(frames) >= count) if count else []


async def collect(subscription: Subscription, until: Callable[[list[Frame]], bool]) -> list[Frame]:
    """Frames from `subscription` until `until(frames)` holds or the stream ends (under the hang guard)."""
    frames: list[Frame] = []

    async def read() -> None:
        async for frame in subscription:
            frames.append(frame)
            if until(frames):
                return

    await asyncio.wait_for(read(), HANG_GUARD_S)
    return frames


@contextlib.asynccontextmanager
async def served_hub(
    home: Path,
    model: Any,
    *,
    buffer_size: int = 1024,
    queue_size: int = 1000,
    ping_interval_s: float = 15.0,
    database_url: str | None = None,
) -> AsyncIterator[tuple[Runtime, PushHub, LiveServer]]:
    """A scripted runtime on `home` (JSONL unless `database_url`) served on 127.0.0.1:0 with a hub of these sizes."""
    values: dict[str, Any] = {"home": home}
    if database_url is not None:
        values["database_url"] = database_url
    runtime = Runtime.open(Config(**values), model=model, ids=SequentialIds(), clock=StepClock(), use_cache=False)
    async with runtime as rt:
        hub = PushHub(rt, buffer_size=buffer_size, queue_size=queue_size)
        hub.start()
        async with running_server(rt, hub=hub, ping_interval_s=ping_interval_s) as server:
            yield rt, hub, server


@dataclass(frozen=True, slots=True)
class Received:
    """One Server-Sent Event as a client parsed it: `raw` is the `data` line exactly as sent."""

    id: int | None
    event: str
    raw: str

    @property
    def data(self) -> dict[str, Any]:
        """The parsed `data` object."""
        value: dict[str, Any] = json.loads(self.raw)
        return value


class EventSource:
    """Reads the frames (and `: ping` comments) of one open `text/event-stream` response."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self._lines = response.aiter_lines()
        self.frames: list[Received] = []
        """Every frame read so far, in arrival order."""
        self.comments: list[str] = []
        """Every comment line read so far (`: ping`)."""
        self.ended = False

    async def _next(self) -> Received | str | None:
        """The next frame, or comment line, or None when the stream ended."""
        fields: dict[str, str] = {}
        async for line in self._lines:
            if line == "":
                if fields:
                    frame_id = fields.get("id")
                    return Received(int(frame_id) if frame_id else None, fields.get("event", "message"), fields["data"])
                continue
            if line.startswith(":"):
                return line
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            fields[name] = f"{fields[name]}\n{value}" if name == "data" and name in fields else value
        self.ended = True
        return None

    async def until(self, done: Callable[[list[Received]], bool]) -> list[Received]:
        """Read until `done(frames)` holds (checked after each frame) or the stream ends; under the hang guard."""

        async def read() -> None:
            while not done(self.frames):
                item = await self._next()
                if item is None:
                    return
                if isinstance(item, str):
                    self.comments.append(item)
                else:
                    self.frames.append(item)

        await asyncio.wait_for(read(), HANG_GUARD_S)
        return self.frames

    async def until_comment(self) -> str:
        """Read until the next comment line (frames read meanwhile are kept); under the hang guard."""
        seen = len(self.comments)

        async def read() -> None:
            while len(self.comments) == seen:
                item = await self._next()
                if item is None:
                    raise AssertionError("the stream ended before a comment arrived")
                if isinstance(item, str):
                    self.comments.append(item)
                else:
                    self.frames.append(item)

        await asyncio.wait_for(read(), HANG_GUARD_S)
        return self.comments[-1]

    async def rest(self) -> list[Received]:
        """Read to the end of the stream (under the hang guard) and return every frame."""
        return await self.until(lambda _: False)
