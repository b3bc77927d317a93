"""The in-backend fault hook every shipped backend offers for tests (`dsh.testing.IOFaultSeam`).

Layer: persistence (private). A test arms one fault; the backend's next `append_batch` or
`commit_repair` takes it and fails from the inside, after writing part of the batch (`partial-write`,
`rollback`) or all of it (`sync`, failing at the durability step). The backend must still leave
the batch all-or-nothing: it rolls back before the error propagates. `rollback` additionally makes
the rollback fail where a backend can fail it (JSONL); elsewhere it acts as `partial-write`. The
memory, JSONL, SQLite and PostgreSQL backends all keep their armed fault in one `IOFaultSlot`, so
the seams share one shape and one meaning.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

__all__ = ["IOFault", "IOFaultSlot"]


@dataclass(frozen=True, slots=True)
class IOFault:
    """One armed fault: where it strikes (`partial-write`, `sync` or `rollback`) and what it raises."""

    kind: str
    error: BaseException

    def staged_length(self, size: int) -> int:
        """How much of a batch of `size` items (records, rows, bytes) is written before the fault strikes.

        All of it for `sync` (the fault strikes at the durability step), else half.
        """
        return size if self.kind == "sync" else size // 2

    @property
    def fails_rollback(self) -> bool:
        """Whether the rollback that follows must fail too (`rollback`)."""
        return self.kind == "rollback"


class IOFaultSlot:
    """Holds at most one armed fault until a write takes it (thread-safe: JSONL writes in worker threads)."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._fault: IOFault | None = None

    def arm(self, kind: str, error: BaseException) -> None:
        """Arm a fault for the next write (replacing one not yet taken)."""
        with self._mutex:
            self._fault = IOFault(kind, error)

    def take(self) -> IOFault | None:
        """The armed fault, removed from the slot, or None."""
        with self._mutex:
            fault, self._fault = self._fault, None
        return fault
