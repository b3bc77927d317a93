"""Production backends hold no test seams: faults and holds are installed from `dsh.testing`.

The memory, JSONL, SQLite and PostgreSQL backends (and every private helper class in their
modules) define no `arm_*`, `hold_*`, `fail_*` or `inject_*` member and keep no armed fault; tests
reach the same faults by replacing one private primitive per step on one instance
(`dsh.testing.io_faults`, `dsh.testing.postgres`).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path
from types import ModuleType

import pytest

from dsh.persistence.jsonl import JsonlBackend
from dsh.persistence.memory import MemoryBackend
from dsh.persistence.postgres import PostgresBackend
from dsh.persistence.sqlite import SqliteBackend

BACKEND_MODULES = (
    "dsh.persistence.memory",
    "dsh.persistence.jsonl",
    "dsh.persistence.sqlite",
    "dsh.persistence.postgres",
    "dsh.persistence._locks",
    "dsh.persistence._workers",
)
"""The backends, their packages' private modules, and the private modules they share."""

SEAM_PREFIXES = ("arm_", "hold_", "fail_", "inject_")


def _modules() -> list[ModuleType]:
    """Every module of the backends: each package with all of its submodules."""
    found: list[ModuleType] = []
    for name in BACKEND_MODULES:
        module = importlib.import_module(name)
        found.append(module)
        for info in pkgutil.iter_modules(getattr(module, "__path__", []), f"{name}."):
            found.append(importlib.import_module(info.name))
    return found


def _defined_in(cls: type, module: ModuleType) -> bool:
    """Whether `cls` is written in `module`'s file (a public class shows its public module in `__module__`)."""
    if cls.__module__ == module.__name__:
        return True
    return any(
        getattr(getattr(member, "__code__", None), "co_filename", None) == module.__file__
        for member in vars(cls).values()
    )


def _classes(module: ModuleType) -> list[type]:
    """The classes defined in `module`, nested ones included."""
    pending = [value for value in vars(module).values() if inspect.isclass(value) and _defined_in(value, module)]
    found: list[type] = []
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(value for value in vars(cls).values() if inspect.isclass(value) and _defined_in(value, module))
    return found


def _is_seam(name: str) -> bool:
    return name.lstrip("_").startswith(SEAM_PREFIXES)


def _attributes(owner: object) -> dict[str, object]:
    """The instance attributes of `owner`, from its `__dict__` and the slots of its classes."""
    found = dict(getattr(owner, "__dict__", {}))
    for cls in type(owner).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if hasattr(owner, name):
                found[name] = getattr(owner, name)
    return found


def test_the_scan_sees_every_backend_and_its_helpers() -> None:
    """The scan covers the four backends and private helpers such as `Writes`, `Leases` and `OpenLogs`."""
    names = {cls.__qualname__ for module in _modules() for cls in _classes(module)}
    assert {"MemoryBackend", "JsonlBackend", "SqliteBackend", "PostgresBackend"} <= names
    assert {"Writes", "Leases", "OpenLogs", "WriterThreads", "WriterLocks"} <= names


def test_no_backend_class_defines_a_fault_or_hold_seam() -> None:
    """No class in a backend module has an `arm_*`, `hold_*`, `fail_*` or `inject_*` method or attribute."""
    seams = [
        f"{cls.__module__}.{cls.__qualname__}.{name}"
        for module in _modules()
        for cls in _classes(module)
        for name in dir(cls)
        if _is_seam(name)
    ]
    assert seams == []


def test_no_backend_module_defines_a_fault_or_hold_function() -> None:
    """No backend module has a module-level `arm_*`, `hold_*`, `fail_*` or `inject_*` function."""
    seams = [f"{module.__name__}.{name}" for module in _modules() for name in vars(module) if _is_seam(name)]
    assert seams == []


@pytest.mark.parametrize(
    "make",
    [
        lambda _root: MemoryBackend(),
        lambda root: JsonlBackend(root / "sessions"),
        lambda root: SqliteBackend(root / "sessions.sqlite3"),
        lambda _root: PostgresBackend("postgresql://127.0.0.1/never-opened"),
    ],
    ids=["memory", "jsonl", "sqlite", "postgresql"],
)
def test_a_constructed_backend_keeps_no_fault_state(tmp_path: Path, make: object) -> None:
    """A new backend instance, and every helper object it holds, has no attribute naming a fault or a seam."""
    backend = make(tmp_path)  # type: ignore[operator]
    helpers = [value for value in _attributes(backend).values() if type(value).__module__.startswith("dsh.")]
    names = [f"{type(owner).__name__}.{name}" for owner in [backend, *helpers] for name in _attributes(owner)]
    assert [name for name in names if "fault" in name.lower() or _is_seam(name.rpartition(".")[2])] == []
