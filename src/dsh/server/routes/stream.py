"""`GET /api/v1/stream`: the push stream as Server-Sent Events, fed by the application's `PushHub`.

Layer: server. The route subscribes with the repeatable `sessionId` filter and the `Last-Event-ID`
header (a malformed one is passed on as -1, which the hub answers with a `reset` first), then
writes each frame's bytes, and a `: ping` comment whenever the stream was quiet for the ping
interval (15 s by default). The stream ends when the hub ends the subscription (overflow, shutdown)
or when the client disconnects; either way the subscription is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Annotated, Any, Final

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import Response

from dsh.server.errors import bad_request
from dsh.server.replicas import ReplicaSet
from dsh.server.routes.deps import error_responses
from dsh.server.stream import PushHub, Subscription
from dsh.session.ids import id_problem

__all__ = ["EventStream", "router"]

router = APIRouter()

_MAX_FILTER_IDS: Final = 256
_PING: Final = b": ping\n\n"

Scope = Any


class EventStream(Response):
    """A `text/event-stream` response that writes a subscription's frames until it ends or the client leaves."""

    media_type = "text/event-stream"

    def __init__(self, subscription: Subscription, *, ping_interval_s: float) -> None:
        self.status_code = 200
        self.background = None
        self.init_headers({"cache-control": "no-store", "x-accel-buffering": "no"})
        self._subscription = subscription
        self._ping_s = ping_interval_s

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        subscription = self._subscription
        lock = asyncio.Lock()

        async def write(data: bytes) -> None:
            async with lock:
                await send({"type": "http.response.body", "body": data, "more_body": True})

        async def pump() -> None:
            async for frame in subscription:
                await write(frame.encode())

        async def client_gone() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            frames = asyncio.ensure_future(pump())
            gone = asyncio.ensure_future(client_gone())
            try:
                while True:
                    done, _ = await asyncio.wait(
                        {frames, gone}, timeout=self._ping_s, return_when=asyncio.FIRST_COMPLETED
                    )
                    if done:
                        break
                    await write(_PING)
            finally:
                for task in (frames, gone):
                    task.cancel()
                for task in (frames, gone):
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            if frames.done() and not frames.cancelled() and frames.exception() is None:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            subscription.close()


def _last_event_id(value: str | None) -> int | None:
    if value is None:
        return None
    text = value.strip()
    return int(text) if text.isdigit() and len(text) <= 18 else -1


@router.get(
    "/stream",
    operation_id="streamEvents",
    status_code=200,
    response_class=EventStream,
    responses={
        200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}, "description": "Server-Sent Events"},
        **error_responses(400, 401),
    },
)
async def stream_events(
    request: Request,
    session_id: Annotated[
        list[str] | None,
        Query(alias="sessionId", description="Follow these sessions (repeatable); without it only broadcast frames."),
    ] = None,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", include_in_schema=True)] = None,
) -> EventStream:
    """Live frames: session events, projections, statuses, new sessions and subagent starts and ends."""
    ids: frozenset[str] | None = None
    if session_id:
        if len(session_id) > _MAX_FILTER_IDS:
            raise bad_request(["query", "sessionId"], f"at most {_MAX_FILTER_IDS} session ids", "too_many")
        for index, value in enumerate(session_id):
            problem = id_problem(value)
            if problem is not None:
                raise bad_request(["query", "sessionId", index], problem, "session_id")
        ids = frozenset(session_id)
    replicas: ReplicaSet | None = request.app.state.replicas
    subscription: Subscription
    if replicas is not None:
        # Frame ids are store positions, valid on every replica (docs/server.md#replicas).
        subscription = await replicas.subscribe(ids, last_event_id)
    else:
        hub: PushHub = request.app.state.hub
        subscription = hub.subscribe(ids, _last_event_id(last_event_id))
    return EventStream(subscription, ping_interval_s=request.app.state.ping_interval_s)
