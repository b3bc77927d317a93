"""The append workload and every system `bench.p6_append` measures besides dsh: the peers and the floor.

Workload: turns of 20 events (1 user message, 17 assistant chunk/message/tool events, 1 tool result,
1 turn end) with one durable commit per turn. Each system is a `Variant`: `open` prepares it (and
the whole workload's payloads) in a fresh directory, `turn(n)` performs turn n's commit and is what
gets timed, `close` releases it. The peers are imported on first use, so this module imports
without them.

* `openai-agents==0.24.0` `SQLiteSession.add_items` of the turn's 20 items (one commit; its I/O runs
  in `asyncio.to_thread`);
* `langgraph-checkpoint-sqlite==3.1.2` `SqliteSaver.put` of one checkpoint per turn, either carrying
  the conversation's message list (*agent state*: how an agent keeps its state in the checkpointer)
  or only the turn's 20 messages (*turn only*: the peer's most favourable use). `SqliteSaver` is
  synchronous: it runs on the caller's thread and pays no thread hop;
* the floor: write the turn's 20 JSON lines and `fsync` (the least a durable commit costs here),
  the same through one `asyncio.to_thread` hop (the least a commit that keeps I/O off the event loop
  costs), and the hop alone.

Each peer runs in two configurations. *Default*: exactly as its documentation opens it
(`SQLiteSession(id, db_path=...)`; `SqliteSaver(sqlite3.connect(path, check_same_thread=False))`),
with whatever journal mode and `synchronous` level that gives; the effective ones are read from the
connection and reported. *Equal durability*: the connection is also set to `journal_mode=WAL` with
`synchronous=FULL` (checked: a run with anything else fails), the durability dsh's SQLite backend
runs with. (SQLite's own default is `synchronous=FULL`, so on most builds the two coincide.)
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import orjson

EVENTS_PER_TURN = 20
TEXT = "The teapot is short and stout; here is my handle, here is my spout. "


def turn_events(turn: int) -> list[tuple[str, dict[str, Any]]]:
    """The 20 events of one turn, as (type, data), dsh's."""
    call_id = f"call-{turn}"
    events: list[tuple[str, dict[str, Any]]] = [
        ("turn/start", {"turn": turn}),
        (
            "user/message",
            {
                "id": f"u{turn}",
                "role": "user",
                "content": [{"type": "text", "text": f"Question {turn}: {TEXT}"}],
                "source": {"kind": "user"},
            },
        ),
        ("step/start", {"turn": turn, "step": 1}),
    ]
    events.extend(
        ("assistant/chunk", {"turn": turn, "step": 1, "chunk": {"type": "text-delta", "text": TEXT[: 20 + i]}})
        for i in range(12)
    )
    events += [
        (
            "assistant/message",
            {
                "turn": turn,
                "step": 1,
                "message": {
                    "id": f"a{turn}",
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": TEXT * 2},
                        {"type": "tool-call", "id": call_id, "name": "read", "arguments": '{"path": "/x"}'},
                    ],
                    "source": {"kind": "model", "provider": "bench", "model": "m"},
                },
            },
        ),
        ("tool/call", {"turn": turn, "step": 1, "callId": call_id, "name": "read", "arguments": '{"path": "/x"}'}),
        (
            "tool/result",
            {
                "turn": turn,
                "step": 1,
                "message": {
                    "id": f"r{turn}",
                    "role": "user",
                    "source": {"kind": "tool", "callId": call_id},
                    "content": [
                        {"type": "tool-result", "toolCallId": call_id, "content": [{"type": "text", "text": TEXT}]}
                    ],
                },
            },
        ),
        ("step/end", {"turn": turn, "step": 1}),
        ("turn/end", {"turn": turn, "reason": {"kind": "completed"}}),
    ]
    assert len(events) == EVENTS_PER_TURN
    return events


def peer_items(turn: int) -> list[dict[str, Any]]:
    """The same turn for the peers: the same 20 payloads, one item (or message) per event."""
    return [{"type": kind, **data} for kind, data in turn_events(turn)]


def turn_bytes(turn: int) -> bytes:
    """The turn as 20 JSON lines: what the floor variants write."""
    return b"".join(orjson.dumps(item) + b"\n" for item in peer_items(turn))


class Variant(ABC):
    """One measured system: `open` (untimed), then `turn(1..n)` (each timed), then `close` (untimed)."""

    async def open(self, root: Path, turns: int) -> None:  # noqa: B027 - most variants need no set-up
        """Prepare the system in the fresh directory `root` for `turns` turns."""

    @abstractmethod
    async def turn(self, turn: int) -> None:
        """Commit turn `turn` durably."""

    async def close(self) -> None:  # noqa: B027 - most variants hold nothing
        """Release the system."""


