"""Helpers of the replica tests: `dsh serve` processes on one PostgreSQL schema, and an SSE client.

`Replica` runs `python -m dsh serve --database-url ... --script ...` exactly as an operator would,
with its own home folder, the shared token in `DSH_SERVE_TOKEN` and the test's throw-away schema in
`DSH_PG_SCHEMA` (so its tables and its notification channel are the test's own). `SseClient` parses
a push stream the way a browser's `EventSource` does: a block with an `id:` line sets the last event
id even when it carries no event, which is what a reconnect sends as `Last-Event-ID`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.postgres.helpers import sql

GUARD_S = 60.0
"""A hang guard for awaited facts (a server start, a turn's end), never a timing assertion."""

LONG_ANSWER = "A scripted answer that is long enough to arrive as many streamed chunks. " * 4
HELD_ANSWER = "Partial text of an answer that waits."


def write_script(path: Path) -> Path:
    """The model script of every replica: `HOLD` waits forever, `WRITE` asks to write a file, else a long answer."""
    script = {
        "version": 1,
        "model": "replica-test",
        "agents": {
            "main": {
                "steps": [],
                "on": [
                    {"match": {"lastToolResult": ""}, "text": "WRITTEN"},
                    {"match": {"lastUser": "HOLD"}, "hold": "never-released", "text": HELD_ANSWER},
                    {
                        "match": {"lastUser": "WRITE"},
                        "toolCalls": [{"name": "write", "arguments": {"file_path": "note.txt", "content": "hi"}}],
                    },
                    {"text": LONG_ANSWER, "chunkSize": 8},
                ],
            }
        },
    }
    path.write_text(json.dumps(script), encoding="utf-8")
    return path


@dataclass
class Replica:
    """One `dsh serve` process; `url` once it announced itself."""

    name: str
    workdir: Path
    url: str = ""
    process: asyncio.subprocess.Process | None = None
    token: str = ""
    env: dict[str, str] = field(default_factory=dict)

    def client(self, **options: Any) -> httpx.AsyncClient:
        """An HTTP client with the token."""
        headers = {"Authorization": f"Bearer {self.token}"}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=GUARD_S, **options)

    async def kill(self) -> None:
        """SIGKILL: no shutdown, no lease release."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        await self.process.wait()

    async def stop(self) -> None:
        """SIGTERM and wait (a graceful stop); kill after the guard."""
        process = self.process
        if process is None or process.returncode is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), GUARD_S)
        except TimeoutError:
            process.kill()
            await process.wait()

    def log(self) -> str:
        """What the server wrote on stderr."""
        path = self.workdir / f"{self.name}.log"
        return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""


class ReplicaGroup:
    """Replicas of one schema; every one is stopped when the group ends."""

    def __init__(self, url: str, schema: str, workdir: Path) -> None:
        self.url = url
        self.schema = schema
        self.workdir = workdir
        self.token = secrets.token_urlsafe(32)
        self.script = write_script(workdir / "script.json")
        self.replicas: list[Replica] = []

    async def start(self, name: str, **env: str) -> Replica:
        """Start a replica and wait for its URL."""
        home = self.workdir / f"home-{name}"
        replica = Replica(name, self.workdir, token=self.token)
        environment = {
            **os.environ,
            "DSH_PG_SCHEMA": self.schema,
            "DSH_SERVE_TOKEN": self.token,
            "NO_COLOR": "1",
            **env,
        }
        log = (self.workdir / f"{name}.log").open("wb")
        replica.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "dsh",
            "--home",
            str(home),
            "serve",
            "--port",
            "0",
            "--script",
            str(self.script),
            "--database-url",
            self.url,
            cwd=str(self.workdir),
            env=environment,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
        )
        log.close()
        self.replicas.append(replica)
        assert replica.process.stdout is not None

        async def announced() -> str:
            assert replica.process is not None
            assert replica.process.stdout is not None
            while True:
                line = (await replica.process.stdout.readline()).decode()
                if not line:
                    raise AssertionError(f"replica {name} ended before serving:\n{replica.log()}")
                if line.startswith("http://"):
                    return line.strip()

        replica.url = await asyncio.wait_for(announced(), GUARD_S)
        return replica

    async def close(self) -> None:
        """Stop every replica still running."""
        for replica in self.replicas:
            with contextlib.suppress(Exception):
                await replica.stop()

    async def holder_of(self, session_id: str) -> str | None:
        """The session's lease holder (any lease row, expired or not)."""
        rows = await sql(
            self.url, "SELECT holder FROM {s}.session_leases WHERE session_id = %s", [session_id], schema=self.schema
        )
        return str(rows[0][0]) if rows else None

    async def stored(self, session_id: str) -> list[tuple[int, str, dict[str, Any]]]:
        """Every stored event of the session: `(seq, type, data)` in seq order."""
        rows = await sql(
            self.url,
            "SELECT seq, type, data FROM {s}.events WHERE session_id = %s ORDER BY seq",
            [session_id],
            schema=self.schema,
        )
        return [(int(seq), str(kind), json.loads(data)) for seq, kind, data in rows]


