"""Follow-ups on the real loop: FIFO delivery to a resident child, cold resume, authorization, `NOT_RESUMABLE`.

Layer: subagent. A resident child gets a follow-up as its next turn on the same agent; a settled
child is resumed cold with exactly one `prepare` and no second descriptor; what may not be resumed
fails with `UNAUTHORIZED` or `NOT_RESUMABLE` and the texts the tools show.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from dsh.abort import AbortController
from dsh.agent.messages import RelaySource
from dsh.runtime import Runtime
from dsh.subagent.errors import SubagentDescriptorError, SubagentError
from dsh.subagent.providers import SubagentRequest
from dsh.testing.jsonl_writer import JsonlLogWriter
from tests.subagent.helpers import desc, descriptor, end_seed, stored_header, turn_end, turn_start, user_message
from tests.subagent.ops_helpers import (
    LifecycleLog,
    ReadCounter,
    RecordingModel,
    descriptor_events,
    ops_runtime,
    scripted,
    settle,
    start_child,
    stored_events,
    turn_numbers,
    user_prompts,
    user_sources,
)


async def _author(
    rt: Runtime, child_id: str, parent_id: str, events: Sequence[Mapping[str, Any]], cut: int = 0
) -> None:
    """Write a child log under `parent_id` straight into the runtime's JSONL root."""
    header = stored_header(child_id, parentSession=parent_id, **({"seedLength": cut} if cut else {}))
    await JsonlLogWriter(rt.config.sessions_dir).write(child_id, header, list(events))


def _continuable_log(*payloads: object) -> list[dict[str, Any]]:
    """Descriptors staged first (continuable placement), then the end-seed marker and one settled turn."""
    records = [descriptor(seq, payload) for seq, payload in enumerate(payloads)]
    n = len(records)
    return [*records, end_seed(n), turn_start(n + 1, 1), user_message(n + 2), turn_end(n + 3, 1)]


async def test_followups_to_a_running_child_queue_as_separate_turns(tmp_path: Path) -> None:
    """Two follow-ups to a running child reuse its agent and run as FIFO turns: [task, first, second]."""
    client = scripted({"worker": [{"hold": "task-gate", "text": "T"}, {"text": "F1"}, {"text": "F2"}]})
    async with ops_runtime(tmp_path, client) as rt:
        parent = await rt.create_agent()
        child_id = await start_child(rt, parent, "worker", prompt="task")
        agent = rt.agents.get(child_id)
        for text in ("first", "second"):
            await rt.subagents.followup(parent, child_id, text, source=RelaySource(parent.id))
            assert rt.agents.get(child_id) is agent
        client.release("task-gate")
        await settle(rt)
        events = await stored_events(rt, child_id)
    assert user_prompts(events) == ["task", "first", "second"]
    assert turn_numbers(events) == [1, 2, 3]
    sources = user_sources(events)
    assert sources[1:] == [{"kind": "coordinator", "form": "relay", "senderSessionId": parent.id}] * 2


async def test_a_settled_child_is_resumed_cold_with_one_prepare(tmp_path: Path) -> None:
    """A follow-up to a settled child makes a new Activation from one `prepare` (no `inspect`); one descriptor stays."""
    client = scripted({"helper": [{"text": "FIRST"}, {"text": "SECOND"}]})
    async with ops_runtime(tmp_path, client) as rt:
        parent = await rt.create_agent()
        log = LifecycleLog(rt)
        child_id = await start_child(rt, parent, "helper")
        first = rt.subagents.activation(child_id)
        await settle(rt)
        assert rt.subagents.activation(child_id) is None
        counter = ReadCounter(rt.persistence)
        await rt.subagents.followup(parent, child_id, "again", source=RelaySource(parent.id))
        second = rt.subagents.activation(child_id)
        assert second is not None
        assert second is not first
        assert (counter.count("prepare", child_id), counter.count("inspect", child_id)) == (1, 0)
        assert counter.reads(child_id) == 1
        await settle(rt)
        counter.restore()
        events = await stored_events(rt, child_id)
    assert len(descriptor_events(events)) == 1
    assert turn_numbers(events) == [1, 2]
    assert user_prompts(events) == ["task: helper", "again"]
    starts, ends = log.of("subagent/start"), log.of("subagent/end")
    assert len(starts) == len(ends) == 2
    assert [start["runId"] for start in starts] == [end["runId"] for end in ends]
    assert starts[0]["runId"] != starts[1]["runId"]


