"""Continuable children on the real loop: creation, placement of the descriptor, admission and rollback.

Layer: subagent. A continuable child is created with its descriptor in the creation seed (seq == cut,
before any own turn), returns at inbox acceptance, and rolls back completely when the start fails
before acceptance.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from dsh.abort import AbortController
from dsh.agent.messages import RelaySource
from dsh.services import Services
from dsh.subagent.authority import AncestorAuthority
from dsh.subagent.descriptor import ToolFilter
from dsh.subagent.errors import SubagentDepthError, SubagentError
from dsh.subagent.providers import (
    ContinuablePreparation,
    ContinuableSpec,
    ProviderCapabilities,
    SubagentRequest,
    SubagentRun,
)
from dsh.subagent.runtime import SubagentRuntime
from tests.subagent.ops_helpers import (
    LifecycleLog,
    RecordingModel,
    data,
    descriptor_events,
    ops_runtime,
    scripted,
    settle,
    start_child,
    stored_events,
    turn_numbers,
    user_prompts,
)


class _PrepareOnly:
    """A provider that prepares continuable children (spawn-like) but may not declare the capability."""

    inherits_parent_context = False

    def __init__(self, name: str, *, continuable: bool, on_prepare: Any = None) -> None:
        self.name = name
        self.capabilities = ProviderCapabilities(continuable=continuable)
        self.on_prepare = on_prepare
        self.prepared = 0

    async def start(self, request: SubagentRequest) -> SubagentRun:
        raise AssertionError("one-shot start is not used here")

    async def prepare_continuable(self, request: SubagentRequest) -> ContinuablePreparation:
        self.prepared += 1
        if self.on_prepare is not None:
            self.on_prepare()
        return ContinuablePreparation()


async def test_spawn_child_has_one_descriptor_first_in_its_seed(tmp_path: Path) -> None:
    """A continuable spawn child: one descriptor at seq 0 == cut, then the end-seed marker, then its first turn."""
    client = scripted({"summarize the doc": [{"text": "SUMMARY"}]})
    async with ops_runtime(tmp_path, client) as rt:
        parent = await rt.create_agent(cwd="/work")
        child_id = await start_child(rt, parent, "summarize the doc")
        await settle(rt)
        events = await stored_events(rt, child_id)
        header = (await rt.query.observe_session(child_id)).header
    (descriptor,) = descriptor_events(events)
    assert descriptor.seq == 0
    assert descriptor.surface_op is None
    assert data(descriptor) == {
        "version": 2,
        "mode": "continuable",
        "provider": "spawn",
        "label": "summarize the doc",
        "agentProvider": "scripted",
        "agentModel": "scripted-test",
    }
    assert [event.type for event in events[:3]] == ["subagent/descriptor", "session/end-seed", "turn/start"]
    assert header.parent_session == parent.id
    assert header.origin == "subagent"
    assert header.cwd == "/work"
    assert header.delegation_depth == 1
    assert header.is_seeded is False
    assert user_prompts(events) == ["task: summarize the doc"]


async def test_persona_and_tool_filter_are_recorded_and_composed(tmp_path: Path) -> None:
    """Persona and tool filter land in the descriptor, the persona in the system prompt, the filter in the tools."""
    model = RecordingModel(scripted({"filtered": [{"text": "OK"}]}))
    async with ops_runtime(tmp_path, model) as rt:
        parent = await rt.create_agent()
        child_id = await start_child(
            rt, parent, "filtered", persona="Answer tersely.", tool_filter=ToolFilter(allow=("list_agents",))
        )
        await settle(rt)
        (descriptor,) = descriptor_events(await stored_events(rt, child_id))
    assert data(descriptor)["persona"] == "Answer tersely."
    assert data(descriptor)["toolFilter"] == {"allow": ["list_agents"]}
    (request,) = model.for_key("filtered")
    assert request.system is not None
    assert request.system.endswith("Answer tersely.")
    assert [tool["name"] for tool in request.tools] == ["list_agents"]
    assert request.meta.agent_key == "filtered"


async def test_fork_child_is_seeded_and_continues_turn_numbering(tmp_path: Path) -> None:
    """A fork child inherits the parent's completed turns; its descriptor sits at seq == cut and its turns continue."""
    client = scripted({"main": [{"text": "PARENT_ONE"}], "forked": [{"text": "FORK_DONE"}]})
    async with ops_runtime(tmp_path, client) as rt:
        first = await rt.run("hello")
        parent = rt.agents.get(first.session_id)
        assert parent is not None
        inherited = len(parent.session.events)
        child_id = await start_child(rt, parent, "forked", provider="fork")
        activation = rt.subagents.activation(child_id)
        assert activation is not None
        session = activation.agent.session
        assert session.header.is_seeded is True
        assert session.inherited_event_count == inherited
        await settle(rt)
        events = await stored_events(rt, child_id)
    (descriptor,) = descriptor_events(events)
    assert descriptor.seq == inherited
    assert session.is_own_seq(descriptor.seq)
    assert events[inherited + 1].type == "session/end-seed"
    assert turn_numbers(events) == [1, 2]
    assert user_prompts(events) == ["hello", "task: forked"]


