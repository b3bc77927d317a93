"""The turn/step loop driven by the scripted model: events in order, dispatch, flush points, cancellation, inbox.

Layer: agent. Every test runs a real `Runtime` (JSONL persistence on a temporary home) with a
`ScriptedModelClient`, so the events checked are the ones a person would find in the log.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from dsh.agent.errors import AgentError
from dsh.agent.loop import Agent
from dsh.session import Session
from dsh.subagent.errors import SubagentError
from dsh.subagent.providers import ContinuableSpec
from tests.agent.helpers import (
    FIRST_STEP_PROLOGUE,
    HANG_GUARD_S,
    TOOL_STEP_THEN_ANSWER,
    BlockingTool,
    EchoTool,
    RaisingTool,
    open_runtime,
    prompt_texts,
    script,
    turn_events,
    types_of,
)
from tests.subagent.ops_helpers import scripted


def _data(event: Any) -> Mapping[str, Any]:
    data = event.data
    assert isinstance(data, Mapping)
    return data


def _results(events: list[Any]) -> list[Mapping[str, Any]]:
    """The tool-result blocks of the `tool/result` events, in order."""
    return [_data(e)["message"]["content"][0] for e in events if e.type == "tool/result"]


def _result_text(block: Mapping[str, Any]) -> str:
    return "".join(part["text"] for part in block["content"])


async def test_a_text_reply_writes_the_turn_events_in_order(tmp_path: Path) -> None:
    """One text answer writes turn, step, prompt, request context, answer, step end and turn end, in order."""
    async with open_runtime(tmp_path, script([{"text": "Hello there."}])) as rt:
        result = await rt.run("hi")
        events = list(rt.sessions.get(result.session_id).events)  # type: ignore[union-attr]
    assert types_of(events) == [*FIRST_STEP_PROLOGUE, "assistant/message", "step/end", "turn/end"]
    user, title, context, assistant = _data(events[5]), _data(events[6]), _data(events[7]), _data(events[10])
    assert events[5].surface_op == "append"
    assert events[10].surface_op == "append"
    assert title == {"title": "hi", "messageSeqs": [5], "source": {"kind": "fallback"}}
    assert user["content"] == [{"type": "text", "text": "hi"}]
    assert user["source"] == {"kind": "user"}
    assert context["source"]["kind"] == "plugin"
    assert [section["name"] for section in context["source"]["sections"]] == [
        "time-context",
        "sandbox:policy",
        "approval:policy",
    ]
    assert assistant["message"]["content"] == [{"type": "text", "text": "Hello there."}]
    assert assistant["usage"] == {"inputTokens": 10, "outputTokens": 5}
    assert _data(events[8])["reason"] == "initial"
    assert _data(events[9]) == {"provider": "scripted", "model": "scripted-test"}
    assert _data(events[-1])["reason"] == {"kind": "completed"}
    assert (result.output, result.stop_reason) == ("Hello there.", "completed")


async def test_a_tool_step_answers_every_call_and_a_second_step_ends_the_turn(tmp_path: Path) -> None:
    """A tool call then text: step 1 holds the call and its result (citing the call), step 2 ends the turn."""
    echo = EchoTool()
    steps = [{"toolCalls": [{"name": "echo", "arguments": {"text": "ping"}}]}, {"text": "done"}]
    async with open_runtime(tmp_path, script(steps), tools=[echo]) as rt:
        result = await rt.run("use the tool")
        events = list(rt.sessions.get(result.session_id).events)  # type: ignore[union-attr]
    assert types_of(events) == TOOL_STEP_THEN_ANSWER
    call, outcome = events[11], events[12]
    assert _data(call)["name"] == "echo"
    assert _data(call)["arguments"] == '{"text":"ping"}'
    assert outcome.source_event_seqs == [call.seq]
    block = _results(events)[0]
    assert block["toolCallId"] == _data(call)["callId"]
    assert block["isError"] is False
    assert _result_text(block) == "echo: ping"
    assert block["output"] == {"echo": "ping"}
    assert echo.calls == ["ping"]
    assert _data(events[14]) == {"turn": 1, "step": 2}
    assert result.output == "done"


async def test_request_context_is_written_only_when_the_model_changes(tmp_path: Path) -> None:
    """Two turns on the same model write one request/context; switching the model writes a second."""
    async with open_runtime(tmp_path, script([{"text": "a"}, {"text": "b"}, {"text": "c"}])) as rt:
        agent = await rt.create_agent()
        for prompt in ("one", "two"):
            await agent.turn_result(await agent.send(prompt))
        agent.update_options(model="other-model")
        await agent.turn_result(await agent.send("three"))
        contexts = [_data(e) for e in agent.session.events if e.type == "request/context"]
    assert contexts == [
        {"provider": "scripted", "model": "scripted-test"},
        {"provider": "scripted", "model": "other-model"},
    ]


async def test_the_loop_flushes_before_the_model_before_the_tool_body_and_after_turn_end(tmp_path: Path) -> None:
    """Flushes happen after the prompt and before the request, between tool/call and the body, and after turn/end."""
    timeline: list[str] = []

    class Recorder(EchoTool):
        async def execute(self, args: Any, ctx: Any) -> object:
            timeline.append("tool body")
            return await super().execute(args, ctx)

    steps = [{"toolCalls": [{"name": "echo", "arguments": {"text": "x"}}]}, {"text": "done"}]
    client = script(steps)
    original = client.stream

    def recording_stream(request: Any, *, signal: Any) -> Any:
        timeline.append("model")
        return original(request, signal=signal)

    client.stream = recording_stream  # type: ignore[method-assign]
    # Without the projection cache, whose checkpoint writes flush too, only the loop's flushes remain.
    async with open_runtime(tmp_path, client, tools=[Recorder()], use_cache=False) as rt:

        async def on_flush(session: Session) -> None:
            timeline.append(f"flush after {session.events[-1].type}")

        rt.sessions.on_flush(on_flush)
        await rt.run("go")
        seen = list(timeline)
    assert seen == [
        "flush after request/context",
        "model",
        "flush after tool/call",
        "tool body",
        "flush after step/start",
        "model",
        "flush after turn/end",
    ]


async def test_a_failed_flush_before_the_request_ends_the_turn_without_calling_the_model(tmp_path: Path) -> None:
    """When the flush before the model fails the model is never called and the turn ends PERSISTENCE_FLUSH_FAILED."""
    client = script([{"text": "never sent"}])
    async with open_runtime(tmp_path, client) as rt:
        failures = iter([OSError("disk full")])

        async def failing(session: Session) -> None:
            error = next(failures, None)
            if error is not None:
                raise error

        rt.sessions.on_flush(failing)
        result = await rt.run("hi")
        agent = rt.agents.get(result.session_id)
        assert agent is not None
        events = list(agent.session.events)
        assert agent.status == "idle"
        assert isinstance(agent.last_error, OSError)
    assert "assistant/message" not in types_of(events)
    assert _data(events[-1])["reason"]["kind"] == "error"
    assert _data(events[-1])["reason"]["error"]["code"] == "PERSISTENCE_FLUSH_FAILED"
    assert result.stop_reason == "error"
    with pytest.raises(Exception, match=r"not consumed"):
        client.assert_consumed()


async def test_a_failed_flush_after_turn_end_is_recorded_and_adds_no_second_turn_end(tmp_path: Path) -> None:
    """When only the flush after turn/end fails, agent.last_error holds it and the log has one turn/end."""
    async with open_runtime(tmp_path, script([{"text": "ok"}])) as rt:

        async def failing(session: Session) -> None:
            if session.events[-1].type == "turn/end":
                raise OSError("disk full")

        rt.sessions.on_flush(failing)
        result = await rt.run("hi")
        agent = rt.agents.get(result.session_id)
        assert agent is not None
        assert isinstance(agent.last_error, OSError)
        assert types_of(list(agent.session.events)).count("turn/end") == 1
    assert result.stop_reason == "completed"


async def test_unknown_tools_and_unparseable_arguments_become_errored_results(tmp_path: Path) -> None:
    """A call to an unknown tool and one with invalid JSON get errored results; no body runs; the turn goes on."""
    echo = EchoTool()
    steps = [
        {
            "toolCalls": [
                {"name": "nope", "arguments": {}},
                {"name": "echo", "arguments": "{not json"},
                {"name": "echo", "arguments": {"wrong": 1}},
            ]
        },
        {"text": "recovered"},
    ]
    async with open_runtime(tmp_path, script(steps), tools=[echo]) as rt:
        result = await rt.run("go")
        events = list(rt.sessions.get(result.session_id).events)  # type: ignore[union-attr]
    texts = [_result_text(block) for block in _results(events)]
    assert texts[0] == 'Error: unknown tool "nope"'
    assert texts[1].startswith("Error: arguments are not valid JSON: ")
    assert texts[2].startswith("Error: invalid arguments for echo: ")
    assert all(block["isError"] for block in _results(events))
    assert echo.calls == []
    assert result.output == "recovered"
    assert result.stop_reason == "completed"


async def test_a_tool_error_with_a_code_records_its_name_and_code(tmp_path: Path) -> None:
    """A body raising SubagentError(..., "UNAUTHORIZED") gives isError, `Error: <message>` and error {name, code}."""
    failing = RaisingTool(SubagentError("not yours", "UNAUTHORIZED"))
    steps = [{"toolCalls": [{"name": "fail", "arguments": {}}]}, {"text": "ok"}]
    async with open_runtime(tmp_path, script(steps), tools=[failing]) as rt:
        result = await rt.run("go")
        events = list(rt.sessions.get(result.session_id).events)  # type: ignore[union-attr]
    outcome = next(e for e in events if e.type == "tool/result")
    assert _data(outcome)["error"] == {"name": "SubagentError", "code": "UNAUTHORIZED"}
    assert _result_text(_results(events)[0]) == "Error: not yours"
    assert _results(events)[0]["isError"] is True


async def test_cancelling_mid_stream_keeps_the_partial_text_and_ends_the_turn_aborted(tmp_path: Path) -> None:
    """A turn cancelled while the model streams keeps an interrupted partial message, asks no more, ends aborted."""
    client = script([{"text": "a long answer that never finishes", "chunkSize": 4, "hold": "mid"}])
    requests: list[Any] = []
    original = client.stream

    def counting_stream(request: Any, *, signal: Any) -> Any:
        requests.append(request)
        return original(request, signal=signal)

    client.stream = counting_stream  # type: ignore[method-assign]
    async with open_runtime(tmp_path, client) as rt:
        agent = await rt.create_agent()
        message_id = await agent.send("talk")
        await asyncio.wait_for(client.wait_held("mid"), HANG_GUARD_S)
        assert agent.cancel("user") is True
        result = await asyncio.wait_for(agent.turn_result(message_id), HANG_GUARD_S)
        await asyncio.wait_for(agent.wait_idle(), HANG_GUARD_S)
        events = list(agent.session.events)
        assert agent.status == "idle"
    message = next(e for e in events if e.type == "assistant/message")
    assert _data(message)["interrupted"] is True
    assert _data(message)["message"]["content"] == [{"type": "text", "text": "a lo"}]
    assert _data(events[-1])["reason"] == {"kind": "aborted", "reason": {"kind": "user"}}
    assert types_of(events)[-2:] == ["step/end", "turn/end"]
    assert result.stop_reason == "aborted"
    assert len(requests) == 1  # no further request after the cancel


async def test_cancelling_during_a_tool_answers_the_running_and_the_later_calls(tmp_path: Path) -> None:
    """With two calls and the first blocking, a cancel answers both with errors and the turn ends aborted."""
    blocker = BlockingTool()
    echo = EchoTool()
    steps = [{"toolCalls": [{"name": "wait", "arguments": {}}, {"name": "echo", "arguments": {"text": "x"}}]}]
    async with open_runtime(tmp_path, script(steps), tools=[blocker, echo]) as rt:
        agent = await rt.create_agent()
        message_id = await agent.send("go")
        await asyncio.wait_for(blocker.started.wait(), HANG_GUARD_S)
        agent.cancel("parent")
        result = await asyncio.wait_for(agent.turn_result(message_id), HANG_GUARD_S)
        events = list(agent.session.events)
    texts = [_result_text(block) for block in _results(events)]
    assert texts == ["Error: tool call was cancelled", "Error: not run: the turn was cancelled"]
    assert echo.calls == []
    assert _data(events[-1])["reason"] == {"kind": "aborted", "reason": {"kind": "parent"}}
    assert result.stop_reason == "aborted"


async def test_a_tool_body_that_ignores_the_signal_is_cancelled_after_the_grace(tmp_path: Path) -> None:
    """A body that never looks at its signal has its task cancelled once the cancel grace has passed."""
    stubborn = BlockingTool(ignore_signal=True)
    steps = [{"toolCalls": [{"name": "wait", "arguments": {}}]}]
    async with open_runtime(tmp_path, script(steps), tools=[stubborn], cancel_grace_s=0.05) as rt:
        agent = await rt.create_agent()
        message_id = await agent.send("go")
        await asyncio.wait_for(stubborn.started.wait(), HANG_GUARD_S)
        agent.cancel("user")
        await asyncio.wait_for(agent.turn_result(message_id), HANG_GUARD_S)
    assert stubborn.task_cancelled is True


async def test_sends_return_at_acceptance_and_run_as_fifo_turns(tmp_path: Path) -> None:
    """Three sends to a running agent each return an id before their turn starts, and run in FIFO order."""
    client = script([{"text": "first", "hold": "first"}, {"text": "second"}, {"text": "third"}])
    async with open_runtime(tmp_path, client) as rt:
        agent = await rt.create_agent()
        ids = [await agent.send("one")]
        await asyncio.wait_for(client.wait_held("first"), HANG_GUARD_S)
        ids += [await agent.send("two"), await agent.send("three")]
        assert len(set(ids)) == 3
        user_ids = [
            _data(e)["id"]
            for e in agent.session.events
            if e.type == "user/message" and _data(e)["source"]["kind"] == "user"
        ]
        assert user_ids == [ids[0]]
        client.release("first")
        await asyncio.wait_for(agent.wait_idle(), HANG_GUARD_S)
        prompts = prompt_texts(agent.session.events)
        answers = [
            _data(e)["message"]["content"][0]["text"] for e in agent.session.events if e.type == "assistant/message"
        ]
    assert prompts == ["one", "two", "three"]
    assert answers == ["first", "second", "third"]


async def test_a_cancel_parks_the_inbox_until_the_next_send(tmp_path: Path) -> None:
    """After a cancel the queued item waits; the next send runs it first, then the new one."""
    client = script([{"text": "long", "hold": "long"}, {"text": "queued answer"}, {"text": "wake answer"}])
    async with open_runtime(tmp_path, client) as rt:
        agent = await rt.create_agent()
        await agent.send("long work")
        await asyncio.wait_for(client.wait_held("long"), HANG_GUARD_S)
        await agent.send("queued")
        agent.cancel("parent")
        await asyncio.wait_for(agent.wait_idle(), HANG_GUARD_S)
        assert agent.parked
        assert agent.pending == 1
        prompts = prompt_texts(agent.session.events)
        assert prompts == ["long work"]
        await agent.send("wake")
        await asyncio.wait_for(rt.settle(HANG_GUARD_S), HANG_GUARD_S)
        prompts = prompt_texts(agent.session.events)
    assert prompts == ["long work", "queued", "wake"]


async def test_a_turn_that_keeps_calling_tools_stops_at_max_steps(tmp_path: Path) -> None:
    """A model that always calls a tool ends the turn with AGENT_MAX_STEPS after max_steps steps."""
    call = {"toolCalls": [{"name": "echo", "arguments": {"text": "again"}}]}
    async with open_runtime(tmp_path, script([call, call, call]), tools=[EchoTool()], max_steps=3) as rt:
        result = await rt.run("loop forever")
        events = list(rt.sessions.get(result.session_id).events)  # type: ignore[union-attr]
    assert types_of(events).count("step/start") == 3
    assert result.stop_reason == "error"
    assert result.error is not None
    assert result.error["code"] == "AGENT_MAX_STEPS"


async def test_the_registry_reports_running_then_idle_and_forgets_a_closed_agent(tmp_path: Path) -> None:
    """A turn moves the status running → idle; a second registration of the id is refused; close removes it."""
    async with open_runtime(tmp_path, script([{"text": "ok"}])) as rt:
        seen: list[tuple[str, str]] = []
        rt.agents.subscribe(lambda agent, status: seen.append((agent.id, status)))
        agent = await rt.create_agent()
        await agent.turn_result(await agent.send("hi"))
        assert seen == [(agent.id, "running"), (agent.id, "idle")]
        assert rt.agents.status(agent.id) == "idle"
        with pytest.raises(AgentError) as refused:
            rt.agents.register(agent)
        assert refused.value.code == "DUPLICATE_AGENT"
        await agent.aclose()
        assert rt.agents.get(agent.id) is None
        assert rt.agents.unregister(agent) is False  # already gone: closing the agent removed it
        assert seen == [(agent.id, "running"), (agent.id, "idle"), (agent.id, "closed")]


async def test_a_resumed_session_continues_the_turn_numbering(tmp_path: Path) -> None:
    """A session with two closed turns, resumed in a new runtime and prompted, starts turn 3."""
    client = script([{"text": "one"}, {"text": "two"}, {"text": "three"}])
    async with open_runtime(tmp_path, client) as rt:
        agent = await rt.create_agent()
        await agent.turn_result(await agent.send("a"))
        await agent.turn_result(await agent.send("b"))
        session_id = agent.id
    async with open_runtime(tmp_path, client) as rt:
        result = await rt.run("c", session_id)
        events = list(rt.sessions.get(session_id).events)  # type: ignore[union-attr]
    assert result.turn == 3
    assert [_data(e)["turn"] for e in events if e.type == "turn/start"] == [1, 2, 3]
    assert turn_events(events, 3)[0].type == "turn/start"


async def test_a_script_mismatch_ends_the_turn_with_the_script_code(tmp_path: Path) -> None:
    """When the scripted model refuses the request, the turn ends with error SCRIPT_MISMATCH naming the step."""
    async with open_runtime(tmp_path, script([{"match": {"lastUser": "A"}, "text": "never"}])) as rt:
        result = await rt.run("B")
    assert result.stop_reason == "error"
    assert result.error is not None
    assert result.error["code"] == "SCRIPT_MISMATCH"
    assert 'agent "main" at step 1 (request 1)' in result.error["message"]


async def test_closing_the_runtime_mid_turn_aborts_it_as_disposed_and_leaves_no_task(tmp_path: Path) -> None:
    """Closing the runtime while a tool body runs ends the turn aborted (disposed) and leaves no task running."""
    blocker = BlockingTool(ignore_signal=True)
    steps = [{"toolCalls": [{"name": "wait", "arguments": {}}]}]
    before = asyncio.all_tasks()
    async with open_runtime(tmp_path, script(steps), tools=[blocker], cancel_grace_s=0.05) as rt:
        agent = await rt.create_agent()
        session_id = agent.id
        await agent.send("go")
        await asyncio.wait_for(blocker.started.wait(), HANG_GUARD_S)
    assert asyncio.all_tasks() - before == set()
    assert blocker.task_cancelled is True
    async with open_runtime(tmp_path, script([])) as rt:
        observation = await rt.query.observe_session(session_id)
    events = list(observation.events)
    assert _data(events[-1])["reason"] == {"kind": "aborted", "reason": {"kind": "disposed"}}
    assert _result_text(_results(events)[0]) == "Error: tool call was cancelled"


async def test_send_to_a_closing_agent_is_refused(tmp_path: Path) -> None:
    """A message sent to an agent that is closing raises AGENT_CLOSING."""
    async with open_runtime(tmp_path, script([])) as rt:
        agent: Agent = await rt.create_agent()
        await agent.aclose()
        with pytest.raises(AgentError) as refused:
            await agent.send("late")
    assert refused.value.code == "AGENT_CLOSING"


async def test_logged_chunks_are_cited_by_the_assistant_message(tmp_path: Path) -> None:
    """With log_chunks on every chunk is an assistant/chunk event and the message cites their seqs."""
    async with open_runtime(tmp_path, script([{"text": "chunky text", "chunkSize": 4}]), log_chunks=True) as rt:
        result = await rt.run("hi")
        events = list(rt.sessions.get(result.session_id).events)  # type: ignore[union-attr]
    chunks = [e for e in events if e.type == "assistant/chunk"]
    message = next(e for e in events if e.type == "assistant/message")
    assert [_data(c)["chunk"]["type"] for c in chunks] == [
        "block-start",
        "text-delta",
        "text-delta",
        "text-delta",
        "block-end",
        "usage",
        "finish",
    ]
    assert message.source_event_seqs == [c.seq for c in chunks]


async def test_usage_is_written_only_on_steps_in_the_harness_shape(tmp_path: Path) -> None:
    """Each step's `assistant/message` and logged usage chunk carry the disjoint usage; `turn/end` is exactly
    `{turn, reason}`; the turn result sums the steps."""
    steps = [
        {
            "toolCalls": [{"name": "echo", "arguments": {"text": "x"}}],
            "usage": {"inputTokens": 30, "outputTokens": 4, "cacheReadTokens": 70, "cacheWriteTokens": 2},
        },
        {"text": "done", "usage": {"inputTokens": 5, "outputTokens": 6, "cacheReadTokens": 100, "reasoningTokens": 1}},
    ]
    async with open_runtime(tmp_path, script(steps), tools=[EchoTool()], log_chunks=True) as rt:
        result = await rt.run("go")
        events = list(rt.sessions.get(result.session_id).events)  # type: ignore[union-attr]
    messages = [_data(e)["usage"] for e in events if e.type == "assistant/message"]
    chunks = [
        _data(e)["chunk"]["usage"]
        for e in events
        if e.type == "assistant/chunk" and _data(e)["chunk"]["type"] == "usage"
    ]
    assert messages == chunks == [steps[0]["usage"], steps[1]["usage"]]
    assert [dict(_data(e)) for e in events if e.type == "turn/end"] == [{"turn": 1, "reason": {"kind": "completed"}}]
    assert result.usage is not None
    assert result.usage.to_json() == {
        "inputTokens": 35,
        "outputTokens": 10,
        "cacheReadTokens": 170,
        "cacheWriteTokens": 2,
        "reasoningTokens": 1,
    }


async def test_resume_agent_refuses_a_subagent_session_live_or_stored(tmp_path: Path) -> None:
    """`rt.resume_agent` of a child session is SESSION_OWNED_BY_SUBAGENT, resident or cold, and loads nothing."""
    client = scripted({"helper": [{"hold": "helper", "text": "HELPED"}]})  # `main` answers the notice
    async with open_runtime(tmp_path, client) as rt:
        parent = await rt.create_agent()
        started = await rt.subagents.start_continuable(ContinuableSpec(parent=parent, prompt="help", label="helper"))
        child = rt.agents.get(started.child_id)
        with pytest.raises(AgentError) as live:
            await rt.resume_agent(started.child_id)
        assert rt.agents.get(started.child_id) is child
        client.release("helper")
        await rt.settle(HANG_GUARD_S)
        assert rt.agents.get(started.child_id) is None
        with pytest.raises(AgentError) as stored:
            await rt.resume_agent(started.child_id)
        assert rt.agents.get(started.child_id) is None
        assert rt.sessions.get(started.child_id) is None
        client.assert_consumed()
    assert live.value.code == stored.value.code == "SESSION_OWNED_BY_SUBAGENT"