async def test_resume_does_not_need_the_provider_that_made_the_child(tmp_path: Path) -> None:
    """After the child's provider is unregistered a cold resume still works, and both runs name that provider."""
    client = scripted({"kept": [{"text": "ONE"}, {"text": "TWO"}]})
    async with ops_runtime(tmp_path, client) as rt:
        spawn = rt.subagents.get_provider("spawn")
        assert spawn is not None

        class Custom:
            name = "custom"
            capabilities = spawn.capabilities
            inherits_parent_context = False

            async def start(self, request: SubagentRequest) -> Any:
                return await spawn.start(request)

            async def prepare_continuable(self, request: SubagentRequest) -> Any:
                return await spawn.prepare_continuable(request)

        dispose = rt.subagents.register_provider(Custom())
        parent = await rt.create_agent()
        log = LifecycleLog(rt)
        child_id = await start_child(rt, parent, "kept", provider="custom")
        await settle(rt)
        dispose()
        assert "custom" not in rt.subagents.providers()
        await rt.subagents.followup(parent, child_id, "more", source=RelaySource(parent.id))
        await settle(rt)
    assert [event["provider"] for event in log.of("subagent/start")] == ["custom", "custom"]
    assert [event["provider"] for event in log.of("subagent/end")] == ["custom", "custom"]


async def test_delivery_is_refused_to_strangers_one_shots_and_unknown_ids(tmp_path: Path) -> None:
    """A stranger gets `UNAUTHORIZED`; a finished one-shot and an unknown id get `NOT_RESUMABLE` with their texts."""
    client = scripted({"owned": [{"text": "OWNED"}], "one-shot": [{"text": "ONCE"}]})
    async with ops_runtime(tmp_path, client) as rt:
        parent = await rt.create_agent()
        stranger = await rt.create_agent()
        child_id = await start_child(rt, parent, "owned")
        run = await rt.subagents.start("spawn", SubagentRequest(parent=parent, prompt="once"))
        await run.result
        await settle(rt)
        with pytest.raises(SubagentError, match="belongs to another parent session") as stranger_error:
            await rt.subagents.followup(stranger, child_id, "hi", source=RelaySource(stranger.id))
        assert stranger_error.value.code == "UNAUTHORIZED"
        with pytest.raises(SubagentError, match="no supported continuation state") as one_shot:
            await rt.subagents.followup(parent, run.id, "hi", source=RelaySource(parent.id))
        assert one_shot.value.code == "NOT_RESUMABLE"
        assert str(one_shot.value) == (
            f'subagent "{run.id}" has no supported continuation state and cannot be resumed; '
            "do not retry send_message with this id"
        )
        with pytest.raises(SubagentError, match='subagent "nobody" is unavailable') as unknown:
            await rt.subagents.followup(parent, "nobody", "hi", source=RelaySource(parent.id))
        assert unknown.value.code == "NOT_RESUMABLE"
        assert unknown.value.__cause__ is not None
        assert rt.subagents.activation(child_id) is None


async def test_only_the_exact_live_parent_may_deliver(tmp_path: Path) -> None:
    """A parent object that is not the registry's live entry is refused, resident child or cold."""
    client = scripted({"guarded": [{"hold": "guard-gate", "text": "G"}]})
    async with ops_runtime(tmp_path, client) as rt:
        parent = await rt.create_agent()
        child_id = await start_child(rt, parent, "guarded")
        rt.agents.unregister(parent)
        try:
            with pytest.raises(SubagentError, match="exact live parent agent") as caught:
                await rt.subagents.followup(parent, child_id, "hi", source=RelaySource(parent.id))
            assert caught.value.code == "UNAUTHORIZED"
        finally:
            rt.agents.register(parent)
        client.release("guard-gate")
        await settle(rt)


async def test_resume_ignores_an_ancestor_descriptor_in_the_seed(tmp_path: Path) -> None:
    """A seeded child whose own suffix has no descriptor is not resumable, whatever its inherited seed holds."""
    async with ops_runtime(tmp_path, scripted({})) as rt:
        parent = await rt.create_agent()
        prefix = [turn_start(0, 1), user_message(1), descriptor(2, desc("ancestor")), turn_end(3, 1)]
        own = [end_seed(4), turn_start(5, 2), user_message(6), turn_end(7, 2)]
        await _author(rt, "seeded", parent.id, [*prefix, *own], cut=4)
        with pytest.raises(SubagentError, match="no supported continuation state") as caught:
            await rt.subagents.followup(parent, "seeded", "hi", source=RelaySource(parent.id))
        assert caught.value.code == "NOT_RESUMABLE"
        assert rt.sessions.get("seeded") is None


