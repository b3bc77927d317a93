"""Small concurrency helpers of the continuation manager: per-key locks and an abortable wait.

Layer: subagent (private).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dsh.abort import AbortSignal

__all__ = ["KeyedLocks", "wait_or_abort"]


class KeyedLocks:
    """One `asyncio.Lock` per key, dropped again when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        """Hold the lock of `key` for the body of the `async with`."""
        lock, users = self._locks.get(key, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


async def wait_or_abort(event: asyncio.Event, signal: AbortSignal | None) -> None:
    """Wait for `event`; an abort of `signal` first raises the signal's reason."""
    if signal is None:
        await event.wait()
        return
    waiters = {asyncio.ensure_future(event.wait()), asyncio.ensure_future(signal.wait())}
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
    if not event.is_set():
        signal.throw_if_aborted()
