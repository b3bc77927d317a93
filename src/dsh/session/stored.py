"""`StoredEvents`: a validated stored log whose events are frozen lazily, on first access.

Layer: session. Reading a log is dominated by parsing it and by turning parsed JSON into deeply
immutable values. The read pipeline parses every record once and validates it eagerly (so
corruption is reported at read time), but hands a record out as a `SessionEvent` only when someone
looks at it. A file backend hands its records over as `LineRecords` — the validated JSON lines, their
types, the fast validation verdicts taken while scanning and, when the C helpers (`dsh._speedups`)
are built, the dicts parsed while scanning. With those dicts, the first touch of a chunk the scan
was certain of turns each dict into its `SessionEvent` and each payload into a lazily frozen view
(`dsh._lazy_json`) in place, without copying or parsing anything. Otherwise the chunk's lines are
parsed with one `orjson` call, each payload is wrapped in a view and each envelope copied into a
`SessionEvent` (with C-level `map`s and no Python call per event when the scan was certain of the
whole chunk). Records from other backends are frozen whole (`adopt`). A fold that declares its event
types can use `select` and never touches the events it ignores. Once frozen, an event is kept and its
line is dropped, so every access returns the same immutable object
(docs/architecture.md#read-path).
"""

from __future__ import annotations

import contextlib
import gc
import re
from collections import deque
from collections.abc import Collection, Iterator, Sequence
from itertools import repeat
from operator import is_, itemgetter, setitem
from typing import Any, Final, cast, overload

import orjson

from dsh._accel import speedups
from dsh._lazy_json import LazyFrozenDict, LazyFrozenList
from dsh.json import adopt
from dsh.session.events import KNOWN_EVENT_TYPES, SessionEvent

__all__ = [
    "LineRecords",
    "StoredEvents",
    "adopt_event",
    "collector_paused",
    "may_hold_negative_zero",
    "view_event",
]

_CHUNK: Final = 512

# A JSON number that parses to -0.0 is negative and either starts `-0` without a nonzero first
# decimal (`-0`, `-0.00`, `-0e5`, and `-0.000...01` with hundreds of zeros, which underflows) or has a
# negative exponent that may underflow (`-1e-400`, `-0.5e-400`). `-0` followed by a digit is no JSON
# number, so dates such as `2024-01-05` do not match. The search may say yes for text inside a
# string; it never says no for such a number.
_NEGATIVE_ZERO: Final = re.compile(rb"-(?:0(?![0-9]|\.[1-9])|[0-9]+(?:\.[0-9]+)?[eE]-)")

_DATA: Final = itemgetter("data")
_UNSURE: Final = 0
if speedups is not None:
    # What the JSONL scanner's C check hands records out as (and the types it shares strings for).
    speedups.configure(tuple(KNOWN_EVENT_TYPES), SessionEvent, LazyFrozenDict, LazyFrozenList)


