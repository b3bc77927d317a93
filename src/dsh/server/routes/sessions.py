"""Session routes: health, the session list, create, get, prompt, interrupt, resume and history.

Layer: server (an adapter: every decision is the library's). Lists read headers only (the query
corpus, zero log reads) and take the status from the agent registry. The three agent-bound routes
(`promptSession`, `interruptSession`, `resumeSession`) first fence by header facts alone: a session
whose header says `origin: "subagent"`, live or stored, is refused with 409 `agent-busy` before
anything is loaded (docs/server.md#owner-checks). History goes through the one shared query read.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
from typing import Annotated, Any, Final
from urllib.parse import quote

import orjson
from fastapi import APIRouter, Depends, Query, Request

from dsh import __version__
from dsh.abort import AbortSignal
from dsh.agent.errors import ModelError
from dsh.agent.loop import Agent
from dsh.agent.messages import UserSource
from dsh.errors import DshError
from dsh.query.errors import SessionQueryError
from dsh.query.records import SessionRecord
from dsh.runtime import Runtime
from dsh.server.errors import LIBRARY_CODES, WireError, bad_request
from dsh.server.models import (
    MAX_PAGE,
    Accepted,
    CompactionOutcome,
    CreateSessionBody,
    Health,
    HistoryPage,
    MessageAccepted,
    PromptBody,
    SessionCreated,
    SessionList,
    SessionSummary,
    summary_json,
)
from dsh.server.routes.deps import (
    NO_BODY,
    BeforeSeq,
    JsonBody,
    MaxMessages,
    QueryInt,
    ResumeLocks,
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
from dsh.session.header import SessionHeader, SessionId

__all__ = ["decode_cursor", "encode_cursor", "router"]

_log = logging.getLogger("dsh.server")

router = APIRouter()

_MAX_CURSOR_CHARS: Final = 1024
_FENCE_REASON: Final = "use subagent delivery for this child session"
_BUSY_REASONS: Final = {
    "AGENT_CLOSING": "the agent is closing",
    "DUPLICATE_AGENT": "the session is being resumed by another request",
    "SESSION_LIVE": "the session is being resumed by another request",
    "SESSION_LEASE_HELD": "another process is writing this session",
}

Rt = Annotated[Runtime, Depends(runtime)]
Signal = Annotated[AbortSignal, Depends(signal)]


# ---------------------------------------------------------------- helpers


def encode_cursor(header: SessionHeader) -> str:
    """The opaque keyset cursor after `header`: base64url of `{createdAt, id}`."""
    raw = orjson.dumps({"createdAt": header.created_at, "id": header.id})
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_cursor(cursor: str) -> tuple[int, str]:
    """`(createdAt, id)` of a cursor; `bad-request` for anything this server did not write."""
    problem = bad_request(["query", "cursor"], "not a cursor this server wrote", "cursor")
    if len(cursor) > _MAX_CURSOR_CHARS:
        raise problem
    try:
        value = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError):
        raise problem from None
    if not isinstance(value, dict) or set(value) != {"createdAt", "id"}:
        raise problem
    created, session_id = value["createdAt"], value["id"]
    if type(created) is not int or type(session_id) is not str:
        raise problem
    return created, session_id


def _status(rt: Runtime, session_id: str) -> str:
    return rt.agents.status(session_id) or "stored"


async def _summary(rt: Runtime, header: SessionHeader) -> dict[str, Any]:
    """The wire summary: title and token total only from a live snapshot or a projection-cache hit."""
    facts = await rt.listed_facts(header)
    tokens = facts.tokens.to_json() if facts.tokens is not None else None
    return summary_json(header, _status(rt, header.id), facts.title, tokens)


async def _corpus(rt: Runtime, signal: AbortSignal) -> list[SessionRecord]:
    try:
        return await rt.query.list_sessions(signal)
    except SessionQueryError as error:
        if error.code == "SESSION_QUERY_ABORTED":
            raise cancelled("session listing") from None
        _log.warning("session listing failed: %s", error.code)
        raise internal("session listing failed") from None


async def _header(rt: Runtime, session_id: str, signal: AbortSignal) -> SessionHeader | None:
    """Header facts only: the live agent's or session's header, else the corpus header (no log read)."""
    agent = rt.agents.get(session_id)
    if agent is not None:
        return agent.session.header
    live = rt.sessions.get(session_id)
    if live is not None:
        return live.header
    for record in await _corpus(rt, signal):
        if record.id == session_id:
            return record.header
    return None


def _not_found(session_id: str) -> WireError:
    return WireError("session-not-found", f'session "{session_id}" not found', {"sessionId": session_id})


async def _fenced_header(rt: Runtime, session_id: str, signal: AbortSignal) -> SessionHeader:
    header = await _header(rt, session_id, signal)
    if header is None:
        raise _not_found(session_id)
    if header.origin == "subagent":
        raise WireError("agent-busy", f'session "{session_id}" is owned by subagent routing', {"reason": _FENCE_REASON})
    return header


def _model_unavailable() -> WireError:
    return WireError(
        "model-unavailable",
        "no model is configured: set DSH_MODEL_API_KEY or DEEPSEEK_API_KEY, or start dsh serve with --script",
        {"reason": "not-configured"},
    )


def agent_failure(session_id: str, error: BaseException, fallback: str) -> WireError:
    """The wire error for a failed resume or send; anything unexpected is `internal` with `fallback`."""
    code = error.code if isinstance(error, DshError) else None
    wire = LIBRARY_CODES.get(code) if code is not None else None
    if wire == "session-not-found":
        return _not_found(session_id)
    if wire == "session-unreadable":
        return WireError("session-unreadable", f'session "{session_id}" could not be read', {"sessionId": session_id})
    if wire == "agent-busy" and code is not None:
        if code == "SESSION_OWNED_BY_SUBAGENT":
            return WireError(
                "agent-busy", f'session "{session_id}" is owned by subagent routing', {"reason": _FENCE_REASON}
            )
        return WireError("agent-busy", f'session "{session_id}" is busy', {"reason": _BUSY_REASONS[code]})
    if wire == "model-unavailable":
        return _model_unavailable()
    if wire == "cancelled":
        return cancelled("the request")
    _log.error('session "%s": %s (%s)', session_id, fallback, type(error).__name__)
    return internal(fallback)


async def _live_agent(request: Request, rt: Runtime, session_id: str, fallback: str) -> Agent:
    """The session's live agent, resuming the stored session as a top-level agent when needed."""
    agent = rt.agents.get(session_id)
    if agent is not None:
        return agent
    locks: ResumeLocks = request.app.state.resume_locks
    async with locks.hold(session_id):
        try:
            return await rt.resume_agent(session_id)
        except Exception as error:
            raise agent_failure(session_id, error, fallback) from None


