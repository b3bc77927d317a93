"""One MCP server connection: start, list tools, call, notice a death, restart on the next call.

Layer: tools (private to `dsh.tools.mcp`). The official SDK's transports and `ClientSession` are
anyio context managers that must be entered and left by one task, so each connection runs a serving
task that opens them, lists the tools, hands the live session over and waits until it is told to
stop. Calls are made from the agents' tasks on that session. A failure of the transport (the server
exited, a call timed out, the HTTP endpoint went away) marks the connection dead; the serving task is
then stopped, and the next call starts the server again (docs/tools.md#mcp-servers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import tempfile
from collections.abc import AsyncIterator, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final, Literal

from dsh.agent.errors import ToolError
from dsh.config import McpServerConfig

if TYPE_CHECKING:
    import mcp.types
    from mcp import ClientSession

__all__ = ["McpConnection", "ServerState"]

_log = logging.getLogger("dsh.tools.mcp")

ServerState = Literal["stopped", "running", "failed"]
"""A server's state: not started (or stopped), serving, or its last start or call failed."""

_VARIABLE: Final = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_STOP_GRACE_S: Final = 5.0
_STDERR_TAIL: Final = 400
_CONNECTION_CLOSED: Final = -32000  # the SDK's JSON-RPC code for a closed connection


class McpConnection:
    """The connection to one configured MCP server.

    Args:
        name: The server's configured name.
        config: Its settings.
    """

    def __init__(self, name: str, config: McpServerConfig) -> None:
        self.name = name
        self.config = config
        self.state: ServerState = "stopped"
        self.last_error: str | None = None
        self.tools: tuple[mcp.types.Tool, ...] = ()
        self._session: ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._stderr: Any = None
        self._lock = asyncio.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"McpConnection({self.name!r}, {self.config.transport}, state={self.state!r})"

    # ---------------------------------------------------------------- start and stop

    async def start(self) -> None:
        """Start the server and list its tools (a running connection is left as it is).

        Raises:
            ToolError: `MCP_SERVER_UNAVAILABLE` naming the server and what went wrong.
        """
        async with self._lock:
            if self._closed:
                raise self._unavailable("the runtime is closing")
            if self._session is not None:
                return
            await self._start_locked()

    async def _start_locked(self) -> None:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[tuple[ClientSession, tuple[mcp.types.Tool, ...]]] = loop.create_future()
        stop = asyncio.Event()
        stderr = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115 - closed by stop()
        task = loop.create_task(self._serve(ready, stop, stderr), name=f"dsh-mcp-{self.name}")
        try:
            async with asyncio.timeout(self.config.startup_timeout_s):
                session, tools = await asyncio.shield(ready)
        except BaseException as error:
            stop.set()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            if isinstance(error, asyncio.CancelledError):
                raise
            if isinstance(error, TimeoutError):
                why = f"it did not start within {self.config.startup_timeout_s:g} s"
            elif _closed(error):
                why = "the server closed the connection during start-up (did it exit?)"
            else:
                why = _describe(error)
            self.state = "failed"
            self.last_error = why + _stderr_tail(stderr)
            stderr.close()
            raise self._unavailable(self.last_error) from None
        self._session, self._task, self._stop, self._stderr = session, task, stop, stderr
        self.tools = tools
        self.state = "running"
        self.last_error = None

    async def _serve(
        self,
        ready: asyncio.Future[tuple[ClientSession, tuple[mcp.types.Tool, ...]]],
        stop: asyncio.Event,
        stderr: Any,
    ) -> None:
        from mcp import ClientSession

        try:
            async with contextlib.AsyncExitStack() as stack:
                streams = await stack.enter_async_context(self._transport(stderr))
                session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
                await session.initialize()
                tools = await _list_tools(session)
                if not ready.done():
                    ready.set_result((session, tools))
                await stop.wait()
        except BaseException as error:
            if not ready.done():
                ready.set_exception(error if isinstance(error, Exception) else RuntimeError(repr(error)))
            elif not isinstance(error, asyncio.CancelledError):
                _log.debug('MCP server "%s": its connection closed with %r', self.name, error)
            if isinstance(error, asyncio.CancelledError):
                raise

    def _transport(self, stderr: Any) -> contextlib.AbstractAsyncContextManager[tuple[Any, ...]]:
        config = self.config
        if config.command is not None:
            from mcp import StdioServerParameters
            from mcp.client.stdio import stdio_client

            parameters = StdioServerParameters(
                command=config.command,
                args=list(config.args),
                env={key: self._expand(value, f"env.{key}") for key, value in config.env.items()} or None,
                cwd=config.cwd,
            )
            return stdio_client(parameters, errlog=stderr)
        assert config.url is not None
        headers = {key: self._expand(value, f"headers.{key}") for key, value in config.headers.items()}
        return _http_transport(config.url, headers, config.startup_timeout_s, config.call_timeout_s)

    def _expand(self, value: str, where: str) -> str:
        def variable(found: re.Match[str]) -> str:
            name = found.group(1)
            resolved = os.environ.get(name)
            if resolved is None:
                raise ValueError(f"the environment variable {name} (named by {where}) is not set")
            return resolved

        return _VARIABLE.sub(variable, value)

    async def stop(self) -> None:
        """Stop the server (the next call starts it again); idempotent."""
        task, stop, stderr = self._task, self._stop, self._stderr
        self._session = self._task = self._stop = self._stderr = None
        if self.state == "running":
            self.state = "stopped"
        if task is not None and stop is not None:
            stop.set()
            done, _ = await asyncio.wait({task}, timeout=_STOP_GRACE_S)
            if not done:
                task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if stderr is not None:
            stderr.close()

    async def aclose(self) -> None:
        """Stop the server for good: later calls fail with `MCP_SERVER_UNAVAILABLE`."""
        self._closed = True
        async with self._lock:
            await self.stop()

    # ---------------------------------------------------------------- calls

    async def call(self, tool: str, arguments: Mapping[str, Any]) -> mcp.types.CallToolResult:
        """Call `tool` (the server's own name), starting the server first when it is not running.

        Raises:
            ToolError: `MCP_SERVER_UNAVAILABLE` when the server cannot be started, dies during the
                call or does not answer within `call_timeout_s` (it is then restarted on the next
                call); `MCP_CALL_FAILED` when it answers with a protocol error.
        """
        import anyio
        from mcp.shared.exceptions import McpError

        await self.start()
        session = self._session
        assert session is not None
        try:
            try:
                return await self._send(session, tool, arguments)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                # The server went away since the last call, before this one was sent: start it again
                # and send the call once more (nothing reached the old server).
                _log.info('MCP server "%s" had exited; starting it again', self.name)
                async with self._lock:
                    if self._session is session:
                        await self.stop()
                await self.start()
                session = self._session
                assert session is not None
                return await self._send(session, tool, arguments)
        except McpError as error:
            if error.error.code != _CONNECTION_CLOSED:
                raise ToolError(
                    f'MCP server "{self.name}" refused the call of {tool}: {error.error.message}',
                    code="MCP_CALL_FAILED",
                    name=tool,
                ) from None
            raise await self._died(tool, "the server exited during the call") from None
        except TimeoutError:
            raise await self._died(tool, f"no answer within {self.config.call_timeout_s:g} s") from None
        except asyncio.CancelledError:
            raise
        except Exception as error:
            raise await self._died(tool, _describe(error)) from None

    async def _send(self, session: ClientSession, tool: str, arguments: Mapping[str, Any]) -> mcp.types.CallToolResult:
        # The SDK's streamable HTTP transport swallows a stream that breaks mid-call (the call would
        # wait forever), so the call timeout is what notices an HTTP server that went away.
        async with asyncio.timeout(self.config.call_timeout_s):
            return await session.call_tool(
                tool, dict(arguments), read_timeout_seconds=timedelta(seconds=self.config.call_timeout_s)
            )

    async def _died(self, tool: str, why: str) -> ToolError:
        """Record a failed call, warn once, stop what is left of the connection; the error to raise."""
        async with self._lock:
            await self.stop()
        self.state = "failed"
        self.last_error = why
        _log.warning(
            'MCP server "%s" failed during a call of %s: %s; it is restarted on the next call', self.name, tool, why
        )
        return self._unavailable(f"{why} (calling {tool}); it is restarted on the next call")

    def _unavailable(self, why: str) -> ToolError:
        return ToolError(f'MCP server "{self.name}" is unavailable: {why}', code="MCP_SERVER_UNAVAILABLE")


