"""The shared persistence conformance suite (`dsh.testing.persistence`) run against the JSONL backend, zstd and raw."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsh.persistence.jsonl import Compression, JsonlBackend
from dsh.testing.jsonl_writer import JsonlLogWriter
from dsh.testing.persistence import ConformanceTarget, PersistenceConformance


def _target(root: Path, compression: Compression) -> ConformanceTarget:
    return ConformanceTarget(
        lambda: JsonlBackend(root, compression=compression),
        JsonlLogWriter(root, compression=compression),
        f"jsonl-{'zstd' if compression == 'zstd' else 'raw'}",
        lambda: _target(root.with_name(f"independent-{root.name}"), compression),
    )


class TestJsonlZstdConformance(PersistenceConformance):
    """Every conformance test on a zstd-framed JSONL root."""

    __test__ = True

    @pytest.fixture
    def target(self, tmp_path: Path) -> ConformanceTarget:
        """A fresh root, its backend factory and its fixture writer."""
        return _target(tmp_path / "sessions", "zstd")


class TestJsonlRawConformance(PersistenceConformance):
    """Every conformance test on a plain `.jsonl` root."""

    __test__ = True

    @pytest.fixture
    def target(self, tmp_path: Path) -> ConformanceTarget:
        """A fresh root, its backend factory and its fixture writer."""
        return _target(tmp_path / "sessions", "none")
