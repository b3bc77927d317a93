"""The shared persistence conformance suite (`dsh.testing.persistence`) run against the PostgreSQL backend."""

from __future__ import annotations

import pytest

from dsh.persistence.postgres import PostgresBackend
from dsh.testing.persistence import ConformanceTarget, PersistenceConformance
from dsh.testing.postgres import PostgresStoredLogWriter, ThrowawaySchemas


def _target(schemas: ThrowawaySchemas) -> ConformanceTarget:
    url, schema = schemas.url, schemas.new()
    return ConformanceTarget(
        lambda: PostgresBackend(url, schema=schema),
        PostgresStoredLogWriter(url, schema),
        "postgresql",
        lambda: _target(schemas),
    )


class TestPostgresConformance(PersistenceConformance):
    """Every conformance test on a real PostgreSQL server, each in its own throw-away schema."""

    __test__ = True

    @pytest.fixture
    def target(self, pg_schemas: ThrowawaySchemas) -> ConformanceTarget:
        """A fresh schema, its backend factory and its fixture writer."""
        return _target(pg_schemas)