# ---------------------------------------------------------------- routes


@router.get("/health", operation_id="health", response_model=Health, responses=error_responses(400))
async def health() -> JsonBody:
    """Liveness and version; needs no token."""
    return JsonBody({"ok": True, "version": __version__})


@router.get(
    "/sessions",
    operation_id="listSessions",
    response_model=SessionList,
    responses=error_responses(400, 401, 500),
)
async def list_sessions(
    rt: Rt,
    signal: Signal,
    limit: Annotated[QueryInt, Query(ge=1, le=MAX_PAGE, description="Sessions per page.")] = 50,
    cursor: Annotated[
        str | None, Query(max_length=_MAX_CURSOR_CHARS, description="`nextCursor` of the previous page.")
    ] = None,
    include_subagents: Annotated[
        bool, Query(alias="includeSubagents", description="Also list sessions whose origin is `subagent`.")
    ] = False,
) -> JsonBody:
    """Sessions newest first (headers only, zero log reads), keyset-paged by an opaque cursor."""
    after = decode_cursor(cursor) if cursor is not None else None
    records = await _corpus(rt, signal)
    page: list[SessionRecord] = []
    more = False
    for record in records:
        header = record.header
        if not include_subagents and header.origin == "subagent":
            continue
        if after is not None and (-header.created_at, header.id) <= (-after[0], after[1]):
            continue
        if len(page) == limit:
            more = True
            break
        page.append(record)
    items = [await _summary(rt, record.header) for record in page]
    return JsonBody({"items": items, "nextCursor": encode_cursor(page[-1].header) if more else None})


@router.post(
    "/sessions",
    operation_id="createSession",
    status_code=201,
    response_model=SessionCreated,
    responses={
        **error_responses(400, 401, 409, 413, 415, 500, 503),
        201: {"description": "Created", "headers": {"Location": {"schema": {"type": "string"}}}},
    },
)
async def create_session(request: Request, rt: Rt, body: CreateSessionBody | None = None) -> JsonBody:
    """A new top-level session (cwd = the server's) with a live agent; `prompt`, when given, is sent to it."""
    try:
        rt.model_client()
    except ModelError:
        raise _model_unavailable() from None
    try:
        agent = await rt.create_agent(cwd=os.getcwd())
    except Exception as error:
        raise agent_failure("new", error, "session creation failed") from None
    out: dict[str, Any] = {}
    if body is not None and body.prompt is not None:
        try:
            out["messageId"] = await agent.send(body.prompt, UserSource(rpc_id=request_id(request)))
        except Exception as error:
            raise agent_failure(agent.id, error, "session prompt failed") from None
    out = {"session": summary_json(agent.session.header, _status(rt, agent.id)), **out}
    location = f"/api/v1/sessions/{quote(agent.id, safe='')}"
    return JsonBody(out, status_code=201, headers={"Location": location})


