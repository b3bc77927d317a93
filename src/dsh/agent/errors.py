"""Errors of the agent layer: the agent loop, its tools and the model clients.

Layer: agent. `AgentError` covers the live agents and their registry, `ToolError` the tool
registry, `ModelError` every model client (the OpenAI-compatible client and the scripted one). A
model failure ends the turn with `turn/end {kind: "error", error: {code, message}}`; the CLI maps the
model family to exit 6 and `MODEL_NOT_CONFIGURED` to exit 4 (docs/errors.md#cli-exit-codes).
"""

from __future__ import annotations

from typing import ClassVar

from dsh.errors import DshError

__all__ = ["AgentError", "ApprovalError", "ModelError", "ToolError"]


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
            "COMPACTION_FAILED",
            "PERSISTENCE_FLUSH_FAILED",
            "SESSION_OWNED_BY_SUBAGENT",
            "STRUCTURED_OUTPUT_MISSING",
        }
    )

    def __init__(self, message: str, *, code: str, session_id: str | None = None) -> None:
        super().__init__(message, code=code)
        self.session_id = session_id


class ToolError(DshError):
    """A tool could not be registered or built, or a tool body failed in a way it names.

    The workspace tools raise it from their bodies; the loop turns it into an errored result that
    carries `error: {name, code}` (docs/tools.md#workspace-tools).

    Attributes:
        name: The tool's name, when one is concerned.
        path: The file or folder concerned, as the model gave it, when there is one.
    """

    codes: ClassVar[frozenset[str]] = frozenset(
        {
            "DUPLICATE_TOOL",
            "TOOL_INVALID",
            "PATH_OUTSIDE_WORKSPACE",
            "FILE_NOT_FOUND",
            "FILE_NOT_REGULAR",
            "FILE_NOT_TEXT",
            "READ_OUT_OF_RANGE",
            "EDIT_NOT_FOUND",
            "EDIT_AMBIGUOUS",
            "SEARCH_FAILED",
            "SANDBOX_DENIED",
            "SANDBOX_UNAVAILABLE",
            "STRUCTURED_OUTPUT_INVALID",
            "MCP_SERVER_UNAVAILABLE",
            "MCP_CALL_FAILED",
        }
    )

    def __init__(
        self, message: str, *, code: str = "DUPLICATE_TOOL", name: str | None = None, path: str | None = None
    ) -> None:
        super().__init__(message, code=code)
        self.name = name
        self.path = path


class ApprovalError(DshError):
    """A tool call was not approved, or an approval decision was refused.

    The loop records the first three codes on the `tool/result` of a call that did not run
    (docs/tools.md#approvals); the HTTP route answers `APPROVAL_NOT_FOUND` for a decision on a
    request that is not pending.

    Attributes:
        approval_id: The approval request concerned, when there is one.
    """

    codes: ClassVar[frozenset[str]] = frozenset(
        {"APPROVAL_RULE_DENIED", "APPROVAL_REJECTED", "APPROVAL_UNAVAILABLE", "APPROVAL_NOT_FOUND"}
    )

    def __init__(self, message: str, *, code: str, approval_id: str | None = None) -> None:
        super().__init__(message, code=code)
        self.approval_id = approval_id


class ModelError(DshError):
    """A model request failed; the turn that made it ends with `turn/end {kind: "error"}`.

    Attributes:
        status: The HTTP status the endpoint answered, when there was one.
        request_id: The provider's request id, when it sent one.
        retry_after_ms: The provider's retry hint (`Retry-After`), when it sent one.
        retryable: True when the same request may well succeed if sent again: a stream that broke
            after its first byte (cut connection, an error chunk, a stall past the chunk timeout).
            The agent loop retries such a failure under the client's `retry_policy`
            (docs/agent.md#retries); failures before the first byte are retried by the client itself.
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
        retryable: bool = False,
    ) -> None:
        super().__init__(message, code=code)
        self.status = status
        self.request_id = request_id
        self.retry_after_ms = retry_after_ms
        self.retryable = retryable

    def to_json(self) -> dict[str, object]:
        """The `error` object of a `turn/end {kind: "error"}` event: message, code and known extras."""
        out: dict[str, object] = {"message": self.message, "code": self.code}
        if self.status is not None:
            out["status"] = self.status
        if self.retry_after_ms:  # the harness's failure shape allows only a positive delay
            out["providerRetryAfterMs"] = self.retry_after_ms
        if self.request_id is not None:
            out["requestId"] = self.request_id
        return out
