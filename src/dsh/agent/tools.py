"""The `Tool` protocol, the `ToolContext` a tool body runs with, and the `ToolRegistry`.

Layer: agent (the loop needs them; the model-facing tools themselves live in `dsh.tools`, above the
subagent layer). A tool declares its model-visible contract as a literal JSON Schema (`parameters`),
validates arguments with a pydantic model (`args_model`, lax, unknown keys ignored), runs an async
body and renders its output as content blocks. The model sees only the rendered blocks; the raw
output is kept on the tool-result block (docs/agent.md#tool-dispatch).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from dsh.abort import AbortSignal
from dsh.agent.errors import ToolError

if TYPE_CHECKING:
    from pydantic import BaseModel

    from dsh.agent.approval import Permissions
    from dsh.services import Services
    from dsh.session.session import Session

__all__ = [
    "CallingAgent",
    "DescribesCalls",
    "Tool",
    "ToolContext",
    "ToolHandle",
    "ToolRegistry",
    "neutral_schema",
]


@runtime_checkable
class CallingAgent(Protocol):
    """What a tool body may know about the agent that called it (the live `Agent` satisfies it)."""

    @property
    def id(self) -> str:
        """The agent's id (its session id)."""

    @property
    def session(self) -> Session:
        """The agent's live session."""


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a tool body runs with.

    Attributes:
        agent: The calling agent, or None when a tool is run outside an agent (tests, the demo).
        call_id: The model's id for this call.
        signal: Aborted when the turn is cancelled; a body that ignores it is cancelled after the grace.
        services: The runtime's services (read at call time).
        permissions: The calling agent's permissions (its sandbox mode), when it has some.
    """

    agent: CallingAgent | None
    call_id: str
    signal: AbortSignal
    services: Services
    permissions: Permissions | None = None


@runtime_checkable
class Tool(Protocol):
    """A model-facing tool."""

    @property
    def name(self) -> str:
        """The name the model calls it by."""

    @property
    def description(self) -> str:
        """What the model is told the tool does."""

    @property
    def parameters(self) -> Mapping[str, Any]:
        """The literal JSON Schema of the arguments: the model-visible contract."""

    @property
    def args_model(self) -> type[BaseModel]:
        """The pydantic model the arguments are validated with (lax; unknown keys ignored)."""

    @property
    def output_schema(self) -> Mapping[str, Any] | None:
        """The JSON Schema of `execute`'s output, if the tool declares one."""

    async def execute(self, args: Any, ctx: ToolContext) -> object:
        """Run the tool body with validated `args`; raising makes an errored result."""

    def render(self, args: Any, output: object) -> list[dict[str, Any]]:
        """The content blocks the model sees for `output`."""


@runtime_checkable
class DescribesCalls(Protocol):
    """A tool that says what its calls are about, for approvals (docs/tools.md#approval-rules).

    Without it, a call's subject is its compact JSON arguments and its preview the tool's name and
    those arguments.
    """

    async def call_subject(self, args: Any, ctx: ToolContext) -> str:
        """What approval rules match against (a command, a workspace-relative path ...); asked for every call."""

    async def call_preview(self, args: Any, ctx: ToolContext) -> str:
        """The exact command or change, as a person is shown it; asked for only when someone is asked."""


@dataclass(slots=True)
class ToolHandle:
    """A registration; `dispose()` unregisters it (idempotent)."""

    _dispose: Callable[[], None]

    def dispose(self) -> None:
        """Unregister the tool."""
        self._dispose()


def neutral_schema(tool: Tool) -> dict[str, Any]:
    """`{name, description, parameters}`: the provider-neutral schema the model clients wrap."""
    return {"name": tool.name, "description": tool.description, "parameters": dict(tool.parameters)}


class ToolRegistry:
    """The tools an agent may call, by name."""

    def __init__(self, tools: Sequence[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> ToolHandle:
        """Add `tool`.

        Raises:
            ToolError: `DUPLICATE_TOOL` when a tool with that name is registered.
        """
        name = tool.name
        if name in self._tools:
            raise ToolError(f'tool "{name}" is already registered', name=name)
        self._tools[name] = tool

        def dispose() -> None:
            if self._tools.get(name) is tool:
                del self._tools[name]

        return ToolHandle(dispose)

    def get(self, name: str) -> Tool | None:
        """The tool called `name`, or None."""
        return self._tools.get(name)

    def names(self) -> tuple[str, ...]:
        """Registered names, sorted."""
        return tuple(sorted(self._tools))

    def __iter__(self) -> Iterator[Tool]:
        return iter([self._tools[name] for name in sorted(self._tools)])

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def filtered(self, *, allow: Sequence[str] | None = None, deny: Sequence[str] | None = None) -> ToolRegistry:
        """A new registry holding the tools `allow` admits (all when None) minus those `deny` names."""
        keep = [
            tool for tool in self if (allow is None or tool.name in allow) and (deny is None or tool.name not in deny)
        ]
        return ToolRegistry(keep)

    def schemas(self) -> list[dict[str, Any]]:
        """The neutral schema list `[{name, description, parameters}]`, sorted by name."""
        return [neutral_schema(tool) for tool in self]


# The public names (docs/architecture.md#public-names).
ToolContext.__module__ = "dsh"
