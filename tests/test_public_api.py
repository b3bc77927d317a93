"""The public API of `dsh` is pinned: an explicit, sorted `__all__` whose every name resolves."""

from __future__ import annotations

import importlib

import dsh

# Changing the public API is a deliberate act: update this list in the same change.
_PUBLIC_API = [
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


def test_pinned_list_is_sorted() -> None:
    """The pin itself is in plain `str` order (so a diff shows exactly what changed)."""
    assert sorted(_PUBLIC_API) == _PUBLIC_API
    assert len(set(_PUBLIC_API)) == len(_PUBLIC_API)


def test_all_is_the_pinned_list() -> None:
    """`dsh.__all__` equals the pinned list, in the same order."""
    assert list(dsh.__all__) == _PUBLIC_API


def test_all_is_sorted() -> None:
    """`dsh.__all__` is sorted in plain `str` order."""
    assert sorted(dsh.__all__) == list(dsh.__all__)


def test_every_public_name_resolves() -> None:
    """Every name in `__all__` is an attribute of `dsh`, and `from dsh import *` binds exactly those names."""
    for name in dsh.__all__:
        assert getattr(dsh, name) is not None, name
    namespace: dict[str, object] = {}
    exec("from dsh import *", namespace)
    namespace.pop("__builtins__", None)
    assert set(namespace) == set(dsh.__all__)


def test_reexports_are_the_layer_objects() -> None:
    """Top-level names are the very objects defined in their layer modules (no copies or shims)."""
    assert dsh.SessionStore is importlib.import_module("dsh.session.store").SessionStore
    assert dsh.FrozenDict is importlib.import_module("dsh.json").FrozenDict
    assert dsh.AbortSignal is importlib.import_module("dsh.abort").AbortSignal
