"""Fold mechanics shared by the registry's live cells and its cold restores.

Layer: projection (internal to `dsh.projection.registry`). `Entry` is one registered unit with its
hot-path fields precomputed. The helpers here enforce the unit contract around every call into a
unit (an exception, an awaitable or a non-object state is a `UnitContractError`, never an escape),
render and validate views, read checkpoint rows without ever raising on their content, and run the
cold fold (`cold_fold`, `floor_of`, `views_of`) that `ProjectionRegistry.restore`,
`restore_floor` and `view_checkpoint` expose. Pure and synchronous; no I/O.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dsh.json import FrozenDict, JsonValue, freeze, is_safe_int, thaw
from dsh.projection.errors import ProjectionError
from dsh.projection.unit import Checkpoint, CheckpointRow, ClientView, ProjectionSnapshot, ProjectionUnit, Restored
from dsh.session.events import SessionEvent
from dsh.session.stored import StoredEvents

__all__ = [
    "Entry",
    "UnitContractError",
    "cold_fold",
    "discard",
    "floor_of",
    "fold_range",
    "initial_state",
    "render_view",
    "unit_problem",
    "views_of",
]

_log = logging.getLogger("dsh.projection.registry")  # one logger for everything the registry reports


class Entry:
    """One registered key: the first definition, its refcount and precomputed hot-path fields."""

    __slots__ = ("alive", "apply", "init", "key", "refs", "types", "unit", "version", "view")

    def __init__(self, unit: ProjectionUnit[Any, Any]) -> None:
        self.unit = unit
        self.key = unit.key
        self.version = unit.state_version
        self.init: Callable[[], Any] = unit.init
        self.apply: Callable[[Any, SessionEvent], Any] = unit.apply
        self.view: ClientView[Any, Any] | None = unit.view
        self.types: frozenset[str] | None = None if unit.event_types is None else frozenset(unit.event_types)
        self.refs = 1
        self.alive = True


class UnitContractError(Exception):
    """A unit broke the never-raise contract while folding event `seq` (-1 for `init`)."""

    def __init__(self, seq: int, error: BaseException | None = None, result: object = None) -> None:
        super().__init__(seq)
        self.seq = seq
        self.error = error
        self.result = result


def discard(result: object) -> None:
    """Close an awaitable a unit returned, so it is never awaited and never warns."""
    close = getattr(result, "close", None)
    if inspect.iscoroutine(result) or (inspect.isawaitable(result) and callable(close)):
        close()  # type: ignore[misc]


def initial_state(entry: Entry) -> Any:
    """`init()` checked against the contract: a plain JSON object, not an awaitable."""
    try:
        state = entry.init()
    except Exception as error:
        raise UnitContractError(-1, error) from error
    if not isinstance(state, dict):
        raise UnitContractError(-1, None, state)
    return state


def fold_range(entry: Entry, state: Any, events: Sequence[SessionEvent], start: int, stop: int) -> Any:
    """Apply `events[start:stop]` (index = seq) to `state`, skipping undeclared types."""
    apply = entry.apply
    types = entry.types
    for index in range(start, stop):
        event = events[index]
        if types is not None and event["type"] not in types:
            continue
        try:
            new = apply(state, event)
        except Exception as error:
            raise UnitContractError(index, error) from error
        if new is not state:
            if not isinstance(new, dict):
                raise UnitContractError(index, None, new)
            state = new
    return state


def render_view(entry: Entry, state: Any, session_id: str | None) -> JsonValue:
    """Render, schema-validate and freeze one view, or raise `PROJECTION_INVALID_VIEW`."""
    view = entry.view
    assert view is not None
    where = f' on session "{session_id}"' if session_id is not None else ""
    problem: str
    cause: Exception | None = None
    try:
        value = view.render(state)
    except Exception as error:
        problem, cause = f"render raised {error!r}", error
    else:
        if inspect.isawaitable(value):
            discard(value)
            problem = "render returned an awaitable"
        else:
            try:
                # freeze() is the lossless-JSON check and detaches the value from the live state.
                return freeze(view.schema.validate_python(value))
            except Exception as error:
                problem, cause = f"{type(error).__name__}: {error}", error
    raise ProjectionError(
        f'session projection "{entry.key}" produced an invalid view{where}: {problem}',
        code="PROJECTION_INVALID_VIEW",
        key=entry.key,
        session_id=session_id,
    ) from cause


def _row_seq(row: object, version: int) -> int | None:
    """The seq of a present, version-matching, well-formed row; None otherwise (never raises)."""
    if not isinstance(row, Mapping) or "val" not in row:
        return None
    ver = row.get("ver")
    seq: Any = row.get("seq")
    if type(ver) is not int or ver != version or not is_safe_int(seq) or seq < -1:
        return None
    return seq  # type: ignore[no-any-return]


def _parse_state(entry: Entry, raw: object) -> Any:
    """`state_schema.validate_python(raw)`, required to give a plain JSON object."""
    state = entry.unit.state_schema.validate_python(raw)
    if not isinstance(state, dict):
        discard(state)
        raise TypeError(f"state_schema returned {type(state).__name__}, not a JSON object")
    return state


def unit_problem(unit: object) -> tuple[str, str | None] | None:
    """The first contract violation visible at registration: `(message, key)`, or None."""
    if not isinstance(unit, ProjectionUnit):
        return f"session projection unit must be a ProjectionUnit, got {type(unit).__name__}", None
    key: object = unit.key
    if not isinstance(key, str) or not key:
        return f"session projection key must be a non-empty string, got {key!r}", None
    version: object = unit.state_version
    if type(version) is not int or version < 0:
        return f'session projection "{key}" stateVersion must be a non-negative integer, got {version!r}', key
    functions: tuple[object, object] = (unit.init, unit.apply)
    if not all(callable(fn) for fn in functions):
        return f'session projection "{key}" init and apply must be callable', key
    if not callable(getattr(unit.state_schema, "validate_python", None)):
        return f'session projection "{key}" state_schema must provide validate_python', key
    view = unit.view
    if view is not None and (
        not isinstance(view, ClientView)
        or not callable(view.render)
        or not callable(getattr(view.schema, "validate_python", None))
    ):
        return f'session projection "{key}" view must be a ClientView with a render and a schema', key
    types = unit.event_types
    if types is not None and (
        not isinstance(types, frozenset | set) or not all(isinstance(t, str) and t for t in types)
    ):
        return f'session projection "{key}" event_types must be a frozenset of event type names', key
    return None


def _needed_from(checkpoint: Checkpoint | None, entry: Entry) -> int:
    seq = _row_seq(checkpoint.get(entry.key), entry.version) if checkpoint is not None else None
    return 0 if seq is None else seq + 1


def floor_of(entries: Sequence[Entry], checkpoint: Checkpoint | None) -> int | None:
    """`ProjectionRegistry.restore_floor` over already selected entries."""
    if not entries:
        return None
    first = min(_needed_from(checkpoint, entry) for entry in entries)
    return max(first - 1, 0)


def views_of(entries: Sequence[Entry], checkpoint: Checkpoint) -> dict[str, JsonValue]:
    """`ProjectionRegistry.view_checkpoint` over already selected entries (never raises on row content)."""
    values: dict[str, JsonValue] = {}
    for entry in entries:
        if entry.view is None:
            continue
        row = checkpoint.get(entry.key)
        if _row_seq(row, entry.version) is None:
            _log.debug('projection checkpoint row "%s" is absent, mismatched or malformed', entry.key)
            continue
        assert row is not None
        try:
            state = _parse_state(entry, row["val"])
            values[entry.key] = render_view(entry, state, None)
        except Exception as error:
            _log.debug('projection checkpoint row "%s" cannot be served: %r', entry.key, error)
    return values


class _Fold:
    """One selected unit's progress through a cold fold."""

    __slots__ = ("after", "entry", "state")

    def __init__(self, entry: Entry, state: Any, after: int) -> None:
        self.entry = entry
        self.state = state
        self.after = after


