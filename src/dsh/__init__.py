"""pydsh: the session and subagent core of an LLM agent harness.

The top-level package re-exports the public API of every layer; `__all__` is pinned by a test.
Start with `Runtime.open(Config())` for the composed defaults, or build `Services` by hand.
"""

from dsh.abort import AbortController, AbortError, AbortSignal
from dsh.config import Config
from dsh.errors import ConfigError, DshError
from dsh.json import FrozenDict, FrozenList, JsonValue, NotJsonError
from dsh.persistence import (
    JsonlBackend,
    MemoryBackend,
    PersistenceCoordinator,
    SessionPersistence,
    SessionPersistenceError,
    SqliteBackend,
)
from dsh.projection import ClientView, ProjectionError, ProjectionRegistry, ProjectionSnapshot, ProjectionUnit
from dsh.projection.cache import ProjectionCache
from dsh.query import SessionQuery, SessionQueryError
from dsh.runtime import Runtime
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
from dsh.subagent.errors import SubagentError
from dsh.subagent.rows import SubagentChildRow, SubagentDescendantEntry, SubagentDiagnosticRow
from dsh.subagent.runtime import SubagentRuntime

__version__ = "0.1.0"

__all__ = [
    "AbortController",
    "AbortError",
    "AbortSignal",
    "ClientView",
    "Config",
    "ConfigError",
    "DshError",
    "FrozenDict",
    "FrozenList",
    "HeaderInit",
    "JsonValue",
    "JsonlBackend",
    "KNOWN_EVENT_TYPES",
    "MemoryBackend",
    "NotJsonError",
    "PersistenceCoordinator",
    "ProjectionCache",
    "ProjectionError",
    "ProjectionRegistry",
    "ProjectionSnapshot",
    "ProjectionUnit",
    "Runtime",
    "SESSION_FORMAT_VERSION",
    "Services",
    "Session",
    "SessionError",
    "SessionEvent",
    "SessionForkError",
    "SessionHeader",
    "SessionId",
    "SessionPersistence",
    "SessionPersistenceError",
    "SessionQuery",
    "SessionQueryError",
    "SessionStore",
    "SqliteBackend",
    "SubagentChildRow",
    "SubagentDescendantEntry",
    "SubagentDiagnosticRow",
    "SubagentError",
    "SubagentRuntime",
    "__version__",
]
