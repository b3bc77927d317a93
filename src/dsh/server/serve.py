"""`serve()`: run the HTTP API on uvicorn, in-process, over a `Runtime` it opens and closes.

Layer: server. The order is the one docs/server.md#running-it describes: check the bind
(loopback unless `allow_remote`), load or create the token, bind the socket (so the printed URL has
the real port), open the runtime, build the application, announce the URL, serve. On SIGINT or
SIGTERM the server stops accepting connections, ends every push stream (streams never finish by
themselves, so the graceful shutdown would otherwise wait for them), lets running requests finish,
and then closes the runtime: open turns end `aborted` (cause `disposed`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import Awaitable, Callable, Generator
from types import FrameType
from typing import Final

import uvicorn
from fastapi import FastAPI

from dsh.agent.approval import Permissions
from dsh.agent.model import ModelClient
from dsh.config import Config
from dsh.errors import ConfigError
from dsh.persistence.postgres import PostgresBackend
from dsh.runtime import Runtime
from dsh.server.app import close_streams, create_app
from dsh.server.replicas import ReplicaSet, ReplicaSettings
from dsh.server.routes.deps import ResumeLocks
from dsh.server.security import TOKEN_FILE, ServeToken, check_bind, load_token
from dsh.server.stream import PushHub

__all__ = ["GRACEFUL_SHUTDOWN_S", "ApiServer", "bind_socket", "serve", "uvicorn_config"]

GRACEFUL_SHUTDOWN_S: Final = 10.0
"""How long running requests may take to finish after a stop was asked for."""

_HANDLED: Final = (signal.SIGINT, signal.SIGTERM)


class ApiServer(uvicorn.Server):
    """uvicorn's server with two changes: streams end first on shutdown, and a caught signal is not re-raised.

    Args:
        config: The uvicorn configuration.
        before_shutdown: Awaited once, as soon as a stop was asked for (ends the push streams).
        handle_signals: Install SIGINT/SIGTERM handlers (only `dsh serve`; never in tests).
    """

    def __init__(
        self,
        config: uvicorn.Config,
        *,
        before_shutdown: Callable[[], Awaitable[None]],
        handle_signals: bool = False,
    ) -> None:
        super().__init__(config)
        self._before_shutdown = before_shutdown
        self._handle_signals = handle_signals
        self._shutdown_started = False
        self.ready = asyncio.Event()
        self._wake = asyncio.Event()
        self.signals: list[int] = []
        """The signals that asked this server to stop."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.ready.set()

    def request_exit(self) -> None:
        """Ask the server to stop now (the main loop wakes at once instead of at its next tick)."""
        self.should_exit = True
        self._wake.set()

    async def main_loop(self) -> None:
        # uvicorn's loop, with a wake-up for `request_exit`: a tick every 100 ms otherwise.
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 1) % 864_000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), 0.1)

    async def on_tick(self, counter: int) -> bool:
        should_exit = await super().on_tick(counter)
        if should_exit and not self._shutdown_started:
            self._shutdown_started = True
            await self._before_shutdown()
        return should_exit

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # uvicorn re-raises a caught signal after serving; here the caller decides the exit instead.
        if not self._handle_signals:
            yield
            return
        previous = {sig: signal.signal(sig, self._on_signal) for sig in _HANDLED}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        self.signals.append(sig)
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        self.should_exit = True


