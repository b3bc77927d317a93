"""The shared persistence conformance suite (`dsh.testing.persistence`) run against the SQLite backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsh.persistence.sqlite import SqliteBackend
from dsh.testing.persistence import ConformanceTarget, PersistenceConformance
from dsh.testing.sqlite_writer import SqliteStoredLogWriter


def _target(path: Path) -> ConformanceTarget:
    independent = path.with_name(f"independent-{path.name}")
    return ConformanceTarget(
        lambda: SqliteBackend(path), SqliteStoredLogWriter(path), "sqlite", lambda: _target(independent)
    )


@pytest.mark.usefixtures("strict_sqlite_guard")
class TestSqliteConformance(PersistenceConformance):
    """Every conformance test on a SQLite file, with no sqlite3 call allowed on the event loop."""

    __test__ = True

    @pytest.fixture
    def target(self, tmp_path: Path) -> ConformanceTarget:
        """A fresh database file, its backend factory and its fixture writer."""
        return _target(tmp_path / "sessions.sqlite3")
