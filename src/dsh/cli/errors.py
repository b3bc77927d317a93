"""The CLI's one table from error families to exit codes (docs/errors.md#cli-exit-codes)."""

from __future__ import annotations

from typing import Final

from dsh.errors import DshError

__all__ = ["EXIT_CODES", "exit_code_for"]

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
_REFUSED: Final = frozenset({"UNAUTHORIZED", "NOT_RESUMABLE", "SESSION_LEASE_HELD"})
_STORAGE_PREFIXES: Final = ("SESSION_QUERY_", "PERSISTENCE_", "SESSION_CORRUPT", "SESSION_FORMAT", "STORE_")


def exit_code_for(error: BaseException) -> int:
    """The exit code of an error's family."""
    if isinstance(error, KeyboardInterrupt):
        return EXIT_CODES["interrupted"]
    if not isinstance(error, DshError):
        return EXIT_CODES["internal"]
    code = error.code
    if code in _NOT_FOUND:
        return EXIT_CODES["not-found"]
    if code == "CONFIG_INVALID" or code.endswith("_UNAVAILABLE"):
        return EXIT_CODES["configuration"]
    if code in _REFUSED:
        return EXIT_CODES["refused"]
    if code.startswith(_STORAGE_PREFIXES) or code in ("SESSION_LEASE_LOST", "APPEND_SEQ_MISMATCH"):
        return EXIT_CODES["storage"]
    if code.startswith(("MODEL_", "SCRIPT_")):
        return EXIT_CODES["model"]
    return EXIT_CODES["internal"]
