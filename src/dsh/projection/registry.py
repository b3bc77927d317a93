"""`ProjectionRegistry`: the single authority for every fold rule, read live, from checkpoints, or cold.

Layer: projection (`Services.projections`). Units are registered once (refcounted by key). The
registry keeps one *cell* (state + watermark) per unit per `Session`, weakly keyed by the session
object, and drives the cells from the store's post-commit `event` feed. Reads (`state_of`,
`snapshot`, `checkpoint`) catch cells up lazily, so they never lag the log they were given, for
published and unpublished sessions alike. `restore` is the one authoritative cold fold over a
stored tail, seeded from checkpoint rows. There is no failure channel next to values: a
unit that raises anyway is disabled for that session only, and only readers that select its key
see `PROJECTION_UNIT_FAILED`. Everything here is synchronous and does no I/O.
"""

from __future__ import annotations

import inspect
import logging
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeAlias

from dsh.errors import ConfigError
from dsh.json import FrozenDict, JsonValue, thaw
from dsh.projection.errors import ProjectionError
from dsh.projection.fold import (
    Entry,
    UnitContractError,
    cold_fold,
    discard,
    floor_of,
    fold_range,
    initial_state,
    render_view,
    unit_problem,
    views_of,
)
from dsh.projection.unit import (
    Checkpoint,
    CheckpointRow,
    JsonObject,
    ProjectionSnapshot,
    ProjectionUnit,
    Restored,
)
from dsh.session.events import SessionEvent
from dsh.session.header import SessionSeq
from dsh.session.session import Session
from dsh.session.store import SessionStore

__all__ = ["ChangeListener", "Disposer", "ProjectionRegistry"]

_log = logging.getLogger(__name__)

Disposer: TypeAlias = Callable[[], None]
"""Releases one registration or subscription; idempotent."""

ChangeListener: TypeAlias = Callable[[Session, str, JsonValue, SessionSeq], None]
"""`(session, key, validated view, causing seq)`; called after a client-visible state changed."""

_FAILED_SEQ: Final = 1 << 62
"""The watermark of a failed cell: past every event, so drive skips it with its usual seq test."""

_UNIT_RAISED: Final = 'session projection "%s" raised on session "%s" at seq %d; unit disabled for this session'


class _Cell:
    """One unit's live state for one session: the state object and the last folded seq."""

    __slots__ = ("failed", "seq", "state")

    def __init__(self) -> None:
        self.state: Any = None
        self.seq = -1
        self.failed = False


class _Cells(dict[Entry, _Cell]):
    """A session's cells by entry (a `dict` subclass so the hot-path cache can refer to it weakly)."""


