"""Deterministic ids: `Runtime.open(..., ids=IdFactory)` mints sessions, messages and runs from separate streams.

Layer: agent. A `SequentialIds` factory numbers each kind on its own counter, so the ids a real run
writes are predictable and a new message never shifts the next session or run id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from dsh.config import Config
from dsh.errors import ConfigError
from dsh.runtime import Runtime
from dsh.session.events import SessionEvent
from tests.agent.helpers import EchoTool
from tests.subagent.ops_helpers import LifecycleLog, ops_runtime, scripted, settle, start_child


def _id(kind: int, number: int) -> str:
    return f"{kind:08d}-0000-4000-8000-{number:012d}"


def _message_ids(events: Sequence[SessionEvent]) -> list[str]:
    ids = []
    for event in events:
        data = event.data
        assert isinstance(data, Mapping)
        if event.type == "user/message":
            ids.append(data["id"])
        elif event.type in ("assistant/message", "tool/result"):
            ids.append(data["message"]["id"])
    return ids


async def test_sessions_messages_and_runs_each_count_on_their_own_stream(tmp_path: Path) -> None:
    """Sessions, messages and subagent runs are numbered on separate counters, whatever the others minted."""
    client = scripted(
        {
            "main": [{"toolCalls": [{"name": "echo", "arguments": {"text": "x"}}]}, {"text": "done"}],
            "helper": [{"text": "HELPED"}],
        }
    )
    async with ops_runtime(tmp_path, client, tools=[EchoTool()]) as rt:
        log = LifecycleLog(rt)
        result = await rt.run("go")
        parent = rt.agents.get(result.session_id)
        assert parent is not None
        child_id = await start_child(rt, parent, "helper")
        await settle(rt)
        child_events = list((await rt.query.observe_session(child_id)).events)
    assert (result.session_id, child_id) == (_id(1, 1), _id(1, 2))
    # The parent's turn: prompt, per-turn context, tool-call answer, tool result, final answer.
    assert _message_ids(list(parent.session.events))[:5] == [_id(2, n) for n in (1, 2, 3, 4, 5)]
    # The child's prompt, context and answer continue the same message stream.
    assert _message_ids(child_events) == [_id(2, 6), _id(2, 7), _id(2, 8)]
    assert [event["runId"] for event in log.events] == [_id(4, 1), _id(4, 1)]


def test_runtime_open_refuses_an_id_callable() -> None:
    """`ids` must be an IdFactory with one method per kind; a bare callable is refused as CONFIG_INVALID."""
    with pytest.raises(ConfigError) as refused:
        Runtime.open(Config(database_url="memory:"), ids=lambda: "s1")  # type: ignore[arg-type]
    assert refused.value.code == "CONFIG_INVALID"
