"""Content blocks, message sources and the model history an agent rebuilds from its log.

Layer: agent. Messages are the upstream frames the session validates (`{id, role, content, source}`);
this module only builds and reads them. The model history of a step is the session's surface
(`Session.derive_messages()`): user messages, assistant messages and tool results in log order,
inherited prefix included, replacements applied, model-hidden events skipped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "NoticeSource",
    "RelaySource",
    "Source",
    "UserSource",
    "message_text",
    "source_json",
    "text",
    "text_of_blocks",
]


def text(value: str) -> dict[str, Any]:
    """A text content block."""
    return {"type": "text", "text": value}


@dataclass(frozen=True, slots=True)
class UserSource:
    """A message a person (or a program acting for one) sent."""

    rpc_id: str | None = None
    client_time_zone: str | None = None

    def to_json(self) -> dict[str, Any]:
        """`{kind: "user", rpcId?, clientTimeZone?}`."""
        out: dict[str, Any] = {"kind": "user"}
        if self.rpc_id is not None:
            out["rpcId"] = self.rpc_id
        if self.client_time_zone is not None:
            out["clientTimeZone"] = self.client_time_zone
        return out


@dataclass(frozen=True, slots=True)
class RelaySource:
    """A message a parent agent relayed to its subagent (`send_message`)."""

    sender_session_id: str

    def to_json(self) -> dict[str, Any]:
        """`{kind: "coordinator", form: "relay", senderSessionId}`."""
        return {"kind": "coordinator", "form": "relay", "senderSessionId": self.sender_session_id}


@dataclass(frozen=True, slots=True)
class NoticeSource:
    """The notice a parent receives when a subagent settles."""

    sender_session_id: str
    summary: str

    def to_json(self) -> dict[str, Any]:
        """`{kind: "subagent-settled", form: "notice", summary, senderSessionId}`."""
        return {
            "kind": "subagent-settled",
            "form": "notice",
            "summary": self.summary,
            "senderSessionId": self.sender_session_id,
        }


Source = UserSource | RelaySource | NoticeSource | Mapping[str, Any]
"""A message source: one of the dataclasses above, or a raw `{kind, ...}` mapping."""


def source_json(source: Source) -> dict[str, Any]:
    """The JSON form of a source (a raw mapping is copied as it is)."""
    if isinstance(source, UserSource | RelaySource | NoticeSource):
        return source.to_json()
    return dict(source)


def text_of_blocks(blocks: Iterable[Any]) -> str:
    """The concatenated `text` of the text blocks (other block types are skipped)."""
    return "".join(
        block["text"]
        for block in blocks
        if isinstance(block, Mapping) and block.get("type") == "text" and isinstance(block.get("text"), str)
    )


def message_text(message: Mapping[str, Any]) -> str:
    """The text a message shows: its text blocks, or for a tool result the text of the result's content."""
    content = message.get("content")
    if not isinstance(content, Sequence) or isinstance(content, str):
        return ""
    source = message.get("source")
    if isinstance(source, Mapping) and source.get("kind") == "tool":
        for block in content:
            if isinstance(block, Mapping) and block.get("type") == "tool-result":
                inner = block.get("content")
                return text_of_blocks(inner) if isinstance(inner, Sequence) else ""
        return ""
    return text_of_blocks(content)
