"""Persistence: the contract, the coordinator and the storage backends.

Layer: persistence (imports `dsh.session` and the base modules only). `PersistenceCoordinator`
implements the `SessionPersistence` contract on top of one `StorageBackend`: `MemoryBackend` (the
reference), `JsonlBackend` (the default: JSONL with zstd frames) or `SqliteBackend`.
"""

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
)
from dsh.persistence.coordinator import PersistenceCoordinator
from dsh.persistence.errors import SessionPersistenceError
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
]
