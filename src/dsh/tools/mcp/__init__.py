"""MCP servers as tools: the configured servers' tools, offered to every agent of a runtime.

Layer: tools. `McpHub(config.mcp)` owns one connection per enabled server
(`[mcp.servers.<name>]` in the configuration file, docs/tools.md#mcp-servers). `start()` starts them
all at once, before any agent's first model request, so their tool lists are part of it; a server
that fails to start costs one WARNING and offers no tools, and the others are unaffected. Each tool
is an `McpTool` named `mcp__<server>__<tool>` (`dsh.agent.mcp_names.mcp_tool_name`); its calls go through
the approval rules (every MCP tool asks unless configured otherwise). A server that dies or hangs
during a call turns that call into an errored result and is started again by the next call.
`aclose()` stops every server. `probe(config.mcp)` starts each server once to report on it, which is
what `dsh mcp list` shows. The SDK (`mcp`) is imported only when a server is started.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from dsh.agent.errors import ToolError
from dsh.agent.mcp_names import mcp_tool_name
from dsh.agent.tools import Tool
from dsh.config import McpConfig
from dsh.tools.mcp._connection import McpConnection, ServerState
from dsh.tools.mcp._tool import McpTool

__all__ = ["McpConnection", "McpHub", "McpServerReport", "McpTool", "McpToolInfo", "ServerState", "probe"]

_log = logging.getLogger("dsh.tools.mcp")


@dataclass(frozen=True, slots=True)
class McpToolInfo:
    """One tool a server lists: the server's name for it, the model's, and its description."""

    name: str
    public_name: str
    description: str


@dataclass(frozen=True, slots=True)
class McpServerReport:
    """What one configured server looks like (`dsh mcp list`).

    Attributes:
        name: The configured name.
        transport: `stdio` or `streamable-http`.
        target: The command line or the URL.
        enabled: False when the configuration keeps it switched off (it is not started).
        started: True when it started and listed its tools.
        error: Why it did not start.
        tools: Its tools, when it started.
    """

    name: str
    transport: str
    target: str
    enabled: bool
    started: bool
    error: str | None = None
    tools: tuple[McpToolInfo, ...] = ()


class McpHub:
    """The configured MCP servers of one runtime and the tools they offer."""

    def __init__(self, config: McpConfig) -> None:
        self.connections = tuple(
            McpConnection(name, server) for name, server in sorted(config.servers.items()) if server.enabled
        )
        self._tools: list[Tool] = []

    def __repr__(self) -> str:
        return f"McpHub({[connection.name for connection in self.connections]!r})"

    async def start(self) -> None:
        """Start every server at once; each one that fails is logged once (WARNING) and offers no tools."""
        results = await asyncio.gather(*(connection.start() for connection in self.connections), return_exceptions=True)
        tools: list[Tool] = []
        for connection, outcome in zip(self.connections, results, strict=True):
            if isinstance(outcome, asyncio.CancelledError):
                raise outcome
            if isinstance(outcome, BaseException):
                _log.warning("%s; its tools are not offered", outcome)
                continue
            tools += [McpTool(connection, tool) for tool in connection.tools]
        self._tools = tools

    def tools(self) -> list[Tool]:
        """The tools of the servers that started, by server, in the order each server lists them."""
        return list(self._tools)

    async def aclose(self) -> None:
        """Stop every server."""
        await asyncio.gather(*(connection.aclose() for connection in self.connections), return_exceptions=True)


# Shown under the name users import (docs/architecture.md#public-names).
McpConnection.__module__ = __name__
McpTool.__module__ = __name__


async def probe(config: McpConfig) -> list[McpServerReport]:
    """Start each configured server (at once), list its tools, stop it; one report per server, by name."""

    async def report(name: str) -> McpServerReport:
        server = config.servers[name]
        target = " ".join([server.command, *server.args]) if server.command is not None else str(server.url)
        if not server.enabled:
            return McpServerReport(name, server.transport, target, enabled=False, started=False)
        connection = McpConnection(name, server)
        try:
            await connection.start()
        except ToolError as error:
            return McpServerReport(
                name, server.transport, target, True, False, error=connection.last_error or str(error)
            )
        finally:
            await connection.aclose()
        tools = tuple(
            McpToolInfo(tool.name, mcp_tool_name(name, tool.name), tool.description or "") for tool in connection.tools
        )
        return McpServerReport(name, server.transport, target, True, True, tools=tools)

    return list(await asyncio.gather(*(report(name) for name in sorted(config.servers))))