@contextlib.contextmanager
def collector_paused(*, keep: bool = False) -> Iterator[None]:
    """Pause the cyclic garbage collector while a bulk step allocates objects.

    Parsed and frozen JSON never forms reference cycles, but every 700 container allocations the
    collector walks the young objects, and as kept objects age it walks them again in the middle
    and the oldest generation; for a large log that costs more than building them. With
    `keep=True` (the step keeps what it builds) the objects still young when the pause ends are
    moved straight to the oldest generation — `gc.freeze()` then `gc.unfreeze()` is exactly that
    move, and it costs O(1) — where only full collections, on their usual schedule, look at them.
    Young objects of other code move too: cyclic garbage among them waits for the next full
    collection instead of a young one. The move is skipped when the process keeps frozen objects of
    its own (`gc.get_freeze_count()`), since unfreezing would release them.

    The collector is re-enabled only if it was enabled on entry, so nested pauses and callers that
    disabled it on purpose keep their state. Use it only around code that runs no foreign callbacks.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if keep and gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()
            gc.enable()


def may_hold_negative_zero(text: bytes) -> bool:
    """Whether JSON `text` may spell a number that parses to `-0.0` (never a false "no")."""
    return _NEGATIVE_ZERO.search(text) is not None


def adopt_event(record: dict[str, Any]) -> SessionEvent:
    """Freeze one validated, freshly parsed record completely (read-side JSON rules)."""
    return adopt(record, root=SessionEvent)  # type: ignore[return-value]


def _view(value: Any) -> Any:
    """`value` wrapped in a lazily frozen view when it is a plain container, else `value` itself."""
    cls = value.__class__
    if cls is dict:
        return LazyFrozenDict(value)
    if cls is list:
        return LazyFrozenList(value)
    return value


def _all_of(items: list[Any], cls: type) -> bool:
    """Whether the class of every item is exactly `cls` (one C-level pass)."""
    classes = set(map(type, items))
    return not classes or (len(classes) == 1 and cls in classes)


def view_event(record: dict[str, Any]) -> SessionEvent:
    """Hand out one validated, freshly parsed record with its payload frozen lazily.

    Only for records whose values the read rules accept unchanged: parsed by `orjson` from a line
    the scanner checked for integers beyond 64 bits, holding no `-0.0`. The envelope of a plain
    event (`type`, `seq`, `time`, `data`, and `surfaceOp: "append"` on a surface event) holds scalars
    besides `data`, so wrapping `data` in a view and copying the envelope into a `SessionEvent`
    freezes it completely. Any other envelope (`ignorable`, `sourceEventSeqs`, a surface replace)
    is frozen whole by `adopt_event`. The caller hands `record` over (its `data` is replaced).
    """
    size = len(record)
    if size == 4 or (size == 5 and record.get("surfaceOp") == "append"):
        record["data"] = _view(record["data"])
        return SessionEvent(record)
    return adopt_event(record)


def _view_events(records: list[dict[str, Any]]) -> map[SessionEvent]:
    """`view_event` of every record, for records known to be plain events, with no Python call per
    event while every payload is an object (C-level `map`s; the records are handed over)."""
    payloads = list(map(_DATA, records))
    views = map(LazyFrozenDict, payloads) if _all_of(payloads, dict) else map(_view, payloads)
    deque(map(setitem, records, repeat("data"), views), maxlen=0)
    return map(SessionEvent, records)


def _line_event(line: bytes) -> SessionEvent:
    """The event of one validated line: lazily frozen unless a `-0.0` may hide in it."""
    record = orjson.loads(line)
    return adopt_event(record) if may_hold_negative_zero(line) else view_event(record)


class LineRecords(Sequence[dict[str, Any]]):
    """Stored records kept as their JSON lines or their parses; callers only read them.

    Every line is one complete JSON object on its own (the scanner parsed it), so lines joined by
    commas inside brackets form a JSON array of exactly their records; `StoredEvents` parses a
    whole chunk that way, with one call.

    Indexing returns the kept plain parse of a record when there is one, else a fresh parse of the
    record; slices and iteration always return fresh parses, so what they hand out is the caller's.

    Attributes:
        lines: One JSON text per record, in log order, or None where `parsed` keeps the record.
        types: Each record's `type`, taken while scanning (so selections need no parsing).
        verdicts: `dsh.session.fastcheck` verdicts per record (0 = not certain), or None when the
            positions are not seqs (a selection) or nobody checked.
        parsed: None, or one entry per record: what `orjson` parsed from its line while scanning
            (owned here; no `-0.0` can hide in it and the line held no oversized integer) —
            already the record's `SessionEvent` when its verdict is nonzero, else a plain dict —
            or None where the line is kept instead. Indexing hands out only the plain dicts (for an
            event, a fresh plain copy), so callers always see plain parsed records.
    """

    __slots__ = ("lines", "parsed", "types", "verdicts")

    def __init__(
        self,
        lines: list[bytes | None],
        types: list[str],
        verdicts: bytearray | None = None,
        parsed: list[dict[str, Any] | None] | None = None,
    ) -> None:
        self.lines = lines
        self.types = types
        self.verdicts = verdicts
        self.parsed = parsed

    def __len__(self) -> int:
        return len(self.lines)

    def _fresh(self, index: int) -> dict[str, Any]:
        """A new plain parse of the record at `index`."""
        line = self.lines[index]
        if line is None:
            assert self.parsed is not None
            line = orjson.dumps(self.parsed[index])
        record: dict[str, Any] = orjson.loads(line)
        return record

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(index, slice):
            return [self._fresh(i) for i in range(*index.indices(len(self.lines)))]
        if index < 0:
            index += len(self.lines)
        if self.parsed is not None:
            kept = self.parsed[index]
            if kept is not None and kept.__class__ is dict:
                return kept
        return self._fresh(index)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for index in range(len(self.lines)):
            yield self._fresh(index)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(other) == len(self.lines) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"LineRecords(len={len(self.lines)})"

    def select(self, types: Collection[str] | None, start: int = 0) -> LineRecords:
        """The records from `start` on whose type is in `types` (all when None), nothing parsed."""
        parsed = self.parsed
        if types is None:
            return LineRecords(self.lines[start:], self.types[start:], None, None if parsed is None else parsed[start:])
        wanted = frozenset(types)
        picked = [i for i in range(start, len(self.lines)) if self.types[i] in wanted]
        return LineRecords(
            [self.lines[i] for i in picked],
            [self.types[i] for i in picked],
            None,
            None if parsed is None else [parsed[i] for i in picked],
        )

    def replace(self, index: int, record: dict[str, Any], verdict: int | None) -> None:
        """Store `record` at `index` in place of what was read there (a migrated older shape)."""
        self.lines[index] = orjson.dumps(record)
        self.types[index] = record["type"]
        if self.verdicts is not None and verdict is not None:
            self.verdicts[index] = verdict
        if self.parsed is not None:
            self.parsed[index] = None

    def take(self) -> tuple[list[bytes | None], list[str], bytearray | None, list[dict[str, Any] | None] | None]:
        """Hand the lines, types, verdicts and parses over, leaving this object empty.

        A backend's result can outlive the read in a reference cycle (an executor future); once
        the records are taken, it no longer keeps them alive.
        """
        taken = self.lines, self.types, self.verdicts, self.parsed
        self.lines, self.types, self.verdicts, self.parsed = [], [], None, None
        return taken


class StoredEvents(Sequence[SessionEvent]):
    """Validated records plus in-memory tail events, exposed as immutable `SessionEvent`s.

    Args:
        records: Records that passed validation, contiguous from seq 0 — `LineRecords` (taken
            over; parsed chunk by chunk and frozen lazily) or other parsed dicts (frozen whole on
            first access). Ownership moves here.
        tail: Already-frozen events that follow the records (crash-repair closers).
    """

    __slots__ = ("_all_frozen", "_events", "_n", "_parsed", "_records", "_types", "_verdicts")

    def __init__(self, records: Sequence[dict[str, Any]], tail: Sequence[SessionEvent] = ()) -> None:
        self._records: list[Any]
        self._types: list[str] | None
        # The scan's fast verdicts (by position) when the records are the whole log from seq 0.
        self._verdicts: bytearray | None = None
        # The scan's parses (by position), when the C helpers kept them; else lines are parsed again.
        self._parsed: list[dict[str, Any] | None] | None = None
        self._events: list[SessionEvent | None]
        # Every event is frozen already: iteration and `materialize` have nothing to do.
        self._all_frozen = False
        if isinstance(records, LineRecords):
            self._records, self._types, self._verdicts, self._parsed = records.take()
        else:
            self._records = list(records)
            self._types = None
        parsed = self._parsed
        if (
            parsed is not None
            and self._verdicts is not None
            and self._verdicts.find(_UNSURE) < 0
            and self._records.count(None) == len(self._records)
        ):
            # The common case with the C helpers: the scan was certain of every record and kept
            # every parse, so every record is its event already (`LineRecords.parsed`).
            self._events = cast("list[SessionEvent | None]", parsed)
            self._parsed = None
            self._records = []
            self._all_frozen = True
        else:
            self._events = [None] * len(self._records)
        self._events.extend(tail)
        self._n = len(self._events)

    def __len__(self) -> int:
        return self._n

    def _get(self, index: int) -> SessionEvent:
        event = self._events[index]
        if event is None:
            kept = self._parsed[index] if self._parsed is not None else None
            if kept is not None:
                # The scan's event, or a plain parse it was unsure of (owned here, no `-0.0`).
                event = kept if kept.__class__ is SessionEvent else view_event(kept)
                self._parsed[index] = None  # type: ignore[index]
            else:
                record = self._records[index]
                assert record is not None
                event = _line_event(record) if type(record) is bytes else adopt_event(record)
            assert event is not None
            self._events[index] = event
            self._records[index] = None
        return event

    def _certain_parses(self, start: int, end: int) -> bool:
        """Whether every record of `[start, end)` has a kept parse the scan was certain of (and so
        handed out as its event already: `LineRecords.parsed`)."""
        parsed = self._parsed
        verdicts = self._verdicts
        return (
            parsed is not None
            and verdicts is not None
            and verdicts.find(_UNSURE, start, end) < 0
            and not any(map(is_, parsed[start:end], repeat(None)))
        )

    def _lines_only(self, start: int, end: int) -> bool:
        """Whether `[start, end)` has no kept parse (so every record there is a line)."""
        assert self._parsed is not None
        return all(map(is_, self._parsed[start:end], repeat(None)))

    def _freeze_parsed(self, start: int, end: int) -> None:
        """Take the events the scan made of `[start, end)` (`_certain_parses` holds)."""
        parsed = self._parsed
        assert parsed is not None
        # Nonzero verdict and a kept parse: the scan made it the event (`LineRecords.parsed`).
        self._events[start:end] = cast("list[SessionEvent]", parsed[start:end])
        self._records[start:end] = repeat(None, end - start)
        parsed[start:end] = repeat(None, end - start)

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

        A chunk nobody touched yet whose records all have a kept parse the scan was certain of
        becomes events in place (`_freeze_parsed`). Otherwise a chunk of lines nobody touched yet is
        parsed with one `orjson` call (the lines joined into
        one array). When the scan was certain of every record of the chunk (a nonzero fast verdict
        implies the plain envelope) and no `-0.0` can hide in it, the chunk becomes events with no
        Python call per event (`_view_events`); otherwise event by event. The collector is paused,
        and what the chunk keeps goes to the oldest generation (`collector_paused(keep=True)`), so
        freezing a whole log triggers no collection that would walk every event again.
        """
        events = self._events
        records = self._records
        with collector_paused(keep=True):
            untouched = all(map(is_, events[start:end], repeat(None)))
            if untouched and self._certain_parses(start, end):
                self._freeze_parsed(start, end)
                return
            if self._types is not None and untouched and (self._parsed is None or self._lines_only(start, end)):
                lines = records[start:end]
                joined = b"[" + b",".join(lines) + b"]"
                try:
                    parsed: list[dict[str, Any]] = orjson.loads(joined)
                except orjson.JSONDecodeError:
                    parsed = []  # deeper than the parser's limit once nested in the array: line by line
                if len(parsed) == len(lines):
                    verdicts = self._verdicts
                    if may_hold_negative_zero(joined):
                        events[start:end] = [
                            adopt_event(record) if may_hold_negative_zero(line) else view_event(record)
                            for record, line in zip(parsed, lines, strict=True)
                        ]
                    elif verdicts is not None and verdicts.find(_UNSURE, start, end) < 0:
                        events[start:end] = _view_events(parsed)
                    else:
                        events[start:end] = map(view_event, parsed)
                    records[start:end] = repeat(None, end - start)
                    if self._parsed is not None:
                        self._parsed[start:end] = repeat(None, end - start)
                    return
            for index in range(start, end):
                if events[index] is None:
                    self._get(index)

    def __iter__(self) -> Iterator[SessionEvent]:
        if self._all_frozen:
            yield from self._events  # type: ignore[misc]
            return
        # Freeze chunk by chunk, never while the consumer's code runs.
        stored = len(self._records)
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
        if self._all_frozen:
            return list(self._events)  # type: ignore[arg-type]
        stored = len(self._records)
        for start in range(0, stored, _CHUNK):
            self._freeze_range(start, min(start + _CHUNK, stored))
        return list(self._events)  # type: ignore[arg-type]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(other) == self._n and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"StoredEvents(len={self._n})"
