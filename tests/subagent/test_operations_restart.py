"""Continuable children survive the process: cold resume after a clean restart and after a SIGKILL.

Layer: subagent. After the runtime closes (or its process is killed mid-turn), a child keeps its
identity on disk; listing it changes nothing, and a follow-up from its parent resumes it from one
`prepare` (which also commits the crash repair), under the same id, with its turn numbering
continued and its single descriptor.
"""

from __future__ import annotations

import asyncio
import hashlib
import signal
import sys
from pathlib import Path

import pytest

from dsh.agent.ids import RandomIds, SequentialIds
from dsh.agent.messages import RelaySource
from dsh.subagent.errors import SubagentError
from dsh.subagent.listing import ListingReport
from dsh.subagent.providers import SubagentRequest
from dsh.subagent.rows import SubagentChildRow
from dsh.testing.stored_logs import StepClock
from tests.subagent.ops_helpers import (
    HANG_GUARD_S,
    LifecycleLog,
    ReadCounter,
    data,
    descriptor_events,
    log_file,
    ops_runtime,
    scripted,
    settle,
    start_child,
    stored_events,
    turn_ends,
    turn_numbers,
    user_prompts,
)

CHILD = Path(__file__).with_name("crash_subagent_child.py")


async def test_after_a_restart_a_followup_resumes_the_child_from_one_prepare(tmp_path: Path) -> None:
    """Reopened on the same home, a follow-up resumes the child: same id, next turn number, one prepare, no inspect."""
    ids, clock = SequentialIds(), StepClock()
    first = scripted(
        {"main": [{"text": "PARENT_READY"}], "helper": [{"text": "FIRST"}], "one-shot": [{"text": "ONCE"}]}
    )
    async with ops_runtime(tmp_path, first, ids=ids, clock=clock) as rt:
        hello = await rt.run("hello")
        parent = rt.agents.get(hello.session_id)
        assert parent is not None
        child_id = await start_child(rt, parent, "helper")
        run = await rt.subagents.start("spawn", SubagentRequest(parent=parent, prompt="once"))
        await asyncio.wait_for(run.result, HANG_GUARD_S)
        await settle(rt)
    second = scripted({"helper": [{"text": "SECOND"}]})
    async with ops_runtime(tmp_path, second, ids=ids, clock=clock) as rt:
        parent = await rt.resume_agent(hello.session_id)
        counter = ReadCounter(rt.persistence)
        log = LifecycleLog(rt)
        await rt.subagents.followup(parent, child_id, "second task", source=RelaySource(parent.id))
        activation = rt.subagents.activation(child_id)
        assert activation is not None
        assert activation.agent.id == child_id
        assert (counter.count("prepare", child_id), counter.count("inspect", child_id)) == (1, 0)
        assert counter.reads(child_id) == 1
        with pytest.raises(SubagentError, match="no supported continuation state") as one_shot:
            await rt.subagents.followup(parent, run.id, "again", source=RelaySource(parent.id))
        assert one_shot.value.code == "NOT_RESUMABLE"
        await settle(rt)
        counter.restore()
        events = await stored_events(rt, child_id)
        second.assert_consumed()
    (descriptor,) = descriptor_events(events)
    assert descriptor.seq == 0
    assert turn_numbers(events) == [1, 2]
    assert user_prompts(events) == ["task: helper", "second task"]
    assert [event["childSessionId"] for event in log.of("subagent/end")] == [child_id]


async def _run_until_ready(home: Path) -> tuple[str, str]:
    """Start the child process, wait for its READY line, SIGKILL it; returns (parent id, child id)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(CHILD),
        str(home),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    assert process.stderr is not None
    try:
        line = await asyncio.wait_for(process.stdout.readline(), HANG_GUARD_S)
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGKILL)
        stderr = await asyncio.wait_for(process.stderr.read(), HANG_GUARD_S)
        await asyncio.wait_for(process.wait(), HANG_GUARD_S)
    assert line.startswith(b"READY "), stderr.decode()[-3000:]
    assert process.returncode == -signal.SIGKILL
    _, parent_id, child_id = line.decode().split()
    return parent_id, child_id


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
async def test_a_child_killed_mid_turn_lists_unchanged_and_resumes_repaired(tmp_path: Path) -> None:
    """Killed mid-turn, the child lists with its identity and no byte changes; a follow-up repairs and resumes it."""
    parent_id, child_id = await _run_until_ready(tmp_path)
    path = log_file(tmp_path, child_id)
    before = _digest(path)
    client = scripted({"crash helper": [{"text": "RECOVERED"}]})
    # Fresh random ids: nothing this process mints may repeat an id the killed process wrote.
    # Without the projection cache the listing must read the crashed log itself (one observation).
    clock = StepClock(start=2_000_000_000_000)
    async with ops_runtime(tmp_path, client, ids=RandomIds(), clock=clock, use_cache=False) as rt:
        reports: list[ListingReport] = []
        rows = await rt.subagents.list_children(parent_id, report=reports.append)
        assert rows == [SubagentChildRow(child_id, "continuable", "inactive", False, label="crash helper")]  # type: ignore[arg-type]
        assert (reports[0].rungs, reports[0].observations) == ({child_id: 3}, 1)
        assert _digest(path) == before
        parent = await rt.resume_agent(parent_id)
        counter = ReadCounter(rt.persistence)
        await rt.subagents.followup(parent, child_id, "please continue", source=RelaySource(parent.id))
        assert (counter.count("prepare", child_id), counter.count("inspect", child_id)) == (1, 0)
        counter.restore()
        await settle(rt)
        assert rt.sessions.get(child_id) is None  # settled again: the read below is a stored one
        observation = await rt.persistence.inspect(child_id)
        client.assert_consumed()
    events = list(observation.events)
    assert observation.synthetic_tail == 0  # the closers were stored by the resume, not added by this read
    assert len(descriptor_events(events)) == 1
    assert user_prompts(events) == ["a long task", "please continue"]
    assert turn_numbers(events) == [1, 2]
    assert [reason["kind"] for reason in turn_ends(events)] == ["interrupted", "completed"]
    interrupted = next(index for index, event in enumerate(events) if event.type == "turn/end")
    assert events[interrupted - 1].type == "step/end"  # the open step was closed too
    (answer,) = [data(event) for event in events if event.type == "assistant/message"]
    assert answer["message"]["content"] == [{"type": "text", "text": "RECOVERED"}]