def cold_fold(
    entries: Sequence[Entry], checkpoint: Checkpoint | None, events: Sequence[SessionEvent], base_seq: int
) -> Restored:
    """`ProjectionRegistry.restore` over already selected entries (see its docstring)."""
    if not (is_safe_int(base_seq) and base_seq >= 0):
        raise ValueError(f"base_seq must be a non-negative integer, got {base_seq!r}")
    stored = isinstance(events, StoredEvents)
    if not stored:
        # A StoredEvents is skipped here on purpose: reading `.seq` would freeze every event. The read
        # pipeline validated its contiguity; the fold still checks every event it touches.
        for index, event in enumerate(events):
            if event.seq != base_seq + index:
                raise ValueError(
                    f"restore events must be contiguous from seq {base_seq}; index {index} holds seq {event.seq}"
                )
    count = len(events)
    end_seq = base_seq + count - 1
    folds = [_start(checkpoint, entry, base_seq, end_seq) for entry in entries]
    if folds:
        start = max(min(fold.after for fold in folds) + 1 - base_seq, 0)
        if stored and all(fold.entry.types is not None for fold in folds):
            _fold_typed(folds, events, base_seq, start)  # type: ignore[arg-type]
        else:
            _fold_all(folds, events, base_seq, start, check_seqs=stored)
    values: dict[str, JsonValue] = {}
    rows: dict[str, CheckpointRow] = {}
    for fold in folds:
        entry = fold.entry
        rows[entry.key] = {"ver": entry.version, "seq": end_seq, "val": thaw(fold.state)}
        if entry.view is not None:
            values[entry.key] = render_view(entry, fold.state, None)
    return Restored(ProjectionSnapshot(as_of_seq=end_seq, values=FrozenDict(values)), rows)


