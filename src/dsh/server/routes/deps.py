"""What every route shares: the runtime, the request's signal and id, path ids, responses and their docs.

Layer: server. Path ids arrive re-escaped by the middleware (`%` and `/` inside a segment stay
escaped so an id is always one segment); `decode_id` undoes that and applies the id rules of
`dsh.session.ids.id_problem`, so a malformed id is a `bad-request` before anything is looked up.
"""

from __future__ import annotations

import asyncio
import contextlib
import zoneinfo
from collections.abc import AsyncIterator, Mapping
from typing import Annotated, Any, Final
from urllib.parse import unquote

from fastapi import Depends, Path, Query, Request, Response
from pydantic import BeforeValidator

from dsh.abort import AbortSignal
from dsh.json import dumps
from dsh.query.records import HistoryPage
from dsh.runtime import Runtime
from dsh.server.errors import STATUS, WireError, bad_request
from dsh.server.models import MAX_PAGE, EmptyBody, ErrorBody
from dsh.session.ids import id_problem

__all__ = [
    "BeforeSeq",
    "ChildId",
    "JsonBody",
    "MaxMessages",
    "NO_BODY",
    "ParentId",
    "ResumeLocks",
    "SessionIdPath",
    "cancelled",
    "check_time_zone",
    "decode_id",
    "error_responses",
    "internal",
    "page_json",
    "request_id",
    "runtime",
    "signal",
]

MAX_SAFE_INT: Final = 2**53 - 1


class JsonBody(Response):
    """A JSON response encoded by `dsh.json.dumps` (library `to_json()` values go out unchanged)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return dumps(content)


def runtime(request: Request) -> Runtime:
    """The runtime the application serves."""
    rt: Runtime = request.app.state.runtime
    return rt


def signal(request: Request) -> AbortSignal:
    """The request's abort signal (aborted when the client disconnects)."""
    found = getattr(request.state, "signal", None)
    return found if isinstance(found, AbortSignal) else AbortSignal.none()


def request_id(request: Request) -> str | None:
    """The request's `X-Request-Id` (the client's, or a generated one)."""
    found = getattr(request.state, "request_id", None)
    return found if isinstance(found, str) else None


def decode_id(name: str, value: str) -> str:
    """A path id decoded and checked by the session id rules; `bad-request` otherwise."""
    decoded = unquote(value)
    problem = id_problem(decoded)
    if problem is not None:
        raise bad_request(["path", name], problem, "session_id")
    return decoded


_ID_DOC: Final = (
    "A session id: 1-128 UTF-16 code units, no control characters, no lone surrogates "
    "(percent-encode `/` and other reserved characters)."
)


def _session_id(id: Annotated[str, Path(min_length=1, description=_ID_DOC)]) -> str:
    return decode_id("id", id)


def _parent_id(pid: Annotated[str, Path(min_length=1, description="The parent session id. " + _ID_DOC)]) -> str:
    return decode_id("pid", pid)


def _child_id(cid: Annotated[str, Path(min_length=1, description="The child session id. " + _ID_DOC)]) -> str:
    return decode_id("cid", cid)


SessionIdPath = Annotated[str, Depends(_session_id)]
ParentId = Annotated[str, Depends(_parent_id)]
ChildId = Annotated[str, Depends(_child_id)]


def _no_body(body: EmptyBody | None = None) -> None:
    """Nothing: FastAPI has already refused a body that is not empty, `null` or `{}` (`bad-request`)."""


NO_BODY: Final = Depends(_no_body)
"""A route dependency for routes that take no body: a body with fields, or that is not JSON, is `bad-request`."""


def check_time_zone(value: str | None) -> str | None:
    """`value` when it is None, `UTC` or a zone `zoneinfo` can load; `invalid-time-zone` otherwise."""
    if value is None or value == "UTC":
        return value
    try:
        zoneinfo.ZoneInfo(value)
    except Exception:
        raise WireError("invalid-time-zone", "clientTimeZone is not a known time zone", {"value": value}) from None
    return value


def cancelled(what: str) -> WireError:
    """The client went away (nothing is written; the access log says 499)."""
    return WireError("cancelled", f"{what} was cancelled")


def internal(message: str) -> WireError:
    """A failure answered with a fixed message, never a backend's text."""
    return WireError("internal", message)


_DESCRIPTIONS: Final[Mapping[int, str]] = {
    400: "Bad request",
    401: "Missing or wrong bearer token",
    403: "Forbidden",
    404: "Not found",
    409: "Conflict",
    413: "Request body too large",
    415: "Request body is not JSON",
    500: "Internal error",
    502: "The model did not produce a compaction summary",
    503: "Unavailable; retry later",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries for error statuses, each documented with `ErrorBody` and its codes."""
    out: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        codes = ", ".join(f"`{code}`" for code, mapped in STATUS.items() if mapped == status)
        out[status] = {"model": ErrorBody, "description": f"{_DESCRIPTIONS[status]} ({codes})"}
    return out


class ResumeLocks:
    """One lock per session id, so two requests never resume the same stored session at once."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, session_id: str) -> AsyncIterator[None]:
        """Hold the lock of `session_id`; the entry is dropped when nobody holds or waits for it."""
        lock, users = self._locks.get(session_id, (asyncio.Lock(), 0))
        self._locks[session_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[session_id]
            if users <= 1:
                del self._locks[session_id]
            else:
                self._locks[session_id] = (lock, users - 1)


def page_json(page: HistoryPage) -> dict[str, Any]:
    """`HistoryPage.to_json()` with each event wrapped as `{event}` (the wire's `HistoryEntry`)."""
    out = page.to_json()
    events = out["events"]
    assert isinstance(events, list)
    out["events"] = [{"event": event} for event in events]
    return out


def _digits_only(value: object) -> object:
    """Integer query parameters are written in decimal digits: `1.0`, `1e3` or ` 5` are refused."""
    if isinstance(value, str) and not (value.isascii() and value.isdigit()):
        raise ValueError("must be written as a whole number in decimal digits")
    return value


QueryInt = Annotated[int, BeforeValidator(_digits_only)]
"""An integer query parameter, refused with 400 unless written in plain decimal digits."""

BeforeSeq = Annotated[
    QueryInt | None,
    Query(alias="beforeSeq", ge=0, le=MAX_SAFE_INT, description="Read the page before this seq (older events)."),
]
MaxMessages = Annotated[
    QueryInt | None,
    Query(alias="maxMessages", ge=1, le=MAX_PAGE, description="Messages per page (default 50)."),
]
