"""Sixteen clients at once against one server: every prompt durable, every push frame once and in order.

Layer: server. Each client owns a parent session, follows it on its own push stream, and meanwhile
prompts it (its first prompt starts a background child), reads its catalog, its history, a child's
history and the session list, all concurrently with the other fifteen. The checks are counts and
orders only, never timings: every request succeeds; after the runtime closed, a fresh runtime reads
every prompt and every turn back from disk; and each subscriber received each of its parent's events
exactly once, in log order, with rising frame ids and one start and one end per child.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from dsh.config import Config
from dsh.runtime import Runtime
from dsh.session.events import SessionEvent
from dsh.testing.server import LiveServer
from tests.server.stream_helpers import HANG_GUARD_S, EventSource, Received, scripted, served_hub

CLIENTS = 16
ROUNDS = 3
HELPER = "Helper"


def _model() -> Any:
    # Every parent shares the `main` track, so only standing entries answer (steps would be consumed
    # in whatever order the sixteen agents happen to ask).
    return scripted(
        {
            "main": {
                "steps": [],
                "on": [
                    {"match": {"lastToolResult": "started subagent"}, "text": "STARTED"},
                    {
                        "match": {"lastUser": "start a helper"},
                        "toolCalls": [
                            {
                                "name": "agent",
                                "arguments": {"description": HELPER, "prompt": "Help out.", "run_in_background": True},
                            }
                        ],
                    },
                    {"text": "OK"},
                ],
            },
            HELPER: {"steps": [], "on": [{"text": "HELPER_OK"}]},
        }
    )


def _prompt(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}]}


def _ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, (response.request.url, response.status_code, response.text)
    return response.json()


class Client:
    """One simulated user: a parent session, its push stream, and a round of requests per prompt.

    Its client skips TLS setup (`verify=False`: plain HTTP on loopback), which would otherwise build
    a certificate store per client on the shared event loop.
    """

    def __init__(self, server: LiveServer, index: int) -> None:
        self.server = server
        self.index = index
        self.parent = ""
        self.prompts: list[str] = []
        self.frames: list[Received] = []
        self.requests = 0
        self._subscribed = asyncio.Event()
        self._arrived = asyncio.Event()
        self._done = asyncio.Event()

    async def listen(self) -> None:
        """Follow the parent, recording every frame, until the test has checked it received everything."""
        async with (
            self.server.client(verify=False) as http,
            http.stream("GET", "/api/v1/stream", params={"sessionId": self.parent}) as response,
        ):
            assert response.status_code == 200
            source = EventSource(response)
            self.frames = source.frames
            self._subscribed.set()
            reading = asyncio.ensure_future(source.until(self._arrival))
            await self._done.wait()
            reading.cancel()

    def _arrival(self, frames: list[Received]) -> bool:
        self._arrived.set()
        return False

    async def wait_for_everything(self, last_seq: int) -> None:
        """Wait until the frame of the parent's event `last_seq` and the child's end arrived, then stop listening."""
        while not (
            any(f.data["seq"] == last_seq for f in self.received("session/event")) and self.received("subagent/end")
        ):
            self._arrived.clear()
            await self._arrived.wait()
        self._done.set()

    async def run(self, listeners: list[asyncio.Future[None]]) -> None:
        """Create the parent, subscribe, then prompt and read for `ROUNDS` rounds."""
        async with self.server.client(verify=False) as http:
            self.parent = _ok(await http.post("/api/v1/sessions", json={}), 201)["session"]["id"]
            self.requests += 1
            listeners.append(asyncio.ensure_future(self.listen()))
            await asyncio.wait_for(self._subscribed.wait(), HANG_GUARD_S)
            for round_ in range(ROUNDS):
                text = "start a helper" if round_ == 0 else f"client {self.index} round {round_}"
                self.prompts.append(text)
                _ok(await http.post(f"/api/v1/sessions/{self.parent}/prompt", json=_prompt(text)), 202)
                catalog = _ok(await http.get(f"/api/v1/sessions/{self.parent}/subagents"))
                _ok(await http.get(f"/api/v1/sessions/{self.parent}/history"))
                _ok(await http.get("/api/v1/sessions", params={"limit": 50, "includeSubagents": "true"}))
                self.requests += 4
                for entry in catalog["entries"]:
                    if entry.get("kind") != "diagnostic":
                        _ok(await http.get(f"/api/v1/sessions/{self.parent}/subagents/{entry['id']}/history"))
                        self.requests += 1

    def received(self, event: str) -> list[Received]:
        """The frames of one kind, in arrival order."""
        return [frame for frame in self.frames if frame.event == event]


def _summarised(events: Any) -> list[SessionEvent]:
    return [event for event in events if event.type != "assistant/chunk"]


@pytest.mark.slow  # 3-8 s with the machine's load; mostly the JSONL corpus listing every catalog and list repeats
async def test_sixteen_clients_prompting_and_reading_lose_nothing(tmp_path: Path) -> None:
    """Concurrent prompts and reads all succeed, every prompt is on disk, and every frame arrives once, in order."""
    home = tmp_path / "home"
    async with served_hub(home, _model()) as (rt, _, server):
        clients = [Client(server, index) for index in range(CLIENTS)]
        listeners: list[asyncio.Future[None]] = []
        await asyncio.wait_for(asyncio.gather(*(client.run(listeners) for client in clients)), HANG_GUARD_S * 2)
        await rt.settle(timeout=HANG_GUARD_S)
        logs = {}
        for client in clients:
            agent = rt.agents.get(client.parent)
            assert agent is not None
            logs[client.parent] = list(agent.session.events)

        # Event-driven: each subscriber stops once its parent's last event and its child's end arrived.
        waits = [client.wait_for_everything(logs[client.parent][-1].seq) for client in clients]
        await asyncio.wait_for(asyncio.gather(*waits), HANG_GUARD_S)
        await asyncio.wait_for(asyncio.gather(*listeners), HANG_GUARD_S)

    # Durable: a fresh runtime on the same home reads every prompt and turn back from disk.
    async with Runtime.open(Config(home=home), use_cache=False) as cold:
        for client in clients:
            stored = list((await cold.query.observe_session(client.parent)).events)
            assert [(e.seq, e.type, e.data) for e in stored] == [(e.seq, e.type, e.data) for e in logs[client.parent]]
            prompts = [
                e.data["content"][0]["text"]
                for e in stored
                if e.type == "user/message" and e.data["source"]["kind"] == "user"
            ]
            assert prompts == client.prompts
            assert Counter(e.type for e in stored)["turn/end"] == ROUNDS + 1  # one more: the child's notice
            child = client.received("subagent/start")[0].data["childSessionId"]
            child_log = list((await cold.query.observe_session(child)).events)
            prompts = [e.data for e in child_log if e.type == "user/message" and e.data["source"]["kind"] != "plugin"]
            assert [data["content"][0]["text"] for data in prompts] == ["Help out."]
            assert [e.type for e in child_log].count("turn/end") == 1

    # Once and in order: each subscriber's event seqs are its parent's logged events, frame ids rise.
    total_requests = sum(client.requests for client in clients)
    assert total_requests >= CLIENTS * (1 + 4 * ROUNDS)
    for client in clients:
        seqs = [frame.data["seq"] for frame in client.received("session/event")]
        assert seqs == [event.seq for event in _summarised(logs[client.parent])]
        assert {frame.data["sessionId"] for frame in client.received("session/event")} == {client.parent}
        frame_ids = [frame.id for frame in client.frames if frame.event != "session/delta"]  # deltas have no id
        assert frame_ids == sorted(set(frame_ids))  # type: ignore[type-var]
        starts, ends = client.received("subagent/start"), client.received("subagent/end")
        assert len(starts) == 1
        assert len(ends) == 1
        assert client.frames.index(starts[0]) < client.frames.index(ends[0])
        assert not client.received("reset")