@router.get(
    "/sessions/{id}",
    operation_id="getSession",
    response_model=SessionSummary,
    responses=error_responses(400, 401, 404, 500),
)
async def get_session(session_id: SessionIdPath, rt: Rt, signal: Signal) -> JsonBody:
    """One session's summary (headers only)."""
    agent = rt.agents.get(session_id)
    live = agent.session if agent is not None else rt.sessions.get(session_id)
    if live is not None:
        record = SessionRecord(live.header, live=True, persisted=False)
    else:
        found = [record for record in await _corpus(rt, signal) if record.id == session_id]
        if not found:
            raise _not_found(session_id)
        record = found[0]
    return JsonBody(await _summary(rt, record.header))


@router.post(
    "/sessions/{id}/prompt",
    operation_id="promptSession",
    status_code=202,
    response_model=MessageAccepted,
    responses=error_responses(400, 401, 404, 409, 413, 415, 500, 503),
)
async def prompt_session(
    request: Request, session_id: SessionIdPath, body: PromptBody, rt: Rt, signal: Signal
) -> JsonBody:
    """Queue a prompt as the session's next turn: a live agent gets it, a stored session is resumed first."""
    time_zone = check_time_zone(body.client_time_zone)
    await _fenced_header(rt, session_id, signal)
    agent = await _live_agent(request, rt, session_id, "session prompt failed")
    if signal.aborted:
        raise cancelled("the prompt")
    try:
        message_id = await agent.send(body.blocks(), UserSource(rpc_id=request_id(request), client_time_zone=time_zone))
    except Exception as error:
        raise agent_failure(session_id, error, "session prompt failed") from None
    return JsonBody({"messageId": message_id}, status_code=202)


@router.post(
    "/sessions/{id}/interrupt",
    operation_id="interruptSession",
    dependencies=[NO_BODY],
    response_model=Accepted,
    responses=error_responses(400, 401, 404, 409, 413, 415, 500),
)
async def interrupt_session(session_id: SessionIdPath, rt: Rt) -> JsonBody:
    """Cancel the live agent's current turn (cause `user`, inbox kept); a session without one is a no-op."""
    await _fenced_header(rt, session_id, AbortSignal.none())
    agent = rt.agents.get(session_id)
    if agent is not None:
        agent.cancel("user", keep_inbox=True)
    return JsonBody({"accepted": True})


@router.post(
    "/sessions/{id}/compact",
    operation_id="compactSession",
    dependencies=[NO_BODY],
    response_model=CompactionOutcome,
    responses=error_responses(400, 401, 404, 409, 413, 415, 500, 502, 503),
)
async def compact_session(request: Request, session_id: SessionIdPath, rt: Rt, signal: Signal) -> JsonBody:
    """Compact the session's conversation now (after a running turn); a stored session is resumed first."""
    await _fenced_header(rt, session_id, signal)
    agent = await _live_agent(request, rt, session_id, "session compaction failed")
    try:
        result = await agent.compact(signal=signal)
    except DshError as error:
        if error.code == "COMPACTION_FAILED":
            raise WireError("compaction-failed", str(error), {"sessionId": session_id}) from None
        raise agent_failure(session_id, error, "session compaction failed") from None
    body: dict[str, Any] = {"compacted": result is not None}
    if result is not None:
        body["compaction"] = result.to_json()
    return JsonBody(body)


@router.post(
    "/sessions/{id}/resume",
    operation_id="resumeSession",
    dependencies=[NO_BODY],
    response_model=SessionSummary,
    responses=error_responses(400, 401, 404, 409, 413, 415, 500, 503),
)
async def resume_session(request: Request, session_id: SessionIdPath, rt: Rt, signal: Signal) -> JsonBody:
    """Make a stored top-level session live (its agent registered); a live one is returned as it is."""
    await _fenced_header(rt, session_id, signal)
    agent = await _live_agent(request, rt, session_id, "session resume failed")
    return JsonBody(summary_json(agent.session.header, _status(rt, agent.id)))


@router.get(
    "/sessions/{id}/history",
    operation_id="getSessionHistory",
    response_model=HistoryPage,
    responses=error_responses(400, 401, 404, 500),
)
async def get_session_history(
    session_id: SessionIdPath, rt: Rt, signal: Signal, before_seq: BeforeSeq = None, max_messages: MaxMessages = None
) -> JsonBody:
    """One history page of any session (subagent children included); observation only."""
    try:
        page = await rt.query.read_history(
            SessionId(session_id), before_seq=before_seq, max_messages=max_messages, signal=signal
        )
    except SessionQueryError as error:
        wire = LIBRARY_CODES.get(error.code)
        if wire == "session-not-found":
            raise _not_found(session_id) from None
        if wire == "cancelled":
            raise cancelled("the history read") from None
        if wire == "bad-request":
            raise bad_request(["query"], "beforeSeq or maxMessages is out of range", "range") from None
        _log.warning('history of session "%s" could not be read: %s', session_id, error.code)
        raise WireError(
            "session-unreadable", f'session "{session_id}" could not be read', {"sessionId": session_id}
        ) from None
    return JsonBody(page_json(page))
