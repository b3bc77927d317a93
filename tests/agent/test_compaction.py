"""Context compaction: automatic under a small window, on request, on failure, and after a restart."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest

from dsh.abort import AbortSignal
from dsh.agent.errors import AgentError
from dsh.agent.function_tool import tool
from dsh.agent.ids import SequentialIds
from dsh.agent.model import ModelChunk, ModelRequest, Usage, UsageChunk
from dsh.agent.models import ScriptedModelClient
from dsh.config import Config
from dsh.runtime import Runtime
from dsh.session.events import SessionEvent
from dsh.testing.event_shapes import assert_harness_shapes
from dsh.testing.stored_logs import StepClock
from tests.agent.helpers import open_runtime, script

MODEL = "scripted-test"
WINDOW = 6000
BYTES_PER_TOKEN = 3  # the test model's own tokenizer: what it reports as usage
BIG = 3000  # characters of every tool result


def measured_tokens(request: ModelRequest) -> int:
    """What the test model counts for a request: every byte it was sent, in compact JSON, over 3."""
    size = len((request.system or "").encode("utf-8"))
    size += len(orjson.dumps(list(request.tools))) if request.tools else 0
    size += sum(len(orjson.dumps(dict(message))) for message in request.messages)
    return math.ceil(size / BYTES_PER_TOKEN)


class MeasuringModel:
    """A scripted model that reports the usage its own byte tokenizer measures, and keeps every request."""

    def __init__(self, inner: ScriptedModelClient) -> None:
        self.inner = inner
        self.provider = inner.provider
        self.model = MODEL
        self.requests: list[tuple[ModelRequest, int]] = []

    async def stream(self, request: ModelRequest, *, signal: AbortSignal) -> AsyncIterator[ModelChunk]:
        tokens = measured_tokens(request)
        self.requests.append((request, tokens))
        async for chunk in self.inner.stream(request, signal=signal):
            yield UsageChunk(Usage(tokens, 5)) if isinstance(chunk, UsageChunk) else chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


@tool
def fetch(n: int) -> str:
    """Fetch record n (long)."""
    return f"record {n}: " + ("lorem ipsum dolor sit amet " * (BIG // 27 + 1))[:BIG]


def _config(home: Path) -> Config:
    return Config(
        home=home,
        agent={"time_context": False},
        persistence={"write_batch_max_delay_ms": 1},
        compaction={
            "context_windows": {MODEL: WINDOW},
            "prune_threshold_chars": 2000,
            "prune_head_chars": 600,
            "prune_tail_chars": 200,
        },
    )


def _turns(first: int, count: int) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = []
    for n in range(first, first + count):
        steps.append({"toolCalls": [{"name": "fetch", "arguments": {"n": n}}]})
        steps.append({"text": f"done {n}"})
    return steps


def _model(steps: list[dict[str, Any]]) -> MeasuringModel:
    data = {
        "version": 1,
        "model": MODEL,
        "agents": {
            "main": {"steps": steps},
            "compaction": {"on": [{"text": "## Goal\n- fetch records\n## Now\n- next"}]},
        },
    }
    return MeasuringModel(ScriptedModelClient.from_dict(data))


def _plain(messages: Sequence[Mapping[str, Any]]) -> list[Any]:
    return [orjson.loads(orjson.dumps(dict(message))) for message in messages]


def _types(events: Sequence[SessionEvent], prefix: str) -> list[str]:
    return [event.type for event in events if event.type.startswith(prefix)]


async def test_three_hundred_turns_under_a_small_window_compact_and_a_restart_builds_the_same_request(
    tmp_path: Path,
) -> None:
    """300 turns of 3,000-character tool results against a 6,000-token window: pruning and summaries keep every
    request the model was sent under the window, the log holds the harness's `compaction/*` events, and after a
    restart the next request starts with the same compacted context."""
    model = _model(_turns(1, 300))
    async with Runtime.open(
        _config(tmp_path), model=model, ids=SequentialIds(), clock=StepClock(), tools=[fetch]
    ) as rt:
        agent = await rt.create_agent()
        for n in range(1, 301):
            result = await agent.turn_result(await agent.send(f"Fetch record {n}."))
            assert (result.stop_reason, result.output) == ("completed", f"done {n}")
        session_id = agent.id
        events = list(agent.session.events)
        surface_before = _plain(agent.session.derive_messages())
        estimate_before = agent.context_estimate()
    assert max(tokens for _, tokens in model.requests) < WINDOW
    summaries = [request for request, _ in model.requests if request.meta.agent_key == "compaction"]
    assert len(summaries) == _types(events, "compaction/").count("compaction/summary") > 3
    starts, ends = (
        _types(events, "compaction/").count("compaction/start"),
        _types(events, "compaction/").count("compaction/end"),
    )
    assert starts == ends == len(summaries)
    assert _types(events, "compaction/").count("compaction/prune") > 0
    assert not any(event.type == "compaction/end" and "error" in event.data for event in events)  # type: ignore[operator]
    assert_harness_shapes(events)
    # The model sees a checkpoint first, then only the turns after it.
    assert surface_before[0]["source"]["plugin"] == "compact"
    assert len(surface_before) < 40

    # A new process: the next request is built from the same compacted surface, measured the same way.
    model_after = _model(_turns(301, 1))
    async with Runtime.open(_config(tmp_path), model=model_after, tools=[fetch]) as rt:
        agent = await rt.resume_agent(session_id)
        assert agent.context_estimate() == estimate_before
        result = await agent.turn_result(await agent.send("Fetch record 301."))
        assert result.output == "done 301"
    first = model_after.requests[0][0]
    assert _plain(first.messages)[: len(surface_before)] == surface_before


async def test_a_summary_replaces_the_span_the_harness_way(tmp_path: Path) -> None:
    """`compaction/start`, `compaction/summary`, the replacing `user/message` and `compaction/end` share one id;
    the replacement cites every shadowed node and the summary request carried the span plus the instruction."""
    model = _model(_turns(1, 3))
    async with Runtime.open(_config(tmp_path), model=model, tools=[fetch]) as rt:
        agent = await rt.create_agent()
        for n in range(1, 4):
            await agent.turn_result(await agent.send(f"Fetch record {n}."))
        result = await agent.compact()
        assert result is not None
        events = list(agent.session.events)
        surface = agent.session.surface.nodes
    start, summary, replacement, end = (
        events[seq] for seq in (result.start_seq, result.summary_seq, result.summary_seq + 1, result.end_seq)
    )
    assert start.data == {"compactionId": result.compaction_id, "turn": None}
    assert end.data == {"compactionId": result.compaction_id, "turn": None}
    assert summary.data["shadowedSeqs"] == list(result.shadowed_seqs)  # type: ignore[index]
    assert summary.data["summary"] == [{"type": "text", "text": result.summary}]  # type: ignore[index]
    assert (summary.data["provider"], summary.data["model"]) == ("scripted", MODEL)  # type: ignore[index]
    assert replacement.type == "user/message"
    assert replacement.data["source"] == {"kind": "plugin", "plugin": "compact", "compactionId": result.compaction_id}  # type: ignore[index]
    assert replacement.surface_op is not None
    assert replacement.surface_op != "append"
    assert list(replacement.source_event_seqs or ()) == list(result.shadowed_seqs)
    assert surface[0] == replacement.seq
    sent = model.requests[-1][0]
    assert sent.meta.agent_key == "compaction"
    assert sent.messages[-1]["source"] == {"kind": "plugin", "plugin": "pydsh/compaction"}
    assert len(sent.messages) == len(result.shadowed_seqs) + 1
    assert_harness_shapes(events)


async def test_a_failed_summary_leaves_the_session_usable_and_says_why(tmp_path: Path) -> None:
    """A summary request that fails raises `COMPACTION_FAILED` naming the cause, closes the attempt with an error,
    leaves the surface as it was, and the next turn runs normally."""
    client = script(
        [{"text": "one"}, {"text": "two"}, {"text": "three"}],
        compaction=[{"error": {"code": "MODEL_UNAVAILABLE", "message": "summary endpoint down"}}],
    )
    async with open_runtime(tmp_path, client) as rt:
        first = await rt.run("first")
        await rt.run("second", first.session_id)
        agent = rt.agents.get(first.session_id)
        assert agent is not None
        before = list(agent.session.surface.nodes)
        with pytest.raises(AgentError, match="summary endpoint down") as caught:
            await rt.compact(first.session_id)
        assert caught.value.code == "COMPACTION_FAILED"
        assert list(agent.session.surface.nodes) == before
        events = list(agent.session.events)
        end = events[-1]
        assert end.type == "compaction/end"
        assert "summary endpoint down" in end.data["error"]
        assert events[-2].type == "compaction/start"
        third = await rt.run("third", first.session_id)
        assert (third.stop_reason, third.output) == ("completed", "three")
        assert_harness_shapes(agent.session.events)


async def test_nothing_to_compact_writes_nothing(tmp_path: Path) -> None:
    """A session with a single exchange has nothing useful to summarise: `compact()` returns None, no event."""
    async with open_runtime(tmp_path, script([{"text": "hello"}])) as rt:
        result = await rt.run("hi")
        count = len(rt.sessions.get(result.session_id).events)  # type: ignore[union-attr]
        assert await rt.compact(result.session_id) is None
        assert len(rt.sessions.get(result.session_id).events) == count  # type: ignore[union-attr]


async def test_an_automatic_compaction_failure_only_logs_and_the_turn_goes_on(tmp_path: Path) -> None:
    """Over the threshold with a failing summary request, the turn still gets its answer; the failed attempt is
    closed in the log with its error, and a turn tries at most once."""
    client = script(
        [
            # A provider counting about a token per byte: the calibrated estimate crosses the threshold.
            {"text": "a" * 400, "usage": {"inputTokens": 300, "outputTokens": 100}},
            {"text": "b" * 400, "usage": {"inputTokens": 700, "outputTokens": 100}},
            {"text": "still here"},
        ],
        compaction=[{"error": {"code": "MODEL_UNAVAILABLE", "message": "no summaries today"}}],
    )
    config = Config(home=tmp_path, agent={"time_context": False}, compaction={"context_windows": {MODEL: 500}})
    async with Runtime.open(config, model=client) as rt:
        first = await rt.run("x " * 100)
        await rt.run("y " * 100, first.session_id)
        third = await rt.run("z", first.session_id)
        events = list(rt.sessions.get(first.session_id).events)  # type: ignore[union-attr]
    assert (third.stop_reason, third.output) == ("completed", "still here")
    ends = [event for event in events if event.type == "compaction/end"]
    assert ends
    assert all("no summaries today" in end.data["error"] for end in ends)
    attempts = [event.data["turn"] for event in events if event.type == "compaction/start"]  # type: ignore[index]
    assert len(attempts) == len(set(attempts))  # at most one failed attempt per turn
    assert_harness_shapes(events)