async def test_resume_composes_from_the_first_own_descriptor(tmp_path: Path) -> None:
    """With own descriptors `first` then `second`, resume composes from `first` while the listing shows `second`."""
    model = RecordingModel(scripted({"first": [{"text": "FROM FIRST"}]}))
    async with ops_runtime(tmp_path, model) as rt:
        parent = await rt.create_agent()
        first = {**desc("first"), "persona": "First persona."}
        second = {**desc("second"), "persona": "Second persona."}
        await _author(rt, "twice", parent.id, _continuable_log(first, second))
        (row,) = await rt.subagents.list_children(parent.id)
        assert row.label == "second"  # type: ignore[union-attr]
        await rt.subagents.followup(parent, "twice", "go", source=RelaySource(parent.id))
        await settle(rt)
        events = await stored_events(rt, "twice")
    (request,) = model.for_key("first")
    assert request.system is not None
    assert request.system.endswith("First persona.")
    assert len(descriptor_events(events)) == 2  # resume appended none


async def test_a_malformed_own_descriptor_is_not_resumable(tmp_path: Path) -> None:
    """A malformed first own descriptor gives `NOT_RESUMABLE` with the descriptor error as its cause."""
    async with ops_runtime(tmp_path, scripted({})) as rt:
        parent = await rt.create_agent()
        await _author(rt, "broken", parent.id, _continuable_log({"version": 2, "mode": "continuable", "provider": 7}))
        with pytest.raises(SubagentError, match="no supported continuation state") as caught:
            await rt.subagents.followup(parent, "broken", "hi", source=RelaySource(parent.id))
        assert caught.value.code == "NOT_RESUMABLE"
        assert isinstance(caught.value.__cause__, SubagentDescriptorError)


async def test_cancellation_during_prepare_raises_the_signal_reason(tmp_path: Path) -> None:
    """An abort while the cold resume prepares raises the signal's own reason, not a subagent code."""
    async with ops_runtime(tmp_path, scripted({})) as rt:
        parent = await rt.create_agent()
        await _author(rt, "cold", parent.id, _continuable_log(desc("cold")))
        controller = AbortController()
        reason = RuntimeError("the caller gave up")
        prepare = rt.persistence.prepare

        async def aborting_prepare(session_id: str, *, signal: Any = None) -> Any:
            controller.abort(reason)
            return await prepare(session_id, signal=signal)

        rt.persistence.prepare = aborting_prepare  # type: ignore[method-assign]
        try:
            with pytest.raises(RuntimeError) as caught:
                await rt.subagents.followup(
                    parent, "cold", "hi", source=RelaySource(parent.id), signal=controller.signal
                )
        finally:
            del rt.persistence.prepare
        assert caught.value is reason
        assert rt.sessions.get("cold") is None


async def test_a_subagent_error_from_agent_start_is_reraised_unchanged(tmp_path: Path) -> None:
    """When starting the resumed agent raises a `SubagentError`, that same object reaches the caller."""
    client = scripted({"cold": [{"text": "BACK"}]})
    async with ops_runtime(tmp_path, client) as rt:
        parent = await rt.create_agent()
        await _author(rt, "cold", parent.id, _continuable_log(desc("cold")))
        refusal = SubagentError("the host refused the agent", "UNAUTHORIZED")

        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise refusal

        rt.start_agent = refuse  # type: ignore[method-assign]
        try:
            with pytest.raises(SubagentError) as caught:
                await rt.subagents.followup(parent, "cold", "hi", source=RelaySource(parent.id))
        finally:
            del rt.start_agent
        assert caught.value is refusal
        assert rt.sessions.get("cold") is None
        await rt.subagents.followup(parent, "cold", "hi", source=RelaySource(parent.id))
        await settle(rt)
        assert user_prompts(await stored_events(rt, "cold"))[-1] == "hi"


async def test_a_fresh_runtime_resumes_with_the_recorded_persona_and_model(tmp_path: Path) -> None:
    """In a fresh runtime the resumed child runs on its model client with the persona; `agentModel` names the model."""
    async with ops_runtime(tmp_path, scripted({})) as rt:
        await _author(rt, "persona", "p-route", _continuable_log({**desc("persona"), "persona": "Be terse."}))
        await _author(rt, "modelled", "p-route", _continuable_log({**desc("modelled"), "agentModel": "m"}))
    model = RecordingModel(scripted({"persona": [{"text": "P"}], "modelled": [{"text": "M"}]}))
    async with ops_runtime(tmp_path, model) as rt:
        parent = await rt.create_agent("p-route")
        await rt.subagents.followup(parent, "persona", "hi", source=RelaySource(parent.id))
        await rt.subagents.followup(parent, "modelled", "hi", source=RelaySource(parent.id))
        await settle(rt)
    (persona,) = model.for_key("persona")
    assert persona.system is not None
    assert persona.system.endswith("Be terse.")
    assert persona.model == "scripted-test"
    (modelled,) = model.for_key("modelled")
    assert modelled.model == "m"