async def test_start_returns_at_acceptance_before_any_model_request(tmp_path: Path) -> None:
    """`start_continuable` returns the id from the id factory and the message id before the child asks its model."""
    model = RecordingModel(scripted({"quick": [{"text": "DONE"}]}))
    async with ops_runtime(tmp_path, model) as rt:
        parent = await rt.create_agent()
        started = await rt.subagents.start_continuable(ContinuableSpec(parent=parent, prompt="go", label="quick"))
        assert model.for_key("quick") == []
        assert started.child_id == "00000001-0000-4000-8000-000000000002"
        await settle(rt)
        events = await stored_events(rt, started.child_id)
    (message,) = [event for event in events if event.type == "user/message" and data(event)["source"]["kind"] == "user"]
    assert data(message)["id"] == started.message_id


async def test_reserved_child_id_is_used_once_live_or_stored(tmp_path: Path) -> None:
    """A caller-reserved id is used; a second start with it fails `DUPLICATE_CHILD`, live and after it was stored."""
    client = scripted({"reserved": {"steps": [{"hold": "reserved-gate", "text": "DONE"}]}})
    async with ops_runtime(tmp_path, client) as rt:
        parent = await rt.create_agent()
        child_id = await start_child(rt, parent, "reserved", child_id="my-child")
        assert child_id == "my-child"
        with pytest.raises(SubagentError) as live:
            await start_child(rt, parent, "reserved", child_id="my-child")
        assert live.value.code == "DUPLICATE_CHILD"
        client.release("reserved-gate")
        await settle(rt)
        assert rt.sessions.get("my-child") is None
        with pytest.raises(SubagentError) as stored:
            await start_child(rt, parent, "reserved", child_id="my-child")
        assert stored.value.code == "DUPLICATE_CHILD"


async def test_provider_without_continuable_capability_is_refused(tmp_path: Path) -> None:
    """A provider that defines `prepare_continuable` but does not declare `continuable` is refused; no child exists."""
    async with ops_runtime(tmp_path, scripted({})) as rt:
        parent = await rt.create_agent()
        provider = _PrepareOnly("undeclared", continuable=False)
        rt.subagents.register_provider(provider)
        with pytest.raises(SubagentError, match="does not support continuable children") as caught:
            await start_child(rt, parent, "nope", provider="undeclared")
        assert caught.value.code == "UNSUPPORTED_CAPABILITY"
        assert provider.prepared == 0
        assert [session.id for session in rt.sessions.list()] == [parent.id]
        with pytest.raises(SubagentError) as missing:
            await start_child(rt, parent, "nope", provider="missing")
        assert missing.value.code == "NO_PROVIDER"


async def test_continuable_children_need_persistence(tmp_path: Path) -> None:
    """Without persistence a continuable start fails `PERSISTENCE_UNAVAILABLE` and creates nothing."""
    async with ops_runtime(tmp_path, scripted({})) as rt:
        parent = await rt.create_agent()
        persistence, rt.services.persistence = rt.services.persistence, None
        try:
            with pytest.raises(SubagentError, match="require session persistence") as caught:
                await start_child(rt, parent, "no store")
        finally:
            rt.services.persistence = persistence
        assert caught.value.code == "PERSISTENCE_UNAVAILABLE"
        assert [session.id for session in rt.sessions.list()] == [parent.id]


