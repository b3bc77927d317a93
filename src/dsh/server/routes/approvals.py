"""Approval routes: the tool calls waiting for a decision, and the decision.

Layer: server (an adapter over the runtime's `ApprovalBroker`). `dsh serve` enables remote decisions:
an agent's question waits as a pending request, is pushed on the stream as an `approval/pending`
frame, and is settled by `decideApproval` (`allow`, `always` or `deny`) or, unanswered, refused
after `approvals.timeout_s` (docs/server.md#approvals). A decision for a request that is not pending
(unknown, or settled already) is 404 `approval-not-found`.
"""

from __future__ import annotations

from typing import Annotated, Final

from fastapi import APIRouter, Depends, Path, Request

from dsh.agent.errors import ApprovalError
from dsh.runtime import Runtime
from dsh.server.errors import WireError
from dsh.server.models import ApprovalDecided, ApprovalDecisionBody, ApprovalList
from dsh.server.replicas import ReplicaSet
from dsh.server.routes.deps import JsonBody, error_responses, runtime

__all__ = ["router"]

router = APIRouter()

Rt = Annotated[Runtime, Depends(runtime)]
_MAX_ID_CHARS: Final = 256


def _approval_id(
    id: Annotated[str, Path(min_length=1, max_length=_MAX_ID_CHARS, description="A pending approval request's id.")],
) -> str:
    return id


ApprovalId = Annotated[str, Depends(_approval_id)]


@router.get(
    "/approvals", operation_id="listApprovals", response_model=ApprovalList, responses=error_responses(400, 401)
)
async def list_approvals(rt: Rt) -> JsonBody:
    """The tool calls waiting for a decision, oldest first."""
    broker = rt.services.approvals
    items = [request.to_json() for request in broker.pending()] if broker is not None else []
    return JsonBody({"items": items})


@router.post(
    "/approvals/{id}",
    operation_id="decideApproval",
    response_model=ApprovalDecided,
    responses=error_responses(400, 401, 404, 413, 415),
)
async def decide_approval(request: Request, approval_id: ApprovalId, body: ApprovalDecisionBody, rt: Rt) -> JsonBody:
    """Decide a pending request: `allow` runs the call, `always` also allows calls like it for the rest of
    the session, `deny` refuses it."""
    broker = rt.services.approvals
    not_found = WireError(
        "approval-not-found", f'no approval request "{approval_id}" is pending', {"approvalId": approval_id}
    )
    try:
        if broker is None:
            raise ApprovalError("no approval request is pending", code="APPROVAL_NOT_FOUND", approval_id=approval_id)
        decided = broker.decide(approval_id, body.decision)
    except ApprovalError:
        replicas: ReplicaSet | None = request.app.state.replicas
        if replicas is None:
            raise not_found from None
        # It may wait on another replica (docs/server.md#replicas).
        answer = await replicas.decide(approval_id, body.decision)
        if answer is None:
            raise not_found from None
        return JsonBody(answer)
    return JsonBody({"id": decided.id, "sessionId": decided.session_id, "decision": body.decision})
