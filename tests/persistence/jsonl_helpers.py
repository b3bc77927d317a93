"""Shared helpers of the JSONL backend tests: record builders, a coordinator stack, a counting opener."""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import IO, Any

from dsh.persistence.coordinator import PersistenceCoordinator
from dsh.persistence.jsonl import JsonlBackend
from dsh.session import SessionStore
from dsh.testing.jsonl_writer import JsonlLogWriter
from dsh.testing.stored_logs import (
    StepClock,
    append_closed_turn,
    append_every_core_type,
    append_open_step,
    build_records,
    stored_header,
)

__all__ = [
    "CountingOpener",
    "closed_records",
    "digest",
    "every_type_records",
    "make_backend",
    "make_writer",
    "open_step_records",
    "running",
    "stored_header",
    "tree_digest",
]


def closed_records(turns: int = 2) -> list[dict[str, Any]]:
    """Valid records of `turns` complete turns."""

    def build(session: Any) -> None:
        for turn in range(turns):
            append_closed_turn(session, turn)

    return build_records(build)


def open_step_records(
    *, closed: int = 1, calls: tuple[str, ...] = ("call-1",), started: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    """Valid records: `closed` complete turns, then a turn left open inside a step."""

    def build(session: Any) -> None:
        for turn in range(closed):
            append_closed_turn(session, turn)
        append_open_step(session, closed, calls=calls, started=started)

    return build_records(build)


def every_type_records() -> list[dict[str, Any]]:
    """One complete turn holding every appendable core type."""
    return build_records(append_every_core_type)


def make_backend(root: str | os.PathLike[str], compression: str, **kwargs: Any) -> JsonlBackend:
    """A JSONL backend over `root`."""
    return JsonlBackend(root, compression=compression, **kwargs)  # type: ignore[arg-type]


def make_writer(root: str | os.PathLike[str], compression: str) -> JsonlLogWriter:
    """The fixture writer for the same root."""
    return JsonlLogWriter(root, compression=compression)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def running(
    backend: Any, *, clock: Callable[[], int] | None = None
) -> AsyncIterator[tuple[PersistenceCoordinator, SessionStore]]:
    """An opened coordinator over `backend` with its own store, closed in the runtime's order."""
    store = SessionStore(clock=clock or StepClock())
    coordinator = PersistenceCoordinator(backend, store)
    await coordinator.open()
    try:
        yield coordinator, store
    finally:
        await store.aclose()
        await coordinator.close()


def digest(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a file's bytes."""
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def tree_digest(root: str | os.PathLike[str]) -> dict[str, str]:
    """Path -> SHA-256 of every file under `root` (proves a read path changed nothing)."""
    out: dict[str, str] = {}
    for directory, _, files in os.walk(root):
        for name in files:
            path = os.path.join(directory, name)
            out[path] = digest(path)
    return out


class _CountedFile:
    """A read-only file wrapper that reports every byte it hands out."""

    def __init__(self, handle: IO[bytes], owner: CountingOpener, path: str) -> None:
        self._handle = handle
        self._owner = owner
        self._path = path

    def read(self, size: int = -1) -> bytes:
        data = self._handle.read(size)
        self._owner.bytes_read[self._path] += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._handle.seek(offset, whence)

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> _CountedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CountingOpener:
    """An `opener` for `JsonlBackend` counting opens and bytes read per path."""

    def __init__(self) -> None:
        self.opens: Counter[str] = Counter()
        self.bytes_read: Counter[str] = Counter()

    def __call__(self, path: str, mode: str) -> Any:
        self.opens[path] += 1
        return _CountedFile(open(path, mode), self, path)  # the wrapper closes it