@contextlib.asynccontextmanager
async def replica_group(url: str, schema: str, workdir: Path) -> AsyncIterator[ReplicaGroup]:
    """A group whose replicas are stopped at the end."""
    group = ReplicaGroup(url, schema, workdir)
    try:
        yield group
    finally:
        await group.close()


@dataclass(frozen=True, slots=True)
class Sse:
    """One dispatched event (or, with event "", an id-only block): its name, parsed data, and the last event id."""

    event: str
    data: dict[str, Any]
    last_id: str | None


class SseClient:
    """A push stream read like a browser's `EventSource` (one connection; `last_id` as it would resend it)."""

    def __init__(self, response: httpx.Response) -> None:
        self._lines = response.aiter_lines()
        self.last_id: str | None = None
        self.events: list[Sse] = []

    async def _next(self) -> Sse | None:
        event, data = "message", ""
        seen = False
        async for line in self._lines:
            if line == "":
                if not seen:
                    continue
                if not data:  # an id-only block: the id changes, nothing is dispatched (shown as event "")
                    return Sse("", {}, self.last_id)
                return Sse(event, json.loads(data), self.last_id)
            if line.startswith(":"):
                continue
            seen = True
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "id":
                self.last_id = value
            elif name == "event":
                event = value
            elif name == "data":
                data = value
        return None

    async def until(self, done: Callable[[Sse], bool]) -> list[Sse]:
        """Read events until one satisfies `done` (under the guard); returns the events read by this call."""
        read: list[Sse] = []

        async def run() -> None:
            while True:
                found = await self._next()
                if found is None:
                    raise AssertionError("the stream ended")
                read.append(found)
                self.events.append(found)
                if done(found):
                    return

        await asyncio.wait_for(run(), GUARD_S)
        return read


@contextlib.asynccontextmanager
async def stream(replica: Replica, session_id: str, last_event_id: str | None = None) -> AsyncIterator[SseClient]:
    """Follow one session on a replica's push stream."""
    headers = {} if last_event_id is None else {"Last-Event-ID": last_event_id}
    async with (
        replica.client() as http,
        http.stream("GET", "/api/v1/stream", params={"sessionId": session_id}, headers=headers) as response,
    ):
        assert response.status_code == 200
        client = SseClient(response)
        # The stream opens with its position: wait for it, so the stream is attached before the test acts.
        await asyncio.wait_for(_first_id(client), GUARD_S)
        yield client


async def _first_id(client: SseClient) -> None:
    await client.until(lambda sse: sse.last_id is not None)


def turn_end(turn: int) -> Callable[[Sse], bool]:
    """Whether an event is the `turn/end` frame of `turn`."""
    return lambda sse: sse.event == "session/event" and sse.data["type"] == "turn/end" and sse.data.get("turn") == turn


def event_seqs(events: list[Sse]) -> list[int]:
    """The seqs of the `session/event` frames, in arrival order."""
    return [sse.data["seq"] for sse in events if sse.event == "session/event"]


def summarised(stored: list[tuple[int, str, dict[str, Any]]], after: int) -> list[int]:
    """The stored seqs after `after` that a stream carries (streamed chunks are left out)."""
    return [seq for seq, kind, _ in stored if seq > after and kind != "assistant/chunk"]
