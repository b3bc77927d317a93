"""One-shot runs and the provider registry, on the real loop.

Layer: subagent. `start` checks the provider and its declared capabilities before any work, hands
the provider a new request carrying the one-shot descriptor, and pairs `subagent/start` with
`subagent/end`. The in-process driver writes the descriptor inside the child's first turn, reads the
result from the own suffix and releases the child, which then lists as `inactive`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from dsh.abort import AbortController, AbortError
from dsh.agent.loop import Agent
from dsh.subagent.descriptor import ToolFilter
from dsh.subagent.errors import SubagentError
from dsh.subagent.providers import (
    ContinuablePreparation,
    ProviderCapabilities,
    SubagentRequest,
    SubagentResult,
    SubagentRun,
)
from dsh.subagent.rows import SubagentChildRow, SubagentDiagnosticRow
from tests.subagent.ops_helpers import (
    HANG_GUARD_S,
    LifecycleLog,
    RecordingModel,
    data,
    descriptor_events,
    ops_runtime,
    scripted,
    settle,
    stored_events,
    turn_ends,
)


class _StubProvider:
    """Records the requests it gets; its runs resolve with `result` (or fail with `fail`)."""

    inherits_parent_context = False

    def __init__(self, name: str = "stub", *, capabilities: ProviderCapabilities | None = None) -> None:
        self.name = name
        self.capabilities = capabilities or ProviderCapabilities()
        self.requests: list[SubagentRequest] = []
        self.raise_on_start: BaseException | None = None
        self.fail: BaseException | None = None

    async def start(self, request: SubagentRequest) -> SubagentRun:
        self.requests.append(request)
        if self.raise_on_start is not None:
            raise self.raise_on_start
        result: asyncio.Future[SubagentResult] = asyncio.get_running_loop().create_future()
        if self.fail is not None:
            result.set_exception(self.fail)
        else:
            result.set_result(SubagentResult("completed", ({"type": "text", "text": "stubbed"},)))
        return SubagentRun(f"run-{len(self.requests)}", result)

    async def prepare_continuable(self, request: SubagentRequest) -> ContinuablePreparation:
        return ContinuablePreparation()


async def test_duplicate_and_missing_providers_are_refused(tmp_path: Path) -> None:
    """A second provider with a taken name is `DUPLICATE_PROVIDER`; starting an unknown one is `NO_PROVIDER`."""
    async with ops_runtime(tmp_path, scripted({})) as rt:
        parent = await rt.create_agent()
        assert rt.subagents.providers() == ("spawn", "fork")
        rt.subagents.register_provider(_StubProvider())
        with pytest.raises(SubagentError) as duplicate:
            rt.subagents.register_provider(_StubProvider())
        assert duplicate.value.code == "DUPLICATE_PROVIDER"
        with pytest.raises(SubagentError) as missing:
            await rt.subagents.start("missing", SubagentRequest(parent=parent, prompt="x"))
        assert missing.value.code == "NO_PROVIDER"
        assert rt.subagents.providers() == ("spawn", "fork", "stub")


async def test_missing_capabilities_are_refused_in_order_before_the_provider_runs(tmp_path: Path) -> None:
    """Output schema, depth limit, tool filter, persona: the first one the provider lacks is named; it never starts."""
    async with ops_runtime(tmp_path, scripted({})) as rt:
        parent = await rt.create_agent()
        provider = _StubProvider()
        rt.subagents.register_provider(provider)
        asked: dict[str, Any] = {
            "output_schema": {"type": "object"},
            "max_depth": 3,
            "tool_filter": ToolFilter(deny=("agent",)),
            "persona": "Careful.",
        }
        named = ["an output schema", "a depth limit", "a tool filter", "a persona"]
        for index, expected in enumerate(named):
            fields = dict(list(asked.items())[index:])
            with pytest.raises(SubagentError, match=expected) as caught:
                await rt.subagents.start("stub", SubagentRequest(parent=parent, prompt="x", **fields))
            assert caught.value.code == "UNSUPPORTED_CAPABILITY"
        assert provider.requests == []


async def test_invalid_depth_and_schema_are_refused_before_the_provider_runs(tmp_path: Path) -> None:
    """`max_depth` -1 or True and a schema that is not an object schema are refused before the provider starts."""
    async with ops_runtime(tmp_path, scripted({})) as rt:
        parent = await rt.create_agent()
        every = ProviderCapabilities(output_schema=True, depth_limit=True, tool_filter=True, persona=True)
        provider = _StubProvider(capabilities=every)
        rt.subagents.register_provider(provider)
        for bad in (-1, True):
            with pytest.raises(ValueError, match="maxDepth must be a non-negative safe integer"):
                await rt.subagents.start("stub", SubagentRequest(parent=parent, prompt="x", max_depth=bad))
        for schema in ({"type": "array"}, ["not", "an", "object"]):
            with pytest.raises(ValueError, match="outputSchema"):
                await rt.subagents.start("stub", SubagentRequest(parent=parent, prompt="x", output_schema=schema))  # type: ignore[arg-type]
        assert provider.requests == []


async def test_the_provider_gets_a_new_request_with_the_descriptor(tmp_path: Path) -> None:
    """The provider gets a new request: the caller's plus the one-shot descriptor; the original is untouched."""
    async with ops_runtime(tmp_path, scripted({})) as rt:
        parent = await rt.create_agent()
        provider = _StubProvider()
        rt.subagents.register_provider(provider)
        request = SubagentRequest(parent=parent, prompt="do it")
        run = await rt.subagents.start("stub", request)
        await run.result
        (received,) = provider.requests
        assert received is not request
        assert request.descriptor is None
        assert received.descriptor == {"version": 2, "mode": "one-shot", "provider": "stub"}
        assert received == SubagentRequest(parent=parent, prompt="do it", descriptor=received.descriptor)


