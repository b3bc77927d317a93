"""`ManualTimer`: a `dsh.timer.Timer` whose time moves only when a test advances it."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["ManualTimer"]


@dataclass(order=True)
class _Entry:
    due_ms: int
    order: int
    callback: Callable[[], None] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        self.cancelled = True


class ManualTimer:
    """A virtual millisecond clock; `advance` runs due callbacks in due order.

    Attributes:
        now_ms: The current virtual time.
    """

    def __init__(self, start_ms: int = 0) -> None:
        self.now_ms = start_ms
        self._queue: list[_Entry] = []
        self._order = itertools.count()

    def call_later(self, delay_ms: int, callback: Callable[[], None]) -> _Entry:
        """Schedule `callback` at `now_ms + delay_ms`."""
        entry = _Entry(self.now_ms + max(0, delay_ms), next(self._order), callback)
        heapq.heappush(self._queue, entry)
        return entry

    @property
    def pending(self) -> int:
        """How many scheduled callbacks have neither run nor been cancelled."""
        return sum(1 for entry in self._queue if not entry.cancelled)

    def next_due(self) -> int | None:
        """Virtual time of the next live callback, if any."""
        live = [entry.due_ms for entry in self._queue if not entry.cancelled]
        return min(live) if live else None

    def advance(self, ms: int) -> int:
        """Move time forward by `ms`, running every callback that falls due; returns how many ran."""
        return self.advance_to(self.now_ms + ms)

    def advance_to(self, when_ms: int) -> int:
        """Move time forward to `when_ms` (never backwards), running due callbacks in order."""
        ran = 0
        while self._queue and self._queue[0].due_ms <= when_ms:
            entry = heapq.heappop(self._queue)
            if entry.cancelled:
                continue
            self.now_ms = max(self.now_ms, entry.due_ms)
            ran += 1
            entry.callback()
        self.now_ms = max(self.now_ms, when_ms)
        return ran


# Shown under the name users import (docs/architecture.md#public-names).
ManualTimer.__module__ = "dsh.testing"
