"""The ASGI middleware every HTTP request passes first: checks, body limit, request id, abort, access log.

Layer: server. One pure ASGI middleware (no `BaseHTTPMiddleware`: it must see the raw `receive`
channel to notice a client that goes away). In order, for each request (docs/server.md#limits):

1. `X-Request-Id`: a valid client value (1-128 visible ASCII characters) is kept, else one is
   generated; every response carries it, and handlers read it from `request.state.request_id`.
2. The `Host` check (`security.HostCheck`) → 400 `bad-request`.
3. The bearer token for every `/api/v1` path except `/api/v1/health` → 401 `unauthenticated` with
   `WWW-Authenticate: Bearer`; nothing of the request is read before this.
4. The body limit, on the declared `Content-Length` and on the bytes actually received, before any
   JSON parsing → 413 `payload-too-large` `{limit}`; the handler never runs. The body is read whole
   here (it is small) and replayed to the application.
5. A body that is not `application/json` (or `+json`) → 415 `unsupported-media-type`; a `GET` or
   `HEAD` request with a body → 400 `bad-request` (those routes take none).
6. Path segments are re-escaped so that an id holding `/` or `%` stays one path parameter; routes
   decode their ids with `routes.deps.session_id`.
7. An `AbortController` per request (`request.state.signal`): a watcher owns the `receive` channel
   and aborts it when the client disconnects before the response is complete. A request whose
   client left before the response started writes nothing and is logged with status 499.
8. The access log (`dsh.server.access`): method, raw path, status and duration. Never a body, a
   header, a token or a key.

Every `/api/v1` response, errors included, carries `Cache-Control: no-store` unless its route set
its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final
from urllib.parse import unquote_to_bytes

import orjson

from dsh.abort import AbortController
from dsh.server.errors import WireError, bad_request, status_of
from dsh.server.security import HostCheck, bearer_matches

__all__ = ["CLIENT_GONE_STATUS", "ApiMiddleware", "ClientDisconnected"]

_BODILESS_METHODS: Final = frozenset({"GET", "HEAD"})

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

CLIENT_GONE_STATUS: Final = 499
"""The status the access log records for a request whose client left before any response."""

_REQUEST_ID: Final = re.compile(r"[\x21-\x7e]{1,128}")
_API_PREFIX: Final = "/api/v1"
_PUBLIC_PATHS: Final = frozenset({"/api/v1/health", "/api/v1/ready"})

_access_log = logging.getLogger("dsh.server.access")
_log = logging.getLogger("dsh.server")


class ClientDisconnected(Exception):  # noqa: N818 - an abort reason, not an error raised to callers
    """The reason a request's signal is aborted with when its client goes away."""


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


def _is_api(path: str) -> bool:
    return path == _API_PREFIX or path.startswith(_API_PREFIX + "/")


def _needs_token(path: str) -> bool:
    return _is_api(path) and path not in _PUBLIC_PATHS


def _is_json(content_type: str | None) -> bool:
    if content_type is None:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _escaped_path(scope: Scope) -> str | None:
    """The request path with every segment decoded once and `%`/`/` re-escaped; None for bad UTF-8."""
    raw = scope.get("raw_path")
    if not isinstance(raw, bytes | bytearray):
        return "/".join(segment.replace("%", "%25") for segment in str(scope.get("path", "")).split("/"))
    segments = []
    for segment in bytes(raw).split(b"?", 1)[0].split(b"/"):
        try:
            text = unquote_to_bytes(segment).decode("utf-8")
        except UnicodeDecodeError:
            return None
        segments.append(text.replace("%", "%25").replace("/", "%2F"))
    return "/".join(segments)


class _Exchange:
    """The response side of one request: adds `X-Request-Id`, records the status, drops writes once the client left."""

    def __init__(self, send: Send, request_id: str, *, api: bool) -> None:
        self._send = send
        self._request_id = request_id.encode("ascii")
        self._api = api
        self.status: int | None = None
        self.started = False
        self.complete = False
        self.gone = asyncio.Event()

    async def send(self, message: Message) -> None:
        if self.gone.is_set() and not self.started:
            return  # the client left before any response: write nothing
        if message["type"] == "http.response.start":
            self.started = True
            self.status = int(message["status"])
            headers = [(k, v) for k, v in message.get("headers", ()) if bytes(k).lower() != b"x-request-id"]
            headers.append((b"x-request-id", self._request_id))
            if self._api and not any(bytes(k).lower() == b"cache-control" for k, _ in headers):
                # API answers hold session content: no browser or proxy may keep a copy.
                headers.append((b"cache-control", b"no-store"))
            message = {**message, "headers": headers}
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self.complete = True
        await self._send(message)

    async def error(self, error: WireError, extra: dict[str, str] | None = None) -> None:
        body = orjson.dumps(error.body())
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode("ascii")),
        ]
        for name, value in {**error.headers(), **(extra or {})}.items():
            headers.append((name.lower().encode("latin-1"), value.encode("latin-1")))
        await self.send({"type": "http.response.start", "status": status_of(error.code), "headers": headers})
        await self.send({"type": "http.response.body", "body": body, "more_body": False})


