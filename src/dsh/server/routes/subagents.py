"""Subagent routes: the catalog, a child's history, a follow-up prompt and an interrupt.

Layer: server (an adapter over `SubagentRuntime` and the query service). The catalog is the
listing's rows unchanged (diagnostic rows included) with one documented rewrite: a child row's
`activity` is `running` only while the agent registry holds that agent with status `running`.
History and prompt first verify the address against the parent's children (docs/server.md#owner-checks);
history then reads through the same query read as the generic history route. Failures are
answered with the fixed messages of docs/server.md#errors, never with a backend's text.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request

from dsh.abort import AbortSignal
from dsh.agent.messages import UserSource
from dsh.query.errors import SessionQueryError
from dsh.runtime import Runtime
from dsh.server.errors import LIBRARY_CODES, WireError
from dsh.server.models import Accepted, HistoryPage, MessageAccepted, PromptBody, SubagentCatalog
from dsh.server.routes.deps import (
    NO_BODY,
    BeforeSeq,
    ChildId,
    JsonBody,
    MaxMessages,
    ParentId,
    SessionIdPath,
    cancelled,
    check_time_zone,
    error_responses,
    internal,
    page_json,
    request_id,
    runtime,
    signal,
)
from dsh.session.header import SessionId
from dsh.subagent.authority import UserAuthority
from dsh.subagent.errors import SubagentError
from dsh.subagent.listing import ListingReport
from dsh.subagent.rows import SubagentChildRow, SubagentDescendantEntry, SubagentDiagnosticRow, SubagentListEntry
from dsh.subagent.runtime import SubagentRuntime

__all__ = ["router"]

_log = logging.getLogger("dsh.server")

router = APIRouter()

Rt = Annotated[Runtime, Depends(runtime)]
Signal = Annotated[AbortSignal, Depends(signal)]
Mode = Literal["one-shot", "continuable"]

_UNAVAILABLE = {
    "SUBAGENT_CONTROL_PROJECTIONS_UNAVAILABLE": "this deployment does not mount the projection registry",
    "SUBAGENT_CONTROL_QUERY_UNAVAILABLE": "this deployment does not mount the session query service",
    "SUBAGENT_CONTROL_SESSION_STORE_UNAVAILABLE": "this deployment does not mount the session store",
    "SUBAGENT_CONTROL_UNITS_UNAVAILABLE": "this deployment does not register the subagent projection unit",
}


def _service(rt: Runtime) -> SubagentRuntime:
    found = rt.services.subagents
    if found is None:
        raise internal("subagent catalog is unavailable: this deployment does not mount the subagent service")
    return found


def _catalog_failure(error: Exception, signal: AbortSignal) -> WireError:
    code = getattr(error, "code", None)
    if code == "CANCELLED" or signal.aborted:
        return WireError("cancelled", "subagent catalog read was cancelled")
    if isinstance(error, SubagentError) and code in _UNAVAILABLE:
        return internal(f"subagent catalog is unavailable: {_UNAVAILABLE[code]}")
    _log.error("subagent catalog read failed (%s)", type(error).__name__)
    return internal("subagent catalog read failed")


async def _children(rt: Runtime, parent_id: str, signal: AbortSignal) -> list[SubagentListEntry]:
    try:
        return await _service(rt).list_children(parent_id, signal=signal)
    except Exception as error:
        raise _catalog_failure(error, signal) from None


def _row_json(rt: Runtime, entry: SubagentListEntry | SubagentDescendantEntry) -> dict[str, object]:
    """The row's own JSON; a child row's `activity` says whether the registry runs that agent now."""
    out = entry.to_json()
    row = entry.entry if isinstance(entry, SubagentDescendantEntry) else entry
    if isinstance(row, SubagentChildRow):
        out["activity"] = "running" if rt.agents.status(row.id) == "running" else "inactive"
    return out


async def _verify(rt: Runtime, parent_id: str, child_id: str, mode: Mode | None, signal: AbortSignal) -> None:
    """The child is a direct subagent of the parent (of `mode`, when given) with a readable identity."""
    rows: Sequence[SubagentListEntry] = await _children(rt, parent_id, signal)
    row = next((row for row in rows if row.id == child_id), None)
    if isinstance(row, SubagentDiagnosticRow):
        raise WireError(
            "subagent-catalog-diagnostic",
            f'subagent "{child_id}" is {row.reason}',
            {"parentSessionId": parent_id, "childSessionId": child_id, "reason": row.reason},
        )
    if row is None or (mode is not None and row.mode != mode):
        kind = f"{mode} " if mode is not None else ""
        raise WireError(
            "subagent-not-found",
            f'session "{child_id}" is not a {kind}direct child of "{parent_id}"',
            {"parentSessionId": parent_id, "childSessionId": child_id},
        )


@router.get(
    "/sessions/{id}/subagents",
    operation_id="listSubagents",
    response_model=SubagentCatalog,
    responses=error_responses(400, 401, 404, 500),
)
async def list_subagents(
    parent_id: SessionIdPath,
    rt: Rt,
    signal: Signal,
    scope: Annotated[
        Literal["children", "descendants"], Query(description="Direct children, or the whole subtree in pre-order.")
    ] = "children",
) -> JsonBody:
    """The parent's subagents as the catalog lists them, whether the parent's agent is live, and how
    many stored sessions the listing could not read at all."""
    service = _service(rt)
    reports: list[ListingReport] = []
    try:
        if scope == "descendants":
            entries: Sequence[Any] = await service.list_descendants(parent_id, signal=signal, report=reports.append)
        else:
            entries = await service.list_children(parent_id, signal=signal, report=reports.append)
    except Exception as error:
        raise _catalog_failure(error, signal) from None
    return JsonBody(
        {
            "entries": [_row_json(rt, entry) for entry in entries],
            "parentAvailable": rt.agents.get(parent_id) is not None,
            # Counted for the whole store: such an entry has no trustworthy parent link
            # (docs/storage-format.md#damage-stays-visible).
            "unlisted": reports[-1].unlisted if reports else 0,
        }
    )


@router.get(
    "/sessions/{pid}/subagents/{cid}/history",
    operation_id="getSubagentHistory",
    response_model=HistoryPage,
    responses=error_responses(400, 401, 403, 404, 409, 500),
)
async def get_subagent_history(
    *,
    parent_id: ParentId,
    child_id: ChildId,
    rt: Rt,
    signal: Signal,
    mode: Annotated[Mode | None, Query(description="When given, the child must have this mode.")] = None,
    before_seq: BeforeSeq = None,
    max_messages: MaxMessages = None,
) -> JsonBody:
    """One history page of a verified child, read through the same query read as `getSessionHistory`."""
    await _verify(rt, parent_id, child_id, mode, signal)
    address = {"parentSessionId": parent_id, "childSessionId": child_id}
    try:
        page = await rt.query.read_history(
            SessionId(child_id), before_seq=before_seq, max_messages=max_messages, signal=signal
        )
    except SessionQueryError as error:
        wire = LIBRARY_CODES.get(error.code)
        if wire == "session-not-found":
            raise WireError("subagent-not-found", "subagent disappeared during history read", address) from None
        if wire == "cancelled" or signal.aborted:
            raise cancelled("the subagent history read") from None
        _log.error('subagent "%s" history read failed (%s)', child_id, error.code)
        raise internal("subagent history read failed") from None
    except Exception as error:
        if signal.aborted:
            raise cancelled("the subagent history read") from None
        _log.error('subagent "%s" history read failed (%s)', child_id, type(error).__name__)
        raise internal("subagent history read failed") from None
    header = page.header
    if header.origin != "subagent" or header.parent_session != parent_id:
        raise WireError(
            "subagent-unauthorized", "subagent parent changed during history read", {"childSessionId": child_id}
        )
    return JsonBody(page_json(page))


@router.post(
    "/sessions/{pid}/subagents/{cid}/prompt",
    operation_id="promptSubagent",
    status_code=202,
    response_model=MessageAccepted,
    responses=error_responses(400, 401, 403, 404, 409, 413, 415, 500, 503),
)
async def prompt_subagent(
    *, request: Request, parent_id: ParentId, child_id: ChildId, body: PromptBody, rt: Rt, signal: Signal
) -> JsonBody:
    """Queue a follow-up as a continuable child's next turn, on behalf of its live parent."""
    time_zone = check_time_zone(body.client_time_zone)
    parent = rt.agents.get(parent_id)
    if parent is None:
        raise WireError(
            "subagent-parent-unavailable", f'parent session "{parent_id}" is not live', {"parentSessionId": parent_id}
        )
    await _verify(rt, parent_id, child_id, "continuable", signal)
    source = UserSource(rpc_id=request_id(request), client_time_zone=time_zone)
    try:
        message_id = await _service(rt).followup(parent, child_id, body.blocks(), source=source, signal=signal)
    except SubagentError as error:
        raise _prompt_failure(error, child_id, signal) from None
    except Exception as error:
        if signal.aborted:
            raise cancelled("the subagent prompt") from None
        _log.error('subagent "%s" prompt failed (%s)', child_id, type(error).__name__)
        raise internal("subagent prompt failed") from None
    return JsonBody({"messageId": message_id}, status_code=202)


