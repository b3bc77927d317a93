"""`DeltaRelay`: an answer's text as it streams, as coalesced `session/delta` push frames.

Layer: server (an adapter). The model's streamed chunks reach in-process listeners whether or not
they are logged (`agent.log_chunks` is off by default), so the relay listens to every live agent
(`Agent.on_chunk`, attached when an agent starts running, detached when it leaves) rather than to
the log. Text and reasoning deltas are merged per session for `window_ms` and sent as one frame:

    event: session/delta
    data: {"sessionId", "turn", "step", "kind": "text" | "reasoning", "offset", "text"}

`offset` is where `text` starts within that step's text (or reasoning) so far, so a client can tell
that it missed a piece (after a reconnect) and wait for the complete message instead.

A delta frame is **transient**: it has no `id`, it is not kept in the replay buffer and it is only
sent to clients following the session (never to the broadcast stream). The complete message
follows as the ordinary `assistant/message` event, and the relay sends what it holds for a session
before that: at the step's `finish` chunk (the stream's last), when the agent's status changes, and
when the window ends — so a client always sees the deltas of a step before its message.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import orjson

from dsh.agent.model import BlockEnd, Finish, ReasoningDelta, TextDelta
from dsh.timer import LoopTimer, Timer, TimerHandle

if TYPE_CHECKING:
    from dsh.agent.model import ModelChunk
    from dsh.agent.registry import AgentRegistry

__all__ = ["DELTA_EVENT", "DeltaFrame", "DeltaRelay"]

_log = logging.getLogger("dsh.server.stream")

DELTA_EVENT: Final = "session/delta"
"""The event name of a delta frame."""


@dataclass(frozen=True, slots=True)
class DeltaFrame:
    """A transient push frame: no id, never buffered, never replayed."""

    event: str
    data: dict[str, Any]
    _wire: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        body = orjson.dumps(self.data)
        object.__setattr__(self, "_wire", b"event: %s\ndata: %s\n\n" % (self.event.encode(), body))

    @property
    def id(self) -> None:
        """Always None: a transient frame moves no client's `Last-Event-ID`."""
        return None

    def encode(self) -> bytes:
        """The Server-Sent Events form: `event: <name>`, `data: <json>` and a blank line (no `id:`)."""
        return self._wire

    def subjects(self) -> tuple[str, ...]:
        """The session the frame is about (a `sessionId` filter matches it by this id)."""
        session_id = self.data.get("sessionId")
        return (session_id,) if isinstance(session_id, str) else ()


@dataclass(slots=True)
class _Pending:
    turn: int
    step: int
    kind: str
    offset: int
    parts: list[str]


class DeltaRelay:
    """Turns the streamed chunks of every live agent into coalesced `DeltaFrame`s.

    Args:
        agents: The runtime's agent registry (status changes attach and detach the listeners).
        send: Called with each frame (the hub offers it to the session's followers).
        window_ms: How long deltas of one session are merged before they are sent; 0 sends each chunk.
        timer: Runs the window (default: the running loop's `call_later`).
    """

    def __init__(
        self,
        agents: AgentRegistry[Any],
        send: Callable[[DeltaFrame], None],
        *,
        window_ms: int = 50,
        timer: Timer | None = None,
    ) -> None:
        if window_ms < 0:
            raise ValueError("window_ms must be non-negative")
        self._agents = agents
        self._send = send
        self._window_ms = window_ms
        self._timer: Timer = timer if timer is not None else LoopTimer()
        self._attached: dict[str, tuple[Any, Callable[[], None]]] = {}
        self._pending: dict[str, _Pending] = {}
        # Characters sent so far per (session, turn, step, kind): the next delta's `offset`.
        self._sent: dict[tuple[str, int, int, str], int] = {}
        self._handle: TimerHandle | None = None
        self._unsubscribe: Callable[[], None] | None = None

    def start(self) -> None:
        """Follow the registry: agents running now and every agent that starts running later."""
        if self._unsubscribe is not None:
            return
        self._unsubscribe = self._agents.subscribe(self._on_status)
        for agent in self._agents.list():
            self._attach(agent)

    def close(self) -> None:
        """Send what is held and stop listening to every agent."""
        self.flush()
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        for _agent, detach in self._attached.values():
            detach()
        self._attached.clear()
        self._sent.clear()

    def flush(self, session_id: str | None = None) -> None:
        """Send the held text of `session_id` (every session when None)."""
        if session_id is None:
            if self._handle is not None:
                self._handle.cancel()
                self._handle = None
            pending, self._pending = self._pending, {}
            for held_id, held in pending.items():
                self._emit(held_id, held)
            return
        one = self._pending.pop(session_id, None)
        if one is not None:
            self._emit(session_id, one)

    # ---------------------------------------------------------------- listeners

    def _on_status(self, agent: Any, status: str) -> None:
        try:
            self.flush(agent.id)
            if status == "closed":
                entry = self._attached.get(agent.id)
                if entry is not None and entry[0] is agent:
                    del self._attached[agent.id]
                    entry[1]()
                self._forget(agent.id)
            else:
                self._attach(agent)
        except Exception:
            _log.exception("push stream: a delta listener could not follow an agent")

    def _attach(self, agent: Any) -> None:
        entry = self._attached.get(agent.id)
        if entry is not None and entry[0] is agent:
            return
        if entry is not None:
            entry[1]()  # another agent object took the id: follow the new one
        self._attached[agent.id] = (agent, agent.on_chunk(self._on_chunk))

    def _on_chunk(self, agent: Any, turn: int, step: int, chunk: ModelChunk) -> None:
        try:
            session_id: str = agent.id
            if isinstance(chunk, TextDelta | ReasoningDelta):
                if not chunk.text:
                    return
                kind = "text" if isinstance(chunk, TextDelta) else "reasoning"
                held = self._pending.get(session_id)
                if held is not None and (held.turn, held.step, held.kind) != (turn, step, kind):
                    self.flush(session_id)
                    held = None
                if held is None:
                    key = (session_id, turn, step, kind)
                    if key not in self._sent:
                        self._forget(session_id)  # a new step: earlier steps' counts are done
                    offset = self._sent.get(key, 0)
                    held = self._pending[session_id] = _Pending(turn, step, kind, offset, [])
                held.parts.append(chunk.text)
                if self._window_ms == 0:
                    self.flush(session_id)
                elif self._handle is None:
                    self._handle = self._timer.call_later(self._window_ms, self._on_window)
            elif isinstance(chunk, Finish | BlockEnd):
                # The message follows the stream's end: whatever is held goes out before it.
                self.flush(session_id)
        except Exception:
            _log.exception("push stream: a streamed chunk was not forwarded")

    def _on_window(self) -> None:
        self._handle = None
        self.flush()

    # ---------------------------------------------------------------- frames

    def _emit(self, session_id: str, held: _Pending) -> None:
        text = "".join(held.parts)
        key = (session_id, held.turn, held.step, held.kind)
        self._sent[key] = held.offset + len(text)
        data = {
            "sessionId": session_id,
            "turn": held.turn,
            "step": held.step,
            "kind": held.kind,
            "offset": held.offset,
            "text": text,
        }
        try:
            self._send(DeltaFrame(DELTA_EVENT, data))
        except Exception:
            _log.exception('push stream: session "%s" delta was not forwarded', session_id)

    def _forget(self, session_id: str) -> None:
        for key in [key for key in self._sent if key[0] == session_id]:
            del self._sent[key]
