"""The model-facing names of MCP tools (`mcp__<server>__<tool>`), shared by the tools and the approvals.

Layer: agent (a leaf: it imports nothing of dsh). The naming is the TypeScript harness's
(docs/tools.md#mcp-servers).
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

__all__ = ["MCP_TOOL_PREFIX", "mcp_tool_name"]

MCP_TOOL_PREFIX: Final = "mcp__"
"""The name prefix of every MCP tool."""

_MCP_NAME_MAX: Final = 64
_MCP_HASH_CHARS: Final = 12
_NOT_NAME_CHARS: Final = re.compile(r"[^A-Za-z0-9_-]")


def mcp_tool_name(server: str, tool: str) -> str:
    """The model-facing name of MCP tool `tool` of server `server`: `mcp__<server>__<tool>`.

    The harness's naming: characters outside `[A-Za-z0-9_-]` become `_`, and when that changed the
    name or it is longer than 64 characters, it is cut to leave room for `_` and the first 12 hex
    digits of the SHA-256 of `server NUL tool`, so distinct tools never share a name. The name is a
    pure function of the pair; it is never parsed back (docs/tools.md#mcp-servers).
    """
    joined = f"{MCP_TOOL_PREFIX}{server}__{tool}"
    normalized = _NOT_NAME_CHARS.sub("_", joined)
    if normalized == joined and len(normalized) <= _MCP_NAME_MAX:
        return normalized
    digest = hashlib.sha256(f"{server}\0{tool}".encode()).hexdigest()[:_MCP_HASH_CHARS]
    return f"{normalized[: _MCP_NAME_MAX - _MCP_HASH_CHARS - 1]}_{digest}"