def _prompt_failure(error: SubagentError, child_id: str, signal: AbortSignal) -> WireError:
    if signal.aborted:
        return cancelled("the subagent prompt")
    wire = LIBRARY_CODES.get(error.code)
    child = {"childSessionId": child_id}
    if wire == "subagent-not-resumable":
        return WireError("subagent-not-resumable", f'subagent "{child_id}" cannot be resumed', child)
    if wire == "subagent-unauthorized":
        return WireError("subagent-unauthorized", "subagent does not belong to this parent", child)
    if wire == "subagent-delivery-unavailable":
        return WireError("subagent-delivery-unavailable", "subagent delivery is unavailable right now", child)
    _log.error('subagent "%s" prompt failed (%s)', child_id, error.code)
    return internal("subagent prompt failed")


@router.post(
    "/sessions/{pid}/subagents/{cid}/interrupt",
    operation_id="interruptSubagent",
    dependencies=[NO_BODY],
    response_model=Accepted,
    responses=error_responses(400, 401, 403, 404, 413, 415, 500),
)
async def interrupt_subagent(parent_id: ParentId, child_id: ChildId, rt: Rt) -> JsonBody:
    """Cancel the child's current turn for its durable parent; absent, idle or settled children are accepted no-ops."""
    try:
        await _service(rt).interrupt(child_id, UserAuthority(parent_id))
    except SubagentError as error:
        if error.code == "UNAUTHORIZED":
            raise WireError(
                "subagent-unauthorized", "subagent does not belong to this parent", {"childSessionId": child_id}
            ) from None
        _log.error('subagent "%s" interrupt failed (%s)', child_id, error.code)
        raise internal("subagent interrupt failed") from None
    except WireError:
        raise
    except Exception as error:
        _log.error('subagent "%s" interrupt failed (%s)', child_id, type(error).__name__)
        raise internal("subagent interrupt failed") from None
    return JsonBody({"accepted": True})
