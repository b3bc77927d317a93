"""`StoreFeed`: `session/event` frames built from committed rows, numbered by stored seqs (replica mode).

Layer: server. With several `dsh serve` replicas on one PostgreSQL store (docs/server.md#replicas)
a frame id cannot come from a process: a client that reconnects to another replica must resume
exactly where it stopped. So in replica mode the push stream's `session/event` frames are built from
the store, never from in-process appends:

* A commit notice (`{"k": "e", "s": <session>, "q": <last seq>}`, sent by the append transaction)
  or a local trigger makes the feed read the rows of that session it has not read yet, once for all
  the clients of this replica, in seq order, under one lock per session; so a frame is never sent
  twice, never skipped and never out of order, whichever replica wrote the rows.
* A client's **position** is, for each session it follows in the order of the sorted ids, the last
  seq it was served: the id `7` for one session, `7.-1.12` for three. Every `session/event` frame
  carries the position after it, and a stream opens with a bare `id:` line holding its starting
  position, so a browser's `Last-Event-ID` is always a position. Reconnecting (to any replica) with
  it reads the missed rows from the store and then goes on live; an id that is not a position of
  this filter gets a `reset` first and the stream starts at the stored tail.
* A gap in notices (the listening connection broke) is filled by reading every followed session
  again (`refresh_all`): rows are the truth, notices only wake the feed.

The hub's own frames (status, projections, approvals, creations, subagents) carry no id in replica
mode: they describe live state, are relayed between replicas as they happen, and a reconnecting
client refetches them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from dsh.query.summary import event_summary, is_summarised
from dsh.server.stream import RESET_LAST_EVENT_ID, Frame, PushHub, Subscription

if TYPE_CHECKING:
    from dsh.session.events import SessionEvent

Reader = Callable[[str, int], Awaitable[tuple[int, Sequence["SessionEvent"]]]]
"""`read(session_id, after_seq)` → `(last stored seq, events after it)`."""

__all__ = ["StoreFeed", "StoreSubscription", "decode_position", "encode_position"]

_log = logging.getLogger("dsh.server.stream")

_MAX_POSITION_CHARS: Final = 256 * 21
_BEYOND: Final = 1 << 62
"""An `after_seq` past every stored seq: reads only the last stored seq."""


def encode_position(order: Sequence[str], positions: dict[str, int]) -> str:
    """The id of a position: each followed session's last served seq, in the order of the sorted ids."""
    return ".".join(str(positions.get(session_id, -1)) for session_id in order)


def decode_position(value: str, order: Sequence[str]) -> dict[str, int] | None:
    """A `Last-Event-ID` read as a position of this filter, or None when it is not one."""
    if len(value) > _MAX_POSITION_CHARS:
        return None
    parts = value.strip().split(".")
    if len(parts) != len(order):
        return None
    positions: dict[str, int] = {}
    for session_id, part in zip(order, parts, strict=True):
        digits = part.removeprefix("-")
        if not digits.isdigit() or len(digits) > 18 or (part.startswith("-") and part != "-1"):
            return None
        positions[session_id] = int(part)
    return positions


class StoreSubscription(Subscription):
    """A stream in replica mode: the hub's live frames plus this stream's `session/event` frames in store order."""

    def __init__(self, hub: PushHub, session_ids: frozenset[str] | None, queue_size: int, feed: StoreFeed) -> None:
        super().__init__(hub, session_ids, queue_size)
        self._feed = feed
        self.order: tuple[str, ...] = tuple(sorted(session_ids)) if session_ids else ()
        self.positions: dict[str, int] = {}
        """Per followed session, the last seq served (frames queued count as served)."""

    def position(self) -> str:
        """This stream's current position (the id of its newest `session/event` frame)."""
        return encode_position(self.order, self.positions)

    def serve(self, session_id: str, seq: int, data: dict[str, object] | None) -> None:
        """Advance to `seq`; queue a `session/event` frame for it when `data` is given."""
        if seq <= self.positions.get(session_id, -1):
            return
        self.positions[session_id] = seq
        if data is not None:
            self.offer(Frame(self.position(), "session/event", data))

    def mark(self) -> None:
        """Queue a bare `id:` line with the current position (sent once the starting position is known)."""
        self.offer(Frame(self.position(), "", {}))

    def _end(self) -> None:
        super()._end()
        self._feed.discard(self)


@dataclass(eq=False)
class _Followed:
    """What the feed knows of one followed session."""

    tail: int | None = None
    """The last seq read from the store (None before the first read)."""
    subscribers: dict[StoreSubscription, None] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    wanted: int = -1
    """The highest seq a notice announced."""
    task: asyncio.Task[None] | None = None