class ApiMiddleware:
    """See the module docs.

    Args:
        app: The FastAPI application.
        token: The bearer token.
        host_check: Which `Host` headers are answered.
        max_body_bytes: The largest request body.
    """

    def __init__(self, app: ASGIApp, *, token: str, host_check: HostCheck, max_body_bytes: int) -> None:
        self.app = app
        self._token = token
        self._host_check = host_check
        self._limit = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        offered = _header(scope, b"x-request-id")
        request_id = offered if offered is not None and _REQUEST_ID.fullmatch(offered) else uuid.uuid4().hex
        exchange = _Exchange(send, request_id, api=_is_api(str(scope.get("path", ""))))
        try:
            await self._handle(scope, receive, exchange, request_id)
        finally:
            status = exchange.status if exchange.started else CLIENT_GONE_STATUS if exchange.gone.is_set() else None
            raw = scope.get("raw_path")
            path = bytes(raw).decode("latin-1") if isinstance(raw, bytes | bytearray) else scope.get("path", "")
            _access_log.info(
                "%s %s %s %.1fms%s",
                scope.get("method", "?"),
                path,
                status if status is not None else "-",
                (time.perf_counter() - started) * 1000,
                " cancelled" if status == CLIENT_GONE_STATUS else "",
            )

    async def _handle(self, scope: Scope, receive: Receive, exchange: _Exchange, request_id: str) -> None:
        if not self._host_check.allows(_header(scope, b"host")):
            await exchange.error(bad_request(["header", "host"], "this server does not answer that host name", "host"))
            return
        path = str(scope.get("path", ""))
        if _needs_token(path) and not bearer_matches(_header(scope, b"authorization"), self._token):
            await exchange.error(
                WireError("unauthenticated", "a valid bearer token is required"), {"WWW-Authenticate": "Bearer"}
            )
            return
        declared = _header(scope, b"content-length")
        takes_body = scope.get("method") not in _BODILESS_METHODS
        if declared is not None:
            if not declared.strip().isdigit():
                await exchange.error(bad_request(["header", "content-length"], "not a byte count", "header"))
                return
            if not takes_body and int(declared) > 0:
                await exchange.error(self._no_body(scope))
                return
            if int(declared) > self._limit:
                await exchange.error(self._too_large())
                return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                exchange.gone.set()
                return
            body += message.get("body", b"")
            if len(body) > self._limit:
                await exchange.error(self._too_large())
                return
            if body and not takes_body:
                await exchange.error(self._no_body(scope))
                return
            if not message.get("more_body", False):
                break
        if body and not _is_json(_header(scope, b"content-type")):
            await exchange.error(WireError("unsupported-media-type", "the request body must be application/json"))
            return
        escaped = _escaped_path(scope)
        if escaped is None:
            await exchange.error(bad_request(["path"], "the path is not valid UTF-8", "path"))
            return
        controller = AbortController()
        inner: Scope = {**scope, "path": escaped}
        state = dict(scope.get("state") or {})
        state.update(request_id=request_id, signal=controller.signal)
        inner["state"] = state
        watcher = asyncio.ensure_future(self._watch(receive, exchange, controller))
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            await exchange.gone.wait()
            return {"type": "http.disconnect"}

        try:
            await self.app(inner, replay, exchange.send)
        except Exception:
            if exchange.gone.is_set():
                _log.debug("request %s ended after its client left", request_id, exc_info=True)
            elif not exchange.started:
                _log.exception("request %s failed", request_id)
                await exchange.error(WireError("internal", "internal server error"))
            else:
                raise
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    async def _watch(self, receive: Receive, exchange: _Exchange, controller: AbortController) -> None:
        """Own the receive channel; abort the request's signal when the client leaves early."""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
        if not exchange.complete:
            exchange.gone.set()
            controller.abort(ClientDisconnected("the client disconnected"))

    @staticmethod
    def _no_body(scope: Scope) -> WireError:
        return bad_request(["body"], f"a {scope.get('method')} request takes no body", "body")

    def _too_large(self) -> WireError:
        return WireError("payload-too-large", f"the request body exceeds {self._limit} bytes", {"limit": self._limit})
