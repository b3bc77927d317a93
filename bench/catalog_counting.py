"""Read counters for the catalog benchmark, installed at and below the storage backend, never above it.

Two counters, both outside the code under test:

* `CountingBackend` wraps the `StorageBackend` handed to `Runtime.open(backend=...)`. Every async hook
  the coordinator calls on it is counted by name; list-shaped results (`(rows, damaged)`) add their
  row count, and `StoredLog` results (a log load) add their event count. New hooks a backend grows are
  counted the same way, since the wrapper forwards and counts whatever is asked of it.
* `FileCounter` is a process audit hook (`sys.addaudithook`): every `open`, `os.listdir` and
  `os.scandir` under a watched folder is counted, whichever module or thread asks for it. That is
  below the backend and below anything the backend uses (an index file, a helper), so no Python-level
  read of the home can bypass it. SQLite reads happen inside the C library and are not Python-level
  file opens; for SQLite the backend counter is the one that matters.
"""

from __future__ import annotations

import inspect
import os
import sys
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from dsh.persistence.base import StoredLog

LOG_NAMES = ("session.jsonl.zstd", "session.jsonl")
LOAD_HOOKS = ("load", "load_typed")


class CountingBackend:
    """A transparent proxy over a storage backend that counts every async hook call.

    Attributes:
        calls: Calls per hook name.
        rows: Header rows returned per list-shaped hook.
        events: Events returned per load-shaped hook.
    """

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.calls: Counter[str] = Counter()
        self.rows: Counter[str] = Counter()
        self.events: Counter[str] = Counter()

    def __repr__(self) -> str:
        return f"CountingBackend({self._inner!r})"

    def reset(self) -> None:
        """Forget every count."""
        self.calls.clear()
        self.rows.clear()
        self.events.clear()

    @property
    def loads(self) -> int:
        """Log loads (whole or typed): the backend's reads of event bodies."""
        return sum(self.calls[name] for name in LOAD_HOOKS)

    @property
    def header_rows(self) -> int:
        """Header rows returned by list-shaped hooks."""
        return sum(self.rows.values())

    def snapshot(self) -> dict[str, Any]:
        """The counts as plain data."""
        return {
            "loads": self.loads,
            "header_rows": self.header_rows,
            "calls": dict(self.calls),
            "rows": dict(self.rows),
        }

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if not inspect.iscoroutinefunction(value):
            return value
        calls, rows, events = self.calls, self.rows, self.events

        async def counted(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            result = await value(*args, **kwargs)
            if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], list):
                rows[name] += len(result[0])
            elif isinstance(result, StoredLog):
                events[name] += len(result.events)
            return result

        counted.__name__ = name
        # Cached on the instance: later lookups find it without going through `__getattr__`.
        self.__dict__[name] = counted
        return counted


@dataclass
class FileCounts:
    """What one watched window saw under the watched folder."""

    log_opens: int = 0
    other_opens: int = 0
    dir_scans: int = 0
    sqlite_connects: int = 0
    other_names: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        """Plain data (the other file names, most opened first, at most five)."""
        return {
            "log_opens": self.log_opens,
            "other_opens": self.other_opens,
            "dir_scans": self.dir_scans,
            "sqlite_connects": self.sqlite_connects,
            "other_names": dict(self.other_names.most_common(5)),
        }


class FileCounter:
    """Counts file opens and directory scans under one folder while a window is open.

    One instance per process (`FileCounter.installed()`): an audit hook cannot be removed, so the hook
    stays installed and does nothing while no window is open.
    """

    _instance: ClassVar[FileCounter | None] = None

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._prefixes: tuple[str, ...] = ()
        self._counts = FileCounts()

    @classmethod
    def installed(cls) -> FileCounter:
        """The process's counter, installing its audit hook on first use."""
        if cls._instance is None:
            counter = cls()
            sys.addaudithook(counter._hook)
            cls._instance = counter
        return cls._instance

    def start(self, folder: str | os.PathLike[str]) -> None:
        """Open a window: count from now on under `folder`."""
        raw = os.fspath(folder)
        prefixes = {os.path.abspath(raw), os.path.realpath(raw)}
        with self._lock:
            self._prefixes = tuple(prefix.rstrip(os.sep) + os.sep for prefix in prefixes)
            self._counts = FileCounts()

    def stop(self) -> FileCounts:
        """Close the window and return its counts."""
        with self._lock:
            self._prefixes = ()
            counts, self._counts = self._counts, FileCounts()
        return counts

    def _hook(self, event: str, args: tuple[Any, ...]) -> None:
        prefixes = self._prefixes
        if not prefixes or event not in _WATCHED:
            return
        target = args[0] if args else None
        if target is None or isinstance(target, int):
            return  # `open(fd)` after `os.open(path)`: the path was counted already
        try:
            path = os.fsdecode(target)
        except TypeError:
            return
        if not os.path.isabs(path):
            path = os.path.abspath(path)
        if not (path + os.sep).startswith(prefixes):
            return
        _WATCHED[event](self, path)

    def _on_open(self, path: str) -> None:
        name = os.path.basename(path)
        with self._lock:
            if name in LOG_NAMES:
                self._counts.log_opens += 1
            else:
                self._counts.other_opens += 1
                self._counts.other_names[name] += 1

    def _on_scan(self, path: str) -> None:
        with self._lock:
            self._counts.dir_scans += 1

    def _on_connect(self, path: str) -> None:
        with self._lock:
            self._counts.sqlite_connects += 1


_WATCHED: dict[str, Callable[[FileCounter, str], None]] = {
    "open": FileCounter._on_open,
    "os.listdir": FileCounter._on_scan,
    "os.scandir": FileCounter._on_scan,
    "sqlite3.connect": FileCounter._on_connect,
}
