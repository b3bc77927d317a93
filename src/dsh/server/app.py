"""`create_app`: the FastAPI application of `dsh serve` over one open `Runtime`.

Layer: server (only `dsh serve`, this package and `dsh.testing` import fastapi). The application
holds no business logic: routes call the runtime's services and translate their errors through the
one status table of `dsh.server.errors`. It adds:

* remote approval decisions on the runtime's `ApprovalBroker` (a question waits for `decideApproval`);
* the routes of `dsh.server.routes` under `/api/v1`, each with its stable `operationId`, and the
  web UI's `/` and `/static/<name>` (`routes.ui`; no token, left out of the OpenAPI document);
* exception handlers that turn `WireError`, request-validation failures (always `bad-request`, never
  422) and routing errors (`not-found`, `method-not-allowed`) into the one error body;
* `ApiMiddleware` (token, Host check, body limit, request id, abort on disconnect, access log);
* `/openapi.json` without a token; Swagger UI and ReDoc are off (they would load CDN assets).
  The document declares bearer auth, leaves out FastAPI's unused 422 responses, and documents every
  error response with `ErrorBody`.

The push stream's `PushHub` is passed in, or built and started here; `close_streams(app)` ends
every stream (call it before the HTTP server waits for open connections to finish).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Final

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute

from dsh import __version__
from dsh.runtime import Runtime
from dsh.server.errors import WireError
from dsh.server.middleware import ApiMiddleware
from dsh.server.replicas import ReplicaSet
from dsh.server.routes import approvals, sessions, stream, subagents, ui
from dsh.server.routes.deps import JsonBody, ResumeLocks
from dsh.server.security import HostCheck
from dsh.server.stream import PushHub

__all__ = ["DEFAULT_MAX_BODY_BYTES", "close_streams", "create_app"]

DEFAULT_MAX_BODY_BYTES: Final = 1 << 20
"""The request body limit (1 MiB) unless `config.server.max_body_bytes` (`DSH_SERVE_MAX_BODY_BYTES`) says otherwise."""

_PUBLIC_OPERATIONS: Final = frozenset({"health", "ready"})
_MAX_LOC_CHARS: Final = 64


def create_app(
    runtime: Runtime,
    *,
    token: str,
    bound_host: str,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    hub: PushHub | None = None,
    ping_interval_s: float = 15.0,
    replicas: ReplicaSet | None = None,
    resume_locks: ResumeLocks | None = None,
) -> FastAPI:
    """The application over an open `runtime`.

    Args:
        runtime: An open runtime; the application never opens or closes it.
        token: The bearer token every `/api/v1` route but `health` requires.
        bound_host: The address the server listens on (for the `Host` check).
        max_body_bytes: The largest request body (413 above it).
        hub: The push stream's hub; None builds one on `runtime` and starts it.
        ping_interval_s: How long a quiet stream waits before it writes a `: ping` comment.
        replicas: The replica set when several replicas share a PostgreSQL store (docs/server.md#replicas),
            started on `hub`; the push stream and the prompt, interrupt and approval routes then
            reach the other replicas through it.
        resume_locks: The resume locks (shared with `replicas`); None makes new ones.
    """
    if max_body_bytes < 1:
        raise ValueError("max_body_bytes must be at least 1")
    app = FastAPI(
        title="dsh",
        version=__version__,
        description="The HTTP API of `dsh serve`: sessions, history pages, the subagent catalog and a push stream.",
        docs_url=None,
        redoc_url=None,
        swagger_ui_oauth2_redirect_url=None,
        openapi_url="/openapi.json",
        redirect_slashes=False,
    )
    broker = runtime.services.approvals
    if broker is not None and broker.answerer is None and broker.remote_timeout_s is None:
        # Over HTTP an approval waits for `decideApproval` (docs/server.md#approvals).
        broker.enable_remote(runtime.config.approvals.timeout_s)
    if hub is None:
        hub = PushHub(runtime)
        hub.start()
    app.state.runtime = runtime
    app.state.hub = hub
    app.state.ping_interval_s = ping_interval_s
    app.state.resume_locks = resume_locks if resume_locks is not None else ResumeLocks()
    app.state.replicas = replicas
    app.router.routes.extend(_api_routes())
    app.add_exception_handler(WireError, _wire_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    app.add_middleware(ApiMiddleware, token=token, host_check=HostCheck(bound_host), max_body_bytes=max_body_bytes)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _document(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


@functools.cache
def _api_routes() -> tuple[BaseRoute, ...]:
    """The `/api/v1` routes and the UI's routes, built once per process and shared by every application.

    Route objects hold no per-application state (handlers reach the runtime through `request.app`),
    and FastAPI builds each route's validation models lazily on its first request; sharing the
    routes means a second application in the same process (tests, an in-process restart) does not
    build them again.
    """
    template = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    for module in (sessions, subagents, approvals, stream):
        template.include_router(module.router, prefix="/api/v1")
    template.include_router(ui.router)
    return tuple(template.router.routes)


async def close_streams(app: FastAPI) -> None:
    """End every push stream (after its queued frames); idempotent."""
    hub: PushHub = app.state.hub
    await hub.aclose()


# ---------------------------------------------------------------- errors


async def _wire_error(request: Request, error: WireError) -> JsonBody:
    return JsonBody(error.body(), status_code=error.status, headers=error.headers())


def _loc(part: object) -> str | int:
    if isinstance(part, int):
        return part
    text = str(part)
    return text if len(text) <= _MAX_LOC_CHARS else text[: _MAX_LOC_CHARS - 1] + "…"


async def _validation_error(request: Request, error: RequestValidationError) -> JsonBody:
    # `msg` and `type` describe the rule; the offending input (pydantic's `input`/`ctx`) is dropped.
    issues = [
        {"loc": [_loc(part) for part in item.get("loc", ())], "msg": str(item.get("msg", "")), "type": item.get("type")}
        for item in error.errors()
    ]
    wire = WireError("bad-request", "the request is invalid", {"issues": issues})
    return JsonBody(wire.body(), status_code=wire.status)


async def _http_error(request: Request, error: StarletteHTTPException) -> JsonBody:
    if error.status_code == 404:
        wire = WireError("not-found", "no such route")
    elif error.status_code == 405:
        wire = WireError("method-not-allowed", "the route does not allow this method")
    elif 400 <= error.status_code < 500:
        wire = WireError("bad-request", "the request is invalid", {"issues": []})
    else:
        wire = WireError("internal", "internal server error")
    headers = dict(error.headers or {})
    return JsonBody(wire.body(), status_code=wire.status, headers=headers)


# ---------------------------------------------------------------- the OpenAPI document


def _non_null(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A parameter schema `anyOf: [X, null]` becomes X (a query parameter is absent, never null)."""
    options = schema.get("anyOf")
    if isinstance(options, list):
        kept = [option for option in options if option != {"type": "null"}]
        if len(kept) == 1:
            merged = {key: value for key, value in schema.items() if key != "anyOf"}
            merged.update(kept[0])
            return merged
    return dict(schema)


def _document(app: FastAPI) -> dict[str, Any]:
    document = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    components = document.setdefault("components", {})
    components.setdefault("securitySchemes", {})["bearerAuth"] = {"type": "http", "scheme": "bearer"}
    for item in document.get("paths", {}).values():
        for operation in item.values():
            responses = operation.get("responses", {})
            responses.pop("422", None)
            for status, response in responses.items():
                content = response.get("content")
                if int(status) >= 400 and content:
                    # Errors are JSON whatever the route's success media type (the stream's is SSE).
                    response["content"] = {"application/json": next(iter(content.values()))}
            for parameter in operation.get("parameters", ()):
                if "schema" in parameter:
                    parameter["schema"] = _non_null(parameter["schema"])
            if operation.get("operationId") not in _PUBLIC_OPERATIONS:
                operation["security"] = [{"bearerAuth": []}]
    schemas = components.get("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    return document
