"""Spinners for the CLI: on stderr only, only on a terminal, never with `--json`, and only when slow.

Layer: CLI (presentation only). A spinner covers an operation expected to take more than half a
second; it appears only once the operation has run that long (`SPINNER_DELAY_S`), so quick commands
never flicker, and it is transient: nothing of it stays on the screen or reaches stdout
(docs/cli.md#output-and-progress).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Final

from dsh.cli.text import safe

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["SPINNER_DELAY_S", "spinner"]

SPINNER_DELAY_S: Final = 0.5
"""How long an operation runs before its spinner appears."""


@contextlib.contextmanager
def spinner(console: Console, label: str, *, enabled: bool = True, delay_s: float = SPINNER_DELAY_S) -> Iterator[None]:
    """Show `label` with a spinner on `console` (stderr) while the block runs, after `delay_s`.

    Nothing is shown when `enabled` is False (`--json`) or when the console is not a terminal.
    """
    if not enabled or not console.is_terminal:
        yield
        return
    status = console.status(safe(label), spinner="dots")
    lock = threading.Lock()
    state = {"started": False, "done": False}

    def show() -> None:
        with lock:
            if not state["done"]:
                status.start()
                state["started"] = True

    timer = threading.Timer(delay_s, show)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        with lock:
            state["done"] = True
            if state["started"]:
                status.stop()