@contextlib.asynccontextmanager
async def _http_transport(
    url: str, headers: Mapping[str, str], connect_s: float, read_s: float
) -> AsyncIterator[tuple[Any, ...]]:
    """The SDK's streamable HTTP transport over an HTTP client of ours (headers, timeouts), closed after it."""
    import httpx
    from mcp.client.streamable_http import streamable_http_client

    timeout = httpx.Timeout(connect_s, read=read_s)
    async with (
        httpx.AsyncClient(headers=dict(headers), timeout=timeout) as client,
        streamable_http_client(url, http_client=client) as streams,
    ):
        yield streams


async def _list_tools(session: ClientSession) -> tuple[mcp.types.Tool, ...]:
    """Every page of the server's tool list; a name listed twice makes the list invalid."""
    tools: list[mcp.types.Tool] = []
    cursor: str | None = None
    while True:
        page = await session.list_tools(cursor=cursor)
        tools += page.tools
        cursor = page.nextCursor
        if not cursor:
            break
    names = [tool.name for tool in tools]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"the server lists these tools twice: {', '.join(duplicates)}")
    return tuple(tools)


def _closed(error: BaseException) -> bool:
    import anyio
    from mcp.shared.exceptions import McpError

    if isinstance(error, BaseExceptionGroup):
        return any(_closed(inner) for inner in error.exceptions)
    if isinstance(error, anyio.BrokenResourceError | anyio.ClosedResourceError | anyio.EndOfStream):
        return True  # the process exited while the handshake was being written or read
    return isinstance(error, McpError) and error.error.code == _CONNECTION_CLOSED


def _describe(error: BaseException) -> str:
    if isinstance(error, BaseExceptionGroup):
        return "; ".join(_describe(inner) for inner in error.exceptions)
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _stderr_tail(stderr: Any) -> str:
    """The end of what a stdio server wrote to stderr, for the failure's message."""
    try:
        stderr.flush()
        stderr.seek(0)
        text = stderr.read().strip()
    except (OSError, ValueError):
        return ""
    if not text:
        return ""
    tail = text[-_STDERR_TAIL:]
    return f" (stderr: {'…' if len(text) > len(tail) else ''}{' '.join(tail.split())})"
