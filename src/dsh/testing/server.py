"""`running_server`: the HTTP API of `dsh serve` on 127.0.0.1:0, inside the caller's event loop.

Layer: testing (shipped, importable; needs fastapi, uvicorn and httpx, which `import dsh.testing`
does not load). The server runs as a task on the running loop, next to the caller's `Runtime`, so
a test can drive the runtime (release a scripted gate, settle agents) while real HTTP requests are
in flight, and a client that closes its connection really disconnects. On exit the push streams
end first, then uvicorn stops; the runtime stays open (its owner closes it).

    async with Runtime.open(config, model=scripted) as rt, running_server(rt) as server:
        async with server.client() as http:
            response = await http.get("/api/v1/sessions")
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import FastAPI

from dsh.runtime import Runtime
from dsh.server.app import DEFAULT_MAX_BODY_BYTES, close_streams, create_app
from dsh.server.serve import ApiServer, bind_socket, uvicorn_config
from dsh.server.stream import PushHub

__all__ = ["LiveServer", "running_server"]

_START_GUARD_S = 30.0


@dataclass(frozen=True, slots=True)
class LiveServer:
    """A running in-process server.

    Attributes:
        base_url: `http://127.0.0.1:<port>`.
        token: The bearer token it requires.
        app: The FastAPI application (its `state` holds the runtime and the push hub).
    """

    base_url: str
    token: str
    app: FastAPI

    @property
    def hub(self) -> PushHub:
        """The application's push hub."""
        hub: PushHub = self.app.state.hub
        return hub

    def client(self, *, token: str | None = None, **options: Any) -> httpx.AsyncClient:
        """An httpx client on `base_url` sending the token (pass `token=""` for none)."""
        value = self.token if token is None else token
        headers = dict(options.pop("headers", {}))
        if value:
            headers.setdefault("Authorization", f"Bearer {value}")
        options.setdefault("timeout", _START_GUARD_S)
        return httpx.AsyncClient(base_url=self.base_url, headers=headers, **options)


@contextlib.asynccontextmanager
async def running_server(
    runtime: Runtime,
    *,
    token: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    hub: PushHub | None = None,
    ping_interval_s: float = 15.0,
) -> AsyncIterator[LiveServer]:
    """Serve `runtime` on 127.0.0.1:0 until the block ends (see the module docs)."""
    value = token if token is not None else secrets.token_urlsafe(32)
    app = create_app(
        runtime,
        token=value,
        bound_host="127.0.0.1",
        max_body_bytes=max_body_bytes,
        hub=hub,
        ping_interval_s=ping_interval_s,
    )
    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = ApiServer(uvicorn_config(app), before_shutdown=lambda: close_streams(app))
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    try:
        ready = asyncio.ensure_future(server.ready.wait())
        done, _ = await asyncio.wait({serving, ready}, timeout=_START_GUARD_S, return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        if serving in done:
            serving.result()
        if not server.ready.is_set():
            raise RuntimeError(f"the API server did not start within {_START_GUARD_S:g} s")
        yield LiveServer(f"http://127.0.0.1:{port}", value, app)
    finally:
        await close_streams(app)
        server.request_exit()
        try:
            await asyncio.wait_for(asyncio.shield(serving), _START_GUARD_S)
        except TimeoutError:
            server.force_exit = True
            await serving
        sock.close()
