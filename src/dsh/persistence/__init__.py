"""Persistence: the contract, the coordinator and the storage backends.

Layer: persistence (imports `dsh.session`, `dsh.abort`, `dsh.timer` and the base modules only).
`PersistenceCoordinator` implements the `SessionPersistence` contract on top of one
`StorageBackend`: `MemoryBackend` (the reference), `JsonlBackend` (the default: JSONL with zstd
frames), `SqliteBackend` or `PostgresBackend` (several hosts; imported from
`dsh.persistence.postgres`, never from here). The public modules are the map
(docs/architecture.md#inside-the-persistence-package):

* `base`: the contract (`SessionPersistence`, `StorageBackend`, `TypedReads`, `Capability`, the
  records backends return) — what a new backend implements;
* `coordinator`: `PersistenceCoordinator` (its internals are the private `_writer`, `_cold_reads`,
  `_state`, `_validation`, `_legacy_shapes` and `_prepared` modules);
* `memory`, `jsonl`, `sqlite` and `postgres`: the backends (`jsonl`, `sqlite` and `postgres` are
  packages with private helpers; each `__init__` lists the small codec or schema surface fixture
  writers need);
* `headers`: how every read path parses a stored header record;
* `errors`: the persistence errors.

`_locks` (the `flock` writer locks of the file stores) and `_workers` (the writer threads behind the
JSONL backend's eager appends) are shared by the backends and private. The backends hold no test
seams: `dsh.testing` fails their writes by replacing a private primitive on one instance.
"""

from typing import TYPE_CHECKING

from dsh.persistence.base import (
    Capability,
    DamagedSession,
    EventSlice,
    PersistenceObservation,
    PreparedSession,
    Revision,
    SessionListing,
    SessionPersistence,
    StorageBackend,
    StoredSessionInfo,
    TypedReads,
)
from dsh.persistence.coordinator import PersistenceCoordinator
from dsh.persistence.errors import SessionPersistenceError

if TYPE_CHECKING:
    from dsh.persistence.jsonl import JsonlBackend
    from dsh.persistence.memory import MemoryBackend
    from dsh.persistence.sqlite import SqliteBackend

__all__ = [
    "Capability",
    "DamagedSession",
    "EventSlice",
    "JsonlBackend",
    "MemoryBackend",
    "PersistenceCoordinator",
    "PersistenceObservation",
    "PreparedSession",
    "Revision",
    "SessionListing",
    "SessionPersistence",
    "SessionPersistenceError",
    "SqliteBackend",
    "StorageBackend",
    "StoredSessionInfo",
    "TypedReads",
]

# The backends load on first access (PEP 562): a process uses one, and each brings its own
# dependencies (zstandard, sqlite3) (docs/architecture.md#import-cost).
_BACKENDS = {
    "JsonlBackend": "dsh.persistence.jsonl",
    "MemoryBackend": "dsh.persistence.memory",
    "SqliteBackend": "dsh.persistence.sqlite",
}


def __getattr__(name: str) -> object:
    """Load a backend class on first access."""
    source = _BACKENDS.get(name)
    if source is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(source), name)
    globals()[name] = value
    return value