def _start(checkpoint: Checkpoint | None, entry: Entry, base_seq: int, end_seq: int) -> _Fold:
    """Seed one unit's cold fold from its row, or from `init()` when reading from seq 0."""
    row = checkpoint.get(entry.key) if checkpoint is not None else None
    row_seq = _row_seq(row, entry.version)
    if row_seq is None or not base_seq - 1 <= row_seq <= end_seq:
        if base_seq > 0:
            raise ProjectionError(
                f'session projection "{entry.key}" cannot restore from seq {base_seq}: its checkpoint row '
                "is missing, version-mismatched, or beyond the supplied log end; re-read from seq 0",
                code="PROJECTION_REREAD_REQUIRED",
                key=entry.key,
            )
        try:
            return _Fold(entry, initial_state(entry), -1)
        except UnitContractError as violation:
            discard(violation.result)
            raise _cold_failure(entry, violation) from violation.error
    assert row is not None
    try:
        state = _parse_state(entry, row["val"])
    except Exception as error:
        raise ProjectionError(
            f'session projection "{entry.key}" checkpoint state is invalid: {error}',
            code="PROJECTION_INVALID_STATE",
            key=entry.key,
        ) from error
    return _Fold(entry, state, row_seq)


def _step(fold: _Fold, event: SessionEvent, seq: int) -> None:
    """Apply one event to one cold fold; a contract breach is `PROJECTION_UNIT_FAILED`."""
    entry = fold.entry
    state = fold.state
    try:
        new = entry.apply(state, event)
    except Exception as error:
        raise _cold_failure(entry, UnitContractError(seq, error)) from error
    if new is not state:
        if not isinstance(new, dict):
            discard(new)
            raise _cold_failure(entry, UnitContractError(seq, None, new))
        fold.state = new


def _fold_all(
    folds: list[_Fold], events: Sequence[SessionEvent], base_seq: int, start: int, *, check_seqs: bool
) -> None:
    """Fold every event from index `start`; each unit skips seqs it already holds and undeclared types."""
    for index in range(start, len(events)):
        event = events[index]
        seq = base_seq + index
        if check_seqs and event.seq != seq:
            raise ValueError(f"restore events must be contiguous from seq {base_seq}; found seq {event.seq}")
        kind = event["type"]
        for fold in folds:
            types = fold.entry.types
            if seq > fold.after and (types is None or kind in types):
                _step(fold, event, seq)


def _fold_typed(folds: list[_Fold], events: StoredEvents, base_seq: int, start: int) -> None:
    """Fold through `type_at`, freezing only events some selected unit declared."""
    wanted: frozenset[str] = frozenset().union(*(fold.entry.types or () for fold in folds))
    for index in range(start, len(events)):
        if events.type_at(index) not in wanted:
            continue
        event = events[index]
        seq = base_seq + index
        if event.seq != seq:
            raise ValueError(f"restore events must be contiguous from seq {base_seq}; found seq {event.seq}")
        kind = event["type"]
        for fold in folds:
            types = fold.entry.types
            if seq > fold.after and types is not None and kind in types:
                _step(fold, event, seq)


def _cold_failure(entry: Entry, violation: UnitContractError) -> ProjectionError:
    """In a cold fold a breach fails the fold for that selection (callers turn it into a diagnostic)."""
    what = "init" if violation.seq < 0 else f"seq {violation.seq}"
    reason = "returned an awaitable or a non-object state" if violation.error is None else repr(violation.error)
    return ProjectionError(
        f'session projection "{entry.key}" raised during a cold fold at {what}: {reason}',
        code="PROJECTION_UNIT_FAILED",
        key=entry.key,
    )
