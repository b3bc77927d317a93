"""Wire errors of the HTTP API: `WireError`, the one wire-code → status table, and library-code mapping.

Layer: server. Handlers raise `WireError(code, message, details)`; the exception handler takes the
HTTP status from `STATUS` alone, so a code can never be answered with two statuses. Every error body
is `{"error": {"code", "message", "details"}}` (docs/server.md#errors). Library errors carry no HTTP
knowledge: `LIBRARY_CODES` says which wire code each library code becomes when a route maps it on
purpose, and the HTTP column of docs/errors.md is written from that table (a test compares them).
Route-specific mappings (the subagent routes' fixed messages) live next to the routes; a code no
route maps is answered as `internal`, with a fixed message and never the library's text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = [
    "LIBRARY_CODES",
    "RETRY_AFTER_S",
    "STATUS",
    "WireError",
    "bad_request",
    "error_body",
    "status_of",
]

STATUS: Final[Mapping[str, int]] = {
    "bad-request": 400,
    "invalid-time-zone": 400,
    "unauthenticated": 401,
    "subagent-unauthorized": 403,
    "not-found": 404,
    "session-not-found": 404,
    "subagent-not-found": 404,
    "approval-not-found": 404,
    "method-not-allowed": 405,
    "agent-busy": 409,
    "subagent-catalog-diagnostic": 409,
    "subagent-parent-unavailable": 409,
    "subagent-not-resumable": 409,
    "payload-too-large": 413,
    "unsupported-media-type": 415,
    "cancelled": 499,
    "internal": 500,
    "session-unreadable": 500,
    "compaction-failed": 502,
    "model-unavailable": 503,
    "subagent-delivery-unavailable": 503,
}
"""THE table: every wire code and its HTTP status. Nothing else decides a status."""

RETRY_AFTER_S: Final = 1
"""`Retry-After` (seconds) sent with `subagent-delivery-unavailable`."""

LIBRARY_CODES: Final[Mapping[str, str]] = {
    # not found
    "SESSION_NOT_FOUND": "session-not-found",
    "SESSION_QUERY_SESSION_NOT_FOUND": "session-not-found",
    # a stored log that cannot be read
    "SESSION_CORRUPT": "session-unreadable",
    "SESSION_FORMAT_UNSUPPORTED": "session-unreadable",
    "SESSION_QUERY_CORRUPT_SESSION": "session-unreadable",
    "SESSION_QUERY_UNSUPPORTED_FORMAT": "session-unreadable",
    "SESSION_QUERY_PERSISTENCE_FAILED": "session-unreadable",
    "SESSION_QUERY_SOURCE_CONFLICT": "session-unreadable",
    # arguments the route validates first anyway
    "SESSION_QUERY_INVALID_WINDOW": "bad-request",
    "SESSION_QUERY_INVALID_LIMIT": "bad-request",
    # the caller went away
    "SESSION_QUERY_ABORTED": "cancelled",
    "OPERATION_CANCELLED": "cancelled",
    "ABORTED": "cancelled",
    "CANCELLED": "cancelled",
    # the agent cannot take the request now
    "SESSION_OWNED_BY_SUBAGENT": "agent-busy",
    "AGENT_CLOSING": "agent-busy",
    "DUPLICATE_AGENT": "agent-busy",
    "SESSION_LIVE": "agent-busy",
    "SESSION_LEASE_HELD": "agent-busy",
    # the model
    "MODEL_NOT_CONFIGURED": "model-unavailable",
    "COMPACTION_FAILED": "compaction-failed",
    # approvals
    "APPROVAL_NOT_FOUND": "approval-not-found",
    # subagent delivery
    "UNAUTHORIZED": "subagent-unauthorized",
    "NOT_RESUMABLE": "subagent-not-resumable",
    "DRAINING": "subagent-delivery-unavailable",
    "ACTIVATION_CLOSING": "subagent-delivery-unavailable",
    "CONTINUATION_UNAVAILABLE": "subagent-delivery-unavailable",
    "PERSISTENCE_UNAVAILABLE": "subagent-delivery-unavailable",
    # a deployment without a catalog service
    "SUBAGENT_CONTROL_PROJECTIONS_UNAVAILABLE": "internal",
    "SUBAGENT_CONTROL_QUERY_UNAVAILABLE": "internal",
    "SUBAGENT_CONTROL_SESSION_STORE_UNAVAILABLE": "internal",
    "SUBAGENT_CONTROL_UNITS_UNAVAILABLE": "internal",
}
"""Library code → the wire code a route answers with when it maps that code (docs/errors.md#codes)."""


def status_of(code: str) -> int:
    """The HTTP status of a wire code (an unknown code is a bug and answers 500)."""
    return STATUS.get(code, 500)


class WireError(Exception):
    """An error the HTTP API answers with; the status comes from `STATUS`.

    Args:
        code: A wire code (a key of `STATUS`).
        message: Text for people; never a backend's own error text.
        details: The code's details object (see docs/server.md#errors).
    """

    def __init__(self, code: str, message: str, details: Mapping[str, Any] | None = None) -> None:
        if code not in STATUS:
            raise ValueError(f"unknown wire code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message
        self.details: dict[str, Any] = dict(details or {})

    @property
    def status(self) -> int:
        """The HTTP status `STATUS` gives this code."""
        return STATUS[self.code]

    def headers(self) -> dict[str, str]:
        """Extra response headers the code carries (`Retry-After` for a delivery that may succeed soon)."""
        if self.code == "subagent-delivery-unavailable":
            return {"Retry-After": str(RETRY_AFTER_S)}
        return {}

    def body(self) -> dict[str, Any]:
        """`{"error": {"code", "message", "details"}}`."""
        return error_body(self.code, self.message, self.details)


def error_body(code: str, message: str, details: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The one error body shape."""
    return {"error": {"code": code, "message": message, "details": dict(details or {})}}


def bad_request(loc: list[str | int], msg: str, kind: str) -> WireError:
    """A `bad-request` naming one problem (where, what, which rule); the input value is never echoed."""
    return WireError("bad-request", "the request is invalid", {"issues": [{"loc": loc, "msg": msg, "type": kind}]})
