"""The projection cache: durable checkpoints of every registered unit, and its write policy.

Layer: projection (`Services.projection_cache`). It lets readers show projection values of cold
sessions without reading logs (`cached_snapshot`, zero log reads) and lets a cold fold replay only a
tail (`cold_snapshot`). It is optional and derived: the log is the only authority, the log always
leads (a record lands only after the events it covers are durable), and a cache fault never
produces a verdict. Writes follow a policy, never every flush: when enough events (count) or time
(interval) have passed since the last checkpoint, when the session goes idle, and at disposal;
they are fail-soft, and the next write heals a failed one (docs/projections.md#cache-write-policy).

Ordering: every write of one id runs under that id's FIFO slot, so writes of one id never overlap
or reorder, and each takes its cut when it gets the slot (the disposal write takes it earlier, in
the `disposed` listener, while the registry still holds the session's cells). A cold read's
write-back never waits behind or races a policy write: it is skipped whenever a write of the id was
queued, running or cut while the read was in flight, because a cut of the live session always
covers at least as much of the log as any stored read.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal

from dsh.abort import AbortSignal
from dsh.errors import ConfigError
from dsh.json import FrozenDict, is_json
from dsh.persistence.base import EventSlice
from dsh.projection.cache_storage import CacheIdentity, CacheRecord, CacheStorage
from dsh.projection.errors import ProjectionError
from dsh.projection.unit import CheckpointRow, ProjectionSnapshot, Restored
from dsh.session.events import SessionEvent
from dsh.session.header import SessionHeader, SessionId, SessionLogOffset
from dsh.session.session import Session
from dsh.timer import LoopTimer, Timer, TimerHandle

if TYPE_CHECKING:
    from dsh.persistence.base import SessionPersistence
    from dsh.projection.registry import ProjectionRegistry
    from dsh.session.store import SessionStore

__all__ = ["ProjectionCache", "ProjectionCacheConfig"]

_log = logging.getLogger(__name__)

Trigger = Literal["count", "interval", "idle", "dispose"]

_NOT_JSON_MESSAGE: Final = (
    "projection checkpoint is not losslessly JSON-serializable (a unit state violates the plain-JSON contract)"
)
_WRITE_FAILED: Final = 'session projection cache: %s write for "%s" failed (cache stays stale): %s'
_WRITE_BACK_FAILED: Final = 'session projection cache: cold-read write-back for "%s" failed (cache stays stale): %s'
_REFOLD_CODES: Final = frozenset({"PROJECTION_REREAD_REQUIRED", "PROJECTION_INVALID_STATE"})


@dataclass(frozen=True, slots=True)
class ProjectionCacheConfig:
    """Write-policy settings (docs/projections.md#cache-write-policy); invalid values raise `ConfigError`.

    Attributes:
        write_every_events: Count throttle: write after this many dirty events (>= 1).
        write_interval_ms: Interval throttle: write this long after the first dirty event (>= 1).
        close_timeout_s: How long `aclose` waits for in-flight writes before abandoning them (> 0).
        idle_ms: Idle trigger: write once the session received no event for this long (>= 1).
    """

    write_every_events: int = 200
    write_interval_ms: int = 5000
    close_timeout_s: float = 10.0
    idle_ms: int = 1000

    def __post_init__(self) -> None:
        for name in ("write_every_events", "write_interval_ms", "idle_ms"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        close_timeout_s = self.close_timeout_s
        if type(close_timeout_s) not in (int, float) or not close_timeout_s > 0:
            raise ConfigError(f"close_timeout_s must be a positive number, got {close_timeout_s!r}")


@dataclass(frozen=True, slots=True)
class _Cut:
    """What one write will store: the rows and identity taken at one synchronous moment."""

    session_id: SessionId
    identity: CacheIdentity
    rows: dict[str, CheckpointRow]


class _Dirty:
    """Write-policy state of one live session.

    `pending` counts the dirty events since the last cut; `queued` is set while a policy write is
    waiting for its cut: that cut will cover every event that arrives meanwhile, so those events
    neither count nor arm a timer. `timer` is the interval timer (armed once per clean period, never
    moved); `idle` is the idle timer and `idle_mark` the `pending` it saw when it was armed: when it
    fires with more events since, it is armed again instead of writing.
    """

    __slots__ = ("idle", "idle_mark", "pending", "queued", "timer")

    def __init__(self) -> None:
        self.pending = 0
        self.queued = False
        self.timer: TimerHandle | None = None
        self.idle: TimerHandle | None = None
        self.idle_mark = 0

    def disarm(self) -> None:
        """Cancel both timers."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.idle is not None:
            self.idle.cancel()
            self.idle = None


class _Slot:
    """One id's write serialization: a FIFO lock and how many writes hold or await it."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


def _identity_of(header: SessionHeader, cut: int) -> CacheIdentity:
    return CacheIdentity(header.created_at, header.cwd, cut)


def _storage_failure(error: Exception) -> ProjectionError:
    if isinstance(error, ProjectionError):
        return error
    return ProjectionError(f"projection cache storage failed: {error}", code="PROJECTION_CACHE_STORAGE_FAILED")


class ProjectionCache:
    """Durable per-session checkpoints plus the write policy. Open with `await ProjectionCache.open(...)`.

    Attributes:
        storage: Where records live; closed by `aclose`.
    """

    def __init__(
        self,
        storage: CacheStorage,
        *,
        registry: ProjectionRegistry,
        sessions: SessionStore,
        persistence: SessionPersistence,
        config: ProjectionCacheConfig,
        timer: Timer | None,
    ) -> None:
        if not isinstance(config, ProjectionCacheConfig):
            raise ConfigError("config must be a ProjectionCacheConfig")
        self.storage = storage
        self._registry = registry
        self._sessions = sessions
        self._persistence = persistence
        self._config = config
        self._timer: Timer = timer if timer is not None else LoopTimer()
        self._dirty: dict[Session, _Dirty] = {}
        self._slots: dict[SessionId, _Slot] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # Sessions that were published while the policy listened: a publication vetoed by an
        # earlier `created` listener still emits `disposed`, and such a session was never live.
        self._published: weakref.WeakSet[Session] = weakref.WeakSet(sessions.list())
        # Cold-read write-back guard: every cut gets a serial; while cold reads run, the serial of
        # each id's latest cut is remembered so a read can tell whether a write overtook it.
        self._cut_serial = 0
        self._cold_reads = 0
        self._recent_cuts: dict[SessionId, int] = {}
        self._closed = False
        self._close_done: asyncio.Event | None = None
        self._unsubscribe = [
            sessions.on_created(self._on_created),
            sessions.on_event(self._on_event),
            sessions.on_disposed(self._on_disposed),
        ]

    @classmethod
    async def open(
        cls,
        storage: CacheStorage,
        *,
        registry: ProjectionRegistry,
        sessions: SessionStore,
        persistence: SessionPersistence,
        config: ProjectionCacheConfig | None = None,
        timer: Timer | None = None,
    ) -> ProjectionCache:
        """Install the write policy over an opened storage.

        Raises:
            ConfigError: `config` is not a `ProjectionCacheConfig`.
        """
        return cls(
            storage,
            registry=registry,
            sessions=sessions,
            persistence=persistence,
            config=config if config is not None else ProjectionCacheConfig(),
            timer=timer,
        )

    @property
    def closed(self) -> bool:
        """True once `aclose()` started."""
        return self._closed

    # ---------------------------------------------------------------- reads

    async def cached_snapshot(
        self, header: SessionHeader, inherited_cut: SessionLogOffset, keys: Sequence[str] | None = None
    ) -> ProjectionSnapshot | None:
        """Serve client views from the stored record: zero log reads, one storage read.

        Returns None for no record, an identity mismatch, or no servable key. `as_of_seq` is the
        minimum row seq among served keys (under-claiming is safe under "higher seq wins").

        Raises:
            ValueError: `inherited_cut` contradicts `header.is_seeded`.
            ProjectionError: `PROJECTION_CACHE_STORAGE_FAILED`; callers treat any exception as a miss.
        """
        if type(inherited_cut) is not int or inherited_cut < 0 or header.is_seeded != (inherited_cut > 0):
            raise ValueError(f"inherited cut {inherited_cut!r} is inconsistent with isSeeded={header.is_seeded}")
        try:
            record = await self.storage.get(header.id)
        except Exception as error:
            raise _storage_failure(error) from error
        if record is None or record.identity != _identity_of(header, inherited_cut):
            return None
        values = self._registry.view_checkpoint(record.rows, keys)
        if not values:
            return None
        return ProjectionSnapshot(as_of_seq=min(record.rows[key]["seq"] for key in values), values=FrozenDict(values))

    async def cold_snapshot(
        self, session_id: SessionId, keys: Sequence[str] | None = None, *, signal: AbortSignal | None = None
    ) -> ProjectionSnapshot:
        """One authoritative snapshot of a cold session: cached rows plus an anchored tail read.

        Reads `read_events(from_seq=floor)`; falls back to exactly one full read when the rows cannot
        seed the fold (identity mismatch, `PROJECTION_REREAD_REQUIRED`, `PROJECTION_INVALID_STATE`).
        Writes the refreshed rows back fail-softly unless the id is live here.

        Raises:
            SessionPersistenceError: From the reads, unchanged (an absent log is not-found).
            ProjectionError: `PROJECTION_UNIT_FAILED` or `PROJECTION_INVALID_VIEW` from the fold.
            AbortError: `signal` aborted (or its reason, when that is an exception).
        """
        check = signal if signal is not None else AbortSignal.none()
        check.throw_if_aborted()
        # Measured before the first read: a write of this id in flight now, or cut from here on,
        # covers at least what these reads can see, so the write-back must not replace it.
        started = self._cut_serial
        busy = session_id in self._slots
        self._cold_reads += 1
        try:
            try:
                record = await self.storage.get(session_id)
            except Exception as error:
                _log.warning(
                    'session projection cache: read for "%s" failed (treated as a miss): %s', session_id, error
                )
                record = None
            check.throw_if_aborted()
            cached: dict[str, CheckpointRow] = dict(record.rows) if record is not None else {}
            floor = self._registry.restore_floor(cached, keys)
            if floor is None:
                # No selected unit is registered: the read only proves the log exists.
                probe = await self._read(session_id, 0, signal, check)
                return ProjectionSnapshot(as_of_seq=probe.next_seq - 1, values=FrozenDict())
            restored, identity, kept = await self._cold_fold(
                session_id, keys, record, floor, signal=signal, check=check
            )
            if busy or self._overtaken(session_id, started):
                _log.debug('session projection cache: cold-read write-back for "%s" skipped (overtaken)', session_id)
            elif self._sessions.get(session_id) is None:
                await self._write_back(session_id, identity, {**restored.checkpoint, **kept})
            return restored.snapshot
        finally:
            self._cold_reads -= 1
            if not self._cold_reads:
                self._recent_cuts.clear()

    async def _cold_fold(
        self,
        session_id: SessionId,
        keys: Sequence[str] | None,
        record: CacheRecord | None,
        floor: int,
        *,
        signal: AbortSignal | None,
        check: AbortSignal,
    ) -> tuple[Restored, CacheIdentity, dict[str, CheckpointRow]]:
        """The tail read and fold of `cold_snapshot`: `(restored, identity of the folded log, stored rows to keep)`."""
        cached: dict[str, CheckpointRow] = dict(record.rows) if record is not None else {}
        tail = await self._read(session_id, floor, signal, check)
        identity = _identity_of(tail.header, tail.inherited_event_count)
        matched = record is not None and record.identity == identity
        restored: Restored | None = None
        if matched:
            try:
                restored = self._registry.restore(cached, tail.events, floor, keys)
            except ProjectionError as error:
                if error.code not in _REFOLD_CODES:
                    raise  # PROJECTION_UNIT_FAILED: a re-read cannot cure a unit
        if restored is None:
            events: Sequence[SessionEvent] = tail.events
            if floor > 0:
                full = await self._read(session_id, 0, signal, check)
                events = full.events
                identity = _identity_of(full.header, full.inherited_event_count)
                matched = matched and record is not None and record.identity == identity
            restored = self._registry.restore(None, events, 0, keys)
        kept: dict[str, CheckpointRow] = {}
        if matched:
            # Rows of unselected, still-registered keys stay; rows of unregistered keys are dropped.
            registered = set(self._registry.keys())
            kept = {key: row for key, row in cached.items() if key in registered and key not in restored.checkpoint}
        return restored, identity, kept

    async def _read(
        self, session_id: SessionId, from_seq: int, signal: AbortSignal | None, check: AbortSignal
    ) -> EventSlice:
        """One persistence read with the abort checks around it (an abort surfaces as the signal's)."""
        check.throw_if_aborted()
        try:
            result = await self._persistence.read_events(session_id, from_seq=from_seq, signal=signal)
        except Exception:
            check.throw_if_aborted()
            raise
        check.throw_if_aborted()
        return result

    def _overtaken(self, session_id: SessionId, started: int) -> bool:
        """Whether a write of the id is queued or running, or a cut of it was taken after `started`."""
        return session_id in self._slots or self._recent_cuts.get(session_id, -1) > started

    async def _write_back(self, session_id: SessionId, identity: CacheIdentity, rows: dict[str, CheckpointRow]) -> None:
        # Enter the id's slot synchronously after the checks: no write of the id is in flight, so
        # this takes the lock at once and every later policy write queues behind it.
        slot = self._enter(session_id)
        try:
            async with slot.lock:
                if not is_json(rows):
                    raise ProjectionError(_NOT_JSON_MESSAGE, code="PROJECTION_CACHE_NOT_JSON")
                await self.storage.put(session_id, CacheRecord(identity, rows, self._sessions.clock()))
        except Exception as error:
            _log.warning(_WRITE_BACK_FAILED, session_id, error)
        finally:
            self._leave(session_id, slot)

    # ---------------------------------------------------------------- writes

    def _enter(self, session_id: SessionId) -> _Slot:
        slot = self._slots.get(session_id)
        if slot is None:
            slot = self._slots[session_id] = _Slot()
        slot.users += 1
        return slot

    def _leave(self, session_id: SessionId, slot: _Slot) -> None:
        slot.users -= 1
        # Counted users, not `lock.locked()`: a released lock reads unlocked while its next waiter
        # has not run yet, and dropping the slot then would let a new write bypass that waiter.
        if slot.users == 0 and self._slots.get(session_id) is slot:
            del self._slots[session_id]

    def _take_cut(self, session: Session) -> _Cut:
        """Take a write's cut: the rows and identity now; resets the dirty counter and the armed timer."""
        dirty = self._dirty.get(session)
        if dirty is not None:
            dirty.pending = 0
            dirty.queued = False
            dirty.disarm()
        self._cut_serial += 1
        if self._cold_reads:
            self._recent_cuts[session.id] = self._cut_serial
        rows = self._registry.checkpoint(session)
        return _Cut(session.id, _identity_of(session.header, session.inherited_event_count), rows)

    async def write(self, session: Session) -> None:
        """Checkpoint `session` now: serialize per id, take the cut, make the log durable, then store.

        Raises:
            ProjectionError: `PROJECTION_CACHE_NOT_JSON` or `PROJECTION_CACHE_STORAGE_FAILED`.
            Exception: A failed flush propagates unchanged (`SESSION_NOT_LIVE` for a session that is
                neither live here nor disposed); nothing lands.
        """
        slot = self._enter(session.id)
        try:
            async with slot.lock:
                await self._store_cut(self._take_cut(session), session)
        finally:
            self._leave(session.id, slot)

    async def _store_cut(self, cut: _Cut, session: Session) -> None:
        """Finish a write after its cut: make the log durable, check the rows are lossless JSON, put."""
        # The log leads, the cache follows: a record must never describe events that may be lost.
        if session.state == "retired":
            # Disposed: the store no longer flushes it; persistence's retirement drains its events.
            await self._persistence.drain(cut.session_id)
        elif not await self._sessions.flush(session):
            raise ProjectionError(
                f'projection cache: no persistence confirmed durability of session "{cut.session_id}"',
                code="PROJECTION_CACHE_STORAGE_FAILED",
                session_id=cut.session_id,
            )
        if not is_json(cut.rows):
            raise ProjectionError(_NOT_JSON_MESSAGE, code="PROJECTION_CACHE_NOT_JSON", session_id=cut.session_id)
        record = CacheRecord(cut.identity, cut.rows, self._sessions.clock())
        try:
            await self.storage.put(cut.session_id, record)
        except Exception as error:
            raise _storage_failure(error) from error

    # ---------------------------------------------------------------- policy

    def _on_created(self, session: Session) -> None:
        self._published.add(session)

    def _on_event(self, session: Session, event: SessionEvent) -> None:
        # On every append of every live session: a few attribute operations, no allocation once the
        # session's state exists, and no write unless a trigger fires (docs/projections.md#cache-write-policy).
        if self._closed:
            return
        dirty = self._dirty.get(session)
        if dirty is None:
            dirty = self._dirty[session] = _Dirty()
        if dirty.queued:
            return
        dirty.pending += 1
        if dirty.pending >= self._config.write_every_events:
            dirty.queued = True
            self._spawn("count", session, None)
            return
        if dirty.timer is None or dirty.idle is None:
            # Both timers are armed by the first dirty event after a clean write; later events
            # never move the interval, and the idle timer re-arms itself when it fires too early.
            try:
                if dirty.timer is None:
                    dirty.timer = self._timer.call_later(
                        self._config.write_interval_ms, lambda: self._on_interval(session)
                    )
                if dirty.idle is None:
                    dirty.idle_mark = dirty.pending
                    dirty.idle = self._timer.call_later(self._config.idle_ms, lambda: self._on_idle(session))
            except RuntimeError:
                # The default timer needs a running loop; without one no write could run anyway.
                dirty.disarm()
                _log.warning(_WRITE_FAILED, "interval", session.id, "no running event loop")

    def _may_write(self, session: Session, dirty: _Dirty) -> bool:
        """Whether a policy write may start for a session one of whose timers fired."""
        return not (self._closed or dirty.queued) and self._sessions.get(session.id) is session

    def _on_interval(self, session: Session) -> None:
        dirty = self._dirty.get(session)
        if dirty is None:
            return
        dirty.timer = None
        if self._may_write(session, dirty):
            dirty.queued = True
            self._spawn("interval", session, None)

    def _on_idle(self, session: Session) -> None:
        dirty = self._dirty.get(session)
        if dirty is None:
            return
        dirty.idle = None
        if not self._may_write(session, dirty) or dirty.pending == 0:
            return
        if dirty.pending != dirty.idle_mark:
            # Events arrived since the timer was armed: the session is not idle yet.
            dirty.idle_mark = dirty.pending
            dirty.idle = self._timer.call_later(self._config.idle_ms, lambda: self._on_idle(session))
            return
        dirty.queued = True
        self._spawn("idle", session, None)

    def _on_disposed(self, session: Session) -> None:
        if self._closed:
            return
        dirty = self._dirty.pop(session, None)
        if dirty is not None:
            dirty.disarm()
        if session not in self._published:
            return  # a vetoed publication: the session was never live and nothing of it is stored
        self._published.discard(session)
        # The live-to-cold moment: take the cut now, synchronously, while the registry still holds
        # the session's cells; the durable part of the write runs as a tracked task.
        cut = self._take_cut(session)
        self._spawn("dispose", session, cut)

    def _spawn(self, trigger: Trigger, session: Session, cut: _Cut | None) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            # Appended or disposed from synchronous code with no loop: nothing can run the write.
            _log.warning(_WRITE_FAILED, trigger, session.id, "no running event loop")
            dirty = self._dirty.get(session)
            if dirty is not None:
                dirty.queued = False
            return
        # The slot is entered now, not when the task first runs: writes of one id keep the order in
        # which they were triggered, and a cold read sees this write as in flight at once.
        slot = self._enter(session.id)
        task = loop.create_task(self._policy_write(trigger, session, cut, slot), name=f"dsh-cache-{trigger}")
        self._tasks.add(task)

        def done(finished: asyncio.Task[None]) -> None:
            # Released here rather than inside the coroutine: a task cancelled before its first
            # step never runs its body, and the slot must not leak.
            self._tasks.discard(finished)
            self._leave(session.id, slot)

        task.add_done_callback(done)

    async def _policy_write(self, trigger: Trigger, session: Session, cut: _Cut | None, slot: _Slot) -> None:
        try:
            async with slot.lock:
                await self._store_cut(cut if cut is not None else self._take_cut(session), session)
        except Exception as error:
            _log.warning(_WRITE_FAILED, trigger, session.id, error)

    # ---------------------------------------------------------------- close

    async def aclose(self) -> None:
        """Stop the policy, wait up to `close_timeout_s` for in-flight writes, close the storage.

        Idempotent: a later call waits for the first one to finish. No task of the cache is left
        running afterwards; writes still unfinished at the deadline are cancelled with a warning.
        """
        if self._close_done is not None:
            await self._close_done.wait()
            return
        self._close_done = asyncio.Event()
        self._closed = True
        try:
            for unsubscribe in self._unsubscribe:
                unsubscribe()
            for dirty in self._dirty.values():
                dirty.disarm()
            self._dirty.clear()
            tasks = set(self._tasks)
            try:
                if tasks:
                    _, pending = await asyncio.wait(tasks, timeout=self._config.close_timeout_s)
                    if pending:
                        _log.warning(
                            "session projection cache: abandoning %d unfinished write(s) at close", len(pending)
                        )
            finally:
                # Also reached when aclose itself is cancelled: never leave a write running against
                # a storage that is about to close.
                unfinished = [task for task in tasks if not task.done()]
                for task in unfinished:
                    task.cancel()
                if unfinished:
                    await asyncio.gather(*unfinished, return_exceptions=True)
                await self.storage.aclose()
        finally:
            self._close_done.set()


# Shown under the name users import (docs/architecture.md#public-names).
ProjectionCache.__module__ = "dsh"
