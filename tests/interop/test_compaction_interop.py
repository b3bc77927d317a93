"""pydsh compacts, the harness reads: the harness's own session code resumes a session pydsh compacted (a pruned
tool result and a summary) and finds the same surface, the compacted range replaced by the checkpoint."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from dsh.agent.function_tool import tool
from dsh.agent.models import ScriptedModelClient
from dsh.config import Config
from dsh.runtime import Runtime
from dsh.testing.event_shapes import assert_harness_shapes
from tests.interop.harness import HarnessProcess

pytestmark = [pytest.mark.interop, pytest.mark.slow]

MODEL = "scripted-interop"


@tool
def fetch(n: int) -> str:
    """Fetch record n (long)."""
    return f"record {n}: " + "x" * 2500


async def _compacted_home(home: Path) -> tuple[str, list[int], list[str | None]]:
    """A session with a pruned tool result and a summary; its surface as pydsh has it."""
    steps: list[dict[str, Any]] = []
    for n in range(1, 4):
        # A provider counting about a token per byte: the window fills after two long results.
        steps.append(
            {
                "toolCalls": [{"name": "fetch", "arguments": {"n": n}}],
                "usage": {"inputTokens": 3000 * n, "outputTokens": 5},
            }
        )
        steps.append({"text": f"done {n}", "usage": {"inputTokens": 3000 * n + 2600, "outputTokens": 5}})
    data = {
        "version": 1,
        "model": MODEL,
        "agents": {"main": {"steps": steps}, "compaction": {"on": [{"text": "## Goal\n- records"}]}},
    }
    config = Config(
        home=home,
        compaction={
            "context_windows": {MODEL: 8000},
            "prune_threshold_chars": 1000,
            "prune_head_chars": 300,
            "prune_tail_chars": 100,
        },
    )
    async with Runtime.open(config, model=ScriptedModelClient.from_dict(data), tools=[fetch]) as rt:
        agent = await rt.create_agent()
        for n in range(1, 4):
            await agent.turn_result(await agent.send(f"Fetch record {n}."))
        result = await agent.compact()
        assert result is not None
        session = agent.session
        nodes = list(session.surface.nodes)
        kinds = [session.events[seq].type for seq in nodes]
        types = [event.type for event in session.events]
        assert "compaction/prune" in types, types
        assert_harness_shapes(session.events)
        return agent.id, nodes, kinds


def test_the_harness_resumes_a_compacted_session_with_the_same_surface(harness: HarnessProcess, tmp_path: Path) -> None:
    """The harness's `prepare` + surface of a pydsh-compacted session: the same node seqs, the checkpoint first."""
    home = tmp_path / "home"
    session_id, nodes, kinds = asyncio.run(_compacted_home(home))
    theirs = harness.call("surface", root=home / "sessions", compression="zstd", session=session_id)
    assert theirs["nodes"] == nodes
    assert theirs["kinds"] == kinds
    first = theirs["sources"][0]
    assert (first["kind"], first["plugin"]) == ("plugin", "compact")
