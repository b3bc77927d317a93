"""The root error, the error families, and the complete table of error codes.

Layer: base (imported by every layer, imports nothing of dsh). Every exception dsh raises on purpose
derives from `DshError` and carries a stable `code`. Concrete classes live in their layer's
module; this module holds the root, the cross-layer families, and the one table that lists every
code. A code names exactly one failure kind; a class may carry several codes. A test checks that the
table below lists every code some class can carry, and lists each code once.

Class tree (module in parentheses):

    DshError                                   root; every instance has `.code`
    ├── ConfigError (ValueError)               dsh.errors
    ├── NotJsonError (ValueError)              dsh.json
    ├── AbortError                             dsh.abort
    ├── SessionError                           dsh.session.errors
    │   └── SessionForkError                   dsh.session.errors
    ├── SessionPersistenceError (family)       dsh.persistence.errors
    │   ├── SessionNotFoundError
    │   ├── SessionFormatUnsupportedError
    │   ├── SessionCorruptionError
    │   ├── SessionAlreadyExistsError
    │   ├── SessionLiveError
    │   ├── AppendConflictError
    │   ├── LeaseHeldError
    │   ├── LeaseLostError
    │   ├── StoreFormatUnsupportedError
    │   ├── StoreMisconfiguredError
    │   ├── PersistenceIOError
    │   ├── PersistenceClosedError
    │   └── OperationCancelledError
    └── (later layers add their families here)

Codes (each listed once; the meaning is the one failure kind the code names):

    CONFIG_INVALID                           a constructor argument or configuration value is invalid
    NOT_JSON                                 a value is not lossless JSON (type, range, depth, cycle, key)
    ABORTED                                  an operation observed an aborted AbortSignal
    INVALID_HEADER                           a session header failed validation
    INVALID_SEED                             a constructor seed or inherited cut failed validation
    INVALID_EVENT                            an event failed validation at append
    APPEND_REENTRANT                         an append re-entered a session that is publishing an append
    SESSION_ALREADY_EXISTS                   the session id is already live or already stored
    SESSION_NOT_LIVE                         the session is not the live instance in this store
    SESSION_RETIRED                          the session was disposed or vetoed and accepts no appends
    SESSION_STORE_CLOSED                     the session store was closed and refuses new work
    SESSION_NOT_FOUND                        no session with that id exists (live or stored)
    INVALID_BOUNDARY                         a fork boundary is not a valid event seq of the source
    OPEN_TURN                                a fork boundary falls inside an open turn
    SESSION_FORMAT_UNSUPPORTED               an intact stored log uses a format this build cannot read
    SESSION_CORRUPT                          a stored log was read but failed validation
    SESSION_LIVE                             a stored session cannot be prepared while it is live here
    APPEND_SEQ_MISMATCH                      a batch does not start at the stored next seq
    SESSION_LEASE_HELD                       another process or host is the session's writer
    SESSION_LEASE_LOST                       this host was fenced out of a session it was writing
    STORE_FORMAT_UNSUPPORTED                 the store's schema or application id is foreign or unknown
    STORE_MISCONFIGURED                      the store location is unusable as configured
    PERSISTENCE_IO                           an OS or database driver operation failed
    PERSISTENCE_CLOSED                       the persistence coordinator was closed
    OPERATION_CANCELLED                      a persistence read observed the caller's aborted signal
"""

from __future__ import annotations

from typing import ClassVar

__all__ = ["ConfigError", "DshError"]


class DshError(Exception):
    """Root of every error dsh raises on purpose.

    Args:
        message: Human-readable text. Texts the spec pins are data; others may change.
        code: One of the class's `codes`; defaults to the class's only code.

    Attributes:
        code: The stable SCREAMING_SNAKE code naming the failure kind.
    """

    codes: ClassVar[frozenset[str]] = frozenset()
    code: str

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        cls = type(self)
        if code is None:
            if len(cls.codes) != 1:
                raise TypeError(f"{cls.__name__} carries several codes; pass code=")
            (code,) = cls.codes
        elif code not in cls.codes:
            raise TypeError(f"{cls.__name__} cannot carry code {code!r}")
        self.code = code

    @property
    def message(self) -> str:
        """The message the error was raised with."""
        return str(self.args[0]) if self.args else ""


class ConfigError(DshError, ValueError):
    """An invalid constructor argument or configuration value (`CONFIG_INVALID`, CLI exit 4)."""

    codes = frozenset({"CONFIG_INVALID"})
