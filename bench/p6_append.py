"""P6 — append throughput: a live JSONL+zstd session against two SQLite-backed peers, same workload.

Workload for every system: 500 turns x 20 events (1 user message, 17 assistant chunk/message/tool
events, 1 tool result, 1 turn end) with one durable commit per turn.
* ours: `Session.append` for each event, `SessionStore.flush` at the turn end (JSONL+zstd, fsync);
* `openai-agents==0.24.0` `SQLiteSession.add_items` of the turn's 20 items (one commit);
* `langgraph-checkpoint-sqlite==3.1.2` `SqliteSaver.put` of one checkpoint per turn carrying the
  turn's messages.
Target: ours >= 2x the per-event rate of each peer. Run: `python -m bench.p6_append`.
"""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import print_table, verdict, write_json

TURNS = 500
EVENTS_PER_TURN = 20
TEXT = "The teapot is short and stout; here is my handle, here is my spout. "


def _turn_events(turn: int) -> list[tuple[str, dict[str, Any]]]:
    """The 20 events of one turn, as (type, data), ours."""
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


def _peer_items(turn: int) -> list[dict[str, Any]]:
    """The same turn for the peers: the same 20 payloads, one item (or message) per event."""
    return [{"type": kind, **data} for kind, data in _turn_events(turn)]


async def run_ours(root: Path) -> float:
    from dsh.persistence.coordinator import PersistenceCoordinator
    from dsh.persistence.jsonl import JsonlBackend
    from dsh.session.store import SessionStore

    store = SessionStore()
    async with PersistenceCoordinator(JsonlBackend(root), store) as persistence:
        session = store.create(header=None)
        turns = [_turn_events(turn) for turn in range(1, TURNS + 1)]
        start = time.perf_counter()
        for events in turns:
            for kind, data in events:
                session.append(kind, data)
            await store.flush(session)
        elapsed = time.perf_counter() - start
        await store.aclose()
        del persistence
    return elapsed


async def run_openai_agents(root: Path) -> float:
    from agents.memory import SQLiteSession

    session = SQLiteSession("bench", db_path=root / "agents.sqlite3")
    turns = [_peer_items(turn) for turn in range(1, TURNS + 1)]
    start = time.perf_counter()
    for items in turns:
        await session.add_items(items)  # type: ignore[arg-type]
    elapsed = time.perf_counter() - start
    session.close()
    return elapsed


def run_langgraph(root: Path) -> float:
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.sqlite import SqliteSaver

    connection = sqlite3.connect(root / "langgraph.sqlite3", check_same_thread=False)
    saver = SqliteSaver(connection)
    saver.setup()
    config: Any = {"configurable": {"thread_id": "bench", "checkpoint_ns": ""}}
    turns = [_peer_items(turn) for turn in range(1, TURNS + 1)]
    start = time.perf_counter()
    for turn, items in enumerate(turns, 1):
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"messages": items}
        checkpoint["channel_versions"] = {"messages": turn}
        config = saver.put(config, checkpoint, {"source": "loop", "step": turn, "parents": {}}, {"messages": turn})
    elapsed = time.perf_counter() - start
    connection.close()
    return elapsed


def main() -> None:
    """Run the three systems and print per-event rates and ratios."""
    total = TURNS * EVENTS_PER_TURN
    results: dict[str, float] = {}
    tmp = Path(tempfile.mkdtemp(prefix="dsh-p6-"))
    try:
        for name, runner in (
            ("dsh jsonl+zstd", lambda d: asyncio.run(run_ours(d))),
            ("openai-agents SQLiteSession", lambda d: asyncio.run(run_openai_agents(d))),
            ("langgraph SqliteSaver", run_langgraph),
        ):
            best = float("inf")
            for attempt in range(3):
                workdir = tmp / f"{name.split()[0]}-{attempt}"
                workdir.mkdir()
                best = min(best, runner(workdir))
            results[name] = total / best
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ours = results["dsh jsonl+zstd"]
    rows = [[name, round(rate), ours / rate] for name, rate in results.items()]
    print_table("P6 append throughput (events/s, one durable commit per turn)", ["system", "events/s", "ours/x"], rows)
    ratios = {name: ours / rate for name, rate in results.items() if name != "dsh jsonl+zstd"}
    for name, ratio in ratios.items():
        print(f"  ours / {name}: {ratio:.2f}x (target >= 2.0) {verdict(ratio, 2.0, higher_is_better=True)}")
    write_json("p6_append", {"events": total, "rates": results, "ratios": ratios, "target": 2.0})


if __name__ == "__main__":
    main()
