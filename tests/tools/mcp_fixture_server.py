"""A real MCP server written with the SDK's FastMCP, for the MCP client tests.

Run as `python mcp_fixture_server.py stdio` or `python mcp_fixture_server.py http PORT` (streamable
HTTP on 127.0.0.1:PORT/mcp). Its tools cover what the client must handle: text, structured
content, an image, an error result, a server that exits in the middle of a call, and a hang.
"""

from __future__ import annotations

import base64
import os
import sys
import time

from mcp.server.fastmcp import Context, FastMCP, Image

# A 1x1 transparent PNG.
_PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)

server = FastMCP("fixture", host="127.0.0.1", port=int(sys.argv[2]) if len(sys.argv) > 2 else 8000)


@server.tool()
def echo(text: str) -> str:
    """Say the text back, with the server's process id."""
    return f"echo: {text} (pid {os.getpid()})"


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def forecast(city: str) -> dict[str, object]:
    """The weather of a city, as structured data."""
    return {"city": city, "celsius": 21, "sky": "clear"}


@server.tool()
def picture() -> Image:
    """A tiny picture."""
    return Image(data=_PIXEL, format="png")


@server.tool()
def refuse(reason: str) -> str:
    """Always fails with the reason."""
    raise ValueError(f"refused: {reason}")


@server.tool()
def authorization(ctx: Context) -> str:  # type: ignore[type-arg]
    """The Authorization header of the HTTP request that made this call."""
    request = ctx.request_context.request
    headers = getattr(request, "headers", None)
    return str(headers.get("authorization", "(none)")) if headers is not None else "(not HTTP)"


@server.tool()
def die() -> str:
    """Exit the server process in the middle of the call."""
    sys.stdout.flush()
    os._exit(7)


@server.tool()
def hang(seconds: float) -> str:
    """Sleep, then answer."""
    time.sleep(seconds)
    return "woke up"


if __name__ == "__main__":
    server.run("streamable-http" if sys.argv[1] == "http" else "stdio")
