"""`Session`: one conversation's header plus its append-only, deeply immutable event log.

Layer: session. A session is built only by a `SessionStore` and lives through three states:
`prepared` (appends allowed, no notifications) → `live` (published in exactly one store) →
`retired` (disposed or vetoed; appends refused). `append` is synchronous and never does I/O;
durability is the persistence layer's job, driven by the store's notifications.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import islice
from typing import TYPE_CHECKING, Final, Literal, overload

from dsh.json import MAX_DEPTH, FrozenDict, FrozenList, JsonValue, NotJsonError, freeze, is_safe_int
from dsh.session.errors import SessionError
from dsh.session.events import (
    KNOWN_EVENT_TYPES,
    SURFACE_TYPES,
    SessionEvent,
    SurfaceOp,
    SurfaceReplace,
    data_problem,
    legacy_problem,
    make_event,
    source_seqs_problem,
)
from dsh.session.header import SessionHeader, SessionId
from dsh.session.surface import Surface, SurfacePlan, SurfaceView, derive_messages

if TYPE_CHECKING:
    from dsh.session.store import SessionStore

__all__ = ["EventsView", "Session", "SessionState"]

SessionState = Literal["prepared", "live", "retired"]

# Known types that need no refusal check beyond membership: everything except the constructor-only
# marker and the types whose retired (legacy) shapes are recognised by their data.
_PLAIN_TYPES: Final = KNOWN_EVENT_TYPES - frozenset({"session/end-seed", "request/header"}) - SURFACE_TYPES


class EventsView(Sequence[SessionEvent]):
    """An O(1), read-only view of a log, bounded at the length it had when the view was taken.

    The view never grows and never copies: it is backed by the session's one log list. Indexing
    past the bound raises `IndexError`; slicing returns a tuple.
    """

    __slots__ = ("_log", "_n")

    def __init__(self, log: list[SessionEvent], n: int) -> None:
        self._log = log
        self._n = n

    @property
    def backing(self) -> list[SessionEvent]:
        """The log list this view reads (exposed so tests can prove nothing was copied)."""
        return self._log

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, index: int) -> SessionEvent: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[SessionEvent, ...]: ...

    def __getitem__(self, index: int | slice) -> SessionEvent | tuple[SessionEvent, ...]:
        if isinstance(index, slice):
            return tuple(self._log[i] for i in range(*index.indices(self._n)))
        n = self._n
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("events view index out of range")
        return self._log[index]

    def __iter__(self) -> Iterator[SessionEvent]:
        return islice(self._log, self._n)

    def __repr__(self) -> str:
        return f"EventsView(len={self._n})"


class Session:
    """A session: header, cut, event log and surface. Create it through a `SessionStore`."""

    __slots__ = (
        "__weakref__",
        "_clock",
        "_dispose_requested",
        "_first_live_seq",
        "_header",
        "_inherited_event_count",
        "_log",
        "_publishing",
        "_request_context",
        "_state",
        "_store",
        "_surface",
    )

    def __init__(
        self,
        header: SessionHeader,
        *,
        inherited_event_count: int,
        log: list[SessionEvent],
        surface: Surface,
        first_live_seq: int,
        clock: Callable[[], int],
    ) -> None:
        self._header = header
        self._inherited_event_count = inherited_event_count
        self._first_live_seq = first_live_seq
        self._log = log
        self._surface = surface
        self._clock = clock
        self._state: SessionState = "prepared"
        self._store: SessionStore | None = None
        self._publishing = False
        self._dispose_requested = False
        self._request_context: FrozenDict | None = None
        for event in reversed(log):
            if event.type == "request/context":
                self._request_context = event.data  # type: ignore[assignment]
                break

    # ---------------------------------------------------------------- read surface
    # Identity, header and cut are read-only: the cut never changes on resume (docs/glossary.md#cut).

    @property
    def id(self) -> SessionId:
        """The session id (equals `header.id`)."""
        return self._header.id

    @property
    def header(self) -> SessionHeader:
        """The logical header (immutable; `is_seeded`, never the integer cut)."""
        return self._header

    @property
    def inherited_event_count(self) -> int:
        """How many leading events were copied from a parent log (the durable fork cut)."""
        return self._inherited_event_count

    @property
    def first_live_seq(self) -> int:
        """Length of the constructor seed or restored log: the first seq this process may write."""
        return self._first_live_seq

    @property
    def state(self) -> SessionState:
        """`prepared`, `live` or `retired`."""
        return self._state

    @property
    def seq(self) -> int:
        """The next seq (the log length)."""
        return len(self._log)

    @property
    def events(self) -> EventsView:
        """A read-only view of the log as it is now (it never grows)."""
        return EventsView(self._log, len(self._log))

    @property
    def surface(self) -> SurfaceView:
        """The current surface nodes and replace generation."""
        return SurfaceView(self._surface)

    def is_own_seq(self, seq: int) -> bool:
        """True when `seq` lies in the own suffix (`seq >= inherited_event_count`); no range check."""
        return seq >= self._inherited_event_count

    def derive_messages(self) -> tuple[FrozenDict, ...]:
        """The model messages the surface currently shows, in order."""
        return derive_messages(self._surface.nodes, self._log)

    def request_context(self) -> FrozenDict | None:
        """The data of the latest `request/context` event, if any."""
        return self._request_context

    def __repr__(self) -> str:
        return f"Session(id={self.id!r}, state={self._state!r}, seq={len(self._log)})"

    # ---------------------------------------------------------------- append

    def append(
        self,
        type: str,
        data: object,
        *,
        surface_op: SurfaceOp | None = None,
        source_event_seqs: Sequence[int] | None = None,
        ignorable: bool = False,
    ) -> SessionEvent:
        """Append one event and notify the store's `event` listeners (when live).

        Synchronous; never awaits and never does I/O; call it on the loop thread that owns the store.

        Raises:
            SessionError: `SESSION_RETIRED`, `INVALID_EVENT` or `APPEND_REENTRANT`.
            NotJsonError: `data` or the surface metadata is not lossless JSON; nothing is appended.
        """
        if self._state == "retired":
            raise SessionError(
                f'session "{self.id}" is retired and accepts no appends',
                code="SESSION_RETIRED",
                session_id=self.id,
            )
        # Fast path for the common case (a known, ordinary type); every other case gets the full checks.
        if type.__class__ is not str or ignorable is not False or type not in _PLAIN_TYPES:
            self._refuse_type(type, data, ignorable)
        try:
            # The envelope is one nesting level, so data gets one fewer than the cap.
            frozen = freeze(data, max_depth=MAX_DEPTH - 1)
        except NotJsonError as error:
            raise NotJsonError(
                f'session event "{type}" carries non-JSON-serializable data at {error.path}',
                path=error.path,
                reason=error.reason,
            ) from None
        seq = len(self._log)
        op_json: JsonValue = None
        seqs_json: FrozenList | None = None
        if type in SURFACE_TYPES or surface_op is not None or source_event_seqs is not None:
            op_json, seqs_json = self._surface_metadata(type, seq, surface_op, source_event_seqs)
        problem = data_problem(type, frozen)
        if problem is not None:
            raise SessionError(problem, code="INVALID_EVENT", session_id=self.id)
        if self._publishing:
            raise SessionError(
                "session append cannot reenter while another append is being published",
                code="APPEND_REENTRANT",
                session_id=self.id,
            )
        time = self._clock()
        if not is_safe_int(time):
            raise SessionError(
                f"the store clock returned {time!r}; event time must be a safe integer",
                code="INVALID_EVENT",
                session_id=self.id,
            )
        event = make_event(
            type, seq, time, frozen, ignorable=ignorable, source_event_seqs=seqs_json, surface_op=op_json
        )
        plan: SurfacePlan | None = None
        if op_json is not None:
            # Plan only: a refused event must leave the surface untouched.
            checked = self._surface.plan(event, self._log)
            if isinstance(checked, str):
                raise SessionError(checked, code="INVALID_EVENT", session_id=self.id)
            plan = checked
        store = self._store if self._state == "live" else None
        if store is None:
            self._commit(event, plan)
            return event
        # Snapshot before the commit: a listener subscribed by another listener during this
        # publication starts with the next event, never halfway through this one.
        listeners = store._event_listener_snapshot()
        self._commit(event, plan)
        self._publishing = True
        try:
            store._notify_event(self, event, listeners)
        finally:
            self._publishing = False
            # A dispose asked for by a listener waits until publication has unwound, so listeners never see
            # a session disposed half-way through its own publication.
            if self._dispose_requested:
                self._dispose_requested = False
                store._dispose_now(self)
        return event

    def _commit(self, event: SessionEvent, plan: SurfacePlan | None) -> None:
        self._log.append(event)
        if plan is not None:
            self._surface.commit(plan)
        if event["type"] == "request/context":
            self._request_context = event["data"]  # type: ignore[assignment]

    def retire_unpublished(self) -> bool:
        """Retire a session that was prepared but never published (for example a resume that was
        abandoned), so later appends and publication fail instead of forking its log.

        Returns:
            True when the session was `prepared` and is now `retired`; False otherwise (a live
            session leaves only through `SessionStore.dispose`).
        """
        if self._state != "prepared":
            return False
        self._state = "retired"
        return True

    def _append_internal(self, type: str, data: JsonValue) -> SessionEvent:
        """Constructor-only append (the `session/end-seed` marker); the session is unpublished."""
        event = make_event(type, len(self._log), self._clock(), data)
        self._log.append(event)
        return event

    def _refuse_type(self, type: object, data: object, ignorable: bool) -> None:
        if type.__class__ is not str or not type:
            raise SessionError("event type must be a non-empty string", code="INVALID_EVENT", session_id=self.id)
        if ignorable is not True and ignorable is not False:
            raise SessionError("ignorable must be a bool", code="INVALID_EVENT", session_id=self.id)
        if type == "session/end-seed":
            raise SessionError(
                '"session/end-seed" is written only by the session constructor',
                code="INVALID_EVENT",
                session_id=self.id,
            )
        legacy = legacy_problem(type, data if isinstance(data, Mapping) else None)
        if legacy is not None:
            raise SessionError(legacy, code="INVALID_EVENT", session_id=self.id)
        if type not in KNOWN_EVENT_TYPES and not ignorable:
            raise SessionError(
                f'unknown event type "{type}"; append it with ignorable=True to store a foreign type',
                code="INVALID_EVENT",
                session_id=self.id,
            )

    def _surface_metadata(
        self, type: str, seq: int, surface_op: SurfaceOp | None, source_event_seqs: Sequence[int] | None
    ) -> tuple[JsonValue, FrozenList | None]:
        surface = type in SURFACE_TYPES
        if not surface:
            raise SessionError(
                f'session event "{type}" is log-only and must not carry surfaceOp or sourceEventSeqs',
                code="INVALID_EVENT",
                session_id=self.id,
            )
        op_json: JsonValue
        if surface_op is None or surface_op == "append":
            op_json = "append"
        elif isinstance(surface_op, SurfaceReplace):
            if not (is_safe_int(surface_op.start) and is_safe_int(surface_op.end)):
                raise SessionError(
                    "surface replace start and end must be safe integer seqs", code="INVALID_EVENT", session_id=self.id
                )
            op_json = surface_op.to_json()
        else:
            raise SessionError(
                'surface_op must be "append" or a SurfaceReplace', code="INVALID_EVENT", session_id=self.id
            )
        seqs: FrozenList | None = None
        if source_event_seqs is not None:
            if isinstance(source_event_seqs, str | bytes) or not isinstance(source_event_seqs, Sequence):
                raise SessionError(
                    "source_event_seqs must be a sequence of seqs", code="INVALID_EVENT", session_id=self.id
                )
            seqs = freeze(list(source_event_seqs), path="$.sourceEventSeqs")  # type: ignore[assignment]
            problem = source_seqs_problem(type, seq, seqs)
            if problem is not None:
                raise SessionError(problem, code="INVALID_EVENT", session_id=self.id)
        return op_json, seqs
