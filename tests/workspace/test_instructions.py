"""Instructions: the default system prompt, per-agent instructions, AGENTS.md, and what the log records.

What the model is given is recorded in `request/header` (the harness's vocabulary), and a resumed
session goes on with the recorded system prompt even when the configuration changed meanwhile.
The date and time reach the model once per turn as a context message, never inside the prompt.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from dsh.agent.ids import SequentialIds
from dsh.agent.instructions import default_system_prompt
from dsh.config import Config
from dsh.runtime import Runtime
from dsh.testing.event_shapes import assert_harness_shapes
from dsh.testing.stored_logs import StepClock
from tests.subagent.ops_helpers import RecordingModel
from tests.workspace.helpers import GUARD_S, scripted


async def _runtime_run(
    home: Path,
    workspace: Path | None,
    steps: list[dict[str, Any]],
    prompt: str,
    session_id: str | None = None,
    **kwargs: Any,
) -> tuple[RecordingModel, list[Any], str]:
    model = RecordingModel(scripted(steps))
    config = Config(home=home, **kwargs.pop("config", {}))
    async with Runtime.open(config, model=model, ids=SequentialIds(), clock=StepClock(), workspace=workspace) as rt:
        if session_id is None:
            agent = await rt.create_agent(instructions=kwargs.pop("instructions", None))
        else:
            agent = await rt.resume_agent(session_id, **kwargs)
        await asyncio.wait_for(agent.turn_result(await agent.send(prompt)), GUARD_S)
        events = list(agent.session.events)
    return model, events, agent.id


def _headers(events: list[Any]) -> list[dict[str, Any]]:
    return [json.loads(json.dumps(event.data)) for event in events if event.type == "request/header"]


async def test_the_default_prompt_describes_the_harness_workspace_tools_and_subagents(tmp_path: Path) -> None:
    """With a workspace, the default prompt names the root, the tools' use and subagents; the header records it."""
    workspace = tmp_path / "work"
    workspace.mkdir()
    model, events, _ = await _runtime_run(tmp_path / "home", workspace, [{"text": "ok"}], "hi")
    system = model.requests[0].system
    assert system is not None
    assert system.startswith("You are an agent in pydsh")
    assert f"Workspace: {workspace.resolve()}" in system
    for phrase in ("read: ", "bash: ", "[exit code: N]", "agent tool", "approval"):
        assert phrase in system
    (header,) = _headers(events)
    assert header["reason"] == "initial"
    assert header["header"]["system"] == system
    assert header["header"]["config"] == {"provider": "scripted", "model": "scripted-test"}
    assert [tool["name"] for tool in header["header"]["tools"]] == [tool["name"] for tool in model.requests[0].tools]


def test_the_default_prompt_only_mentions_the_tools_an_agent_has() -> None:
    """No workspace tools, no workspace paragraph and no tool guidance; no `agent` tool, no subagent paragraph."""
    bare = default_system_prompt([], workspace=None)
    assert "Workspace:" not in bare
    assert "Tools:" not in bare
    assert "Subagents" not in bare
    assert "Subagents" in default_system_prompt(["agent"], workspace=None)


async def test_instructions_and_agents_md_are_appended_in_order(tmp_path: Path) -> None:
    """The configured instructions, the agent's own, then AGENTS.md (under its heading) follow the base prompt."""
    workspace = tmp_path / "work"
    workspace.mkdir()
    (workspace / "AGENTS.md").write_text("Always run the tests with -q.\n", encoding="utf-8")
    model, _, _ = await _runtime_run(
        tmp_path / "home",
        workspace,
        [{"text": "ok"}],
        "hi",
        instructions="Answer in French.",
        config={"agent": {"instructions": "Be brief."}},
    )
    system = model.requests[0].system
    assert system is not None
    brief, french, agents = (system.index(text) for text in ("Be brief.", "Answer in French.", "Always run the tests"))
    assert brief < french < agents
    assert "Instructions from AGENTS.md in the workspace" in system


