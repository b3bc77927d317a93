"""Errors of the subagent layer (`dsh.subagent`).

`SubagentError` carries every code a subagent operation or the listing can fail with (route on
`.code`, never on the message; docs/errors.md#codes). `SubagentDescriptorError` (a malformed
persisted descriptor) and `SubagentDepthError` (a child past the maximum delegation depth) are
separate kinds with their own codes.
"""

from __future__ import annotations

from dsh.errors import DshError

__all__ = ["SubagentDepthError", "SubagentDescriptorError", "SubagentError"]


class SubagentError(DshError):
    """A subagent operation or the child listing failed; `.code` is one of `codes`.

    Args:
        message: Human-readable text.
        code: The failure kind (the second positional argument, as the public signature has it).
        cause: The underlying exception, kept as `__cause__`.
    """

    codes = frozenset(
        {
            "DUPLICATE_PROVIDER",
            "NO_PROVIDER",
            "UNSUPPORTED_CAPABILITY",
            "CONTINUATION_UNAVAILABLE",
            "PERSISTENCE_UNAVAILABLE",
            "DUPLICATE_CHILD",
            "DRAINING",
            "ACTIVATION_CLOSING",
            "UNAUTHORIZED",
            "NOT_RESUMABLE",
            "ACTIVATION_TEARDOWN_FAILED",
            "SUBAGENT_CONTROL_PROJECTIONS_UNAVAILABLE",
            "SUBAGENT_CONTROL_SESSION_STORE_UNAVAILABLE",
            "SUBAGENT_CONTROL_QUERY_UNAVAILABLE",
            "SUBAGENT_CONTROL_UNITS_UNAVAILABLE",
            "CANCELLED",
        }
    )

    def __init__(self, message: str, code: str, cause: BaseException | None = None) -> None:
        super().__init__(message, code=code)
        if cause is not None:
            self.__cause__ = cause


class SubagentDescriptorError(DshError, ValueError):
    """A persisted `subagent/descriptor` payload is malformed; messages start with
    `persisted subagent descriptor `."""

    codes = frozenset({"SUBAGENT_DESCRIPTOR_INVALID"})


class SubagentDepthError(DshError):
    """A child would exceed `max_depth`.

    Args:
        message: Human-readable text; when omitted, `subagent depth <n> exceeds maxDepth <m>`.
        attempted_depth: The depth the child would have.
        max_depth: The configured maximum delegation depth.
    """

    codes = frozenset({"SUBAGENT_DEPTH_EXCEEDED"})

    def __init__(self, message: str | None = None, *, attempted_depth: int, max_depth: int) -> None:
        if message is None:
            message = f"subagent depth {attempted_depth} exceeds maxDepth {max_depth}"
        super().__init__(message)
        self.attempted_depth = attempted_depth
        self.max_depth = max_depth


# Shown under the name users import (docs/architecture.md#public-names).
SubagentError.__module__ = "dsh"
