"""`StoredEvents`: a validated stored log whose events are frozen lazily, on first access.

Layer: session. Reading a log is dominated by turning parsed JSON into deeply immutable values. The
read pipeline validates every record eagerly (so corruption is reported at read time), but freezes a
record into a `SessionEvent` only when someone looks at it. A fold that declares its event types can
use `select` and never freezes the events it ignores. Once frozen, an event is kept and the raw
record is dropped, so every access returns the same immutable object.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from typing import Any, overload

from dsh.json import adopt
from dsh.session.events import SessionEvent

__all__ = ["StoredEvents", "adopt_event"]


def adopt_event(record: dict[str, Any]) -> SessionEvent:
    """Freeze one validated, freshly parsed record (read-side JSON rules)."""
    return adopt(record, root=SessionEvent)  # type: ignore[return-value]


class StoredEvents(Sequence[SessionEvent]):
    """Validated records plus in-memory tail events, exposed as immutable `SessionEvent`s.

    Args:
        records: Parsed records that passed validation, contiguous from seq 0. Ownership moves here.
        tail: Already-frozen events that follow the records (crash-repair closers).
    """

    __slots__ = ("_events", "_n", "_records")

    def __init__(self, records: list[dict[str, Any]], tail: Sequence[SessionEvent] = ()) -> None:
        self._records: list[dict[str, Any] | None] = list(records)
        self._events: list[SessionEvent | None] = [None] * len(records)
        self._events.extend(tail)
        self._n = len(self._events)

    def __len__(self) -> int:
        return self._n

    def _get(self, index: int) -> SessionEvent:
        event = self._events[index]
        if event is None:
            record = self._records[index]
            assert record is not None
            event = adopt_event(record)
            self._events[index] = event
            self._records[index] = None
        return event

    @overload
    def __getitem__(self, index: int) -> SessionEvent: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[SessionEvent, ...]: ...

    def __getitem__(self, index: int | slice) -> SessionEvent | tuple[SessionEvent, ...]:
        if isinstance(index, slice):
            return tuple(self._get(i) for i in range(*index.indices(self._n)))
        if index < 0:
            index += self._n
        if not 0 <= index < self._n:
            raise IndexError("stored events index out of range")
        return self._get(index)

    def __iter__(self) -> Iterator[SessionEvent]:
        for index in range(self._n):
            yield self._get(index)

    def type_at(self, index: int) -> str:
        """The type of the event at `index`, without freezing it."""
        event = self._events[index]
        if event is not None:
            return event.type
        record = self._records[index]
        assert record is not None
        return record["type"]  # type: ignore[no-any-return]

    def select(self, types: Collection[str], start: int = 0) -> Iterator[SessionEvent]:
        """Yield, in order from `start`, only the events whose type is in `types` (others stay raw)."""
        for index in range(start, self._n):
            if self.type_at(index) in types:
                yield self._get(index)

    def materialize(self) -> list[SessionEvent]:
        """Every event frozen, as a new list (for a session that takes ownership of the log)."""
        return [self._get(index) for index in range(self._n)]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(other) == self._n and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"StoredEvents(len={self._n})"
