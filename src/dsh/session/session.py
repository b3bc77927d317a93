"""`Session`: one conversation's header plus its append-only, deeply immutable event log.

Layer: session. A session is built only by a `SessionStore`. It is the one owner of its own
lifecycle: the state (`SessionState`) changes only through the session's named transitions
(`SessionTransition`, legal pairs in `LIFECYCLE`), and the store asks for them — it never writes
the session's fields. `prepared` (appends allowed, no notifications) → `live` (published in
exactly one store) → `retired` (disposed or vetoed; appends refused). A live session reaches its
store only through the small `SessionHost` protocol defined here, so this module never imports the
store. `append` is synchronous and never does I/O; durability is the persistence layer's job,
driven by the store's notifications.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from enum import StrEnum
from itertools import islice
from types import MappingProxyType
from typing import Final, Protocol, overload

from dsh.json import MAX_DEPTH, SAFE_INT_MAX, FrozenDict, FrozenList, JsonValue, NotJsonError, freeze, is_safe_int
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

__all__ = ["EventListener", "EventsView", "LIFECYCLE", "Session", "SessionHost", "SessionState", "SessionTransition"]


class SessionState(StrEnum):
    """Where a session is in its lifecycle; each member equals its plain string (`"live"`)."""

    PREPARED = "prepared"
    """Built but unpublished: appends are allowed and notify nobody."""
    LIVE = "live"
    """Published in exactly one store; appends are announced to its `event` listeners."""
    RETIRED = "retired"
    """Disposed, vetoed or abandoned: appends are refused and it is never publishable again."""


class SessionTransition(StrEnum):
    """The named lifecycle transitions. Only `Session` performs them; its store asks."""

    PUBLISH = "publish"
    """`Session.attach`: the store publishes the session."""
    VETO = "veto"
    """`Session.veto`: a `created` listener refused the publication."""
    RETIRE_UNPUBLISHED = "retire_unpublished"
    """`Session.retire_unpublished`: a prepared session is abandoned (for example a dropped resume)."""
    DISPOSE = "dispose"
    """`Session.request_dispose`: the session leaves its store (deferred while an append is published)."""


LIFECYCLE: Final[Mapping[tuple[SessionState, SessionTransition], SessionState]] = MappingProxyType(
    {
        (SessionState.PREPARED, SessionTransition.PUBLISH): SessionState.LIVE,
        (SessionState.PREPARED, SessionTransition.RETIRE_UNPUBLISHED): SessionState.RETIRED,
        (SessionState.LIVE, SessionTransition.VETO): SessionState.RETIRED,
        (SessionState.LIVE, SessionTransition.DISPOSE): SessionState.RETIRED,
    }
)
"""Every legal (state, transition) pair and the state it leads to; every other pair is refused and
changes nothing (`attach` raises, the other transitions return False)."""

EventListener = Callable[["Session", SessionEvent], object]
"""An `event` listener: called with the session and each committed event while it is live."""


class SessionHost(Protocol):
    """What a session asks of the store that publishes it (`SessionStore` provides one).

    Defined on the session side so this module never imports the store: the store depends on the
    session, never the other way round (docs/architecture.md#import-rules).
    """

    def admit(self, session: Session) -> None:
        """Enter `session` into the host's registry, or raise when its id is already live there."""

    def event_listeners(self) -> tuple[EventListener, ...]:
        """A snapshot of the `event` listeners, taken before an append commits."""

    def deliver_event(self, session: Session, event: SessionEvent, listeners: tuple[EventListener, ...]) -> None:
        """Call `listeners` with a committed event, containing each listener's failure."""

    def release(self, session: Session) -> None:
        """`session` just retired while live (disposed or vetoed): drop it and announce `disposed`."""


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
        "_dispose_pending",
        "_first_live_seq",
        "_header",
        "_host",
        "_inherited_event_count",
        "_log",
        "_publishing",
        "_request_context",
        "_state",
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
        seal_seed: bool = False,
    ) -> None:
        """Build a prepared session over `log` (the store validated everything first).

        `seal_seed` appends the `session/end-seed` marker unless the log already ends with one: the
        store asks for it whenever a seed or a restored log was supplied.
        """
        self._header = header
        self._inherited_event_count = inherited_event_count
        self._first_live_seq = first_live_seq
        self._log = log
        self._surface = surface
        self._clock = clock
        self._state = SessionState.PREPARED
        self._host: SessionHost | None = None  # set exactly while live
        self._publishing = False  # an append is being announced to `event` listeners
        self._dispose_pending = False  # a dispose asked for during that announcement
        self._request_context: FrozenDict | None = None
        for event in reversed(log):
            if event.type == "request/context":
                self._request_context = event.data  # type: ignore[assignment]
                break
        if seal_seed and (not log or log[-1].type != "session/end-seed"):
            self._append_internal("session/end-seed", FrozenDict())

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
        """`prepared`, `live` or `retired` (read-only: only the named transitions change it)."""
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
        return f"Session(id={self.id!r}, state={self._state.value!r}, seq={len(self._log)})"

    # ---------------------------------------------------------------- lifecycle
    # The transitions below are the only writers of `_state`, `_host`, `_publishing` and
    # `_dispose_pending`. The store drives them; application code uses the store instead.

    def attach(self, host: SessionHost) -> None:
        """Publish into `host` (prepared → live); `SessionStore.publish` calls this.

        The host admits the session before the state changes, so a refused admission leaves the
        session prepared.

        Raises:
            SessionError: `SESSION_RETIRED` (retired sessions are never published again),
                `SESSION_ALREADY_EXISTS` (already attached to a store, or the host refused the id).
        """
        if self._state is SessionState.RETIRED:
            raise SessionError(
                f'session "{self.id}" is retired and cannot be published', code="SESSION_RETIRED", session_id=self.id
            )
        if self._state is not SessionState.PREPARED:
            raise SessionError(
                f'session "{self.id}" is already attached to a store',
                code="SESSION_ALREADY_EXISTS",
                session_id=self.id,
            )
        host.admit(self)
        self._move(SessionTransition.PUBLISH)
        self._host = host

    def veto(self) -> bool:
        """Retire a session whose publication a `created` listener refused (live → retired).

        The host releases it at once (entry rolled back, a paired `disposed` announced).

        Returns:
            True when the session was live; False otherwise (nothing changes).
        """
        return self._retire_live(SessionTransition.VETO)

    def retire_unpublished(self) -> bool:
        """Retire a session that was prepared but never published (for example a resume that was
        abandoned), so later appends and publication fail instead of forking its log.

        Returns:
            True when the session was `prepared` and is now `retired`; False otherwise (a live
            session leaves only through `SessionStore.dispose`).
        """
        return self._move(SessionTransition.RETIRE_UNPUBLISHED)

    def request_dispose(self) -> bool:
        """Leave the store (live → retired); `SessionStore.dispose` calls this.

        While an append is being announced, the dispose waits until that publication has unwound,
        so listeners never see a session disposed half-way through its own publication.

        Returns:
            True when the session was live and no dispose was pending; False otherwise.
        """
        if self._state is not SessionState.LIVE:
            return False
        if self._publishing:
            if self._dispose_pending:
                return False
            self._dispose_pending = True
            return True
        return self._retire_live(SessionTransition.DISPOSE)

    def _begin_publication(self) -> None:
        self._publishing = True

    def _end_publication(self) -> None:
        self._publishing = False
        if self._dispose_pending:
            self._dispose_pending = False
            self._retire_live(SessionTransition.DISPOSE)

    def _retire_live(self, transition: SessionTransition) -> bool:
        host = self._host
        if host is None or not self._move(transition):
            return False
        self._host = None
        host.release(self)
        return True

    def _move(self, transition: SessionTransition) -> bool:
        """The one writer of `_state`: take `transition` if `LIFECYCLE` allows it from here."""
        target = LIFECYCLE.get((self._state, transition))
        if target is None:
            return False
        self._state = target
        return True

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
        if self._state is SessionState.RETIRED:
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
                f'session event "{type}" carries data that is not lossless JSON at {error.path}: {error.reason}',
                path=error.path,
                reason=error.reason,
            ) from None
        log = self._log
        seq = len(log)
        op_json: JsonValue = None
        seqs_json: FrozenList | None = None
        if surface_op is None and source_event_seqs is None:
            if type in SURFACE_TYPES:
                op_json = "append"
        else:
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
        if time.__class__ is not int or not -SAFE_INT_MAX <= time <= SAFE_INT_MAX:
            raise SessionError(
                f"the store clock returned {time!r}; event time must be a safe integer",
                code="INVALID_EVENT",
                session_id=self.id,
            )
        if ignorable or seqs_json is not None:
            event = make_event(
                type, seq, time, frozen, ignorable=ignorable, source_event_seqs=seqs_json, surface_op=op_json
            )
        elif op_json is None:
            # The common shapes, built directly in canonical key order (what `make_event` builds).
            event = SessionEvent({"type": type, "seq": seq, "time": time, "data": frozen})
        else:
            event = SessionEvent({"type": type, "seq": seq, "time": time, "data": frozen, "surfaceOp": op_json})
        plan: SurfacePlan | None = None
        if op_json is not None:
            # Plan only: a refused event must leave the surface untouched.
            checked = self._surface.plan(event, log)
            if isinstance(checked, str):
                raise SessionError(checked, code="INVALID_EVENT", session_id=self.id)
            plan = checked
        host = self._host
        if host is None:
            self._commit(event, plan)
            return event
        # Snapshot before the commit: a listener subscribed by another listener during this
        # publication starts with the next event, never halfway through this one.
        listeners = host.event_listeners()
        self._commit(event, plan)
        self._begin_publication()
        try:
            host.deliver_event(self, event, listeners)
        finally:
            self._end_publication()
        return event

    def _commit(self, event: SessionEvent, plan: SurfacePlan | None) -> None:
        self._log.append(event)
        if plan is not None:
            self._surface.commit(plan)
        if event["type"] == "request/context":
            self._request_context = event["data"]  # type: ignore[assignment]

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


# Shown under the name users import (docs/architecture.md#public-names).
Session.__module__ = "dsh"
EventsView.__module__ = "dsh.session"
SessionState.__module__ = "dsh.session"