class ProjectionRegistry:
    """The registry of projection units and their live per-session cells.

    Args:
        sessions: The store whose post-commit `event` feed drives the cells; unsubscribed by `close()`.

    Raises:
        ConfigError: `sessions` has no `on_event` subscription method.
    """

    def __init__(self, sessions: SessionStore) -> None:
        if not callable(getattr(sessions, "on_event", None)):
            raise ConfigError("ProjectionRegistry requires a SessionStore")
        self._entries: tuple[Entry, ...] = ()
        self._by_key: dict[str, Entry] = {}
        self._listeners: tuple[ChangeListener, ...] = ()
        # Cells die with their session: a detached session never leaks, and disposal drops nothing
        # (the cache's disposal write still reads the cells after the store let go of the session).
        self._sessions: weakref.WeakKeyDictionary[Session, _Cells] = weakref.WeakKeyDictionary()
        # Appends usually hit one session in a row; remember it weakly to skip the weak-dict lookup.
        self._hot_session: weakref.ref[Session] | None = None
        self._hot_cells: weakref.ref[_Cells] | None = None
        self._unsubscribe: Callable[[], None] | None = sessions.on_event(self._on_event)

    @property
    def closed(self) -> bool:
        """True once `close()` ran (cells are no longer driven; reads still catch up lazily)."""
        return self._unsubscribe is None

    def close(self) -> None:
        """Unsubscribe from the store's event feed. Idempotent."""
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        if unsubscribe is not None:
            unsubscribe()

    # ---------------------------------------------------------------- registration

    def register(self, unit: ProjectionUnit[Any, Any]) -> Disposer:
        """Register `unit`, or share the already registered unit with the same key and version.

        Returns:
            An idempotent disposer; the key disappears (with its cells and failures) when the last
            registration of it is disposed. Registering it again refolds lazily from the log.

        Raises:
            ProjectionError: `PROJECTION_INVALID_UNIT` for a malformed unit;
                `PROJECTION_VERSION_CONFLICT` for the same key at another version or visibility.
        """
        problem = unit_problem(unit)
        if problem is not None:
            raise ProjectionError(problem[0], code="PROJECTION_INVALID_UNIT", key=problem[1])
        existing = self._by_key.get(unit.key)
        if existing is None:
            entry = Entry(unit)
            self._by_key[entry.key] = entry
            self._entries = (*self._entries, entry)
        else:
            if existing.version != unit.state_version:
                raise ProjectionError(
                    f'session projection key "{unit.key}" is already registered at stateVersion '
                    f"{existing.version}; refusing to share it with stateVersion {unit.state_version}",
                    code="PROJECTION_VERSION_CONFLICT",
                    key=unit.key,
                )
            if (existing.view is None) != (unit.view is None):
                held = "host-only" if existing.view is None else "client-visible"
                offered = "host-only" if unit.view is None else "client-visible"
                raise ProjectionError(
                    f'session projection key "{unit.key}" is already registered at stateVersion '
                    f"{existing.version} as a {held} unit; refusing to share it with a {offered} unit",
                    code="PROJECTION_VERSION_CONFLICT",
                    key=unit.key,
                )
            existing.refs += 1
            entry = existing
        released = False

        def dispose() -> None:
            nonlocal released
            if not released:
                released = True
                self._release(entry)

        return dispose

    def _release(self, entry: Entry) -> None:
        entry.refs -= 1
        if entry.refs > 0:
            return
        entry.alive = False
        del self._by_key[entry.key]
        self._entries = tuple(e for e in self._entries if e is not entry)
        for cells in list(self._sessions.values()):
            cells.pop(entry, None)

    def keys(self) -> tuple[str, ...]:
        """Every registered key, in registration order."""
        return tuple(entry.key for entry in self._entries)

    def view_keys(self) -> tuple[str, ...]:
        """The client-visible keys, in registration order."""
        return tuple(entry.key for entry in self._entries if entry.view is not None)

    def on_changed(self, listener: ChangeListener) -> Disposer:
        """Call `listener(session, key, value, seq)` whenever a client-visible state changes.

        Listeners run synchronously inside the append's notification and must not append to the
        session. Each call is contained: an exception is logged and affects nothing else.
        """
        self._listeners = (*self._listeners, listener)
        removed = False

        def dispose() -> None:
            nonlocal removed
            if not removed:
                removed = True
                listeners = list(self._listeners)
                listeners.remove(listener)
                self._listeners = tuple(listeners)

        return dispose

    def _select(self, keys: Sequence[str] | None) -> tuple[Entry, ...]:
        if keys is None:
            return self._entries
        if isinstance(keys, str):
            raise TypeError("keys must be a sequence of unit keys, not a single string")
        wanted = set(keys)
        return tuple(entry for entry in self._entries if entry.key in wanted)

    # ---------------------------------------------------------------- cells

    def _cells_for(self, session: Session) -> _Cells:
        hot = self._hot_session
        if hot is not None and hot() is session:
            assert self._hot_cells is not None
            cells = self._hot_cells()
            if cells is not None:
                return cells
        found = self._sessions.get(session)
        if found is None:
            found = _Cells()
            self._sessions[session] = found
        self._hot_session = weakref.ref(session)
        self._hot_cells = weakref.ref(found)
        return found

    def _disable(self, session: Session, entry: Entry, cell: _Cell, violation: UnitContractError) -> None:
        """Contain a unit that broke the contract: this session's cell is failed for good."""
        cell.failed = True
        cell.state = None
        cell.seq = _FAILED_SEQ
        if violation.result is not None:
            discard(violation.result)
        _log.error(_UNIT_RAISED, entry.key, session.id, violation.seq, exc_info=violation.error)

    def _build(self, session: Session, entry: Entry, cells: _Cells, stop: int, at: int) -> _Cell:
        """A new cell: `init()` folded over `events[0:stop]` (contained; `at` names the causing seq)."""
        cell = _Cell()
        cells[entry] = cell
        try:
            state = initial_state(entry)
            if stop > 0:
                state = fold_range(entry, state, session.events, 0, stop)
        except UnitContractError as violation:
            if violation.seq < 0:
                violation.seq = at
            self._disable(session, entry, cell, violation)
            return cell
        cell.state = state
        cell.seq = stop - 1
        return cell

    def _catch_up(self, session: Session, entry: Entry, target: int) -> _Cell:
        """The entry's cell for `session`, folded through `target` unless it failed."""
        cells = self._cells_for(session)
        cell = cells.get(entry)
        if cell is None:
            return self._build(session, entry, cells, target + 1, target)
        if not cell.failed and cell.seq < target:
            try:
                cell.state = fold_range(entry, cell.state, session.events, cell.seq + 1, target + 1)
            except UnitContractError as violation:
                self._disable(session, entry, cell, violation)
                return cell
            cell.seq = target
        return cell

    def _on_event(self, session: Session, event: SessionEvent) -> None:
        """Drive every unit through one committed event; the append hot path.

        Per unit and irrelevant event this is one dict lookup, two int comparisons, one set
        membership test and one attribute store: no allocation, no call into the unit.
        """
        entries = self._entries
        if not entries:
            return
        hot, hot_cells = self._hot_session, self._hot_cells
        cells = hot_cells() if hot is not None and hot_cells is not None and hot() is session else None
        if cells is None:
            cells = self._cells_for(session)
        seq: int = event["seq"]  # type: ignore[assignment]
        prev = seq - 1
        kind = event["type"]
        changed: list[tuple[Entry, Any]] | None = None
        for entry in entries:
            cell = cells.get(entry)
            if cell is None:
                if not entry.alive:  # unregistered while this event is being driven: never rebuild it
                    continue
                cell = self._build(session, entry, cells, seq, seq)
            last = cell.seq
            if last >= seq:
                continue  # a reader already folded past this event, or the cell failed (_FAILED_SEQ)
            if last != prev:
                # Events appended while the session was unpublished were never notified.
                cell = self._catch_up(session, entry, prev)
                if cell.failed:
                    continue
            types = entry.types
            if types is not None and kind not in types:
                cell.seq = seq
                continue
            state = cell.state
            try:
                new = entry.apply(state, event)
            except Exception as error:
                self._disable(session, entry, cell, UnitContractError(seq, error))
                continue
            if new is state:
                cell.seq = seq
                continue
            if not isinstance(new, dict):
                self._disable(session, entry, cell, UnitContractError(seq, None, new))
                continue
            cell.state = new
            cell.seq = seq
            if entry.view is not None and self._listeners:
                if changed is None:
                    changed = []
                changed.append((entry, new))
        if changed is not None:
            # Push only after every unit folded the event: a listener that reads the registry then
            # sees one consistent cut, and its reads cannot pre-empt a later unit's push.
            for entry, new in changed:
                if entry.alive:
                    self._push(session, entry, new, seq)

    def _push(self, session: Session, entry: Entry, state: Any, seq: int) -> None:
        try:
            value = render_view(entry, state, session.id)
        except ProjectionError as error:
            _log.error("%s; nothing pushed for seq %d", error.message, seq)
            return
        causing = SessionSeq(seq)
        for listener in self._listeners:
            try:
                result: object = listener(session, entry.key, value, causing)
            except Exception as error:
                _log.error("session projection listener raised: %r", error, exc_info=error)
                continue
            if result is not None and inspect.isawaitable(result):
                discard(result)
                _log.error("session projection listener raised: listener returned an awaitable")

    # ---------------------------------------------------------------- live reads

    def _unit_failed(self, entry: Entry, session: Session) -> ProjectionError:
        return ProjectionError(
            f'session projection "{entry.key}" is disabled on session "{session.id}" because it raised',
            code="PROJECTION_UNIT_FAILED",
            key=entry.key,
            session_id=session.id,
        )

    def state_of(self, session: Session, key: str) -> JsonObject | None:
        """The borrowed live host state of `key` (do not mutate it); None for an unregistered key.

        Raises:
            ProjectionError: `PROJECTION_UNIT_FAILED` when the unit is disabled for this session.
        """
        entry = self._by_key.get(key)
        if entry is None:
            return None
        cell = self._catch_up(session, entry, session.seq - 1)
        if cell.failed:
            raise self._unit_failed(entry, session)
        return cell.state  # type: ignore[no-any-return]

    def snapshot(self, session: Session, keys: Sequence[str] | None = None) -> ProjectionSnapshot:
        """One consistent cut at `session.seq - 1` of the selected client-visible units.

        Only the selected units are caught up and rendered, so a broken unit outside `keys` cannot
        affect the result. Unregistered and host-only keys are silently absent.

        Raises:
            ProjectionError: `PROJECTION_UNIT_FAILED` or `PROJECTION_INVALID_VIEW` for a selected key.
        """
        target = session.seq - 1
        values: dict[str, JsonValue] = {}
        for entry in self._select(keys):
            if entry.view is None:
                continue
            cell = self._catch_up(session, entry, target)
            if cell.failed:
                raise self._unit_failed(entry, session)
            values[entry.key] = render_view(entry, cell.state, session.id)
        return ProjectionSnapshot(as_of_seq=target, values=FrozenDict(values))

    def checkpoint(self, session: Session, keys: Sequence[str] | None = None) -> dict[str, CheckpointRow]:
        """One `{ver, seq, val}` row per selected unit (host-only included); failed units are omitted.

        `val` is a detached deep copy; an empty log gives `seq == -1` and the `init()` state.
        """
        target = session.seq - 1
        rows: dict[str, CheckpointRow] = {}
        for entry in self._select(keys):
            cell = self._catch_up(session, entry, target)
            if not cell.failed:
                rows[entry.key] = {"ver": entry.version, "seq": cell.seq, "val": thaw(cell.state)}
        return rows

    # ---------------------------------------------------------------- checkpoints and cold folds

    def restore_floor(self, checkpoint: Checkpoint | None, keys: Sequence[str] | None = None) -> int | None:
        """The seq a tail read must start from to restore the selected units from `checkpoint`.

        None when no selected unit is registered. Otherwise one below the first seq any selected
        unit still needs (`row.seq + 1` for a usable row, else 0), floored at 0: reading that one
        extra event proves the stored log still reaches the checkpoint's watermark.
        """
        return floor_of(self._select(keys), checkpoint)

    def view_checkpoint(self, checkpoint: Checkpoint, keys: Sequence[str] | None = None) -> dict[str, JsonValue]:
        """Client views rendered straight from checkpoint rows; zero I/O, never raises on row content.

        A row that is absent, version-mismatched, malformed, fails `state_schema` or cannot be
        rendered leaves its key out (logged at debug level).
        """
        return views_of(self._select(keys), checkpoint)

    def restore(
        self,
        checkpoint: Checkpoint | None,
        events: Sequence[SessionEvent],
        base_seq: int,
        keys: Sequence[str] | None = None,
    ) -> Restored:
        """The authoritative cold fold of the selected units over a stored tail.

        See docs/projections.md#checkpoints-and-cold-restore.

        Args:
            checkpoint: Rows to seed from; None (or a missing row) starts from `init()` when
                `base_seq == 0`.
            events: The stored events with `seq >= base_seq`, contiguous. A `StoredEvents` is read
                through `type_at`/indexing so that, when every selected unit declares `event_types`,
                events of other types are never frozen (their seqs are vouched for by the read
                pipeline's validation; every event the fold touches is checked).
            base_seq: Seq of `events[0]`; `events` empty means the log ends at `base_seq - 1`.
            keys: The units to fold; unselected units are not folded at all.

        Raises:
            ValueError: `base_seq` is not a non-negative integer or `events` is not contiguous from it.
            ProjectionError: `PROJECTION_REREAD_REQUIRED`, `PROJECTION_INVALID_STATE`,
                `PROJECTION_UNIT_FAILED` or `PROJECTION_INVALID_VIEW`.
        """
        return cold_fold(self._select(keys), checkpoint, events, base_seq)


# Shown under the name users import (docs/architecture.md#public-names).
ProjectionRegistry.__module__ = "dsh"
