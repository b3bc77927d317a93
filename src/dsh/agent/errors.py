"""Errors of the agent layer: the agent loop, its tools and the model clients.

Layer: agent. `AgentError` covers the live agents and their registry, `ToolError` the tool
registry, `ModelError` every model client (the OpenAI-compatible client and the scripted one). A
model failure ends the turn with `turn/end {kind: "error", error: {code, message}}`; the CLI maps the
model family to exit 6 and `MODEL_NOT_CONFIGURED` to exit 4 (docs/errors.md#cli-exit-codes).
"""

from __future__ import annotations

from typing import ClassVar

from dsh.errors import DshError

__all__ = ["AgentError", "ModelError", "ToolError"]


class AgentError(DshError):
    """A live agent or the agent registry refused an operation.

    Attributes:
        session_id: The agent's (session's) id, when one is concerned.
    """

    codes: ClassVar[frozenset[str]] = frozenset(
        {
            "DUPLICATE_AGENT",
            "AGENT_CLOSING",
            "AGENT_MAX_STEPS",
            "AGENT_TURN_FAILED",
            "PERSISTENCE_FLUSH_FAILED",
            "SESSION_OWNED_BY_SUBAGENT",
        }
    )

    def __init__(self, message: str, *, code: str, session_id: str | None = None) -> None:
        super().__init__(message, code=code)
        self.session_id = session_id


class ToolError(DshError):
    """The tool registry refused a registration."""

    codes: ClassVar[frozenset[str]] = frozenset({"DUPLICATE_TOOL"})

    def __init__(self, message: str, *, code: str = "DUPLICATE_TOOL", name: str | None = None) -> None:
        super().__init__(message, code=code)
        self.name = name


class ModelError(DshError):
    """A model request failed; the turn that made it ends with `turn/end {kind: "error"}`.

    Attributes:
        status: The HTTP status the endpoint answered, when there was one.
        request_id: The provider's request id, when it sent one.
        retry_after_ms: The provider's retry hint for a rate limit, when it sent one.
    """

    codes: ClassVar[frozenset[str]] = frozenset(
        {
            "MODEL_NOT_CONFIGURED",
            "MODEL_AUTH",
            "MODEL_RATE_LIMITED",
            "MODEL_BAD_REQUEST",
            "MODEL_UNAVAILABLE",
            "MODEL_TIMEOUT",
            "SCRIPT_INVALID",
            "SCRIPT_MISMATCH",
            "SCRIPT_EXHAUSTED",
            "SCRIPT_UNKNOWN_AGENT",
            "SCRIPT_PLACEHOLDER",
            "SCRIPT_UNCONSUMED",
        }
    )

    def __init__(
        self,
        message: str,
        *,
        code: str,
        status: int | None = None,
        request_id: str | None = None,
        retry_after_ms: int | None = None,
    ) -> None:
        super().__init__(message, code=code)
        self.status = status
        self.request_id = request_id
        self.retry_after_ms = retry_after_ms

    def to_json(self) -> dict[str, object]:
        """The `error` object of a `turn/end {kind: "error"}` event: message, code and known extras."""
        out: dict[str, object] = {"message": self.message, "code": self.code}
        if self.status is not None:
            out["status"] = self.status
        if self.retry_after_ms is not None:
            out["providerRetryAfterMs"] = self.retry_after_ms
        if self.request_id is not None:
            out["requestId"] = self.request_id
        return out