def check_durability(conn: sqlite3.Connection, who: str) -> None:
    """Refuse to measure a peer connection that is not WAL + synchronous=FULL."""
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    sync = conn.execute("PRAGMA synchronous").fetchone()[0]
    if str(mode).lower() != "wal" or sync != 2:
        raise RuntimeError(f"{who}: journal_mode={mode}, synchronous={sync}; expected wal and 2 (FULL)")


def durability(conn: sqlite3.Connection) -> str:
    """The connection's journal mode and `synchronous` level, as `journal_mode=..., synchronous=...`."""
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    sync = conn.execute("PRAGMA synchronous").fetchone()[0]
    return f"journal_mode={mode}, synchronous={sync}"


class OpenAIAgents(Variant):
    """`SQLiteSession.add_items` of each turn's 20 items: in its default configuration, or with every
    connection set to WAL + synchronous=FULL (`full_sync`)."""

    def __init__(self, *, full_sync: bool) -> None:
        self.full_sync = full_sync
        self.durability = ""

    async def open(self, root: Path, turns: int) -> None:
        from agents.memory import SQLiteSession

        class FullSyncSession(SQLiteSession):
            @staticmethod
            def _configure_connection(conn: sqlite3.Connection) -> None:
                SQLiteSession._configure_connection(conn)
                conn.execute("PRAGMA synchronous=FULL")

        kind = FullSyncSession if self.full_sync else SQLiteSession
        self.session = kind("bench", db_path=root / "agents.sqlite3")
        self.items = {turn: peer_items(turn) for turn in range(1, turns + 1)}

    async def turn(self, turn: int) -> None:
        await self.session.add_items(self.items[turn])  # type: ignore[arg-type]

    async def close(self) -> None:
        connection = await asyncio.to_thread(self.session._get_connection)
        self.durability = durability(connection)
        if self.full_sync:
            check_durability(connection, "openai-agents")
        self.session.close()


class LangGraphSaver(Variant):
    """`SqliteSaver.put` of one checkpoint per turn: the conversation so far, or only the turn's messages;
    on a connection opened as its documentation opens one, or also set to WAL + synchronous=FULL."""

    def __init__(self, *, agent_state: bool, full_sync: bool) -> None:
        self.agent_state = agent_state
        self.full_sync = full_sync
        self.durability = ""

    async def open(self, root: Path, turns: int) -> None:
        from langgraph.checkpoint.sqlite import SqliteSaver

        self.connection = sqlite3.connect(root / "langgraph.sqlite3", check_same_thread=False)
        if self.full_sync:
            self.connection.execute("PRAGMA journal_mode=WAL")
            self.connection.execute("PRAGMA synchronous=FULL")
        self.saver = SqliteSaver(self.connection)
        self.saver.setup()
        if self.full_sync:
            check_durability(self.connection, "langgraph")
        self.durability = durability(self.connection)
        self.config: Any = {"configurable": {"thread_id": "bench", "checkpoint_ns": ""}}
        self.items = {turn: peer_items(turn) for turn in range(1, turns + 1)}
        self.conversation: list[dict[str, Any]] = []

    async def turn(self, turn: int) -> None:
        from langgraph.checkpoint.base import empty_checkpoint

        items = self.items[turn]
        self.conversation.extend(items)
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"messages": self.conversation if self.agent_state else items}
        checkpoint["channel_versions"] = {"messages": turn}
        metadata: Any = {"source": "loop", "step": turn, "parents": {}}
        self.config = self.saver.put(self.config, checkpoint, metadata, {"messages": turn})

    async def close(self) -> None:
        self.connection.close()


class _FloorFile(Variant):
    async def open(self, root: Path, turns: int) -> None:
        self.payloads = {turn: turn_bytes(turn) for turn in range(1, turns + 1)}
        self.fd = os.open(root / "floor.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def commit(self, turn: int) -> None:
        os.write(self.fd, self.payloads[turn])
        os.fsync(self.fd)

    async def close(self) -> None:
        os.close(self.fd)


class Floor(_FloorFile):
    """Write each turn's 20 lines and `fsync`, on the calling thread."""

    async def turn(self, turn: int) -> None:
        self.commit(turn)


class FloorHop(_FloorFile):
    """The same write + `fsync` through one `asyncio.to_thread` hop."""

    async def turn(self, turn: int) -> None:
        await asyncio.to_thread(self.commit, turn)


class Hop(Variant):
    """One `asyncio.to_thread` round trip of a no-op: the hop alone."""

    async def turn(self, turn: int) -> None:
        await asyncio.to_thread(int)
