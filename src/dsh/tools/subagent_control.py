"""The tools that let a model manage the subagents it started: `list_agents`, `send_message`, `interrupt_agent`.

Layer: tools (above `dsh.subagent`). Each tool acts for the agent that called it (`ctx.agent`) and
reads the subagent service and the live agent registry from `ctx.services` at call time. Their
parameters, descriptions and renders are the model-visible contract, frozen by a golden file
(docs/tools.md). A failure is raised and becomes an errored tool result; a `SubagentError` keeps its
`code` on the result. `list_agents` shows the catalog (docs/catalog.md#rows-on-the-wire) projected
for the model: one-shot children are dropped, diagnostics kept, and a continuable child's status says
whether an agent runs it now (`running`), holds it between turns (`idle`) or only storage does (`ready`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal, cast

from pydantic import BaseModel, ConfigDict

from dsh.agent.messages import RelaySource, text
from dsh.agent.tools import ToolContext
from dsh.subagent.rows import SubagentChildRow, SubagentDescendantEntry, SubagentListEntry
from dsh.tools._context import calling_agent, subagent_service

if TYPE_CHECKING:
    from dsh.agent.loop import Agent
    from dsh.agent.registry import AgentRegistry

__all__ = [
    "InterruptAgentTool",
    "ListAgentsTool",
    "SendMessageTool",
    "agent_status",
    "project_rows",
    "render_rows",
]

Status = Literal["running", "idle", "ready"]

# ------------------------------------------------------------------------------------------ list_agents

_LIST_AGENTS_DESCRIPTION: Final = (
    "List the continuable background subagents you started, each with its durable id and its label. "
    "Use it to recall what exists, not to poll for progress: you are told when one finishes, so there is "
    "no need to check back. Every entry has a status: running (working on a turn right now), idle (loaded "
    "and between turns, possibly waiting on agents it started itself) or ready (kept only in storage; "
    "resumable, not terminal, and not a result waiting to be collected). send_message gives a direct child "
    "a new turn in the same conversation, whatever its status. The list is a snapshot of this moment, not a "
    "promise that anything will be delivered. A child whose record could not be read is still listed, as a "
    "diagnostic entry, instead of being left out. With scope descendants the whole tree below you is walked "
    "in a stable pre-order and each entry shows its direct parent and its depth; only depth-1 entries can "
    "receive send_message, deeper ones are candidates for interrupt_agent only."
)

_LIST_AGENTS_PARAMETERS: Final[Mapping[str, Any]] = {
    "type": "object",
    "properties": {
        "scope": {
            "type": "string",
            "description": (
                "children (the default) lists only your direct children; descendants walks the complete tree below you."
            ),
            "enum": ["children", "descendants"],
        }
    },
}

_PLACEMENT_PROPERTIES: Final[Mapping[str, Any]] = {
    "parent": {"type": "string"},
    "depth": {"type": "integer", "minimum": 1},
}

_LIST_AGENTS_OUTPUT: Final[Mapping[str, Any]] = {
    "type": "array",
    "items": {
        "oneOf": [
            {
                "type": "object",
                "properties": {
                    "kind": {"const": "child"},
                    "id": {"type": "string"},
                    "label": {"type": "string"},
                    "status": {"type": "string", "enum": ["running", "idle", "ready"]},
                    **_PLACEMENT_PROPERTIES,
                },
                "required": ["kind", "id", "label", "status"],
                "additionalProperties": False,
            },
            {
                "type": "object",
                "properties": {
                    "kind": {"const": "diagnostic"},
                    "id": {"type": "string"},
                    "reason": {"type": "string", "enum": ["corrupt", "unsupported", "unavailable"]},
                    **_PLACEMENT_PROPERTIES,
                },
                "required": ["kind", "id", "reason"],
                "additionalProperties": False,
            },
        ]
    },
}

_EMPTY_LISTING: Final = "(no subagents)"


class ListAgentsArgs(BaseModel):
    """`list_agents` arguments (lax; unknown keys ignored)."""

    model_config = ConfigDict(extra="ignore")
    scope: Literal["children", "descendants"] = "children"


def agent_status(agents: AgentRegistry[Agent] | None, agent_id: str) -> Status:
    """The model-facing status of a continuable child: from the live agent registry, never the catalog.

    `running` when a registered agent runs a turn, `idle` when one is registered otherwise, `ready`
    when none is (the child lives only in storage and can be resumed).
    """
    agent = agents.get(agent_id) if agents is not None else None
    if agent is None:
        return "ready"
    return "running" if agent.status == "running" else "idle"


def _project_entry(entry: SubagentListEntry, agents: AgentRegistry[Agent] | None) -> dict[str, Any] | None:
    if isinstance(entry, SubagentChildRow):
        if entry.mode != "continuable":
            return None
        # A continuable row always has a label (the row validates it); the id stands in defensively.
        label = entry.label if entry.label is not None else entry.id
        return {"kind": "child", "id": entry.id, "label": label, "status": agent_status(agents, entry.id)}
    return {"kind": "diagnostic", "id": entry.id, "reason": entry.reason}


def project_rows(
    rows: Sequence[SubagentListEntry | SubagentDescendantEntry], agents: AgentRegistry[Agent] | None
) -> list[dict[str, Any]]:
    """The catalog rows as the model sees them, in the catalog's order.

    One-shot children are dropped (the listing already walked their subtrees, so continuable
    descendants below them still appear); diagnostics are kept; the catalog's `activity` and
    `hasChildren` are not shown. Descendant rows add `parent` and `depth`.
    """
    out: list[dict[str, Any]] = []
    for row in rows:
        entry = row.entry if isinstance(row, SubagentDescendantEntry) else row
        projected = _project_entry(entry, agents)
        if projected is None:
            continue
        if isinstance(row, SubagentDescendantEntry):
            projected["parent"] = row.parent_id
            projected["depth"] = row.depth
        out.append(projected)
    return out


def _row_line(row: Mapping[str, Any]) -> str:
    placement = f" parent={row['parent']} depth={row['depth']}" if "parent" in row else ""
    if row["kind"] == "diagnostic":
        return f"{row['id']} [diagnostic: {row['reason']}]{placement}"
    return f"{row['id']} [{row['status']}]{placement} \u2014 {row['label']}"


def render_rows(rows: Sequence[Mapping[str, Any]]) -> str:
    """One line per projected row, or `(no subagents)` for none."""
    if not rows:
        return _EMPTY_LISTING
    return "\n".join(_row_line(row) for row in rows)


class ListAgentsTool:
    """`list_agents`: the caller's continuable subagents (or its whole subtree) with their status."""

    name: Final = "list_agents"
    description: Final = _LIST_AGENTS_DESCRIPTION
    parameters: Final = _LIST_AGENTS_PARAMETERS
    args_model: Final = ListAgentsArgs
    output_schema: Final = _LIST_AGENTS_OUTPUT

    async def execute(self, args: Any, ctx: ToolContext) -> object:
        """List for the caller with the call's signal; a missing service raises, never an empty list.

        Raises:
            RuntimeError: No calling agent, or no subagent service mounted.
            SubagentError: The listing's own failures (a missing query service, projection registry
                or session store; `CANCELLED` when the call's signal aborted).
        """
        caller = calling_agent(ctx, self.name)
        subagents = ctx.services.subagents
        if subagents is None:
            raise RuntimeError(f"{self.name} requires the subagent service (services.subagents is not mounted)")
        rows: Sequence[SubagentListEntry | SubagentDescendantEntry]
        if cast(ListAgentsArgs, args).scope == "descendants":
            rows = await subagents.list_descendants(caller.id, signal=ctx.signal)
        else:
            rows = await subagents.list_children(caller.id, signal=ctx.signal)
        # The status is read after the listing settles, so it is as fresh as the call can make it.
        return project_rows(rows, ctx.services.agents)

    def render(self, args: Any, output: object) -> list[dict[str, Any]]:
        """A single text block: one line per row, or `(no subagents)`."""
        return [text(render_rows(cast(Sequence[Mapping[str, Any]], output)))]


