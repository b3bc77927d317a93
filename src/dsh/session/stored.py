"""`StoredEvents`: a validated stored log whose events are frozen lazily, on first access.

Layer: session. Reading a log is dominated by turning parsed JSON into deeply immutable values and
by keeping many parsed objects alive. The read pipeline validates every record eagerly (so
corruption is reported at read time), but freezes a record into a `SessionEvent` only when someone
looks at it. A file backend can hand its records over as `LineRecords` — the JSON lines themselves,
their types, and the fast validation verdicts taken while scanning — so a full read keeps bytes
rather than dicts and parses a line again only when its event is used. A fold that declares its
event types can use `select` and never touches the events it ignores. Once frozen, an event is kept
and its raw form is dropped, so every access returns the same immutable object.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Collection, Iterator, Sequence
from typing import Any, overload

import orjson

from dsh.json import adopt
from dsh.session.events import SessionEvent

__all__ = ["LineRecords", "StoredEvents", "adopt_event", "collector_paused"]

_CHUNK = 512


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a bulk step allocates objects it keeps.

    Parsed and frozen JSON never forms reference cycles, but every 700 container allocations the
    collector walks the young objects again, and as retained objects pile up it rescans older
    generations too, which can cost more than the work itself. The collector is re-enabled only if
    it was enabled on entry, so nested pauses and callers that disabled it on purpose keep their
    state. Use it only around code that runs no foreign callbacks.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def adopt_event(record: dict[str, Any]) -> SessionEvent:
    """Freeze one validated, freshly parsed record (read-side JSON rules)."""
    return adopt(record, root=SessionEvent)  # type: ignore[return-value]


class LineRecords(Sequence[dict[str, Any]]):
    """Stored records kept as their JSON lines: indexing parses a fresh dict (callers only read it).

    Attributes:
        lines: One JSON text per record, in log order.
        types: Each record's `type`, taken while scanning (so selections need no parsing).
        verdicts: `dsh.session.fastcheck` verdicts per record (0 = not certain), or None when the
            positions are not seqs (a selection) or nobody checked.
    """

    __slots__ = ("lines", "types", "verdicts")

    def __init__(self, lines: list[bytes], types: list[str], verdicts: bytearray | None = None) -> None:
        self.lines = lines
        self.types = types
        self.verdicts = verdicts

    def __len__(self) -> int:
        return len(self.lines)

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(index, slice):
            return [orjson.loads(line) for line in self.lines[index]]
        parsed: dict[str, Any] = orjson.loads(self.lines[index])
        return parsed

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for line in self.lines:
            yield orjson.loads(line)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(other) == len(self.lines) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"LineRecords(len={len(self.lines)})"

    def select(self, types: Collection[str] | None, start: int = 0) -> LineRecords:
        """The records from `start` on whose type is in `types` (all when None), still as lines."""
        if types is None:
            return LineRecords(self.lines[start:], self.types[start:])
        wanted = frozenset(types)
        picked = [i for i in range(start, len(self.lines)) if self.types[i] in wanted]
        return LineRecords([self.lines[i] for i in picked], [self.types[i] for i in picked])


class StoredEvents(Sequence[SessionEvent]):
    """Validated records plus in-memory tail events, exposed as immutable `SessionEvent`s.

    Args:
        records: Records that passed validation, contiguous from seq 0 — parsed dicts, or
            `LineRecords` (parsed again on first access). Ownership moves here.
        tail: Already-frozen events that follow the records (crash-repair closers).
    """

    __slots__ = ("_events", "_n", "_records", "_types")

    def __init__(self, records: Sequence[dict[str, Any]], tail: Sequence[SessionEvent] = ()) -> None:
        self._records: list[Any]
        self._types: list[str] | None
        if isinstance(records, LineRecords):
            # Keep the lines (bytes) rather than parsed dicts: far less memory, and parsed again
            # only for the events someone looks at.
            self._records = list(records.lines)
            self._types = records.types
        else:
            self._records = list(records)
            self._types = None
        self._events: list[SessionEvent | None] = [None] * len(self._records)
        self._events.extend(tail)
        self._n = len(self._events)

    def __len__(self) -> int:
        return self._n

    def _get(self, index: int) -> SessionEvent:
        event = self._events[index]
        if event is None:
            record = self._records[index]
            assert record is not None
            event = adopt_event(orjson.loads(record) if type(record) is bytes else record)
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
        # Freeze in chunks with the cyclic collector paused (never while the consumer's code runs):
        # retaining thousands of new containers otherwise triggers collections that rescan them all.
        for start in range(0, self._n, _CHUNK):
            end = min(start + _CHUNK, self._n)
            if any(self._events[index] is None for index in range(start, end)):
                with collector_paused():
                    for index in range(start, end):
                        self._get(index)
            yield from self._events[start:end]  # type: ignore[misc]

    def type_at(self, index: int) -> str:
        """The type of the event at `index`, without freezing it."""
        event = self._events[index]
        if event is not None:
            return event.type
        if self._types is not None:
            return self._types[index]
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
        with collector_paused():
            return [self._get(index) for index in range(self._n)]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(other) == self._n and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"StoredEvents(len={self._n})"
