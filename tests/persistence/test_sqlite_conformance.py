"""The shared persistence conformance suite (02 §9 #1 to #36) against the SQLite backend."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dsh.persistence.sqlite import SqliteBackend
from dsh.testing.persistence import ConformanceTarget, PersistenceConformance
from dsh.testing.sqlite_writer import SqliteLoopGuard, SqliteStoredLogWriter


def _target(path: Path) -> ConformanceTarget:
    independent = path.with_name(f"independent-{path.name}")
    return ConformanceTarget(
        lambda: SqliteBackend(path), SqliteStoredLogWriter(path), "sqlite", lambda: _target(independent)
    )


class TestSqliteConformance(PersistenceConformance):
    """Every conformance test on a SQLite file, with no sqlite3 call allowed on the event loop (02 #51)."""

    __test__ = True

    @pytest.fixture(autouse=True)
    def no_sqlite_on_loop(self) -> Iterator[None]:
        """Fail the test if any sqlite3 call ran on the event loop (02 #51)."""
        with SqliteLoopGuard() as guard:
            yield
        guard.assert_clean()

    @pytest.fixture
    def target(self, tmp_path: Path) -> ConformanceTarget:
        """A fresh database file, its backend factory and its fixture writer."""
        return _target(tmp_path / "sessions.sqlite3")