class StoreFeed:
    """`session/event` frames for the clients of one replica, read from the store (see the module docs).

    Args:
        read: `read(session_id, after_seq)` → `(last stored seq, some events with seq > after_seq in
            order)` (`PostgresBackend.events_after`): the store's rows, never a process's memory.
        hub: The hub whose streams receive the frames (in replica mode).
        queue_size: How many undelivered frames one client may hold before it gets `reset`.
    """

    def __init__(self, read: Reader, hub: PushHub, *, queue_size: int = 1000) -> None:
        self._reader = read
        self._hub = hub
        self._queue_size = queue_size
        self._followed: dict[str, _Followed] = {}
        self.reads = 0
        """How many store reads the feed made (tests and benchmarks count them)."""

    def followed(self) -> tuple[str, ...]:
        """The sessions some client of this replica follows."""
        return tuple(self._followed)

    async def subscribe(self, session_ids: frozenset[str] | None, last_event_id: str | None) -> StoreSubscription:
        """A new stream: from `last_event_id` when it is a position of this filter, else from the stored tail."""
        subscription = StoreSubscription(self._hub, session_ids, self._queue_size, self)
        if not self._hub.register(subscription):
            return subscription
        if not subscription.order:
            return subscription
        start = None if last_event_id is None else decode_position(last_event_id, subscription.order)
        if last_event_id is not None and start is None:
            subscription.offer(self._hub.reset_frame(RESET_LAST_EVENT_ID))
        for session_id in subscription.order:
            followed = self._followed.setdefault(session_id, _Followed())
            async with followed.lock:
                if subscription.ended:
                    return subscription
                await self._read_locked(session_id, followed)
                tail = followed.tail if followed.tail is not None else -1
                begin = tail if start is None else min(start[session_id], tail)
                subscription.positions[session_id] = begin
                while begin < tail:  # catch up from the store, up to what the followers were served
                    _, events = await self._read(session_id, begin)
                    if not events:
                        break
                    for event in events:
                        if event.seq <= tail:
                            self._serve(subscription, session_id, event)
                    begin = events[-1].seq
                followed.subscribers[subscription] = None
        subscription.mark()
        return subscription

    def discard(self, subscription: StoreSubscription) -> None:
        """Forget an ended stream; a session nobody follows any more is dropped."""
        for session_id in subscription.order:
            followed = self._followed.get(session_id)
            if followed is None:
                continue
            followed.subscribers.pop(subscription, None)
            if not followed.subscribers and not followed.lock.locked() and followed.task is None:
                del self._followed[session_id]

    def notice(self, session_id: str, last_seq: int) -> None:
        """A commit stored `session_id` up to `last_seq`: read it if some client follows the session."""
        followed = self._followed.get(session_id)
        if followed is None:
            return
        followed.wanted = max(followed.wanted, last_seq)
        if followed.tail is not None and last_seq <= followed.tail:
            return
        self._schedule(session_id, followed)

    def refresh_all(self) -> None:
        """Read every followed session again (after a gap in notices)."""
        for session_id, followed in self._followed.items():
            self._schedule(session_id, followed)

    async def settle(self) -> None:
        """Wait for the reads under way (tests and shutdown)."""
        tasks = [followed.task for followed in self._followed.values() if followed.task is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def _schedule(self, session_id: str, followed: _Followed) -> None:
        if followed.task is not None:
            followed.wanted = max(followed.wanted, (followed.tail or -1) + 1)
            return
        task = asyncio.get_running_loop().create_task(self._refresh(session_id, followed), name="dsh-feed-read")
        followed.task = task

    async def _refresh(self, session_id: str, followed: _Followed) -> None:
        try:
            while True:
                async with followed.lock:
                    await self._read_locked(session_id, followed)
                tail = followed.tail if followed.tail is not None else -1
                if followed.wanted <= tail:
                    break
                # Announced but not visible yet: cannot happen after COMMIT; read once more.
                followed.wanted = tail
        except Exception:
            _log.exception('push stream: the stored events of session "%s" could not be read', session_id)
        finally:
            followed.task = None
            if not followed.subscribers and session_id in self._followed and not followed.lock.locked():
                del self._followed[session_id]

    async def _read_locked(self, session_id: str, followed: _Followed) -> None:
        """Read the rows after the tail and serve them to every follower (the session's lock is held)."""
        if followed.tail is None:
            # First follower: the stream starts at the stored tail.
            followed.tail, _ = await self._read(session_id, _BEYOND)
            return
        while True:
            last, events = await self._read(session_id, followed.tail)
            for event in events:
                for subscription in list(followed.subscribers):
                    self._serve(subscription, session_id, event)
                followed.tail = event.seq
            if not events or followed.tail >= last:
                return

    @staticmethod
    def _serve(subscription: StoreSubscription, session_id: str, event: SessionEvent) -> None:
        data = event_summary(session_id, event) if is_summarised(event) else None
        subscription.serve(session_id, event.seq, data)

    async def _read(self, session_id: str, after_seq: int) -> tuple[int, Sequence[SessionEvent]]:
        self.reads += 1
        return await self._reader(session_id, after_seq)
