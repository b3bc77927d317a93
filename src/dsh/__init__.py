"""pydsh: the session and subagent core of an LLM agent harness.

The top-level package re-exports the public API of every layer; `__all__` is pinned by a test.
Start with `Runtime.open(Config())` for the composed defaults, or build `Services` by hand.

Layer: top (a map, not a layer of its own). The names load on first access (PEP 562 module
`__getattr__`), so `import dsh` loads no dependency and no layer until one is used; the
`TYPE_CHECKING` imports below are what type checkers and IDEs see (docs/architecture.md#import-cost).
"""

from __future__ import annotations

TYPE_CHECKING = False  # `typing.TYPE_CHECKING` without importing `typing`: type checkers read it as True
if TYPE_CHECKING:
    from dsh.abort import AbortController, AbortError, AbortSignal
    from dsh.agent.approval import Permissions
    from dsh.agent.function_tool import tool
    from dsh.agent.tools import ToolContext
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
    "Permissions",
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
    "ToolContext",
    "__version__",
    "tool",
]

# Where each public name is defined; the module is imported the first time the name is read.
_SOURCES: dict[str, str] = {
    "AbortController": "dsh.abort",
    "AbortError": "dsh.abort",
    "AbortSignal": "dsh.abort",
    "ClientView": "dsh.projection",
    "Config": "dsh.config",
    "ConfigError": "dsh.errors",
    "DshError": "dsh.errors",
    "FrozenDict": "dsh.json",
    "FrozenList": "dsh.json",
    "HeaderInit": "dsh.session",
    "JsonValue": "dsh.json",
    "JsonlBackend": "dsh.persistence",
    "KNOWN_EVENT_TYPES": "dsh.session",
    "MemoryBackend": "dsh.persistence",
    "NotJsonError": "dsh.json",
    "PersistenceCoordinator": "dsh.persistence",
    "ProjectionCache": "dsh.projection.cache",
    "ProjectionError": "dsh.projection",
    "ProjectionRegistry": "dsh.projection",
    "ProjectionSnapshot": "dsh.projection",
    "ProjectionUnit": "dsh.projection",
    "Runtime": "dsh.runtime",
    "SESSION_FORMAT_VERSION": "dsh.session",
    "Services": "dsh.services",
    "Session": "dsh.session",
    "SessionError": "dsh.session",
    "SessionEvent": "dsh.session",
    "SessionForkError": "dsh.session",
    "SessionHeader": "dsh.session",
    "SessionId": "dsh.session",
    "SessionPersistence": "dsh.persistence",
    "SessionPersistenceError": "dsh.persistence",
    "SessionQuery": "dsh.query",
    "SessionQueryError": "dsh.query",
    "SessionStore": "dsh.session",
    "SqliteBackend": "dsh.persistence",
    "SubagentChildRow": "dsh.subagent.rows",
    "SubagentDescendantEntry": "dsh.subagent.rows",
    "SubagentDiagnosticRow": "dsh.subagent.rows",
    "SubagentError": "dsh.subagent.errors",
    "SubagentRuntime": "dsh.subagent.runtime",
    "Permissions": "dsh.agent.approval",
    "ToolContext": "dsh.agent.tools",
    "tool": "dsh.agent.function_tool",
}


def __getattr__(name: str) -> object:
    """Load a public name on first access and keep it, so later reads are plain attribute reads."""
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module 'dsh' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(source), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public names (loaded or not) next to what the module already holds."""
    return sorted(set(globals()) | set(__all__))