async def test_a_configured_system_prompt_replaces_the_default(tmp_path: Path) -> None:
    """`agent.system_prompt` is the whole base: the default prompt is not used."""
    model, _, _ = await _runtime_run(
        tmp_path / "home", None, [{"text": "ok"}], "hi", config={"agent": {"system_prompt": "You are a poet."}}
    )
    assert model.requests[0].system == "You are a poet."


async def test_a_resumed_session_keeps_the_instructions_it_was_given(tmp_path: Path) -> None:
    """After a restart with other instructions configured, a resumed session still gets its recorded prompt."""
    home = tmp_path / "home"
    first, _, session_id = await _runtime_run(
        home, None, [{"text": "one"}], "hi", config={"agent": {"instructions": "First rules."}}
    )
    second, events, _ = await _runtime_run(
        home, None, [{"text": "two"}], "again", session_id, config={"agent": {"instructions": "Second rules."}}
    )
    assert first.requests[0].system == second.requests[0].system
    assert "First rules." in (second.requests[0].system or "")
    assert [header["reason"] for header in _headers(events)] == ["initial", "resume"]
    third, events, _ = await _runtime_run(
        home, None, [{"text": "three"}], "once more", session_id, instructions="New rules."
    )
    assert "New rules." in (third.requests[0].system or "")
    assert _headers(events)[-1]["reason"] == "resume"


async def test_the_time_reaches_the_model_each_turn_but_not_the_prompt(tmp_path: Path) -> None:
    """Each turn adds one context message with the time in the configured zone; the recorded prompt has no time."""
    home = tmp_path / "home"
    config = {"agent": {"time_zone": "Asia/Tokyo"}}
    model = RecordingModel(scripted([{"text": "a"}, {"text": "b"}]))
    async with Runtime.open(Config(home=home, **config), model=model, ids=SequentialIds(), clock=StepClock()) as rt:
        first = await asyncio.wait_for(rt.run("one"), GUARD_S)
        await asyncio.wait_for(rt.run("two", first.session_id), GUARD_S)
        events = list(rt.sessions.get(first.session_id).events)  # type: ignore[union-attr]
    contexts = [
        event.data for event in events if event.type == "user/message" and event.data["source"]["kind"] == "plugin"
    ]  # type: ignore[index]
    assert len(contexts) == 2
    texts = [context["content"][0]["text"] for context in contexts]  # type: ignore[index]
    assert texts[0].startswith("Current date and time at the start of turn 1: ")
    assert texts[1].startswith("Current date and time at the start of turn 2: ")
    assert "+09:00 (Asia/Tokyo" in texts[0]
    assert contexts[0]["source"]["plugin"] == "pydsh/runtime-context"  # type: ignore[index]
    assert contexts[0]["source"]["form"] == "snapshot"  # type: ignore[index]
    system = model.requests[0].system or ""
    assert "Current date and time" not in system
    assert len(_headers(events)) == 1  # the second turn's header is the same: not written again
    last_request = model.requests[-1]
    assert any("turn 2" in str(message) for message in last_request.messages)


def test_dsh_run_records_the_instructions_file(tmp_path: Path) -> None:
    """`dsh run --instructions FILE` puts the file's text into the system prompt the log records."""
    rules = tmp_path / "rules.md"
    rules.write_text("Only answer with one word.\n", encoding="utf-8")
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"version": 1, "model": "m", "agents": {"main": {"steps": [{"text": "Fine"}]}}}))
    home = tmp_path / "home"
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    argv = [sys.executable, "-m", "dsh", "--home", str(home), "run", "hi", "--script", str(script)]
    argv += ["--instructions", str(rules), "--workspace", str(tmp_path)]
    completed = subprocess.run(
        argv, capture_output=True, text=True, env=env, timeout=GUARD_S, check=False, stdin=subprocess.DEVNULL
    )
    assert completed.returncode == 0, completed.stderr
    events = asyncio.run(_stored(home))
    (header,) = _headers(events)
    assert "Only answer with one word." in header["header"]["system"]
    assert_harness_shapes(events)


async def _stored(home: Path) -> list[Any]:
    async with Runtime.open(Config(home=home), read_only=True) as rt:
        (record,) = await rt.query.list_sessions()
        return list((await rt.query.observe_session(record.id)).events)
