"""Helpers of the agent-loop tests: test tools, a runtime on a temporary home, and log readers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from dsh.agent.ids import SequentialIds
from dsh.agent.model import ModelClient
from dsh.agent.models import ScriptedModelClient
from dsh.agent.tools import Tool, ToolContext
from dsh.config import Config
from dsh.runtime import Runtime
from dsh.session.events import SessionEvent
from dsh.testing.stored_logs import StepClock

__all__ = [
    "BlockingTool",
    "EchoTool",
    "HANG_GUARD_S",
    "RaisingTool",
    "FIRST_STEP_PROLOGUE",
    "TOOL_STEP_THEN_ANSWER",
    "prompt_texts",
    "events_of",
    "open_runtime",
    "script",
    "turn_events",
    "types_of",
]

HANG_GUARD_S = 30.0

FIRST_STEP_PROLOGUE = [
    "turn/start",
    "permission/preset",
    "sandbox/mode",
    "approval/policy",
    "step/start",
    "user/message",
    "session/title",
    "user/message",
    "request/header",
    "request/context",
]
"""The event types a session's first turn opens with: the permissions in force, the prompt, the session's
fallback title, the per-turn context message, the request header and the request context."""

TOOL_STEP_THEN_ANSWER = [
    *FIRST_STEP_PROLOGUE,
    "assistant/message",
    "tool/call",
    "tool/result",
    "step/end",
    "step/start",
    "assistant/message",
    "step/end",
    "turn/end",
]
"""The event types of a turn whose first step calls one tool and whose second step answers."""
"""How long a test waits for an event before failing: a guard against hangs, never a timing assertion."""


class _EchoArgs(BaseModel):
    model_config = ConfigDict(extra="ignore")
    text: str


class EchoTool:
    """Returns its `text` argument; counts its calls."""

    name = "echo"
    description = "Echo the text back."
    parameters: Mapping[str, Any] = {
        "type": "object",
        "properties": {"text": {"type": "string", "description": "What to echo."}},
        "required": ["text"],
    }
    args_model = _EchoArgs
    output_schema: Mapping[str, Any] | None = {"type": "object"}

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.flushes_seen: list[int] = []

    async def execute(self, args: Any, ctx: ToolContext) -> object:
        """Record and return the text."""
        self.calls.append(args.text)
        return {"echo": args.text}

    def render(self, args: Any, output: object) -> list[dict[str, Any]]:
        """The echoed text as one block."""
        assert isinstance(output, Mapping)
        return [{"type": "text", "text": f"echo: {output['echo']}"}]


class _NoArgs(BaseModel):
    model_config = ConfigDict(extra="ignore")


class BlockingTool:
    """Blocks until released (or, unless `ignore_signal`, until its call's signal aborts)."""

    description = "Wait."
    parameters: Mapping[str, Any] = {"type": "object", "properties": {}}
    args_model = _NoArgs
    output_schema: Mapping[str, Any] | None = None

    def __init__(self, name: str = "wait", *, ignore_signal: bool = False) -> None:
        self.name = name
        self.ignore_signal = ignore_signal
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.finished = asyncio.Event()
        self.task_cancelled = False

    async def execute(self, args: Any, ctx: ToolContext) -> object:
        """Wait for the release, the signal (unless ignored) or a task cancellation."""
        self.started.set()
        try:
            if self.ignore_signal:
                await self.release.wait()
            else:
                waiters = {asyncio.ensure_future(self.release.wait()), asyncio.ensure_future(ctx.signal.wait())}
                try:
                    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for waiter in waiters:
                        waiter.cancel()
        except asyncio.CancelledError:
            self.task_cancelled = True
            raise
        finally:
            self.finished.set()
        return "released"

    def render(self, args: Any, output: object) -> list[dict[str, Any]]:
        """The output as text."""
        return [{"type": "text", "text": str(output)}]


class RaisingTool:
    """Raises the exception it was given."""

    description = "Fail."
    parameters: Mapping[str, Any] = {"type": "object", "properties": {}}
    args_model = _NoArgs
    output_schema: Mapping[str, Any] | None = None

    def __init__(self, error: BaseException, name: str = "fail") -> None:
        self.name = name
        self.error = error

    async def execute(self, args: Any, ctx: ToolContext) -> object:
        """Raise."""
        raise self.error

    def render(self, args: Any, output: object) -> list[dict[str, Any]]:
        """Never reached."""
        return []


def script(main: Sequence[Mapping[str, Any]], **tracks: Sequence[Mapping[str, Any]]) -> ScriptedModelClient:
    """A scripted client whose `main` track answers with `main`; other tracks by keyword."""
    agents: dict[str, Any] = {"main": {"steps": list(main)}}
    agents.update({key: {"steps": list(steps)} for key, steps in tracks.items()})
    return ScriptedModelClient.from_dict({"version": 1, "model": "scripted-test", "agents": agents})


@contextlib.asynccontextmanager
async def open_runtime(
    home: Path,
    model: ModelClient,
    *,
    tools: Sequence[Tool] = (),
    database_url: str | None = None,
    use_cache: bool = True,
    **agent: Any,
) -> AsyncIterator[Runtime]:
    """A runtime on `home` with deterministic ids and clock; `agent` overrides `config.agent` fields."""
    values: dict[str, Any] = {"home": home}
    if database_url is not None:
        values["database_url"] = database_url
    if agent:
        values["agent"] = {"cancel_grace_s": 5.0, **agent}
    config = Config(**values)
    async with Runtime.open(
        config, model=model, ids=SequentialIds(), clock=StepClock(), tools=tools, use_cache=use_cache
    ) as rt:
        yield rt


def events_of(session_events: Sequence[SessionEvent]) -> list[SessionEvent]:
    """The events as a list."""
    return list(session_events)


def types_of(events: Sequence[SessionEvent]) -> list[str]:
    """The event types, in order."""
    return [event.type for event in events]


def turn_events(events: Sequence[SessionEvent], turn: int) -> list[SessionEvent]:
    """The events from `turn/start {turn}` through its `turn/end`."""
    out: list[SessionEvent] = []
    inside = False
    for event in events:
        data = event.data
        if event.type == "turn/start" and isinstance(data, Mapping) and data.get("turn") == turn:
            inside = True
        if inside:
            out.append(event)
        if inside and event.type == "turn/end":
            break
    return out


def prompt_texts(events: Sequence[SessionEvent]) -> list[str]:
    """The text of every `user/message` but the per-turn context messages, in order."""
    return [
        event.data["content"][0]["text"]  # type: ignore[index]
        for event in events
        if event.type == "user/message" and event.data["source"]["kind"] != "plugin"  # type: ignore[index]
    ]
