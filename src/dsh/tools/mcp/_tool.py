"""`McpTool`: one tool of an MCP server, offered to the model under its `mcp__<server>__<tool>` name.

Layer: tools (private to `dsh.tools.mcp`). The schema is the server's input schema as it gave it; the
arguments are passed on as the model wrote them (the server validates them). The result keeps the
server's content blocks and its structured content as the call's output; the model sees the text,
a placeholder for each image or audio block (no shipped model client takes images), resource links
as their name and URI, and the structured content as JSON when there is no text
(docs/tools.md#mcp-servers).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from pydantic import RootModel

from dsh.agent.errors import ToolError
from dsh.agent.mcp_names import mcp_tool_name
from dsh.agent.messages import text
from dsh.agent.tools import ToolContext

if TYPE_CHECKING:
    import mcp.types

    from dsh.tools.mcp._connection import McpConnection

__all__ = ["McpTool"]

_EMPTY_OBJECT: Final[Mapping[str, Any]] = {"type": "object", "properties": {}}


class McpArguments(RootModel[dict[str, Any]]):
    """The arguments of an MCP tool call: any JSON object (the server checks it against its schema)."""


class McpTool:
    """One MCP tool.

    Args:
        connection: The connection to its server.
        tool: The tool as the server listed it.
    """

    args_model: Final = McpArguments
    output_schema: Final = None

    def __init__(self, connection: McpConnection, tool: mcp.types.Tool) -> None:
        self.connection = connection
        self.server = connection.name
        self.raw_name = tool.name
        self.name = mcp_tool_name(connection.name, tool.name)
        self.description = tool.description or f'The tool "{tool.name}" of the MCP server "{connection.name}".'
        schema = tool.inputSchema
        self.parameters: Mapping[str, Any] = schema if isinstance(schema, Mapping) and schema else _EMPTY_OBJECT

    def __repr__(self) -> str:
        return f"McpTool({self.name!r})"

    async def execute(self, args: Any, ctx: ToolContext) -> object:
        """Call the tool on its server; the server's error result is raised as `MCP_CALL_FAILED`.

        Raises:
            ToolError: `MCP_SERVER_UNAVAILABLE` (start, death or timeout of the server; restarted on
                the next call) or `MCP_CALL_FAILED` (the server's error result or protocol error).
        """
        arguments = args.root if isinstance(args, McpArguments) else dict(args)
        call = asyncio.ensure_future(self.connection.call(self.raw_name, arguments))
        aborted = asyncio.ensure_future(ctx.signal.wait())
        try:
            await asyncio.wait({call, aborted}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            aborted.cancel()
            if not call.done():
                # The turn was cancelled: stop waiting for the server (the SDK tells it the request is cancelled).
                call.cancel()
                await asyncio.gather(call, return_exceptions=True)
        ctx.signal.throw_if_aborted()
        result = call.result()
        content = [block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in result.content]
        if result.isError:
            detail = _text_of(content) or "(no details)"
            raise ToolError(
                f'the MCP tool {self.raw_name} of server "{self.server}" failed: {detail}',
                code="MCP_CALL_FAILED",
                name=self.name,
            )
        output: dict[str, Any] = {"content": content}
        if result.structuredContent is not None:
            output["structuredContent"] = result.structuredContent
        return output

    def render(self, args: Any, output: object) -> list[dict[str, Any]]:
        """The text the model sees: text blocks joined by newlines, placeholders for media."""
        out = output if isinstance(output, Mapping) else {}
        shown = _text_of(out.get("content") or [])
        if not shown and out.get("structuredContent") is not None:
            shown = json.dumps(out["structuredContent"], ensure_ascii=False, separators=(",", ":"))
        return [text(shown or "(no output)")]


def _text_of(content: Any) -> str:
    """MCP content blocks as one text, in order: media and unknown blocks as bracketed placeholders."""
    parts: list[str] = []
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, Mapping):
            parts.append("[unsupported MCP content block]")
            continue
        kind = block.get("type")
        if kind == "text":
            parts.append(str(block.get("text", "")))
        elif kind in ("image", "audio"):
            size = _decoded_size(block.get("data"))
            parts.append(f"[{kind}: {block.get('mimeType', 'unknown type')}, {size} bytes; not shown to this model]")
        elif kind == "resource_link":
            parts.append(f"[resource: {block.get('name', '')} {block.get('uri', '')}]")
        elif kind == "resource":
            resource = block.get("resource")
            if isinstance(resource, Mapping) and isinstance(resource.get("text"), str):
                parts.append(resource["text"])
            else:
                uri = resource.get("uri", "") if isinstance(resource, Mapping) else ""
                parts.append(f"[embedded resource {uri}; binary content not shown]")
        else:
            parts.append(f"[unsupported MCP content block: {kind}]")
    return "\n".join(parts)


def _decoded_size(data: object) -> int:
    if not isinstance(data, str):
        return 0
    try:
        return len(base64.b64decode(data, validate=True))
    except (binascii.Error, ValueError):
        return len(data)
