"""Stored records and `StoredEvents`: a validated stored log whose events are frozen on first access.

Layer: session. A cold read parses every record once and validates it eagerly (so corruption is
reported at read time), but hands a record out as a `SessionEvent` only when someone looks at it.
What a backend hands over is a `StoredRecords` source: records by position, their types without
parsing, and `take`, which hands a range over as fresh plain records. A backend that holds plain
records uses `RecordList`; the JSONL backend keeps each record as its validated line and parses a
range when it is taken (its container is private to it). Freezing a record copies its envelope into
a `SessionEvent` and wraps its payload in a lazily frozen view (`dsh._lazy_json`), so a reader pays
for the top level of what it touches and nothing more. Records a backend could not vouch for (see
`viewable`) are frozen whole by `adopt`. Once frozen, an event is kept and its record released, so
every access returns the same immutable object (docs/architecture.md#read-path).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Collection, Iterator, Mapping, Sequence
from itertools import repeat
from operator import is_, itemgetter, setitem
from typing import Any, Final, overload

from dsh._lazy_json import LazyFrozenDict, LazyFrozenList
from dsh.json import adopt
from dsh.session.events import SessionEvent
from dsh.session.fastcheck import FAST_UNSURE

__all__ = ["RecordList", "StoredEvents", "StoredRecords", "adopt_event", "stored_records", "view_event"]

_CHUNK: Final = 512
_DATA: Final = itemgetter("data")


class StoredRecords(Sequence[dict[str, Any]], ABC):
    """The records of a stored log as a backend hands them over (the stored-log contract).

    Positions are record positions (seqs for a whole log). Reading a record gives a plain parsed
    dict the caller only reads; `take` hands a range over for good, as fresh plain dicts the caller
    owns (they may be changed, e.g. wrapped in place), and releases what the source kept for it.
    """

    __slots__ = ()

    @abstractmethod
    def type_at(self, index: int) -> str:
        """The record's `type`, without parsing anything."""

    @abstractmethod
    def replace(self, index: int, record: dict[str, Any]) -> None:
        """Put `record` at `index` in place of what was stored there (a migrated older shape)."""

    @abstractmethod
    def select(self, types: Collection[str] | None, start: int) -> StoredRecords:
        """The records from position `start` on whose type is in `types` (all when None), as a new source."""

    @abstractmethod
    def take(self, start: int, end: int) -> list[dict[str, Any]]:
        """Hand `[start, end)` over as fresh plain records the caller owns; the source forgets them."""

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]


class RecordList(StoredRecords):
    """`StoredRecords` over plain parsed dicts (the backends that decode rows one by one).

    Args:
        records: The records, in order; the list is taken over.
    """

    __slots__ = ("_records",)

    def __init__(self, records: list[dict[str, Any]]) -> None:
        self._records: list[Any] = records

    def __len__(self) -> int:
        return len(self._records)

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        found: dict[str, Any] | list[dict[str, Any]] = self._records[index]
        return found

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._records)

    def type_at(self, index: int) -> str:
        """The record's `type`."""
        kind: str = self._records[index]["type"]
        return kind

    def replace(self, index: int, record: dict[str, Any]) -> None:
        """Put `record` at `index`."""
        self._records[index] = record

    def select(self, types: Collection[str] | None, start: int) -> RecordList:
        """The records from `start` on whose type is in `types` (all when None)."""
        tail = self._records[start:]
        if types is None:
            return RecordList(tail)
        wanted = frozenset(types)
        return RecordList([record for record in tail if record["type"] in wanted])

    def take(self, start: int, end: int) -> list[dict[str, Any]]:
        """Hand `[start, end)` over; the positions keep nothing afterwards."""
        part: list[dict[str, Any]] = self._records[start:end]
        self._records[start:end] = repeat(None, end - start)
        return part

    def __repr__(self) -> str:
        return f"RecordList(len={len(self._records)})"


def stored_records(records: StoredRecords | Sequence[Mapping[str, Any]]) -> StoredRecords:
    """`records` as a `StoredRecords` source: a source as it is, plain records in a `RecordList`."""
    if isinstance(records, StoredRecords):
        return records
    return RecordList([dict(record) if type(record) is not dict else record for record in records])


def adopt_event(record: Mapping[str, Any]) -> SessionEvent:
    """Freeze one validated record completely (read-side JSON rules: `-0.0` reads as `0.0`)."""
    return adopt(record, root=SessionEvent)  # type: ignore[return-value]


def _view(value: Any) -> Any:
    """`value` wrapped in a lazily frozen view when it is a plain container, else `value` itself."""
    cls = type(value)
    if cls is dict:
        return LazyFrozenDict(value)
    if cls is list:
        return LazyFrozenList(value)
    return value