async def test_without_agent_registry_operations_are_unavailable(tmp_path: Path) -> None:
    """Without an agent registry, starts and follow-ups fail `CONTINUATION_UNAVAILABLE`; an interrupt is a no-op."""
    async with ops_runtime(tmp_path, scripted({})) as rt:
        parent = await rt.create_agent()
        services = Services(
            sessions=rt.sessions, persistence=rt.persistence, projections=rt.projections, query=rt.query
        )
        runtime = SubagentRuntime(services, host=rt)
        try:
            with pytest.raises(SubagentError) as start:
                await runtime.start_continuable(ContinuableSpec(parent=parent, prompt="x", label="y"))
            assert start.value.code == "CONTINUATION_UNAVAILABLE"
            with pytest.raises(SubagentError) as followup:
                await runtime.followup(parent, "any", "hello", source={"kind": "user"})
            assert followup.value.code == "CONTINUATION_UNAVAILABLE"
            await runtime.interrupt("any", AncestorAuthority(parent))
        finally:
            await runtime.aclose()
            runtime.release_units()
        assert [session.id for session in rt.sessions.list()] == [parent.id]


async def test_an_abort_before_acceptance_rolls_everything_back(tmp_path: Path) -> None:
    """An abort during preparation raises the signal's own reason; only the parent remains, and no end is emitted."""
    async with ops_runtime(tmp_path, scripted({})) as rt:
        parent = await rt.create_agent()
        log = LifecycleLog(rt)
        controller = AbortController()
        reason = RuntimeError("caller went away")
        rt.subagents.register_provider(
            _PrepareOnly("aborting", continuable=True, on_prepare=lambda: controller.abort(reason))
        )
        with pytest.raises(RuntimeError) as caught:
            await start_child(rt, parent, "never", provider="aborting", signal=controller.signal)
        assert caught.value is reason
        with pytest.raises(RuntimeError) as pre:
            await start_child(rt, parent, "never", signal=controller.signal)
        assert pre.value is reason
        assert [session.id for session in rt.sessions.list()] == [parent.id]
        assert [agent.id for agent in rt.agents.list()] == [parent.id]
        assert log.of("subagent/start") == log.of("subagent/end") == []
        listing = await rt.persistence.list()
    assert len(listing) == 0  # nothing of the child reached storage either


async def test_max_depth_zero_forbids_delegation(tmp_path: Path) -> None:
    """`max_depth=0` raises `SubagentDepthError` ("exceeds maxDepth 0") for both kinds of start; nothing is created."""
    async with ops_runtime(tmp_path, scripted({})) as rt:
        parent = await rt.create_agent()
        with pytest.raises(SubagentDepthError, match="subagent depth 1 exceeds maxDepth 0"):
            await start_child(rt, parent, "too deep", max_depth=0)
        with pytest.raises(SubagentDepthError, match="exceeds maxDepth 0"):
            await rt.subagents.start("spawn", SubagentRequest(parent=parent, prompt="x", max_depth=0))
        assert [session.id for session in rt.sessions.list()] == [parent.id]


async def test_child_depth_grows_with_each_generation(tmp_path: Path) -> None:
    """A grandchild runs at depth 2 and a cap of 1 refuses it; an invalid cap is refused before anything starts."""
    client = scripted({"child": [{"hold": "child-gate", "text": "C"}], "grandchild": [{"text": "G"}]})
    async with ops_runtime(tmp_path, client) as rt:
        parent = await rt.create_agent()
        child_id = await start_child(rt, parent, "child")
        child = rt.agents.get(child_id)
        assert child is not None
        assert child.options.subagent_depth == 1
        with pytest.raises(SubagentDepthError) as capped:
            await start_child(rt, child, "grandchild", max_depth=1)
        assert (capped.value.attempted_depth, capped.value.max_depth) == (2, 1)
        for bad in (-1, True, 1.5):
            with pytest.raises(ValueError, match="maxDepth must be a non-negative safe integer"):
                await start_child(rt, child, "grandchild", max_depth=bad)
        grandchild_id = await start_child(rt, child, "grandchild", max_depth=2)
        grandchild = rt.subagents.activation(grandchild_id)
        assert grandchild is not None
        assert grandchild.agent.session.header.delegation_depth == 2
        client.release("child-gate")
        await settle(rt)


def _descriptor_payload(events: list[Any]) -> Mapping[str, Any]:
    (descriptor,) = descriptor_events(events)
    return data(descriptor)


