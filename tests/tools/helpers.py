"""Helpers of the model-facing tool tests: stub services, a direct tool call, goldens, log readers.

A direct call (`call_tool`) runs one tool the way the agent loop dispatches it — validate with the
argument model, run the body, render, and turn a raised exception into an errored result
`Error: <message>` that keeps the error's `code` — for the cases the loop cannot reach (no calling
agent) and for stubbed catalogs. Everything that needs a real child runs through a real `Runtime`
and the scripted model instead (`tests.agent.helpers.open_runtime`).
"""

from __future__ import annotations

import asyncio
import difflib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsh.abort import AbortController, AbortSignal
from dsh.agent.model import ModelRequest
from dsh.agent.models import ScriptedModelClient
from dsh.agent.registry import AgentRegistry, AgentStatus, StatusListener
from dsh.agent.tools import Tool, ToolContext
from dsh.services import Services
from dsh.session.events import SessionEvent
from dsh.session.header import SessionHeader, SessionId
from dsh.subagent.rows import SubagentDescendantEntry, SubagentListEntry

__all__ = [
    "GOLDEN",
    "Caller",
    "Outcome",
    "PhasedModel",
    "StubAgent",
    "StubSubagents",
    "assert_golden",
    "call_tool",
    "registry_of",
    "result_texts",
    "result_text_of",
    "schema_accepts",
    "scripted",
    "stored",
    "tool_results",
]

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
"""`tests/golden/`: files rewritten by `DSH_SNAPSHOT=refresh` and compared byte for byte otherwise."""


@dataclass(frozen=True, slots=True)
class Caller:
    """A calling agent that is only an id (enough for the tools that act on its behalf)."""

    id: str
    session: Any = None


@dataclass(slots=True)
class StubAgent:
    """A live agent as the registry sees it: an id and a fixed status."""

    id: str
    status: AgentStatus = "idle"

    def on_status(self, listener: StatusListener) -> Callable[[], None]:
        """Statuses never change here; nothing to subscribe to."""
        return lambda: None


def registry_of(*agents: StubAgent) -> AgentRegistry[Any]:
    """A real agent registry holding the given stub agents."""
    registry: AgentRegistry[Any] = AgentRegistry()
    for agent in agents:
        registry.register(agent)
    return registry


