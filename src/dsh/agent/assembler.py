"""`MessageAssembler`: turns a model's chunk stream into the content of one `assistant/message`.

Layer: agent. Clients only stream chunks; the loop feeds every chunk here, so there is one place
that decides what a message holds. Blocks are kept by stream index and emitted in index order. A
`block-end` chunk carries the final form of its block and wins over the deltas; without one, the
deltas are the block. When a turn is cancelled or the stream breaks, `partial()` gives what arrived
so far (text and reasoning only: an unfinished tool call is never dispatched or kept).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dsh.agent.model import (
    BlockEnd,
    BlockStart,
    Finish,
    FinishKind,
    ModelChunk,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
    UsageChunk,
)

__all__ = ["MessageAssembler", "ToolCall"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A complete tool call the model asked for."""

    id: str
    name: str
    arguments: str


@dataclass(slots=True)
class _Block:
    kind: str
    parts: list[str] = field(default_factory=list)
    call_id: str | None = None
    name: str | None = None
    final: dict[str, Any] | None = None

    def content(self) -> dict[str, Any]:
        if self.final is not None:
            return self.final
        joined = "".join(self.parts)
        if self.kind == "tool-call":
            return {"type": "tool-call", "id": self.call_id or "", "name": self.name or "", "arguments": joined}
        return {"type": self.kind, "text": joined}


class MessageAssembler:
    """Collects the chunks of one model response."""

    def __init__(self) -> None:
        self._blocks: dict[int, _Block] = {}
        self.usage: Usage | None = None
        self.finish: FinishKind | None = None

    def feed(self, chunk: ModelChunk) -> None:
        """Take one chunk."""
        match chunk:
            case BlockStart(index, block_type):
                self._blocks.setdefault(index, _Block(block_type))
            case TextDelta(index, text):
                self._blocks.setdefault(index, _Block("text")).parts.append(text)
            case ReasoningDelta(index, text):
                self._blocks.setdefault(index, _Block("reasoning")).parts.append(text)
            case ToolCallDelta(index, call_id, arguments_delta, name):
                block = self._blocks.setdefault(index, _Block("tool-call"))
                block.call_id = block.call_id or call_id
                if name is not None and block.name is None:
                    block.name = name
                block.parts.append(arguments_delta)
            case BlockEnd(index, final):
                block = self._blocks.setdefault(index, _Block(str(final.get("type", "text"))))
                block.kind = str(final.get("type", block.kind))
                block.final = dict(final)
            case UsageChunk(usage):
                self.usage = usage
            case Finish(kind):
                self.finish = kind

    def content(self) -> list[dict[str, Any]]:
        """Every block, in stream-index order; empty text and reasoning blocks are left out."""
        return [block for block in (self._blocks[i].content() for i in sorted(self._blocks)) if not _empty(block)]

    def partial(self) -> list[dict[str, Any]]:
        """What a cancelled or broken stream leaves: the text and reasoning received, no tool calls."""
        return [block for block in self.content() if block.get("type") != "tool-call"]

    def tool_calls(self) -> list[ToolCall]:
        """The tool calls of the response, in stream-index order."""
        return [
            ToolCall(str(block.get("id", "")), str(block.get("name", "")), _arguments(block))
            for block in self.content()
            if block.get("type") == "tool-call"
        ]

    def text(self) -> str:
        """The answer text received so far."""
        return "".join(str(block.get("text", "")) for block in self.content() if block.get("type") == "text")


def _arguments(block: dict[str, Any]) -> str:
    value = block.get("arguments", "")
    return value if isinstance(value, str) else ""


def _empty(block: dict[str, Any]) -> bool:
    return block.get("type") in ("text", "reasoning") and not block.get("text")
