"""`PushHub`: the live push stream behind `GET /api/v1/stream` (Server-Sent Events).

Layer: server (an adapter: it turns the runtime's in-process notifications into wire frames and
decides nothing else). The hub listens to five sources of one `Runtime` and gives every frame a
process-wide rising id:

* `session/event` — the store's event feed, streamed chunks skipped; data from
  `dsh.query.summary.event_summary`;
* `session/projection` — the registry's `on_changed`; data exactly `dsh.projection.push_frame`
  (a `null` value stays a present `null`);
* `session/status` — the agent registry: `{sessionId, status}` with `running`, `idle` or `closed`;
* `session/created` — the store's publications: `{session: SessionSummary}` (`summary_json`);
* `subagent/start`, `subagent/end` — the subagent runtime: `{parentSessionId, childSessionId, runId,
  provider}`, the end adding `stopReason` and `hasOutput`;
* `approval/pending`, `approval/settled` — the approval broker: `{sessionId, approval}` for a tool call
  waiting for `decideApproval`, `{sessionId, id, outcome}` once it is settled;
* `reset` — the hub itself, for one client: `{reason}`; the client refetches its state;
* `session/delta` — streamed answer text, coalesced by `dsh.server.deltas.DeltaRelay`: transient
  frames without an id, never buffered or replayed, sent only to the session's followers.

Notifications arrive synchronously inside appends, publications and status changes. The hub never
blocks or raises there: a frame is built, kept in a ring buffer of the last `buffer_size` frames and
appended to the bounded queue of every subscriber whose filter takes it, all without awaiting. A
subscriber that falls `queue_size` frames behind is dropped: its queue is replaced by one `reset`
frame and its stream ends (the client reconnects and refetches). A reconnect with `Last-Event-ID`
is replayed from the ring buffer; an id the buffer can no longer serve gets a `reset` first.

Projection changes are coalesced (docs/projections.md#push-frames): within `coalesce_ms` only the
latest value per session and key is sent, which is safe because clients apply a projection frame
only when its `seq` is higher than the one they hold. The window runs on an injectable
`dsh.timer.Timer`, so tests move it with `dsh.testing.ManualTimer`.

With a PostgreSQL store (`dsh serve` replicas, docs/server.md#replicas) `use_replicas(relay)` switches
the hub to replica mode: `session/event` frames come from `dsh.server.feed.StoreFeed` (committed rows,
ids are store positions), the hub's own frames carry no id and are not buffered, and each frame it
builds is also handed to `relay` for the other replicas. A new frame kind added through `publish`
works in both modes unchanged.

Everything runs on the runtime's event loop; the hub is not thread-safe.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import orjson

from dsh.projection import push_frame
from dsh.query.summary import event_summary, is_summarised
from dsh.server.deltas import DeltaFrame, DeltaRelay
from dsh.server.models import summary_json
from dsh.timer import LoopTimer, Timer, TimerHandle

if TYPE_CHECKING:
    from dsh.agent.approval import ApprovalDecision, ApprovalRequest
    from dsh.json import JsonValue
    from dsh.runtime import Runtime
    from dsh.session.events import SessionEvent
    from dsh.session.header import SessionSeq
    from dsh.session.session import Session

__all__ = [
    "BROADCAST_EVENTS",
    "RESET_LAST_EVENT_ID",
    "RESET_OVERFLOW",
    "Frame",
    "PushHub",
    "Subscription",
]

_log = logging.getLogger("dsh.server.stream")

BROADCAST_EVENTS: Final = frozenset(
    {"session/created", "session/status", "subagent/start", "subagent/end", "approval/pending", "approval/settled"}
)
"""The frames a subscriber without a `sessionId` filter receives."""

RESET_LAST_EVENT_ID: Final = "last-event-id-unavailable"
"""`reset` reason: the `Last-Event-ID` is older than the ring buffer (or not one of this process's ids)."""

RESET_OVERFLOW: Final = "queue-overflow"
"""`reset` reason: the client fell too far behind; its stream ends after this frame."""

_SUBAGENT_FIELDS: Final = ("parentSessionId", "childSessionId", "runId", "provider")


@dataclass(frozen=True, slots=True)
class Frame:
    """One push frame: `id` rises per server process, `event` names the frame, `data` is its JSON object.

    With a replica set (docs/server.md#replicas) the hub's own frames have no id (None: no `id:`
    line) and `session/event` frames carry the stream's store position as a string
    (`dsh.server.feed`); a frame without an `event` is then a bare `id:` line, a position marker.
    """

    id: int | str | None
    event: str
    data: dict[str, Any]
    _wire: bytes = field(init=False, repr=False, compare=False)
    _subjects: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Encoded once, when the frame is built: every subscriber then writes the same bytes, and a
        # payload that is not JSON fails inside the (contained) notification, never in a stream.
        body = orjson.dumps(self.data)
        head = b"" if self.id is None else b"id: %s\n" % str(self.id).encode()
        wire = head + b"\n" if not self.event else head + b"event: %s\ndata: %s\n\n" % (self.event.encode(), body)
        object.__setattr__(self, "_wire", wire)
        object.__setattr__(self, "_subjects", _subjects_of(self.event, self.data))

    def encode(self) -> bytes:
        """The Server-Sent Events form: `id: <n>` (if any), `event: <name>`, `data: <json>` and a blank line."""
        return self._wire

    def subjects(self) -> tuple[str, ...]:
        """The session ids a `sessionId` filter matches this frame by.

        `sessionId`, `parentSessionId` and `childSessionId`; a `session/created` frame is matched by
        the new session's id and its parent.
        """
        return self._subjects


def _subjects_of(event: str, data: Mapping[str, Any]) -> tuple[str, ...]:
    candidates: tuple[object, ...]
    if event == "session/created":
        session = data.get("session")
        if not isinstance(session, Mapping):
            return ()
        candidates = (session.get("id"), session.get("parentSession"))
    else:
        candidates = (data.get("sessionId"), data.get("parentSessionId"), data.get("childSessionId"))
    return tuple(value for value in candidates if isinstance(value, str))


class Subscription:
    """One client's view of the hub: an async iterator of `Frame`s that ends when the stream closes.

    Created by `PushHub.subscribe`. Frames wait in a bounded queue; `close()` ends the stream at once
    (a disconnecting client), while the hub's `aclose()` lets the queued frames drain first.
    """

    def __init__(self, hub: PushHub, session_ids: frozenset[str] | None, queue_size: int) -> None:
        self._hub = hub
        self.session_ids = session_ids
        """The filter: None for the broadcast frames only, else the session ids this client follows."""
        self._queue: deque[Frame | DeltaFrame] = deque()
        self._queue_size = queue_size
        self._wake = asyncio.Event()
        self._ended = False  # no frame is accepted any more; the iterator stops once the queue is empty
        self.overflowed = False
        """True once the client fell `queue_size` frames behind and was sent a `reset`."""

    @property
    def queued(self) -> int:
        """How many frames wait to be read."""
        return len(self._queue)

    @property
    def ended(self) -> bool:
        """True once the stream accepts no more frames (closed, overflowed or the hub closed)."""
        return self._ended

    def wants(self, frame: Frame) -> bool:
        """Whether this client's filter takes `frame`."""
        ids = self.session_ids
        if ids is None:
            return frame.event in BROADCAST_EVENTS
        return any(subject in ids for subject in frame.subjects())

    def offer(self, frame: Frame | DeltaFrame) -> None:
        """Queue `frame` without waiting; on overflow send `reset` and end the stream."""
        if self._ended:
            return
        if len(self._queue) >= self._queue_size:
            self._queue.clear()
            self._queue.append(self._hub.reset_frame(RESET_OVERFLOW))
            self.overflowed = True
            self._end()
            return
        self._queue.append(frame)
        self._wake.set()

    def finish(self) -> None:
        """Accept no more frames; the iterator ends after the queued ones (graceful shutdown)."""
        self._end()

    def close(self) -> None:
        """End the stream now, dropping queued frames (the client went away). Idempotent."""
        self._queue.clear()
        self._end()

    def _end(self) -> None:
        if not self._ended:
            self._ended = True
            self._hub.discard(self)
        self._wake.set()

    def __aiter__(self) -> AsyncIterator[Frame | DeltaFrame]:
        return self

    async def __anext__(self) -> Frame | DeltaFrame:
        while True:
            if self._queue:
                return self._queue.popleft()
            if self._ended:
                raise StopAsyncIteration
            # Cancelling this wait (a ping timeout, a disconnect) loses nothing: a frame leaves the
            # queue only in the line above.
            self._wake.clear()
            await self._wake.wait()

    def __repr__(self) -> str:
        state = "ended" if self._ended else "open"
        return f"Subscription({state}, queued={len(self._queue)}, filter={self.session_ids!r})"


class PushHub:
    """The push stream's frame source for one runtime.

    Args:
        runtime: The running runtime whose notifications are carried (`start` subscribes).
        buffer_size: How many recent frames serve `Last-Event-ID` replays.
        queue_size: How many undelivered frames one client may hold before it gets `reset`.
        coalesce_ms: The window in which projection changes are merged to the latest per session
            and key; 0 sends every change at once.
        timer: Runs the coalescing window (default: the running loop's `call_later`).
        delta_ms: The window in which streamed text of one session is merged into one
            `session/delta` frame (`dsh.server.deltas`); 0 sends every chunk.
    """

    def __init__(
        self,
        runtime: Runtime,
        *,
        buffer_size: int = 1024,
        queue_size: int = 1000,
        coalesce_ms: int = 100,
        timer: Timer | None = None,
        delta_ms: int = 50,
    ) -> None:
        if buffer_size < 1 or queue_size < 1 or coalesce_ms < 0:
            raise ValueError("buffer_size and queue_size must be positive and coalesce_ms non-negative")
        self._runtime = runtime
        self._buffer: deque[Frame] = deque(maxlen=buffer_size)
        self._queue_size = queue_size
        self._coalesce_ms = coalesce_ms
        self._timer: Timer = timer if timer is not None else LoopTimer()
        self._ids = itertools.count(1)
        self._last_id = 0
        # Insertion-ordered sets: every open subscription, and the same ones indexed by what they
        # follow, so a frame reaches its subscribers without asking every client's filter.
        self._subscribers: dict[Subscription, None] = {}
        self._broadcast: dict[Subscription, None] = {}
        self._followers: dict[str, dict[Subscription, None]] = {}
        self._pending: dict[tuple[str, str], dict[str, Any]] = {}
        self._flush_handle: TimerHandle | None = None
        self._unsubscribe: list[Callable[[], None]] = []
        self._started = False
        self._closed = False
        # Replica mode (docs/server.md#replicas): `session/event` frames come from the store feed,
        # the hub's own frames are unnumbered and each is also handed to the relay.
        self._relay: Callable[[str, dict[str, Any]], None] | None = None
        self._numbered = True
        self._deltas = DeltaRelay(runtime.agents, self.publish_transient, window_ms=delta_ms, timer=self._timer)

    # ---------------------------------------------------------------- state

    @property
    def closed(self) -> bool:
        """True once `aclose()` ran."""
        return self._closed

    @property
    def last_id(self) -> int:
        """The id of the newest frame built so far (0 before the first)."""
        return self._last_id

    def subscribers(self) -> tuple[Subscription, ...]:
        """The open subscriptions, oldest first."""
        return tuple(self._subscribers)

    def buffered(self) -> tuple[Frame, ...]:
        """The ring buffer, oldest first."""
        return tuple(self._buffer)

    @property
    def replicated(self) -> bool:
        """True once `use_replicas` ran."""
        return self._relay is not None

    # ---------------------------------------------------------------- lifecycle

    def use_replicas(self, relay: Callable[[str, dict[str, Any]], None]) -> None:
        """Switch to replica mode (call before `start`): `session/event` frames are left to the store
        feed (`dsh.server.feed.StoreFeed`), the hub's frames carry no id and are not kept for
        replays, and every frame built here is also passed to `relay(event, data)` for the other
        replicas (`publish(..., relayed=True)` builds one that came from them)."""
        self._relay = relay
        self._numbered = False

    def start(self) -> None:
        """Subscribe to the runtime's notifications (call once the runtime is open); idempotent."""
        if self._started or self._closed:
            return
        self._started = True
        rt = self._runtime
        self._unsubscribe = [
            rt.sessions.on_event(self._on_event),
            rt.sessions.on_created(self._on_created),
            rt.projections.on_changed(self._on_projection),
            rt.agents.subscribe(self._on_status),
            rt.subagents.on_event(self._on_subagent),
        ]
        if rt.services.approvals is not None:
            self._unsubscribe.append(rt.services.approvals.subscribe(self._on_approval))
        self._deltas.start()
        self._unsubscribe.append(self._deltas.close)

    async def aclose(self) -> None:
        """Stop listening, send the coalesced frames still waiting, and end every stream after its queued frames."""
        if self._closed:
            return
        for unsubscribe in self._unsubscribe:
            try:
                unsubscribe()
            except Exception:
                _log.exception("push stream: unsubscribing from a notification source failed")
        self._unsubscribe = []
        self._flush_pending()
        self._closed = True
        for subscription in list(self._subscribers):
            subscription.finish()

    # ---------------------------------------------------------------- subscribers

    def subscribe(self, session_ids: frozenset[str] | None, last_event_id: int | None) -> Subscription:
        """A new stream: frames after `last_event_id` from the ring buffer, then live frames.

        `last_event_id` None starts with live frames. An id the buffer cannot serve (older than its
        oldest frame, newer than the newest, or negative) queues a `reset` frame first. A hub that is
        closed returns a stream that has already ended.
        """
        subscription = Subscription(self, session_ids, self._queue_size)
        if not self.register(subscription):
            return subscription
        if last_event_id is not None:
            if self._can_replay(last_event_id):
                for frame in self._buffer:
                    if isinstance(frame.id, int) and frame.id > last_event_id and subscription.wants(frame):
                        subscription.offer(frame)
            else:
                subscription.offer(self.reset_frame(RESET_LAST_EVENT_ID))
        return subscription

    def register(self, subscription: Subscription) -> bool:
        """Let `subscription` receive the frames its filter takes from now on; False (and the
        subscription finished) when the hub is closed."""
        if self._closed:
            subscription.finish()
            return False
        self._subscribers[subscription] = None
        if subscription.session_ids is None:
            self._broadcast[subscription] = None
        else:
            for session_id in subscription.session_ids:
                self._followers.setdefault(session_id, {})[subscription] = None
        return True

    def _can_replay(self, last_event_id: int) -> bool:
        # Servable when every id after `last_event_id` is still buffered: the oldest buffered id is
        # at most one past it (or nothing was built since), and it is not from the future.
        oldest = self._buffer[0].id if self._buffer else self._last_id + 1
        return isinstance(oldest, int) and oldest <= last_event_id + 1 <= self._last_id + 1

    def discard(self, subscription: Subscription) -> None:
        """Forget an ended subscription (called by the subscription itself)."""
        if self._subscribers.pop(subscription, False) is False:
            return
        self._broadcast.pop(subscription, None)
        for session_id in subscription.session_ids or ():
            followers = self._followers.get(session_id)
            if followers is not None:
                followers.pop(subscription, None)
                if not followers:
                    del self._followers[session_id]

    def reset_frame(self, reason: str) -> Frame:
        """A `reset` frame for one client; it takes the next id but is never buffered or broadcast."""
        return Frame(self._next_id(), "reset", {"reason": reason})

    # ---------------------------------------------------------------- publishing

    def _next_id(self) -> int | None:
        if not self._numbered:
            return None
        self._last_id = next(self._ids)
        return self._last_id

    def publish(self, event: str, data: dict[str, Any], *, relayed: bool = False) -> Frame | None:
        """Build a frame, buffer it and offer it to every subscriber whose filter takes it.

        `relayed` marks a frame another replica built (it is not relayed again). Never raises: a
        payload that cannot be encoded is logged and dropped (None).
        """
        if self._closed:
            return None
        try:
            frame = Frame(self._next_id(), event, data)
        except Exception:
            _log.exception("push stream: a %s frame could not be encoded and was dropped", event)
            return None
        if self._numbered:
            self._buffer.append(frame)
        if self._relay is not None and not relayed:
            try:
                self._relay(event, data)
            except Exception:
                _log.exception("push stream: a %s frame was not relayed to the other replicas", event)
        self.offer(frame)
        return frame

    def offer(self, frame: Frame) -> None:
        """Offer a built frame to every subscriber whose filter takes it (nothing is buffered)."""
        event = frame.event
        targets: dict[Subscription, None] = dict(self._broadcast) if event in BROADCAST_EVENTS else {}
        for subject in frame.subjects():
            followers = self._followers.get(subject)
            if followers:
                targets.update(followers)
        for subscription in targets:  # a copy: an overflowing subscription leaves the indexes
            subscription.offer(frame)

    def publish_transient(self, frame: DeltaFrame) -> None:
        """Offer a transient frame to the followers of its session: no id, never buffered or broadcast."""
        if self._closed:
            return
        targets: dict[Subscription, None] = {}
        for subject in frame.subjects():
            followers = self._followers.get(subject)
            if followers:
                targets.update(followers)
        for subscription in targets:
            subscription.offer(frame)

    # ---------------------------------------------------------------- notification sources

    def _on_event(self, session: Session, event: SessionEvent) -> None:
        try:
            if is_summarised(event):
                self._deltas.flush(session.id)  # the streamed text of a step goes out before its events
                if self._relay is None:
                    # (replica mode: the store feed builds `session/event` frames from committed rows)
                    self.publish("session/event", event_summary(session.id, event))
        except Exception:
            _log.exception('push stream: session "%s" event %s was not forwarded', session.id, event.seq)

    def _on_projection(self, session: Session, key: str, value: JsonValue, seq: SessionSeq) -> None:
        try:
            data = push_frame(session.id, key, value, seq)
            if self._coalesce_ms == 0:
                self.publish("session/projection", data)
                return
            if self._closed:
                return
            slot = (session.id, key)
            # The latest change wins and moves to the end, so the window sends keys in the order
            # of their newest changes.
            self._pending.pop(slot, None)
            self._pending[slot] = data
            if self._flush_handle is None:
                self._flush_handle = self._timer.call_later(self._coalesce_ms, self._flush_pending)
        except Exception:
            _log.exception('push stream: session "%s" projection "%s" was not forwarded', session.id, key)

    def _flush_pending(self) -> None:
        handle, self._flush_handle = self._flush_handle, None
        if handle is not None:
            handle.cancel()
        pending, self._pending = self._pending, {}
        for data in pending.values():
            self.publish("session/projection", data)

    def _on_status(self, agent: Any, status: str) -> None:
        try:
            self.publish("session/status", {"sessionId": agent.id, "status": status})
        except Exception:
            _log.exception("push stream: a status change was not forwarded")

    def _on_created(self, session: Session) -> None:
        # A raise here would veto the publication: contain everything. The summary is built on the
        # next loop turn, once the caller has registered the session's agent, so its status is the
        # agent's (`idle`) rather than `stored`.
        try:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                self._announce(session)
                return
            loop.call_soon(self._announce, session)
        except Exception:
            _log.exception('push stream: session "%s" creation was not forwarded', session.id)

    def _announce(self, session: Session) -> None:
        try:
            status = self._runtime.agents.status(session.id) or "stored"
            self.publish("session/created", {"session": summary_json(session.header, status)})
        except Exception:
            _log.exception('push stream: session "%s" creation was not forwarded', session.id)

    def _on_approval(self, kind: str, request: ApprovalRequest, decision: ApprovalDecision | None) -> None:
        try:
            if kind == "pending":
                self.publish("approval/pending", {"sessionId": request.session_id, "approval": request.to_json()})
            elif decision is not None:
                data = {"sessionId": request.session_id, "id": request.id, "outcome": decision.outcome}
                self.publish("approval/settled", data)
        except Exception:
            _log.exception("push stream: an approval notification was not forwarded")

    def _on_subagent(self, notification: Mapping[str, Any]) -> None:
        try:
            kind = notification.get("type")
            if kind not in ("subagent/start", "subagent/end"):
                return
            data = {name: notification.get(name) for name in _SUBAGENT_FIELDS}
            if kind == "subagent/end":
                data["stopReason"] = notification.get("stopReason")
                data["hasOutput"] = bool(notification.get("hasOutput"))
            self.publish(kind, data)
        except Exception:
            _log.exception("push stream: a subagent notification was not forwarded")
