"""An injectable timer for write-behind windows and throttles.

Layer: base. Components that wait (the persistence batching window, the projection cache's
interval throttle) schedule callbacks through a `Timer` instead of sleeping, so tests drive time
with `dsh.testing.ManualTimer` and never depend on the wall clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

__all__ = ["LoopTimer", "Timer", "TimerHandle"]


class TimerHandle(Protocol):
    """A scheduled callback that can be cancelled (cancelling twice is harmless)."""

    def cancel(self) -> None:
        """Prevent the callback from running if it has not run yet."""


class Timer(Protocol):
    """Schedules a callback after a delay in milliseconds."""

    def call_later(self, delay_ms: int, callback: Callable[[], None]) -> TimerHandle:
        """Run `callback()` once, `delay_ms` milliseconds from now."""


class LoopTimer:
    """The default timer: the running event loop's `call_later`."""

    def call_later(self, delay_ms: int, callback: Callable[[], None]) -> TimerHandle:
        """Schedule on the running loop."""
        return asyncio.get_running_loop().call_later(delay_ms / 1000, callback)
