"""Errors of the projection layer (`dsh.projection`): the registry and the projection cache.

Layer: projection. One class, `ProjectionError`, carries every projection code. The registry codes
describe a unit that breaks its contract (`PROJECTION_INVALID_UNIT`, `PROJECTION_UNIT_FAILED`,
`PROJECTION_INVALID_VIEW`), a registration clash (`PROJECTION_VERSION_CONFLICT`) or a checkpoint that
cannot seed a cold fold (`PROJECTION_INVALID_STATE`, `PROJECTION_REREAD_REQUIRED`). The cache codes
describe the optional accelerator only; consumers treat every cache fault as a miss, never a verdict.
"""

from __future__ import annotations

from typing import Final

from dsh.errors import DshError

__all__ = ["CACHE_CODES", "ProjectionError", "REGISTRY_CODES"]

REGISTRY_CODES: Final[frozenset[str]] = frozenset(
    {
        "PROJECTION_INVALID_UNIT",
        "PROJECTION_VERSION_CONFLICT",
        "PROJECTION_UNIT_FAILED",
        "PROJECTION_INVALID_VIEW",
        "PROJECTION_INVALID_STATE",
        "PROJECTION_REREAD_REQUIRED",
    }
)
"""The registry's codes."""

CACHE_CODES: Final[frozenset[str]] = frozenset(
    {
        "PROJECTION_CACHE_UNAVAILABLE",
        "PROJECTION_CACHE_STORAGE_FAILED",
        "PROJECTION_CACHE_NOT_JSON",
    }
)
"""The projection cache's codes."""


class ProjectionError(DshError):
    """A projection registry or projection cache refusal.

    Args:
        message: Human-readable text; the texts 03 pins are data.
        code: One of `REGISTRY_CODES | CACHE_CODES`.
        key: The unit key the failure concerns, when there is one.
        session_id: The session the failure concerns, when known.

    Attributes:
        key: The unit key, or None.
        session_id: The session id, or None.
    """

    codes = REGISTRY_CODES | CACHE_CODES

    def __init__(self, message: str, *, code: str, key: str | None = None, session_id: str | None = None) -> None:
        super().__init__(message, code=code)
        self.key = key
        self.session_id = session_id


# Shown under the name users import (docs/architecture.md#public-names).
ProjectionError.__module__ = "dsh"
