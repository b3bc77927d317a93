"""`SessionStore`: the in-memory registry of live sessions and their notifications.

Layer: session (`Services.sessions`). The store builds sessions (`prepare`, `prepare_restored`,
`fork`), publishes them, and tells listeners about four moments: `created` (a raise vetoes the
publication), `event` (post-commit feed, contained per listener), `flush` (the durability barrier)
and `disposed`. Each session owns its lifecycle: the store asks it to `attach`, `veto` or
`request_dispose` and hears back through the `SessionHost` it hands over at publication.
Persistence, projections and caches hang off these notifications; the store itself does no I/O. It
is not thread-safe: one store per event loop.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import orjson

from dsh.json import MAX_DEPTH, NotJsonError, freeze, is_safe_int
from dsh.session.errors import SessionError, SessionForkError
from dsh.session.events import SessionEvent
from dsh.session.header import HeaderInit, SessionHeader
from dsh.session.ids import id_problem, new_session_id
from dsh.session.session import EventListener, Session, SessionHost
from dsh.session.surface import Surface, SurfacePlan
from dsh.session.validate import check_records

__all__ = ["SessionStore", "Unsubscribe", "wall_clock_ms"]

_log = logging.getLogger(__name__)

Unsubscribe = Callable[[], None]
CreatedListener = Callable[[Session], None]
FlushListener = Callable[[Session], Awaitable[None]]
DisposedListener = Callable[[Session], None]


def wall_clock_ms() -> int:
    """Current Unix time in milliseconds."""
    return time.time_ns() // 1_000_000


def _subscribe(listeners: list[Any], fn: Any) -> Unsubscribe:
    listeners.append(fn)

    def unsubscribe() -> None:
        if fn in listeners:
            listeners.remove(fn)

    return unsubscribe


class SessionStore:
    """Registry of live sessions for one event loop.

    Args:
        clock: Epoch-millisecond clock for `created_at` and event times.
        id_factory: Mints ids for sessions created without one (26-char ULIDs by default).
    """

    def __init__(
        self,
        *,
        clock: Callable[[], int] = wall_clock_ms,
        id_factory: Callable[[], str] = new_session_id,
    ) -> None:
        self._clock = clock
        self._id_factory = id_factory
        self._live: dict[str, Session] = {}
        self._closed = False
        self._created: list[CreatedListener] = []
        self._event: list[EventListener] = []
        self._flush: list[FlushListener] = []
        self._disposed: list[DisposedListener] = []
        # Async listener tasks still to be finished (reported), with the id of their session.
        self._tasks: dict[asyncio.Future[Any], str] = {}
        # What published sessions may ask of this store (checked structurally against `SessionHost`).
        self._host: SessionHost = _StoreHost(self._admit, self._event, self._deliver_event, self._release)

    @property
    def clock(self) -> Callable[[], int]:
        """The store's epoch-millisecond clock."""
        return self._clock

    @property
    def closed(self) -> bool:
        """True once `close()` or `aclose()` ran."""
        return self._closed

    # ---------------------------------------------------------------- subscriptions

    def on_created(self, fn: CreatedListener) -> Unsubscribe:
        """Call `fn(session)` at each publication; a raise vetoes it."""
        return _subscribe(self._created, fn)

    def on_event(self, fn: EventListener) -> Unsubscribe:
        """Call `fn(session, event)` after each committed append of a live session."""
        return _subscribe(self._event, fn)

    def on_flush(self, fn: FlushListener) -> Unsubscribe:
        """Await `fn(session)` in every `flush`."""
        return _subscribe(self._flush, fn)

    def on_disposed(self, fn: DisposedListener) -> Unsubscribe:
        """Call `fn(session)` once when a published session leaves the store."""
        return _subscribe(self._disposed, fn)

    # ---------------------------------------------------------------- building

    def _refuse_closed(self, error: type[SessionError] = SessionError) -> None:
        if self._closed:
            raise error("the session store is closed", code="SESSION_STORE_CLOSED")

    def prepare(
        self,
        id: str | None = None,
        *,
        header: HeaderInit | None = None,
        seed: Sequence[Mapping[str, object]] | None = None,
        inherited_event_count: int = 0,
    ) -> Session:
        """Build an unpublished session, validating header, seed and cut.

        Every seed event crosses the JSON boundary (validated and copied), so the caller's objects
        stay the caller's.

        Raises:
            SessionError: `SESSION_STORE_CLOSED`, `SESSION_ALREADY_EXISTS`, `INVALID_HEADER`,
                `INVALID_SEED`.
        """
        return self._prepare(id, header, seed, inherited_event_count, trusted_seed=False)

    def _prepare(
        self,
        id: str | None,
        header: HeaderInit | None,
        seed: Sequence[Mapping[str, object]] | None,
        inherited_event_count: int,
        *,
        trusted_seed: bool,
    ) -> Session:
        self._refuse_closed()
        session_id = self._id_factory() if id is None else id
        problem = id_problem(session_id)
        if problem is not None:
            raise SessionError(problem, code="INVALID_HEADER", session_id=str(session_id))
        if session_id in self._live:
            raise SessionError(
                f'session "{session_id}" already exists', code="SESSION_ALREADY_EXISTS", session_id=session_id
            )
        init = header if header is not None else HeaderInit()
        if not isinstance(init, HeaderInit):
            raise SessionError("header must be a HeaderInit", code="INVALID_HEADER", session_id=session_id)
        if not (is_safe_int(inherited_event_count) and inherited_event_count >= 0):
            raise SessionError(
                "inherited_event_count must be a non-negative safe integer",
                code="INVALID_SEED",
                session_id=session_id,
            )
        stamp = self._clock() if init.created_at is None else init.created_at
        built = init.build(session_id, created_at=stamp, is_seeded=inherited_event_count > 0)
        log, surface = self._admit_seed(session_id, seed, trusted=trusted_seed)
        limit = len(log) if seed is not None else 0
        if inherited_event_count > limit:
            raise SessionError(
                f"inherited_event_count {inherited_event_count} exceeds the seed length {limit}",
                code="INVALID_SEED",
                session_id=session_id,
            )
        return Session(
            built,
            inherited_event_count=inherited_event_count,
            log=log,
            surface=surface,
            first_live_seq=len(log),
            clock=self._clock,
            seal_seed=seed is not None,
        )

    def _admit_seed(
        self, session_id: str, seed: Sequence[Mapping[str, object]] | None, *, trusted: bool
    ) -> tuple[list[SessionEvent], Surface]:
        """Freeze and validate a constructor seed; `trusted` skips the copy for a live log's events.

        Only `fork` passes `trusted=True`: its prefix comes from a live session's log, whose events
        the library built and froze itself. A caller-supplied `SessionEvent` may hold mutable data
        (anyone can construct one), so it is frozen like any other mapping.
        """
        surface = Surface()
        if seed is None:
            return [], surface
        if isinstance(seed, str | bytes | Mapping) or not isinstance(seed, Sequence):
            raise SessionError("seed must be a sequence of events", code="INVALID_SEED", session_id=session_id)
        log: list[SessionEvent] = []
        for index, record in enumerate(seed):
            if trusted and type(record) is SessionEvent:
                log.append(record)
                continue
            if not isinstance(record, Mapping):
                raise SessionError(
                    f"seed event at index {index} has an invalid event envelope: it is not an object",
                    code="INVALID_SEED",
                    session_id=session_id,
                )
            try:
                frozen = freeze(dict(record), max_depth=MAX_DEPTH, path=f"$[{index}]")
            except NotJsonError as error:
                raise SessionError(
                    f"seed event at index {index} carries data that is not lossless JSON at {error.path}: "
                    f"{error.reason}",
                    code="INVALID_SEED",
                    session_id=session_id,
                ) from error
            log.append(SessionEvent(frozen))  # type: ignore[arg-type]
        problem = check_records(log, surface)
        if problem is not None:
            if problem.kind == "envelope":
                message = f"seed event at index {problem.index} has an invalid event envelope: {problem.message}"
            elif problem.kind == "seq":
                message = (
                    f"seed event at index {problem.index} has seq {problem.found_seq} "
                    f"(expected {problem.index}); seed must be contiguous from 0"
                )
            else:
                message = f"invalid seed event at index {problem.index}: {problem.message}"
            raise SessionError(message, code="INVALID_SEED", session_id=session_id)
        return log, surface

    def prepare_restored(
        self, header: SessionHeader, inherited_event_count: int, events: Sequence[SessionEvent]
    ) -> Session:
        """Ownership-transfer path for persistence: `events` are validated and frozen, not copied.

        A `list` becomes the session's log as it is (any other sequence, such as lazily frozen
        `StoredEvents`, is materialised into one list). The surface is rebuilt from it, and the
        `session/end-seed` marker is appended unless the log already ends with one.

        Raises:
            SessionError: `SESSION_STORE_CLOSED`, `SESSION_ALREADY_EXISTS`, `INVALID_HEADER` (not a
                `SessionHeader`), `INVALID_SEED` (cut out of range or contradicting `is_seeded`, or
                a surface the events cannot fold).
        """
        self._refuse_closed()
        if not isinstance(header, SessionHeader):
            raise SessionError("header must be a SessionHeader", code="INVALID_HEADER")
        if header.id in self._live:
            raise SessionError(
                f'session "{header.id}" already exists', code="SESSION_ALREADY_EXISTS", session_id=header.id
            )
        if type(events) is not list:
            events = list(events)
        if not (is_safe_int(inherited_event_count) and 0 <= inherited_event_count <= len(events)):
            raise SessionError(
                f"inherited_event_count {inherited_event_count!r} is outside 0..{len(events)} (the log length)",
                code="INVALID_SEED",
                session_id=header.id,
            )
        if header.is_seeded != (inherited_event_count > 0):
            raise SessionError(
                f"inherited_event_count {inherited_event_count} contradicts header isSeeded={header.is_seeded}",
                code="INVALID_SEED",
                session_id=header.id,
            )
        surface = Surface()
        for event in events:
            plan = surface.plan(event, events)
            if isinstance(plan, str):
                raise SessionError(
                    f"invalid seed event at index {event.seq}: {plan}", code="INVALID_SEED", session_id=header.id
                )
            if isinstance(plan, SurfacePlan):
                surface.commit(plan)
        return Session(
            header,
            inherited_event_count=inherited_event_count,
            log=events,
            surface=surface,
            first_live_seq=len(events),
            clock=self._clock,
            seal_seed=True,
        )

    # ---------------------------------------------------------------- lifecycle

    def publish(self, session: Session) -> Session:
        """Enter `session` into the store and announce it to `created` listeners.

        A raising `created` listener vetoes: the entry is rolled back, a paired `disposed` is
        emitted, the session is retired and the listener's exception propagates.

        Raises:
            SessionError: `SESSION_STORE_CLOSED`, `SESSION_RETIRED`, `SESSION_ALREADY_EXISTS`.
        """
        self._refuse_closed()
        session.attach(self._host)
        try:
            for fn in list(self._created):
                fn(session)
        except BaseException:
            # A listener may have disposed the session already; then it was released once and
            # the veto has nothing left to undo.
            session.veto()
            raise
        return session

    def create(
        self,
        id: str | None = None,
        *,
        header: HeaderInit | None = None,
        seed: Sequence[Mapping[str, object]] | None = None,
        inherited_event_count: int = 0,
    ) -> Session:
        """`prepare` then `publish`."""
        return self.publish(self.prepare(id, header=header, seed=seed, inherited_event_count=inherited_event_count))

    def get(self, id: str) -> Session | None:
        """The live session with this id, or None."""
        return self._live.get(id)

    def list(self) -> tuple[Session, ...]:
        """Live sessions in publication order (a fresh tuple)."""
        return tuple(self._live.values())

    def dispose(self, session: Session) -> bool:
        """Detach `session` and emit `disposed`; False when it is not live here. Idempotent.

        A dispose requested by an `event` listener runs after that append's publication unwinds.
        """
        if self._live.get(session.id) is not session:
            return False
        return session.request_dispose()

    def _admit(self, session: Session) -> None:
        # Checked again at publication: a stale prepared session cannot overwrite a live one.
        if session.id in self._live:
            raise SessionError(
                f'session "{session.id}" already exists', code="SESSION_ALREADY_EXISTS", session_id=session.id
            )
        self._live[session.id] = session

    def _release(self, session: Session) -> None:
        if self._live.get(session.id) is session:
            del self._live[session.id]
        self._emit_disposed(session)

    def _emit_disposed(self, session: Session) -> None:
        for fn in list(self._disposed):
            try:
                fn(session)
            except Exception:
                _log.exception('session "%s": session/disposed listener raised', session.id)

    async def flush(self, session: Session) -> bool:
        """Run every `flush` listener concurrently and wait for all of them to settle.

        Returns:
            Whether at least one listener participated.

        Raises:
            SessionError: `SESSION_NOT_LIVE` when `session` is not live here.
            Exception: The first listener failure in registration order.
        """
        if self._live.get(session.id) is not session:
            raise SessionError(
                f'session "{session.id}" is not live in this store', code="SESSION_NOT_LIVE", session_id=session.id
            )
        listeners = list(self._flush)
        if not listeners:
            return False
        if len(listeners) == 1:
            # The common case (one persistence): await it directly, without a task per listener.
            await listeners[0](session)
            return True
        results = await asyncio.gather(*(_call_flush(fn, session) for fn in listeners), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return True

    def close(self) -> None:
        """Refuse new work (`prepare`, `publish`, `create`, `fork`). Disposes and awaits nothing."""
        self._closed = True

    async def aclose(self) -> None:
        """Refuse new work, dispose every live session in publication order, await listener tasks."""
        self._closed = True
        for session in list(self._live.values()):
            self.dispose(session)
        while self._tasks:
            pending = list(self._tasks)
            await asyncio.gather(*pending, return_exceptions=True)
            # Finish them here too: on Python 3.12+ a gather of tasks that are done already
            # completes at once, before their done callbacks have run.
            for task in pending:
                self._task_done(task)

    # ---------------------------------------------------------------- event feed

    def _deliver_event(self, session: Session, event: SessionEvent, listeners: tuple[EventListener, ...]) -> None:
        for fn in listeners:
            try:
                result = fn(session, event)
            except Exception as error:
                _log.exception('session "%s": session/event listener raised: %r', session.id, error)
                continue
            if result is not None and inspect.isawaitable(result):
                self._track(session, result)

    def _track(self, session: Session, awaitable: Awaitable[Any]) -> None:
        """Run an async listener's awaitable as a task the store awaits in `aclose`."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            # Appending outside a running loop: there is nowhere to run the coroutine. Close it so
            # it does not warn as never-awaited, and say so once in the log.
            if inspect.iscoroutine(awaitable):
                awaitable.close()
            _log.error('session "%s": session/event listener returned an awaitable outside a loop', session.id)
            return
        task = asyncio.ensure_future(awaitable, loop=loop)
        self._tasks[task] = session.id
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Future[Any]) -> None:
        """Report a finished listener task once (its done callback or `aclose`, whichever comes first)."""
        session_id = self._tasks.pop(task, None)
        if session_id is None:
            return
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            _log.error('session "%s": session/event listener raised: %r', session_id, error, exc_info=error)

    # ---------------------------------------------------------------- fork

    def fork(self, source: Session | str, *, boundary: int | None = None, child_id: str | None = None) -> Session:
        """Create and publish a child seeded with a prefix of `source` (docs/glossary.md#seeded).

        Raises:
            SessionForkError: `SESSION_ALREADY_EXISTS`, `SESSION_NOT_FOUND`, `SESSION_NOT_LIVE`,
                `INVALID_BOUNDARY`, `OPEN_TURN` (and the creation codes).
        """
        self._refuse_closed(SessionForkError)
        if child_id is not None and child_id in self._live:
            raise SessionForkError(
                f'session "{child_id}" already exists', code="SESSION_ALREADY_EXISTS", session_id=child_id
            )
        if isinstance(source, Session):
            if self._live.get(source.id) is not source:
                raise SessionForkError(
                    f'session "{source.id}" is not the live store instance',
                    code="SESSION_NOT_LIVE",
                    session_id=source.id,
                )
            parent = source
        else:
            found = self._live.get(source)
            if found is None:
                raise SessionForkError(f'session "{source}" not found', code="SESSION_NOT_FOUND", session_id=source)
            parent = found
        events = parent.events
        prefix = events[: _fork_end(parent.id, events, boundary)]
        header = HeaderInit(cwd=parent.header.cwd, parent_session=parent.id)
        try:
            child = self._prepare(child_id, header, prefix, len(prefix), trusted_seed=True)
            return self.publish(child)
        except SessionForkError:
            raise
        except SessionError as error:
            raise SessionForkError(error.message, code=error.code, session_id=error.session_id) from error


class _StoreHost:
    """The `SessionHost` a store hands to the sessions it publishes.

    A separate object rather than public methods on `SessionStore`, so application code cannot
    admit or release a session behind its lifecycle; each call goes to the store's own handler.
    """

    __slots__ = ("_admit", "_deliver", "_listeners", "_release")

    def __init__(
        self,
        admit: Callable[[Session], None],
        listeners: list[EventListener],
        deliver: Callable[[Session, SessionEvent, tuple[EventListener, ...]], None],
        release: Callable[[Session], None],
    ) -> None:
        self._admit = admit
        self._listeners = listeners
        self._deliver = deliver
        self._release = release

    def admit(self, session: Session) -> None:
        self._admit(session)

    def event_listeners(self) -> tuple[EventListener, ...]:
        return tuple(self._listeners)

    def deliver_event(self, session: Session, event: SessionEvent, listeners: tuple[EventListener, ...]) -> None:
        self._deliver(session, event, listeners)

    def release(self, session: Session) -> None:
        self._release(session)


def _text(value: object) -> str:
    """Render a refused value as upstream does (JSON spelling: `true`, `1.5`), else `repr`."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return repr(value)


def _fork_end(session_id: str, events: Sequence[SessionEvent], boundary: object) -> int:
    """Validate a fork boundary and return the prefix length (exclusive end)."""
    if boundary is None:
        if not events:
            return 0
        boundary = len(events) - 1
    if not (is_safe_int(boundary) and boundary >= 0):  # type: ignore[operator]
        raise SessionForkError(
            f'fork boundary for session "{session_id}" must be a non-negative safe integer, got {_text(boundary)}',
            code="INVALID_BOUNDARY",
            session_id=session_id,
        )
    assert isinstance(boundary, int)
    if boundary >= len(events):
        last = str(len(events) - 1) if events else "none"
        raise SessionForkError(
            f'fork boundary {boundary} does not exist in session "{session_id}" (last seq: {last})',
            code="INVALID_BOUNDARY",
            session_id=session_id,
        )
    if events[boundary].seq != boundary:
        raise SessionForkError(
            f'fork boundary {boundary} does not match a contiguous event seq in session "{session_id}"',
            code="INVALID_BOUNDARY",
            session_id=session_id,
        )
    for index in range(boundary, -1, -1):
        kind = events[index].type
        if kind == "turn/end":
            break
        if kind == "turn/start":
            turn = events[index]["data"]["turn"]  # type: ignore[index,call-overload]
            raise SessionForkError(
                f'fork boundary {boundary} in session "{session_id}" ends inside open turn {turn}',
                code="OPEN_TURN",
                session_id=session_id,
            )
    return boundary + 1


async def _call_flush(fn: FlushListener, session: Session) -> None:
    await fn(session)


# Shown under the name users import (docs/architecture.md#public-names).
SessionStore.__module__ = "dsh"