def uvicorn_config(app: FastAPI) -> uvicorn.Config:
    """uvicorn settings of `dsh serve`: h11, no lifespan, no access log of its own, no logging setup."""
    return uvicorn.Config(
        app,
        http="h11",
        ws="none",
        lifespan="off",
        access_log=False,
        # No log configuration: it would replace loggers the application and the CLI own.
        log_config=None,
        timeout_graceful_shutdown=int(GRACEFUL_SHUTDOWN_S),
        server_header=False,
    )


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on `host:port` (port 0 picks a free one).

    Raises:
        ConfigError: The address cannot be bound (in use, unknown name, no permission).
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        # The protocol number matters: asyncio sets TCP_NODELAY only on sockets that say IPPROTO_TCP,
        # and without it a response written in two parts waits for the client's delayed ACK.
        sock = socket.socket(family, kind, proto or socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(128)
        except BaseException:
            sock.close()
            raise
    except OSError as error:
        raise ConfigError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    sock.setblocking(False)
    return sock


def _url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host  # noqa: S104 - compared, never bound
    if ":" in shown:
        shown = f"[{shown}]"
    return f"http://{shown}:{port}/"


async def serve(
    config: Config,
    *,
    host: str,
    port: int,
    allow_remote: bool = False,
    rotate_token: bool = False,
    model: ModelClient | None = None,
    announce: Callable[[str], None] = lambda line: None,
    warn: Callable[[str], None] = lambda line: None,
    open_browser: Callable[[str], None] | None = None,
    workspace: str | os.PathLike[str] | None = None,
    permissions: Permissions | None = None,
    token: ServeToken | None = None,
    replica_settings: ReplicaSettings | None = None,
) -> int:
    """Serve until SIGINT or SIGTERM; returns the exit code (130 after SIGINT, else 0).

    Args:
        config: The runtime configuration (home, storage, model settings).
        host: The address to listen on.
        port: The port (0 picks a free one).
        allow_remote: Permit a non-loopback `host` (a warning is given).
        rotate_token: Replace the token (the new one is announced once).
        model: The model client (e.g. a scripted one); None uses `config.model` when a model is needed.
        announce: Receives the lines a person needs: the URL (with the token only when it is new).
        warn: Receives warnings.
        open_browser: Called once the server is ready with the UI's URL, the token in its fragment
            (`dsh serve --open`); it must not block.
        workspace: Give the agents the workspace tools confined to this folder.
        permissions: The agents' permissions (default: from the configuration).
        token: A token shared by replicas (`shared_token`); None uses the home's token file.
        replica_settings: Timings of the replica set, which runs when the store is PostgreSQL
            (docs/server.md#replicas); None takes `config.server.idle_release_s` and the defaults.

    Raises:
        ConfigError: A refused bind, an unsafe token file, or an unusable body limit.
    """
    if check_bind(host, allow_remote=allow_remote):
        warn(f"warning: listening on {host}, reachable from other machines; put TLS in front of it (a reverse proxy)")
    limit = config.server.max_body_bytes
    if token is None:
        token = load_token(config.home, rotate=rotate_token)
    sock = bind_socket(host, port)
    bound_port = sock.getsockname()[1]
    try:
        async with Runtime.open(config, model=model, workspace=workspace, permissions=permissions) as rt:
            hub, locks = PushHub(rt), ResumeLocks()
            replicas = None
            backend = rt.persistence.backend
            if isinstance(backend, PostgresBackend) and not backend.read_only:
                settings = replica_settings or ReplicaSettings(idle_release_s=config.server.idle_release_s)
                replicas = ReplicaSet(rt, hub, backend, locks, settings)
                await replicas.start()
            hub.start()
            app = create_app(
                rt,
                token=token.value,
                bound_host=host,
                max_body_bytes=limit,
                hub=hub,
                replicas=replicas,
                resume_locks=locks,
            )
            server = ApiServer(uvicorn_config(app), before_shutdown=lambda: close_streams(app), handle_signals=True)
            serving = asyncio.ensure_future(server.serve(sockets=[sock]))
            ready = asyncio.ensure_future(server.ready.wait())
            try:
                await asyncio.wait({serving, ready}, return_when=asyncio.FIRST_COMPLETED)
                if server.ready.is_set():
                    url = _url(host, bound_port)
                    if token.fresh:
                        announce(f"{url}#token={token.value}")
                        announce(f"(the token is shown once; it is kept in {token.path})")
                    elif replicas is not None or token.path.name != TOKEN_FILE:
                        announce(url)
                        announce(f"the token is the shared one ({token.path})")
                    else:
                        announce(url)
                        announce(f"the token is in {token.path} (--rotate-token replaces it)")
                    if open_browser is not None:
                        open_browser(f"{url}#token={token.value}")
                await serving
            finally:
                ready.cancel()
                await close_streams(app)
                if replicas is not None:
                    await replicas.aclose()
    finally:
        sock.close()
    return 130 if signal.SIGINT in server.signals else 0