def view_event(record: dict[str, Any]) -> SessionEvent:
    """Hand out one validated, freshly parsed record with its payload frozen lazily.

    Only for records whose values the read rules accept unchanged (a `viewable` load: parsed by
    `orjson`, no integer beyond 64 bits, no `-0.0`). The envelope of a plain event (`type`, `seq`,
    `time`, `data`, and `surfaceOp: "append"` on a surface event) holds scalars besides `data`, so
    wrapping `data` in a view and copying the envelope into a `SessionEvent` freezes it completely.
    Any other envelope (`ignorable`, `sourceEventSeqs`, a surface replace) is frozen whole by
    `adopt_event`. The caller hands `record` over (its `data` is replaced).
    """
    size = len(record)
    if size == 4 or (size == 5 and record.get("surfaceOp") == "append"):
        record["data"] = _view(record["data"])
        return SessionEvent(record)
    return adopt_event(record)


def _view_plain_events(records: list[dict[str, Any]]) -> map[SessionEvent]:
    """`view_event` of records known to hold a plain envelope, with no Python call per event while
    every payload is an object (C-level `map`s). The records are handed over."""
    only_objects = set(map(type, map(_DATA, records))) <= {dict}
    # Each old payload goes as soon as its view has replaced it in its record.
    views = map(LazyFrozenDict if only_objects else _view, map(_DATA, records))
    deque(map(setitem, records, repeat("data"), views), maxlen=0)
    return map(SessionEvent, records)


class StoredEvents(Sequence[SessionEvent]):
    """Validated records plus in-memory tail events, exposed as immutable `SessionEvent`s.

    Args:
        records: Records that passed validation, in log order (contiguous seqs from the first): a
            `StoredRecords` source or plain records. Ownership moves here; each record is taken
            from its source once, when its event is made.
        tail: Already-frozen events that follow the records (crash-repair closers).
        verdicts: The fast-check verdicts of `records` by position (`dsh.session.fastcheck`), when
            the records are a whole log from seq 0: a chunk the check was certain of holds only
            plain envelopes, so it is frozen with no Python call per event.
        viewable: Whether the records are parses the read rules accept unchanged (no integer beyond
            64 bits, no `-0.0`), so their payloads may be wrapped in lazily frozen views; otherwise
            each record is frozen whole (`adopt`) on first access.
    """

    __slots__ = ("_events", "_n", "_records", "_stored", "_verdicts", "_viewable")

    def __init__(
        self,
        records: StoredRecords | Sequence[Mapping[str, Any]],
        tail: Sequence[SessionEvent] = (),
        *,
        verdicts: bytes | bytearray | None = None,
        viewable: bool = False,
    ) -> None:
        self._records = stored_records(records)
        self._stored = len(self._records)
        self._verdicts = verdicts if verdicts is not None and len(verdicts) == self._stored else None
        self._viewable = viewable
        self._events: list[SessionEvent | None] = [None] * self._stored
        self._events.extend(tail)
        self._n = len(self._events)

    def __len__(self) -> int:
        return self._n

    def _freeze(self, record: dict[str, Any]) -> SessionEvent:
        return view_event(record) if self._viewable else adopt_event(record)

    def _get(self, index: int) -> SessionEvent:
        event = self._events[index]
        if event is None:
            event = self._freeze(self._records.take(index, index + 1)[0])
            self._events[index] = event
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

    def _freeze_range(self, start: int, end: int) -> None:
        """Freeze the stored events of `[start, end)` that are not frozen yet.

        A chunk nobody touched yet is taken from the source in one piece (for the JSONL backend: its
        lines parsed with one call) and each record is released as soon as its event exists, so a
        full read never holds a record and its event at once beyond one chunk: its memory, and the
        collector's work, stay what holding the events costs. A chunk the fast check was certain of
        becomes events with no Python call per event.
        """
        events = self._events
        if not all(map(is_, events[start:end], repeat(None))):
            for index in range(start, end):
                if events[index] is None:
                    self._get(index)
            return
        part = self._records.take(start, end)
        if not self._viewable:
            events[start:end] = map(adopt_event, part)
        elif self._verdicts is not None and self._verdicts.find(FAST_UNSURE, start, end) < 0:
            events[start:end] = _view_plain_events(part)
        else:
            events[start:end] = map(view_event, part)

    def __iter__(self) -> Iterator[SessionEvent]:
        # Freeze chunk by chunk, never while the consumer's code runs.
        stored = self._stored
        for start in range(0, self._n, _CHUNK):
            end = min(start + _CHUNK, self._n)
            if start < stored:
                self._freeze_range(start, min(end, stored))
            yield from self._events[start:end]  # type: ignore[misc]

    def type_at(self, index: int) -> str:
        """The type of the event at `index`, without freezing it."""
        event = self._events[index]
        if event is not None:
            return event.type
        return self._records.type_at(index)

    def select(self, types: Collection[str], start: int = 0) -> Iterator[SessionEvent]:
        """Yield, in order from `start`, only the events whose type is in `types` (others stay raw)."""
        for index in range(start, self._n):
            if self.type_at(index) in types:
                yield self._get(index)

    def materialize(self) -> list[SessionEvent]:
        """Every event frozen, as a new list (for a session that takes ownership of the log)."""
        for start in range(0, self._stored, _CHUNK):
            self._freeze_range(start, min(start + _CHUNK, self._stored))
        return list(self._events)  # type: ignore[arg-type]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(other) == self._n and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"StoredEvents(len={self._n})"
