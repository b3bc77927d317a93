"""Subagent providers and the values that cross the provider seam (docs/subagents.md#providers).

Layer: subagent. A provider establishes children: `start` runs a one-shot child and hands back a
`SubagentRun`; `prepare_continuable` returns the inherited prefix a continuable child is seeded
with. What a provider can honour is declared in `ProviderCapabilities`, never guessed from which
methods it defines. The in-process `spawn` and `fork` providers live in `_inprocess.py`; this module
holds only the shapes, so a third-party provider imports nothing else.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from dsh.abort import AbortSignal
    from dsh.agent.loop import Agent
    from dsh.subagent.descriptor import ToolFilter

__all__ = [
    "ContinuablePreparation",
    "ContinuableSpec",
    "ContinuableStarted",
    "ProviderCapabilities",
    "StopReason",
    "SubagentProvider",
    "SubagentRequest",
    "SubagentResult",
    "SubagentRun",
]

StopReason = Literal["completed", "max-tokens", "aborted", "refusal", "error"]
"""How a subagent run (or a continuable child's activation) ended."""


@dataclass(frozen=True, slots=True)
class ProviderCapabilities:
    """What a provider honours in a request; a request asking for more is refused before it starts."""

    output_schema: bool = False
    depth_limit: bool = False
    tool_filter: bool = False
    persona: bool = False
    continuable: bool = False


@dataclass(frozen=True, slots=True)
class SubagentRequest:
    """One delegation.

    Attributes:
        parent: The live calling agent.
        prompt: The task, sent to the child as one text block from a `user` source.
        label: A short display label (the tool's `description`).
        max_depth: An absolute cap on the child's delegation depth; None leaves depth to the provider.
        output_schema: A JSON Schema (object-rooted) the result must match: the child finishes by
            calling `structured_output` with it, and `SubagentResult.structured` is the object.
        tool_filter: Which of the host's tools the child may use.
        persona: Text appended to the child's system prompt.
        model: A model name for the child instead of the parent's.
        signal: Aborting it cancels the run (or, for a continuable start, the start itself).
        descriptor: The descriptor payload; set by the runtime on the copy a provider receives.
    """

    parent: Agent
    prompt: str
    label: str | None = None
    max_depth: int | None = None
    output_schema: Mapping[str, Any] | None = None
    tool_filter: ToolFilter | None = None
    persona: str | None = None
    model: str | None = None
    signal: AbortSignal | None = None
    descriptor: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class SubagentResult:
    """The outcome of a one-shot run.

    Attributes:
        stop_reason: `completed`, `max-tokens`, `aborted`, `refusal` or `error`.
        output: The content blocks of the child's last non-empty answer (else its streamed text, else none).
        structured: The validated object a child started with an `output_schema` passed to
            `structured_output` (None without a schema, or when it never made a valid call).
        error: The child's `turn/end` error object when it stopped with `error`.
    """

    stop_reason: StopReason
    output: tuple[Mapping[str, Any], ...] = ()
    structured: Any = None
    error: Mapping[str, Any] | None = None


class SubagentRun:
    """The handle of a one-shot run: the child id, its live agent when in-process, the result, `dispose()`.

    Args:
        id: The child session id.
        result: Resolved with the `SubagentResult` (or failed) when the run ends.
        local_agent: The child agent when it runs in this process.
        dispose: Cancels the run and waits for it; called at most once by `dispose()`.
    """

    def __init__(
        self,
        id: str,
        result: asyncio.Future[SubagentResult],
        *,
        local_agent: Agent | None = None,
        dispose: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.id = id
        self.result = result
        self.local_agent = local_agent
        self._dispose = dispose
        self._disposal: asyncio.Future[None] | None = None

    async def dispose(self) -> None:
        """Cancel the run and wait for it (idempotent); raises only when releasing the handle fails."""
        if self._disposal is None:
            if self._dispose is None:
                self._disposal = asyncio.get_running_loop().create_future()
                self._disposal.set_result(None)
            else:
                self._disposal = asyncio.ensure_future(self._dispose())
        # Shielded: a caller cancelled while waiting must not leave the child half released.
        await asyncio.shield(self._disposal)

    def __repr__(self) -> str:
        return f"SubagentRun(id={self.id!r}, done={self.result.done()})"


@dataclass(frozen=True, slots=True)
class ContinuablePreparation:
    """What a provider prepares for a continuable child: the inherited prefix (empty for spawn)."""

    seed: Sequence[Mapping[str, Any]] = ()


class SubagentProvider(Protocol):
    """A way to establish children (the runtime registers `spawn` and `fork` itself)."""

    @property
    def name(self) -> str:
        """The name requests and descriptors use."""

    @property
    def capabilities(self) -> ProviderCapabilities:
        """What the provider honours, declared explicitly."""

    @property
    def inherits_parent_context(self) -> bool:
        """True when children start from the parent's conversation (fork)."""

    async def start(self, request: SubagentRequest) -> SubagentRun:
        """Start a one-shot child for `request` (whose `descriptor` the runtime set)."""

    async def prepare_continuable(self, request: SubagentRequest) -> ContinuablePreparation:
        """The inherited prefix of a new continuable child; only called when `continuable` is declared."""


@dataclass(frozen=True, slots=True)
class ContinuableSpec:
    """What `start_continuable` takes.

    Attributes:
        parent: The live parent agent.
        prompt: The first task.
        label: The display label (required: a continuable child always has one).
        provider: The provider that prepares the child (`spawn` by default).
        max_depth: An absolute cap on the child's delegation depth.
        child_id: A caller-reserved id (a new one from the id factory otherwise).
        persona: Text appended to the child's system prompt (recorded in the descriptor).
        tool_filter: Which of the host's tools the child may use (recorded in the descriptor).
        model: A model for the child instead of the parent's (recorded as `agentModel`).
        signal: Owns the start until the prompt is accepted; an abort raises its own reason.
    """

    parent: Agent
    prompt: str
    label: str
    provider: str = "spawn"
    max_depth: int | None = None
    child_id: str | None = None
    persona: str | None = None
    tool_filter: ToolFilter | None = None
    model: str | None = None
    signal: AbortSignal | None = None


@dataclass(frozen=True, slots=True)
class ContinuableStarted:
    """A continuable child was created and its prompt accepted."""

    child_id: str
    message_id: str