@dataclass(slots=True)
class StubSubagents:
    """A subagent service whose catalog returns the given rows and records each call's id and signal."""

    children: Sequence[SubagentListEntry] = ()
    descendants: Sequence[SubagentDescendantEntry] = ()
    calls: list[tuple[str, str, AbortSignal | None]] = field(default_factory=list)

    async def list_children(self, parent_session_id: str, *, signal: AbortSignal | None = None) -> list[Any]:
        """The stubbed children."""
        self.calls.append(("children", parent_session_id, signal))
        return list(self.children)

    async def list_descendants(self, root_session_id: str, *, signal: AbortSignal | None = None) -> list[Any]:
        """The stubbed descendants."""
        self.calls.append(("descendants", root_session_id, signal))
        return list(self.descendants)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a direct tool call produced: the text the model would see, the output and any error code."""

    is_error: bool
    text: str
    output: object = None
    code: str | None = None


async def call_tool(
    tool: Tool,
    arguments: object,
    *,
    agent: Any,
    services: Services,
    signal: AbortSignal | None = None,
) -> Outcome:
    """Validate `arguments`, run the body and render, as the loop does; a raise becomes `Error: <message>`."""
    args = tool.args_model.model_validate(arguments)
    ctx = ToolContext(agent=agent, call_id="call_1", signal=signal or AbortController().signal, services=services)
    try:
        output = await tool.execute(args, ctx)
    except asyncio.CancelledError:
        raise
    except Exception as error:
        message = getattr(error, "message", None)
        shown = message if isinstance(message, str) and message else str(error)
        code = getattr(error, "code", None)
        return Outcome(True, f"Error: {shown}", code=code if isinstance(code, str) else None)
    blocks = tool.render(args, output)
    return Outcome(False, "".join(block["text"] for block in blocks), output)


def assert_golden(path: Path, actual: str) -> None:
    """Compare `actual` with the golden file byte for byte; `DSH_SNAPSHOT=refresh` rewrites it instead."""
    if os.environ.get("DSH_SNAPSHOT") == "refresh":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(actual.encode("utf-8"))
        return
    assert path.is_file(), f"golden file {path} is missing; run the tests with DSH_SNAPSHOT=refresh to write it"
    expected = path.read_bytes().decode("utf-8")
    if expected != actual:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                actual.splitlines(keepends=True),
                fromfile=f"{path.name} (golden)",
                tofile=f"{path.name} (actual)",
            )
        )
        raise AssertionError(f"{path} differs (DSH_SNAPSHOT=refresh rewrites it):\n{diff}")


_TYPES: dict[str, Callable[[object], bool]] = {
    "object": lambda value: isinstance(value, dict),
    "string": lambda value: isinstance(value, str),
    "boolean": lambda value: isinstance(value, bool),
    "integer": lambda value: isinstance(value, int) and not isinstance(value, bool),
    "array": lambda value: isinstance(value, list),
}
_KNOWN_KEYWORDS = frozenset({"type", "description", "enum", "properties", "required"})


def schema_accepts(schema: Mapping[str, Any], value: object) -> bool:
    """Whether `value` satisfies `schema`, for the JSON Schema subset tool parameters use.

    An unknown keyword fails the check outright, so a parameters schema that grows a new keyword
    also has to grow this checker (and its table of inputs) instead of being half-checked.
    """
    unknown = set(schema) - _KNOWN_KEYWORDS
    assert not unknown, f"schema keyword(s) {sorted(unknown)} are not understood by this checker"
    kind = schema.get("type")
    if kind is not None and not _TYPES[kind](value):
        return False
    if "enum" in schema and value not in schema["enum"]:
        return False
    if isinstance(value, dict):
        if any(name not in value for name in schema.get("required", ())):
            return False
        for name, sub in schema.get("properties", {}).items():
            if name in value and not schema_accepts(sub, value[name]):
                return False
    return True


def tool_results(events: Sequence[SessionEvent]) -> list[Mapping[str, Any]]:
    """The `data` of every `tool/result` event, in order."""
    out = []
    for event in events:
        if event.type == "tool/result":
            assert isinstance(event.data, Mapping)
            out.append(event.data)
    return out


def result_texts(events: Sequence[SessionEvent]) -> list[str]:
    """The text the model saw for each tool result, in order."""
    return [result_text_of(data) for data in tool_results(events)]


def scripted(agents: Mapping[str, Mapping[str, Any]]) -> ScriptedModelClient:
    """A scripted model from a map of agent key to track (`{"steps": [...], "on": [...]}`)."""
    return ScriptedModelClient.from_dict({"version": 1, "model": "scripted-test", "agents": dict(agents)})


class PhasedModel:
    """A model client that answers from its current script; a test moves to the next script between phases.

    A later phase can then name ids an earlier phase created (a one-shot child's id, another
    parent's child), which a script written up front cannot know. Streams already running stay
    with the script that started them.
    """

    provider = "scripted"

    def __init__(self, first: ScriptedModelClient) -> None:
        self.current = first
        self.phases = [first]

    @property
    def model(self) -> str:
        """The current script's model name."""
        return self.current.model

    def next_phase(self, script: ScriptedModelClient) -> None:
        """Answer every later request from `script`."""
        self.current = script
        self.phases.append(script)

    def stream(self, request: ModelRequest, *, signal: AbortSignal) -> Any:
        """Stream from the current script."""
        stream: Any = self.current.stream(request, signal=signal)
        return stream

    async def aclose(self) -> None:
        """Nothing to release."""

    def assert_consumed(self) -> None:
        """Every phase's script was used up."""
        for script in self.phases:
            script.assert_consumed()


async def stored(rt: Any, session_id: str) -> tuple[SessionHeader, list[SessionEvent]]:
    """A session's header and events through the query service (live when resident, else from storage)."""
    observation = await rt.query.observe_session(SessionId(session_id))
    return observation.header, list(observation.events)


def result_text_of(data: Mapping[str, Any]) -> str:
    """The text of one `tool/result` event's data."""
    block = data["message"]["content"][0]
    return "".join(part["text"] for part in block["content"])
