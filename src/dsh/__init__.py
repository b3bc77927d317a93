"""pydsh: the session and subagent core of an LLM agent harness.

The top-level package re-exports the public API of every layer; `__all__` is pinned by a test.
"""

from dsh.abort import AbortController, AbortError, AbortSignal
from dsh.errors import ConfigError, DshError
from dsh.json import FrozenDict, FrozenList, JsonValue, NotJsonError
from dsh.services import Services
from dsh.session import (
    KNOWN_EVENT_TYPES,
    SESSION_FORMAT_VERSION,
    HeaderInit,
    Session,
    SessionError,
    SessionEvent,
    SessionForkError,
    SessionHeader,
    SessionId,
    SessionStore,
)

__version__ = "0.1.0"

__all__ = [
    "KNOWN_EVENT_TYPES",
    "SESSION_FORMAT_VERSION",
    "AbortController",
    "AbortError",
    "AbortSignal",
    "ConfigError",
    "DshError",
    "FrozenDict",
    "FrozenList",
    "HeaderInit",
    "JsonValue",
    "NotJsonError",
    "Services",
    "Session",
    "SessionError",
    "SessionEvent",
    "SessionForkError",
    "SessionHeader",
    "SessionId",
    "SessionStore",
    "__version__",
]