# ----------------------------------------------------------------------------------------- send_message

_SEND_MESSAGE_DESCRIPTION: Final = (
    "Continue the conversation with one of your background subagents. The message becomes that "
    "subagent's next turn: if it is still working, the message waits until the running turn ends, so it "
    "cannot redirect work already underway. The call returns no answer from the subagent, only the "
    "confirmation that the message was delivered; when the call fails, the message was NOT delivered."
)

_SEND_MESSAGE_PARAMETERS: Final[Mapping[str, Any]] = {
    "type": "object",
    "properties": {
        "subagent_id": {
            "type": "string",
            "description": "The id you were given when the background subagent was started.",
        },
        "message": {"type": "string", "description": "The message to deliver to the subagent."},
    },
    "required": ["subagent_id", "message"],
}

_SEND_MESSAGE_OUTPUT: Final[Mapping[str, Any]] = {
    "type": "object",
    "properties": {"messageId": {"type": "string"}},
    "required": ["messageId"],
    "additionalProperties": False,
}


class SendMessageArgs(BaseModel):
    """`send_message` arguments (lax; unknown keys ignored)."""

    model_config = ConfigDict(extra="ignore")
    subagent_id: str
    message: str


class SendMessageTool:
    """`send_message`: queue a message as the next turn of one of the caller's continuable children."""

    name: Final = "send_message"
    description: Final = _SEND_MESSAGE_DESCRIPTION
    parameters: Final = _SEND_MESSAGE_PARAMETERS
    args_model: Final = SendMessageArgs
    output_schema: Final = _SEND_MESSAGE_OUTPUT

    async def execute(self, args: Any, ctx: ToolContext) -> object:
        """Deliver through the subagent service (to the resident child, or by resuming it cold).

        The message is relayed with the source `{kind: "coordinator", form: "relay", senderSessionId}`,
        and the call returns at inbox acceptance.

        Raises:
            RuntimeError: No calling agent.
            SubagentError: The delivery was refused (`UNAUTHORIZED`, `NOT_RESUMABLE`, `DRAINING`, ...);
                the message was not delivered.
        """
        caller = calling_agent(ctx, self.name)
        subagents = subagent_service(ctx, self.name)
        parsed = cast(SendMessageArgs, args)
        message_id = await subagents.followup(
            cast("Agent", caller),
            parsed.subagent_id,
            [text(parsed.message)],
            source=RelaySource(caller.id),
            signal=ctx.signal,
        )
        return {"messageId": message_id}

    def render(self, args: Any, output: object) -> list[dict[str, Any]]:
        """`message queued as the next turn for subagent <id>`."""
        return [text(f"message queued as the next turn for subagent {cast(SendMessageArgs, args).subagent_id}")]