async def test_parent_model_override_is_recorded_as_agent_model(tmp_path: Path) -> None:
    """A model override is recorded as `agentModel` and the child's requests name it."""
    model = RecordingModel(scripted({"other model": [{"text": "OK"}]}))
    async with ops_runtime(tmp_path, model) as rt:
        parent = await rt.create_agent()
        child_id = await start_child(rt, parent, "other model", model="m-override")
        await settle(rt)
        payload = _descriptor_payload(await stored_events(rt, child_id))
    assert payload["agentModel"] == "m-override"
    (request,) = model.for_key("other model")
    assert request.model == "m-override"


async def test_a_started_child_lists_as_running_at_once(tmp_path: Path) -> None:
    """A started child that is still running lists as a running continuable row the moment `start` returned."""
    client = scripted({"busy": [{"hold": "busy-gate", "text": "DONE"}]})
    async with ops_runtime(tmp_path, client) as rt:
        parent = await rt.create_agent()
        child_id = await start_child(rt, parent, "busy")
        rows = await rt.subagents.list_children(parent.id)
        assert [(row.id, row.kind, getattr(row, "activity", None)) for row in rows] == [(child_id, "child", "running")]
        client.release("busy-gate")
        await settle(rt)


async def test_an_abort_in_the_creation_window_rolls_everything_back(tmp_path: Path) -> None:
    """An abort raised while the child is being published fails the start; only the parent remains, no end."""
    async with ops_runtime(tmp_path, scripted({})) as rt:
        parent = await rt.create_agent()
        log = LifecycleLog(rt)
        controller = AbortController()
        reason = RuntimeError("caller left during creation")
        published: list[str] = []

        def abort_on_child(session: Any) -> None:
            if session.header.origin == "subagent":
                published.append(session.id)
                controller.abort(reason)

        stop = rt.sessions.on_created(abort_on_child)
        with pytest.raises(RuntimeError) as caught:
            await start_child(rt, parent, "never", signal=controller.signal)
        stop()
        assert caught.value is reason
        assert len(published) == 1  # the abort really came inside the creation window
        (child_id,) = published
        assert [session.id for session in rt.sessions.list()] == [parent.id]
        assert [agent.id for agent in rt.agents.list()] == [parent.id]
        assert rt.subagents.activation(child_id) is None
        assert log.of("subagent/end") == []
        await settle(rt)
        assert await rt.subagents.list_children(parent.id) == []


async def test_a_failing_lifecycle_listener_is_logged_and_the_child_still_runs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A listener raising on `subagent/start` and `subagent/end` is logged; the start succeeds, others hear both."""
    client = scripted({"heard": [{"text": "HEARD"}]})
    async with ops_runtime(tmp_path, client) as rt:
        parent = await rt.create_agent()

        def broken(event: Mapping[str, Any]) -> None:
            raise RuntimeError(f"listener broke on {event['type']}")

        rt.subagents.on_event(broken)
        log = LifecycleLog(rt)
        with caplog.at_level(logging.ERROR, logger="dsh.subagent"):
            child_id = await start_child(rt, parent, "heard")
            await settle(rt)
        events = await stored_events(rt, child_id)
    assert [event["type"] for event in log.events] == ["subagent/start", "subagent/end"]
    assert log.ends_for(child_id)[0]["stopReason"] == "completed"
    assert user_prompts(events) == ["task: heard"]
    assert caplog.text.count("listener raised") == 2


async def test_a_disposing_child_may_not_start_or_reach_children(tmp_path: Path) -> None:
    """While a child's Activation is being disposed, starts and follow-ups on its behalf fail `ACTIVATION_CLOSING`."""
    client = scripted({"middle": [{"text": "MIDDLE"}]})
    codes: list[str] = []
    async with ops_runtime(tmp_path, client) as rt:
        parent = await rt.create_agent()
        middle_id = await start_child(rt, parent, "middle")
        middle = rt.agents.get(middle_id)
        assert middle is not None

        async def during_teardown(session: Any) -> None:
            # The flush of the disposal runs after the Activation stopped being resident.
            activation = rt.subagents.activation(middle_id)
            if session.id != middle_id or activation is None or activation.resident:
                return
            for attempt in (
                start_child(rt, middle, "too late"),
                rt.subagents.followup(middle, "any-child", "late", source=RelaySource(middle.id)),
            ):
                try:
                    await attempt
                except SubagentError as error:
                    codes.append(error.code)

        rt.sessions.on_flush(during_teardown)
        await settle(rt)
        assert rt.subagents.activation(middle_id) is None
        assert [session.id for session in rt.sessions.list()] == [parent.id]
    assert codes == ["ACTIVATION_CLOSING", "ACTIVATION_CLOSING"]
