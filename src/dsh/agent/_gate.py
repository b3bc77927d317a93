"""The approval gate a tool call passes between argument validation and its body.

Layer: agent (private to the loop). `admit` decides one call with the agent's `Permissions`
(docs/tools.md#approvals): allowed calls pass; a deny rule refuses without a question; an `ask` writes
`approval/asked`, flushes (so the question is durable before anyone is waited for), settles through
the runtime's `ApprovalBroker` (or rejects at once under the `never` policy) and writes
`approval/decided` with the harness's outcome. An "always" answer also writes the ignorable
`dsh/approval/rule` grant, which the agent keeps for the rest of its session. A call that does not
run gets an errored result that tells the model why; its `error` carries an `APPROVAL_*` code.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import orjson

from dsh.agent._context import GRANT_EVENT
from dsh.agent.approval import ApprovalRequest, ApprovalRule, suggested_pattern
from dsh.agent.tools import DescribesCalls, Tool, ToolContext

if TYPE_CHECKING:
    from dsh.agent.approval import ApprovalBroker, Permissions
    from dsh.agent.assembler import ToolCall
    from dsh.agent.ids import IdFactory
    from dsh.session.session import Session

__all__ = ["Refusal", "admit"]

_log = logging.getLogger("dsh.agent")

CANCELLED_TEXT: Final = "Error: tool call was cancelled"
_DESCRIBE_FAILED: Final = "(the call could not be described)"


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a call did not run: the result text the model sees, and the `error` of its `tool/result`."""

    text: str
    error: Mapping[str, str] | None = None


def _error(code: str) -> dict[str, str]:
    return {"name": "ApprovalError", "code": code}


def _arguments(args: Any) -> str:
    try:
        return orjson.dumps(args.model_dump(mode="json")).decode()
    except Exception:
        return _DESCRIBE_FAILED


async def subject_of(tool: Tool, args: Any, ctx: ToolContext) -> str:
    """The call's subject: the tool's own, else its compact JSON arguments."""
    if isinstance(tool, DescribesCalls):
        try:
            return await tool.call_subject(args, ctx)
        except Exception as error:
            # The rules still need a subject: fall back to the arguments (the body reports the problem).
            _log.debug('tool "%s" could not name its call\'s subject: %r', tool.name, error)
    return _arguments(args)


async def preview_of(tool: Tool, args: Any, ctx: ToolContext) -> str:
    """What a person is shown: the tool's own preview, else its name and arguments."""
    if isinstance(tool, DescribesCalls):
        try:
            return await tool.call_preview(args, ctx)
        except Exception as error:
            _log.debug('tool "%s" could not preview its call: %r', tool.name, error)
    return f"{tool.name} {_arguments(args)}"


async def admit(
    *,
    tool: Tool,
    args: Any,
    call: ToolCall,
    ctx: ToolContext,
    session: Session,
    permissions: Permissions,
    granted: list[ApprovalRule],
    label: str,
    broker: ApprovalBroker | None,
    ids: IdFactory,
    flush: Callable[[], Awaitable[None]],
) -> Refusal | None:
    """Decide one call; None lets it run, a `Refusal` says why it does not.

    The flush before waiting raises like every flush of the loop (the caller turns it into a
    not-run result and ends the turn).
    """
    subject = await subject_of(tool, args, ctx)
    name = call.name
    action, rule = permissions.decide(name, subject, granted)
    if action == "allow":
        return None
    if action == "deny":
        spec = rule.spec if rule is not None else name
        return Refusal(
            f'Error: not run: the rule "{spec}" denies this {name} call. Do not try to reach the same result '
            "another way; tell the user what you wanted to do.",
            _error("APPROVAL_RULE_DENIED"),
        )
    approval_id = f"approval-{ids.run()}"
    why = f"rule {rule.spec} asks" if rule is not None else f"{name} asks by default"
    session.append("approval/asked", {"id": approval_id, "toolName": name, "callId": call.id, "reason": why})
    if permissions.policy == "never":
        session.append("approval/decided", {"id": approval_id, "outcome": "rejected"})
        return Refusal(
            f'Error: not run: approval prompts are disabled in this session (approval policy "never") and this '
            f"{name} call needs approval. The refusal is final: do not try another way.",
            _error("APPROVAL_REJECTED"),
        )
    try:
        await flush()
    except BaseException:
        # Every question gets its one decision, even when the turn stops here.
        session.append("approval/decided", {"id": approval_id, "outcome": "cancelled"})
        raise
    pattern = suggested_pattern(subject)
    now = broker.now_ms() if broker is not None else 0
    preview = await preview_of(tool, args, ctx)
    request = ApprovalRequest(approval_id, session.id, label, name, subject, preview, pattern, call.id, now)
    if broker is None:
        from dsh.agent.approval import ApprovalDecision

        decision = ApprovalDecision("unavailable", detail="this runtime has no approver")
    else:
        decision = await broker.request(request, ctx.signal)
    session.append("approval/decided", {"id": approval_id, "outcome": decision.outcome})
    if decision.outcome == "allowed-once":
        if decision.always:
            session.append(
                GRANT_EVENT,
                {"tool": name, "pattern": pattern, "action": "allow", "approvalId": approval_id},
                ignorable=True,
            )
            granted.append(ApprovalRule(name, pattern, "allow"))
        return None
    if decision.outcome == "cancelled":
        return Refusal(CANCELLED_TEXT)
    if decision.outcome == "rejected":
        return Refusal(
            f"Error: not run: the user refused this {name} call. Do not retry it or reach the same result another "
            "way; ask the user how to go on.",
            _error("APPROVAL_REJECTED"),
        )
    detail = decision.detail or "no one can approve it here"
    return Refusal(
        f"Error: not run: this {name} call needs approval and it could not be given ({detail}). "
        f"Nothing was changed. The user can allow such calls with --allow '{name}:{pattern}' or an approval "
        "rule in the configuration.",
        _error("APPROVAL_UNAVAILABLE"),
    )
