"""Test support that ships with the library: fakes, fixtures and conformance helpers.

Importable by users who build their own backends or agents: `ManualTimer` drives write-behind
windows and throttles without a wall clock; `FaultyBackend` injects storage faults into any
backend, and `io_fault` fails a backend's own write from the inside (after part of a batch, at its
durability step, or in its rollback) by replacing a private write primitive for one block; the
fixture writers store exact (also damaged) logs for memory, JSONL and SQLite; `CountingPersistence`
counts log reads per session; `check_unit` checks a projection unit against its contract. The pytest
conformance suite lives in `dsh.testing.persistence`.

Importing this package needs only the runtime dependencies. What needs the `pydsh[testing]` extra
(pytest, pytest-asyncio, hypothesis) is imported on first use: `check_unit` loads
`dsh.testing.projection` when it is first accessed, and the conformance suite is its own module.
"""

from typing import TYPE_CHECKING, Any

from dsh.testing.counting import CountingPersistence
from dsh.testing.faulty import FaultyBackend
from dsh.testing.io_faults import IOFault, IOFaultInjector, IOFaultKind, IOFaultShot, io_fault, io_fault_injector
from dsh.testing.jsonl_writer import JsonlLogWriter
from dsh.testing.sqlite_writer import RawText, SqliteLoopGuard, SqliteStoredLogWriter
from dsh.testing.stored_logs import ConformanceTarget, MemoryStoredLogWriter, StoredLogWriter, write_stored_log
from dsh.testing.timer import ManualTimer

if TYPE_CHECKING:
    from dsh.testing.projection import check_unit

__all__ = [
    "ConformanceTarget",
    "CountingPersistence",
    "FaultyBackend",
    "IOFault",
    "IOFaultInjector",
    "IOFaultKind",
    "IOFaultShot",
    "JsonlLogWriter",
    "ManualTimer",
    "MemoryStoredLogWriter",
    "RawText",
    "SqliteLoopGuard",
    "SqliteStoredLogWriter",
    "StoredLogWriter",
    "check_unit",
    "io_fault",
    "io_fault_injector",
    "write_stored_log",
]


def __getattr__(name: str) -> Any:
    # Deferred (PEP 562) so that `import dsh.testing` never imports hypothesis.
    if name == "check_unit":
        from dsh.testing.projection import check_unit

        return check_unit
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
