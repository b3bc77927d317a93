"""The persistence package's map: private modules stay private, public paths stay where they were.

Modules whose names start with `_` are internals of their package (docs/architecture.md#layers):
nothing outside `dsh.persistence` imports them, not even the shipped test support in `dsh.testing`,
which uses the small public surface each backend package re-exports.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

_SRC = Path(__file__).resolve().parents[2] / "src"


def _imports(path: Path) -> set[str]:
    """Every dotted name an import statement of `path` names (`from a import b` gives `a` and `a.b`)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _private(name: str) -> bool:
    return name.startswith("dsh.persistence.") and any(part.startswith("_") for part in name.split(".")[2:])


def test_no_module_outside_persistence_imports_its_private_modules() -> None:
    """No module outside `dsh.persistence` (`dsh.testing` included) imports one of its underscore modules."""
    offenders = {
        str(path.relative_to(_SRC)): sorted(filter(_private, _imports(path)))
        for path in sorted((_SRC / "dsh").rglob("*.py"))
        if "persistence" not in path.relative_to(_SRC / "dsh").parts[:1]
    }
    assert {module: names for module, names in offenders.items() if names} == {}


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("dsh.persistence.coordinator", "PersistenceCoordinator"),
        ("dsh.persistence.jsonl", "JsonlBackend"),
        ("dsh.persistence.sqlite", "SqliteBackend"),
        ("dsh.persistence.postgres", "PostgresBackend"),
        ("dsh.persistence.memory", "MemoryBackend"),
        ("dsh.persistence.base", "PreparedSession"),
        ("dsh.persistence.base", "TypedReads"),
        ("dsh.persistence", "PreparedSession"),
    ],
)
def test_public_paths_resolve(module: str, name: str) -> None:
    """Each documented public import path names its object."""
    assert getattr(importlib.import_module(module), name) is not None


@pytest.mark.parametrize(
    "package", ["dsh.persistence", "dsh.persistence.jsonl", "dsh.persistence.sqlite", "dsh.persistence.postgres"]
)
def test_package_maps_export_only_public_names(package: str) -> None:
    """A package `__init__` lists what it exports, sorted, and every listed name resolves."""
    module = importlib.import_module(package)
    exported = list(module.__all__)
    assert exported == sorted(exported)
    assert all(not name.startswith("_") and getattr(module, name) is not None for name in exported)
