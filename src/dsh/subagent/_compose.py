"""How a child is built and how its outcome is read back: header, options, tools, seed, stop reason, output.

Layer: subagent (private). Shared by the one-shot driver, continuable starts and cold resume, so a
child looks the same whichever path made it (docs/subagents.md#providers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dsh.agent.messages import text, text_of_blocks
from dsh.session.header import HeaderInit
from dsh.subagent.descriptor import SUBAGENT_DESCRIPTOR_TYPE, ToolFilter
from dsh.subagent.errors import SubagentError

if TYPE_CHECKING:
    from dsh.agent.loop import Agent, AgentOptions
    from dsh.agent.tools import ToolRegistry
    from dsh.services import Services
    from dsh.session.events import SessionEvent
    from dsh.session.store import SessionStore
    from dsh.subagent.host import AgentHost
    from dsh.subagent.providers import StopReason

__all__ = [
    "ChildComposer",
    "closing_output",
    "descriptor_record",
    "epoch_stop_reason",
    "fork_prefix",
    "last_turn_end",
    "last_turn_error",
    "one_shot_stop_reason",
    "schema_note",
]


class ChildComposer:
    """Builds children on the host: it checks that one is mounted, and composes header, options and tools."""

    def __init__(self, services: Services, host: AgentHost | None) -> None:
        self.services = services
        self._host = host

    def host(self) -> AgentHost:
        """The host, or `CONTINUATION_UNAVAILABLE` when this runtime cannot run agents."""
        if self._host is None or self.services.agents is None:
            raise SubagentError(
                "running subagents requires the live agent registry (services.agents) and an agent host",
                "CONTINUATION_UNAVAILABLE",
            )
        return self._host

    def sessions(self) -> SessionStore:
        """The session store children are created in."""
        sessions = self.services.sessions
        if sessions is None:
            raise SubagentError(
                "running subagents requires the session store (services.sessions)", "CONTINUATION_UNAVAILABLE"
            )
        return sessions

    @staticmethod
    def header(parent: Agent, depth: int) -> HeaderInit:
        """A child header: the parent's cwd, the parent as `parentSession`, origin `subagent`, its depth."""
        return HeaderInit(
            cwd=parent.session.header.cwd,
            parent_session=parent.id,
            origin="subagent",
            delegation_depth=depth,
        )

    @staticmethod
    def options(
        host: AgentHost,
        *,
        agent_key: str,
        depth: int,
        parent: Agent,
        persona: str | None = None,
        model: str | None = None,
        max_tokens: int | None = None,
        extra_system: str | None = None,
    ) -> AgentOptions:
        """The child's options: the host's defaults with the persona (and any extra note) appended.

        The child inherits the parent's permissions, marked delegated: it can never do more without
        asking than its parent (docs/tools.md#approvals).
        """
        base = host.agent_options()
        parts = [part for part in (base.system_prompt, persona, extra_system) if part]
        overrides: dict[str, object] = {
            "agent_key": agent_key,
            "subagent_depth": depth,
            "system_prompt": "\n\n".join(parts) if parts else None,
        }
        inherited = parent.options.permissions
        if inherited is not None:
            overrides["permissions"] = inherited.for_child()
        if model is not None:
            overrides["model"] = model
        if max_tokens is not None:
            overrides["max_tokens"] = max_tokens
        return host.agent_options(**overrides)

    @staticmethod
    def tools(host: AgentHost, tool_filter: ToolFilter | None) -> ToolRegistry:
        """The host's default tools, narrowed by the filter."""
        if tool_filter is None:
            return host.tools
        return host.tools.filtered(allow=tool_filter.allow, deny=tool_filter.deny)


def schema_note(output_schema: Mapping[str, Any] | None) -> str | None:
    """The system-prompt section of a child with an `output_schema`: finish through `structured_output`.

    The schema itself travels as the tool's parameters, so the prompt does not repeat it.
    """
    if output_schema is None:
        return None
    from dsh.agent.structured import STRUCTURED_OUTPUT_INSTRUCTION

    return STRUCTURED_OUTPUT_INSTRUCTION


def fork_prefix(events: Sequence[SessionEvent]) -> list[SessionEvent]:
    """The parent's prefix up to and including its last `turn/end` (empty when there is none)."""
    for index in range(len(events) - 1, -1, -1):
        if events[index].type == "turn/end":
            return list(events[: index + 1])
    return []


def descriptor_record(seq: int, time: int, payload: Mapping[str, Any]) -> dict[str, Any]:
    """The seed record of a continuable descriptor (log-only: no `surfaceOp`)."""
    return {"type": SUBAGENT_DESCRIPTOR_TYPE, "seq": seq, "time": time, "data": payload}


def last_turn_error(events: Sequence[SessionEvent]) -> Mapping[str, Any] | None:
    """The error object of the last `turn/end` in `events` when it ended with an error."""
    for event in reversed(events):
        if event.type == "turn/end":
            data = event.data
            reason = data.get("reason") if isinstance(data, Mapping) else None
            error = reason.get("error") if isinstance(reason, Mapping) else None
            return error if isinstance(error, Mapping) else None
    return None


def last_turn_end(events: Sequence[SessionEvent]) -> str | None:
    """The reason kind of the last `turn/end` in `events`, or None when there is none."""
    for event in reversed(events):
        if event.type == "turn/end":
            data = event.data
            reason = data.get("reason") if isinstance(data, Mapping) else None
            kind = reason.get("kind") if isinstance(reason, Mapping) else None
            return kind if isinstance(kind, str) else "error"
    return None


def one_shot_stop_reason(kind: str | None, *, cancelled: bool) -> StopReason:
    """A one-shot run's stop reason from its last `turn/end`; a cancelled run that did not complete is aborted."""
    if kind == "completed":
        return "completed"
    if cancelled:
        return "aborted"
    if kind == "max-tokens":
        return "max-tokens"
    if kind == "aborted":
        return "aborted"
    if kind == "blocked":
        return "refusal"
    return "error"


def epoch_stop_reason(kind: str | None, *, dropped_work: bool) -> StopReason:
    """How an activation ended: its last turn, or `aborted` when accepted work was dropped before it ran."""
    if kind == "max-tokens":
        return "max-tokens"
    if kind in ("aborted", "interrupted"):
        return "aborted"
    if kind == "error":
        return "error"
    if kind == "blocked":
        return "refusal"
    return "aborted" if dropped_work else "completed"


def closing_output(events: Sequence[SessionEvent], streamed: str = "") -> tuple[Mapping[str, Any], ...]:
    """The text blocks of the last non-empty answer of the last turn in `events`, else `streamed`, else none."""
    start = 0
    for index in range(len(events) - 1, -1, -1):
        if events[index].type == "turn/start":
            start = index
            break
    for event in reversed(events[start:]):
        if event.type != "assistant/message":
            continue
        data = event.data
        message = data.get("message") if isinstance(data, Mapping) else None
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(content, Sequence):
            continue
        blocks = tuple(
            {"type": "text", "text": block["text"]}
            for block in content
            if isinstance(block, Mapping) and block.get("type") == "text" and block.get("text")
        )
        if text_of_blocks(blocks):
            return blocks
    return (text(streamed),) if streamed else ()
