"""Test support that ships with the library: fakes, fixtures and conformance helpers.

Importable by users who build their own backends or agents: `ManualTimer` drives write-behind
windows and throttles without a wall clock; `FaultyBackend` injects storage faults into any
backend; the fixture writers store exact (also damaged) logs for memory, JSONL and SQLite;
`CountingPersistence` counts log reads per session. The pytest conformance suite lives in
`dsh.testing.persistence` (it needs pytest, so it is not imported here).
"""

from dsh.testing.counting import CountingPersistence
from dsh.testing.faulty import FaultyBackend, IOFaultSeam
from dsh.testing.jsonl_writer import JsonlLogWriter
from dsh.testing.sqlite_writer import RawText, SqliteLoopGuard, SqliteStoredLogWriter
from dsh.testing.stored_logs import ConformanceTarget, MemoryStoredLogWriter, StoredLogWriter, write_stored_log
from dsh.testing.timer import ManualTimer

__all__ = [
    "ConformanceTarget",
    "CountingPersistence",
    "FaultyBackend",
    "IOFaultSeam",
    "JsonlLogWriter",
    "ManualTimer",
    "MemoryStoredLogWriter",
    "RawText",
    "SqliteLoopGuard",
    "SqliteStoredLogWriter",
    "StoredLogWriter",
    "write_stored_log",
]