# -------------------------------------------------------------------------------------- interrupt_agent

_INTERRUPT_AGENT_DESCRIPTION: Final = (
    "Ask a background agent to stop its current turn. The target may be one of your direct children or "
    "an agent deeper in the tree below you. Only the current turn stops: messages already queued for it "
    "stay parked until a later send_message, agents it started keep running, and the agent itself stays "
    "available. The call returns once the request is accepted, so the target may keep running briefly. "
    "Interrupting an agent that has already finished is accepted and changes nothing."
)

_INTERRUPT_AGENT_PARAMETERS: Final[Mapping[str, Any]] = {
    "type": "object",
    "properties": {"agent_id": {"type": "string", "description": "The id of the running agent to interrupt."}},
    "required": ["agent_id"],
}

_INTERRUPT_AGENT_OUTPUT: Final[Mapping[str, Any]] = {
    "type": "object",
    "properties": {"accepted": {"const": True}},
    "required": ["accepted"],
    "additionalProperties": False,
}


class InterruptAgentArgs(BaseModel):
    """`interrupt_agent` arguments (lax; unknown keys ignored)."""

    model_config = ConfigDict(extra="ignore")
    agent_id: str


class InterruptAgentTool:
    """`interrupt_agent`: cancel the current turn of an agent below the caller, keeping its inbox."""

    name: Final = "interrupt_agent"
    description: Final = _INTERRUPT_AGENT_DESCRIPTION
    parameters: Final = _INTERRUPT_AGENT_PARAMETERS
    args_model: Final = InterruptAgentArgs
    output_schema: Final = _INTERRUPT_AGENT_OUTPUT

    async def execute(self, args: Any, ctx: ToolContext) -> object:
        """Request the interrupt with the caller as the ancestor authority; returns once accepted.

        An absent or settled target is an accepted no-op, and so is a runtime without a subagent
        service (nothing can be running below the caller then).

        Raises:
            RuntimeError: No calling agent.
            SubagentError: `UNAUTHORIZED` when the caller is the target itself or not a live
                ancestor of it.
        """
        caller = calling_agent(ctx, self.name)
        subagents = ctx.services.subagents
        if subagents is not None:
            from dsh.subagent.authority import AncestorAuthority

            await subagents.interrupt(cast(InterruptAgentArgs, args).agent_id, AncestorAuthority(cast("Agent", caller)))
        return {"accepted": True}

    def render(self, args: Any, output: object) -> list[dict[str, Any]]:
        """`interrupt requested for agent <id>`."""
        return [text(f"interrupt requested for agent {cast(InterruptAgentArgs, args).agent_id}")]


# Shown under the name users import (docs/architecture.md#public-names).
InterruptAgentTool.__module__ = "dsh.tools"
ListAgentsTool.__module__ = "dsh.tools"
SendMessageTool.__module__ = "dsh.tools"
