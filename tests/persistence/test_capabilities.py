"""Declared capabilities match implemented protocols, for every shipped backend and its fault wrapper.

Capabilities are declared, never guessed from methods; these tests hold each backend to its
declaration: `TYPED_READS` exactly when it implements `TypedReads`, `ARTIFACT_PATHS` exactly when
`locate` names a path, and an in-backend fault injector (`dsh.testing.io_faults`) for all of them. The
coordinator uses typed reads only where they are declared.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from dsh.persistence.base import Capability, StorageBackend, StoredLog, TypedReads, typed_reads_of
from dsh.persistence.coordinator import PersistenceCoordinator
from dsh.persistence.jsonl import JsonlBackend
from dsh.persistence.memory import MemoryBackend, MemoryStorage
from dsh.persistence.postgres import PostgresBackend
from dsh.persistence.sqlite import SqliteBackend
from dsh.session.store import SessionStore
from dsh.testing.faulty import FaultyBackend, TypedFaultyBackend
from dsh.testing.io_faults import io_fault_injector
from dsh.testing.stored_logs import (
    MemoryStoredLogWriter,
    append_closed_turn,
    build_records,
    stored_header,
    write_stored_log,
)

BACKENDS: dict[str, Callable[[Path], StorageBackend]] = {
    "memory": lambda _root: MemoryBackend(),
    "jsonl-zstd": lambda root: JsonlBackend(root / "sessions", compression="zstd"),
    "jsonl-raw": lambda root: JsonlBackend(root / "sessions", compression="none"),
    "sqlite": lambda root: SqliteBackend(root / "sessions.sqlite3"),
    "postgresql": lambda _root: PostgresBackend("postgresql://127.0.0.1/never-opened"),
}


@pytest.fixture(params=sorted(BACKENDS))
def shipped(request: pytest.FixtureRequest, tmp_path: Path) -> StorageBackend:
    """Each shipped backend in turn, constructed but not opened (nothing here does I/O)."""
    return BACKENDS[request.param](tmp_path)


def _declares(backend: StorageBackend, capability: Capability) -> bool:
    return capability in backend.capabilities


def test_typed_reads_are_declared_exactly_when_implemented(shipped: StorageBackend) -> None:
    """A backend declares TYPED_READS if and only if it implements the `TypedReads` protocol."""
    assert _declares(shipped, Capability.TYPED_READS) == isinstance(shipped, TypedReads)
    assert (typed_reads_of(shipped) is shipped) == _declares(shipped, Capability.TYPED_READS)


def test_artifact_paths_are_declared_exactly_when_locate_names_one(shipped: StorageBackend) -> None:
    """A backend declares ARTIFACT_PATHS if and only if `locate` returns a path for a valid header."""
    located = shipped.locate(stored_header("s1", cwd="/work"))
    assert _declares(shipped, Capability.ARTIFACT_PATHS) == (located is not None)


def test_only_the_postgres_backend_hands_out_leases(shipped: StorageBackend) -> None:
    """Only PostgreSQL declares LEASES (fenced lease rows); the file stores guard writers with `flock`."""
    assert _declares(shipped, Capability.LEASES) == (shipped.name == "postgresql")


def test_every_shipped_backend_has_an_in_backend_fault_injector(shipped: StorageBackend) -> None:
    """`dsh.testing.io_faults` can fail the writes of memory, JSONL, SQLite and PostgreSQL from the inside."""
    assert io_fault_injector(shipped) is not None
    assert FaultyBackend(shipped).has_io_faults


def test_the_fault_wrapper_mirrors_the_wrapped_backend(shipped: StorageBackend) -> None:
    """`FaultyBackend` declares and implements exactly what it wraps: `load_typed` only with TYPED_READS."""
    wrapped = FaultyBackend(shipped)
    typed = _declares(shipped, Capability.TYPED_READS)
    assert wrapped.capabilities == shipped.capabilities
    assert isinstance(wrapped, TypedFaultyBackend) == typed
    assert isinstance(wrapped, TypedReads) == typed
    assert hasattr(wrapped, "load_typed") == typed


def test_jsonl_has_no_typed_reads() -> None:
    """The JSONL backend reads whole files, so it neither declares TYPED_READS nor has `load_typed`."""
    backend = JsonlBackend("sessions")
    assert not hasattr(backend, "load_typed")
    assert typed_reads_of(backend) is None


class _UndeclaredTypedReads(MemoryBackend):
    """A memory backend that keeps `load_typed` but does not declare TYPED_READS."""

    def __init__(self, storage: MemoryStorage) -> None:
        super().__init__(storage)
        self.capabilities = frozenset()
        self.typed_calls = 0

    async def load_typed(
        self, session_id: str, types: frozenset[str] | None, from_seq: int, known: frozenset[str]
    ) -> StoredLog | None:
        """Count the call, then read as the memory backend does."""
        self.typed_calls += 1
        return await super().load_typed(session_id, types, from_seq, known)


async def test_coordinator_uses_typed_reads_only_when_declared(store: SessionStore) -> None:
    """A typed read over a backend without the TYPED_READS declaration is a full load, filtered above."""
    storage = MemoryStorage()
    backend = _UndeclaredTypedReads(storage)
    await write_stored_log(MemoryStoredLogWriter(storage), "s1", build_records(lambda s: append_closed_turn(s, 1)))
    async with PersistenceCoordinator(backend, store) as coordinator:
        typed = await coordinator.read_events("s1", types=["turn/end"])
    assert [event.type for event in typed.events] == ["turn/end"]
    assert typed.next_seq == 6
    assert backend.typed_calls == 0