async def test_start_and_end_notifications_follow_the_run(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A failed start emits nothing; a failed result ends `error`; a raising listener is logged, others still run."""
    async with ops_runtime(tmp_path, scripted({})) as rt:
        parent = await rt.create_agent()
        provider = _StubProvider()
        rt.subagents.register_provider(provider)

        def broken(event: Mapping[str, Any]) -> None:
            raise RuntimeError("listener broke")

        rt.subagents.on_event(broken)
        log = LifecycleLog(rt)
        provider.raise_on_start = KeyError("provider refused")
        with pytest.raises(KeyError):
            await rt.subagents.start("stub", SubagentRequest(parent=parent, prompt="x"))
        assert log.events == []
        provider.raise_on_start = None
        provider.fail = RuntimeError("the run failed")
        with caplog.at_level(logging.ERROR, logger="dsh.subagent"):
            run = await rt.subagents.start("stub", SubagentRequest(parent=parent, prompt="x"))
            with pytest.raises(RuntimeError):
                await run.result
            await settle(rt)
        start, end = log.events
        assert (start["type"], end["type"]) == ("subagent/start", "subagent/end")
        assert start["runId"] == end["runId"]
        assert (end["stopReason"], end["hasOutput"], end["local"]) == ("error", False, False)
        assert "listener raised" in caplog.text


async def test_provider_added_listener_failure_rolls_the_registration_back(tmp_path: Path) -> None:
    """A raising `provider-added` listener undoes the registration; a kept one's disposer emits `provider-removed`."""
    async with ops_runtime(tmp_path, scripted({})) as rt:
        seen: list[Mapping[str, Any]] = []
        rt.subagents.on_event(seen.append)
        dispose = rt.subagents.register_provider(_StubProvider("kept"))

        def refuse(event: Mapping[str, Any]) -> None:
            if event["type"] == "subagent/provider-added":
                raise RuntimeError("no more providers")

        stop = rt.subagents.on_event(refuse)
        with pytest.raises(RuntimeError):
            rt.subagents.register_provider(_StubProvider("refused"))
        stop()
        assert rt.subagents.get_provider("refused") is None
        dispose()
        dispose()
        assert [event["type"] for event in seen] == [
            "subagent/provider-added",
            "subagent/provider-added",
            "subagent/provider-removed",
        ]
        assert rt.subagents.get_provider("kept") is None


async def test_a_spawn_run_writes_its_descriptor_inside_the_first_turn(tmp_path: Path) -> None:
    """The descriptor lies after `turn/start` and before `step/start`; the run completes and the child is released."""
    client = scripted({"one-shot": [{"text": "ANSWER"}]})
    async with ops_runtime(tmp_path, client) as rt:
        parent = await rt.create_agent(cwd="/work")
        log = LifecycleLog(rt)
        run = await rt.subagents.start("spawn", SubagentRequest(parent=parent, prompt="question"))
        assert run.local_agent is not None
        result = await asyncio.wait_for(run.result, HANG_GUARD_S)
        assert result == SubagentResult("completed", ({"type": "text", "text": "ANSWER"},))
        await settle(rt)
        assert rt.agents.get(run.id) is None
        assert rt.sessions.get(run.id) is None
        events = await stored_events(rt, run.id)
        header = (await rt.query.observe_session(run.id)).header
        rows = await rt.subagents.list_children(parent.id)
    assert [event.type for event in events[:6]] == [
        "turn/start",
        "subagent/descriptor",
        "permission/preset",
        "sandbox/mode",
        "approval/policy",
        "step/start",
    ]
    # The child's permissions are its parent's, recorded as delegated.
    assert data(events[3]) == {"mode": "workspace-write", "source": "delegation"}
    (descriptor,) = descriptor_events(events)
    assert data(descriptor) == {"version": 2, "mode": "one-shot", "provider": "spawn"}
    assert (header.parent_session, header.origin, header.cwd, header.delegation_depth) == (
        parent.id,
        "subagent",
        "/work",
        1,
    )
    assert rows == [SubagentChildRow(run.id, "one-shot", "inactive", False)]
    (start,) = log.of("subagent/start")
    (end,) = log.of("subagent/end")
    assert start["childSessionId"] == run.id
    assert (start["local"], end["stopReason"], end["lastAssistantMessage"]) == (True, "completed", "ANSWER")


async def test_a_run_disposed_before_its_first_step_has_no_descriptor(tmp_path: Path) -> None:
    """Disposing a run before its child took its first step leaves no descriptor: the child lists as corrupt."""
    async with ops_runtime(tmp_path, scripted({})) as rt:
        parent = await rt.create_agent()

        in_hook, cancelled = asyncio.Event(), asyncio.Event()

        async def gate(agent: Agent, turn: int, step: int) -> None:
            in_hook.set()
            await cancelled.wait()

        start_agent = rt.start_agent

        def gated_start(*args: Any, **kwargs: Any) -> Agent:
            agent = start_agent(*args, **kwargs)
            agent.add_pre_step_hook(gate)  # runs before the driver's descriptor hook
            cancel = agent.cancel

            def noting_cancel(*args: Any, **kwargs: Any) -> bool:
                cancelled.set()
                return cancel(*args, **kwargs)

            agent.cancel = noting_cancel  # type: ignore[method-assign]
            return agent

        rt.start_agent = gated_start  # type: ignore[method-assign]
        try:
            run = await rt.subagents.start("spawn", SubagentRequest(parent=parent, prompt="never", label="gated"))
        finally:
            del rt.start_agent
        await asyncio.wait_for(in_hook.wait(), HANG_GUARD_S)  # the turn started; its first step has not
        await asyncio.wait_for(run.dispose(), HANG_GUARD_S)
        await run.dispose()  # idempotent
        result = run.result.result()
        await settle(rt)
        events = await stored_events(rt, run.id)
        rows = await rt.subagents.list_children(parent.id)
    assert result.stop_reason == "aborted"
    assert descriptor_events(events) == []
    assert turn_ends(events) == [{"kind": "aborted", "reason": {"kind": "parent"}}]
    assert rows == [SubagentDiagnosticRow(run.id, "corrupt")]


async def test_disposing_a_running_child_aborts_it(tmp_path: Path) -> None:
    """Disposing a run whose child is streaming ends its turn `aborted` (cause parent) and resolves the result."""
    client = scripted({"slow": [{"hold": "slow-gate", "text": "PARTIAL ANSWER"}]})
    async with ops_runtime(tmp_path, client) as rt:
        parent = await rt.create_agent()
        run = await rt.subagents.start("spawn", SubagentRequest(parent=parent, prompt="go", label="slow"))
        await asyncio.wait_for(client.wait_held("slow-gate"), HANG_GUARD_S)
        await asyncio.wait_for(run.dispose(), HANG_GUARD_S)
        result = run.result.result()
        events = await stored_events(rt, run.id)
    assert result.stop_reason == "aborted"
    assert result.output == ({"type": "text", "text": "PARTIAL ANSWER"},)  # the text streamed before the hold
    assert turn_ends(events) == [{"kind": "aborted", "reason": {"kind": "parent"}}]


async def test_the_request_signal_cancels_the_run(tmp_path: Path) -> None:
    """Aborting the request's signal cancels a running child; a signal aborted before start refuses to publish one."""
    client = scripted({"cancelled": [{"hold": "cancel-gate", "text": "NEVER"}]})
    async with ops_runtime(tmp_path, client) as rt:
        parent = await rt.create_agent()
        controller = AbortController()
        request = SubagentRequest(parent=parent, prompt="go", label="cancelled", signal=controller.signal)
        run = await rt.subagents.start("spawn", request)
        await asyncio.wait_for(client.wait_held("cancel-gate"), HANG_GUARD_S)
        controller.abort(RuntimeError("stop"))
        result = await asyncio.wait_for(run.result, HANG_GUARD_S)
        assert result.stop_reason == "aborted"
        with pytest.raises(AbortError, match="aborted before child publication"):
            await rt.subagents.start("spawn", request)
        await settle(rt)
        assert [session.id for session in rt.sessions.list()] == [parent.id]


async def test_a_fork_run_inherits_the_completed_turns(tmp_path: Path) -> None:
    """A fork child is seeded with the parent's turns through its last `turn/end`; its descriptor is its own."""
    client = scripted({"main": [{"text": "ONE"}], "forked": [{"text": "FORKED"}]})
    async with ops_runtime(tmp_path, client) as rt:
        first = await rt.run("first")
        parent = rt.agents.get(first.session_id)
        assert parent is not None
        inherited = len(parent.session.events)
        run = await rt.subagents.start("fork", SubagentRequest(parent=parent, prompt="second", label="forked"))
        result = await asyncio.wait_for(run.result, HANG_GUARD_S)
        observation = await rt.query.observe_session(run.id)
    assert result.stop_reason == "completed"
    assert observation.inherited_event_count == inherited
    (descriptor,) = descriptor_events(observation.events)
    assert descriptor.seq > inherited


async def test_persona_schema_model_and_filter_compose_the_child(tmp_path: Path) -> None:
    """A one-shot child gets persona and the structured-output instruction in its system prompt, the schema as the
    `structured_output` tool's parameters, the model override and filtered tools; its valid call is the result."""
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    call = {"toolCalls": [{"name": "structured_output", "arguments": {"ok": True}}]}
    model = RecordingModel(scripted({"composed": [call]}))
    async with ops_runtime(tmp_path, model) as rt:
        parent = await rt.create_agent()
        request = SubagentRequest(
            parent=parent,
            prompt="answer",
            label="composed",
            persona="Be exact.",
            output_schema=schema,
            model="m-child",
            tool_filter=ToolFilter(deny=("agent",)),
        )
        run = await rt.subagents.start("spawn", request)
        result = await asyncio.wait_for(run.result, HANG_GUARD_S)
        assert "structured_output" not in rt.tools  # the runtime's shared registry never gets it
    (sent,) = model.for_key("composed")
    assert sent.system is not None
    assert "Be exact." in sent.system
    assert "`structured_output` tool" in sent.system
    offered = {tool["name"]: tool for tool in sent.tools}
    assert offered["structured_output"]["parameters"] == schema
    assert sent.model == "m-child"
    assert "agent" not in offered
    assert (result.stop_reason, result.structured) == ("completed", {"ok": True})
