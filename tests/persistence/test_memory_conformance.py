"""The shared persistence conformance suite (`dsh.testing.persistence`) run against the memory backend."""

from __future__ import annotations

import pytest

from dsh.persistence.memory import MemoryBackend, MemoryStorage
from dsh.testing.persistence import ConformanceTarget, MemoryStoredLogWriter, PersistenceConformance


def _target() -> ConformanceTarget:
    storage = MemoryStorage()
    return ConformanceTarget(lambda: MemoryBackend(storage), MemoryStoredLogWriter(storage), "memory", _target)


class TestMemoryConformance(PersistenceConformance):
    """Every conformance test on the in-memory reference backend."""

    __test__ = True

    @pytest.fixture
    def target(self) -> ConformanceTarget:
        """A fresh memory storage, its backend factory and its fixture writer."""
        return _target()
