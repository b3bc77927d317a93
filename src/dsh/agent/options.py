"""The agent's records: `AgentOptions` (how an agent talks to its model), `InboxItem` (a message
waiting for its turn), `TurnResult` (how a turn ended), who cancels a turn and when an item is claimed.

Layer: agent. `dsh.agent.loop` runs the turns these describe (docs/agent.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from dsh.agent.approval import Permissions
    from dsh.agent.compaction import CompactionSettings
    from dsh.agent.model import Usage
    from dsh.agent.usage import TokenTotals

__all__ = [
    "AgentOptions",
    "CancelCause",
    "Delivery",
    "InboxItem",
    "TurnResult",
]

CancelCause = Literal["user", "parent", "disposed"]
"""Who cancelled a turn: a person, the parent agent, or the runtime closing."""

Delivery = Literal["next-turn"]
"""When an inbox item is claimed. Only `next-turn` (FIFO, one item per turn) exists today."""


@dataclass(frozen=True, slots=True)
class AgentOptions:
    """How an agent talks to its model.

    Attributes:
        model: The model name requests are made for.
        max_steps: Steps per turn before the turn ends with `AGENT_MAX_STEPS`.
        max_tokens: The output limit per request, if any.
        system_prompt: The system prompt, if any.
        temperature: The sampling temperature, if set.
        log_chunks: Log every streamed chunk as an `assistant/chunk` event.
        cancel_grace_s: How long a cancelled tool body may take to notice its signal before its task is cancelled.
        agent_key: The script track a scripted model answers from (`main` for a top-level agent); also
            the label an approval request shows.
        subagent_depth: The delegation depth this agent runs at, when it was started as a subagent.
        permissions: What the agent's tool calls may do without asking (docs/tools.md#approvals);
            None runs every call without a question.
        time_context: Give the model the current date and time (and the permissions) once per turn.
        time_zone: The IANA zone the time is given in (None: the prompt's `clientTimeZone`, else local).
        compaction: When and how the agent compacts its context (None: only on request, with the defaults).
        model_titles: Ask the model for a short session title in the background after the first message.
        structured_output_attempts: Invalid `structured_output` calls and plain answers allowed when
            the agent runs with an output schema (docs/agent.md#structured-output).
    """

    model: str
    max_steps: int = 50
    max_tokens: int | None = None
    system_prompt: str | None = None
    temperature: float | None = None
    log_chunks: bool = False
    cancel_grace_s: float = 5.0
    agent_key: str = "main"
    subagent_depth: int | None = None
    permissions: Permissions | None = None
    time_context: bool = False
    time_zone: str | None = None
    compaction: CompactionSettings | None = None
    model_titles: bool = False
    structured_output_attempts: int = 3


@dataclass(frozen=True, slots=True)
class InboxItem:
    """A message waiting for its turn."""

    message_id: str
    content: tuple[Mapping[str, Any], ...]
    source: Mapping[str, Any]
    delivery: Delivery = "next-turn"


@dataclass(frozen=True, slots=True)
class TurnResult:
    """How one turn ended.

    Attributes:
        session_id: The agent's session.
        message_id: The inbox item the turn was for.
        turn: The turn number.
        output: The answer text of the turn's last non-empty assistant message ("" when none).
        stop_reason: The `turn/end` reason kind: completed, max-tokens, blocked, aborted or error.
        usage: The tokens of every request of the turn, summed (None when the model reported none); the
            log holds each request's usage on its `assistant/message`, never a turn total.
        error: The `turn/end` error object when `stop_reason` is `error`.
        dropped: True when the item was dropped unclaimed (the agent closed); the other fields are empty.
        tokens: The turn's priced token total (`Runtime.run` fills it in).
        session_tokens: The session's priced token total after the turn (`Runtime.run` fills it in).
        structured: The validated object of a run with an output schema (`Runtime.run(...,
            output_schema=...)`), else None (docs/agent.md#structured-output).
    """

    session_id: str
    message_id: str
    turn: int
    output: str
    stop_reason: str
    usage: Usage | None = None
    error: Mapping[str, Any] | None = None
    dropped: bool = False
    tokens: TokenTotals | None = None
    session_tokens: TokenTotals | None = None
    structured: Any = None
