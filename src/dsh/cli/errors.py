"""The CLI's one table from error families to exit codes (docs/errors.md#cli-exit-codes)."""

from __future__ import annotations

from typing import Final

from dsh.errors import DshError

__all__ = ["EXIT_CODES", "exit_code_for", "exit_code_for_code"]

EXIT_CODES: Final = {
    "success": 0,
    "internal": 1,
    "usage": 2,
    "not-found": 3,
    "configuration": 4,
    "storage": 5,
    "model": 6,
    "doctor": 7,
    "refused": 8,
    "interrupted": 130,
}

_NOT_FOUND: Final = frozenset({"SESSION_NOT_FOUND", "SESSION_QUERY_SESSION_NOT_FOUND"})
_REFUSED: Final = frozenset({"UNAUTHORIZED", "NOT_RESUMABLE", "SESSION_LEASE_HELD", "SESSION_OWNED_BY_SUBAGENT"})
_STORAGE_PREFIXES: Final = ("SESSION_QUERY_", "PERSISTENCE_", "SESSION_CORRUPT", "SESSION_FORMAT", "STORE_")
_STORAGE: Final = frozenset({"SESSION_LEASE_LOST", "APPEND_SEQ_MISMATCH", "PERSISTENCE_FLUSH_FAILED"})


def exit_code_for_code(code: str) -> int:
    """The exit code of an error code's family.

    Order matters: a missing model key is configuration (exit 4, with a hint), every other model or
    script failure is a model failure (exit 6) even when its code ends in `_UNAVAILABLE`.
    """
    if code in _NOT_FOUND:
        return EXIT_CODES["not-found"]
    if code == "MODEL_NOT_CONFIGURED":
        return EXIT_CODES["configuration"]
    if code.startswith(("MODEL_", "SCRIPT_")) or code == "COMPACTION_FAILED":
        return EXIT_CODES["model"]
    if code == "CONFIG_INVALID" or code.endswith("_UNAVAILABLE"):
        return EXIT_CODES["configuration"]
    if code in _REFUSED:
        return EXIT_CODES["refused"]
    if code in _STORAGE or code.startswith(_STORAGE_PREFIXES):
        return EXIT_CODES["storage"]
    return EXIT_CODES["internal"]


def exit_code_for(error: BaseException) -> int:
    """The exit code of an error's family (KeyboardInterrupt is 130, anything not a `DshError` is 1)."""
    if isinstance(error, KeyboardInterrupt):
        return EXIT_CODES["interrupted"]
    if not isinstance(error, DshError):
        return EXIT_CODES["internal"]
    return exit_code_for_code(error.code)
