"""`ReplicaSet`: several `dsh serve` processes on one PostgreSQL store serve every session together.

Layer: server (docs/server.md#replicas). Created by `serve()` when the store is PostgreSQL. One
replica set per process:

* **Events.** It switches the push hub to replica mode and owns its `StoreFeed`: `session/event`
  frames come from committed rows, numbered by stored seqs, woken by the commit notices every append
  sends. The hub's own frames (status, projections, approvals, creations, subagents; any frame
  built by `PushHub.publish`) are relayed to the other replicas as notices `{"k": "f", "o": <sender>,
  "e": <event>, "d": <data>}` (one sender task keeps their order; a frame over the notice size limit
  is not relayed). When the listening connection broke and came back, every followed session is
  read again and every waiting request re-checked: nothing is skipped or repeated.
* **Work for a session another replica holds** (a prompt, an interrupt, an approval decision) becomes
  a `session_requests` row; the holder is woken by its notice, claims it, does it and answers, and
  the replica that received it answers its client. A prompt for a session nobody holds is taken by
  the receiving replica (it resumes the session). A holder that died is replaced: a pending request
  tries to take the session over on every poll, which succeeds at once for a dead process of this
  machine and after the lease expired otherwise; the new holder's resume closes the dead holder's
  open turn by the crash rules, then it adopts the dead holder's unfinished requests (a prompt
  whose turn never started is queued again under the message id its client was given).
* **Idle release.** A session whose agent stayed idle for `idle_release_s` is closed here, which
  releases its lease, so the next prompt may land on any replica.
* **The sweep** (every `sweep_s`) releases idle sessions and looks for requests nobody works on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import orjson

from dsh.agent.errors import ApprovalError
from dsh.errors import DshError
from dsh.persistence.errors import LeaseHeldError
from dsh.server.errors import WireError
from dsh.server.feed import StoreFeed, StoreSubscription
from dsh.server.routes.deps import ResumeLocks
from dsh.server.stream import PushHub

if TYPE_CHECKING:
    from dsh.agent.loop import Agent
    from dsh.persistence.postgres import Listener, PostgresBackend, RequestRow
    from dsh.runtime import Runtime

__all__ = ["ReplicaSet", "ReplicaSettings", "readiness"]

_log = logging.getLogger("dsh.server.replicas")

_RELAY_QUEUE: Final = 10_000
_READY_TIMEOUT_S: Final = 5.0


async def readiness(runtime: Runtime, replicas: ReplicaSet | None) -> dict[str, str]:
    """The readiness checks of `GET /api/v1/ready`: `{"store": "ok" | "unavailable", "notices"?: ...}`.

    The store answers a round trip (PostgreSQL: `SELECT 1` on a pooled connection; other stores: a
    lookup) within 5 s; with replicas, the notice connection listens.
    """
    checks: dict[str, str] = {}
    backend = runtime.persistence.backend
    try:
        ping = getattr(backend, "ping", None)
        async with asyncio.timeout(_READY_TIMEOUT_S):
            if ping is not None:
                await ping()
            else:
                await backend.exists("dsh-ready-probe")
        checks["store"] = "ok"
    except Exception as error:
        _log.warning("readiness: the store does not answer: %s", error)
        checks["store"] = "unavailable"
    if replicas is not None:
        checks["notices"] = "ok" if replicas.listening else "unavailable"
    return checks


@dataclass(frozen=True, slots=True)
class ReplicaSettings:
    """How a replica set behaves (docs/server.md#replicas).

    Attributes:
        idle_release_s: Close a session's agent (releasing its lease) after this long idle; 0 never.
        sweep_s: The period of the sweep (idle release, stranded requests).
        prompt_timeout_s: How long a forwarded prompt waits to be accepted before 409 `agent-busy`.
        reply_timeout_s: How long a forwarded interrupt or approval decision waits for its answer.
        poll_s: How often a waiting request re-reads its row (and tries to take a holderless session).
    """

    idle_release_s: float = 300.0
    sweep_s: float = 1.0
    prompt_timeout_s: float = 60.0
    reply_timeout_s: float = 3.0
    poll_s: float = 0.5

    def __post_init__(self) -> None:
        if self.idle_release_s < 0 or min(self.sweep_s, self.prompt_timeout_s, self.reply_timeout_s, self.poll_s) <= 0:
            raise ValueError("replica settings must be positive (idle_release_s may be 0: never)")


class ReplicaSet:
    """This process's part in a set of `dsh serve` replicas on one PostgreSQL store.

    Args:
        runtime: The open runtime (its store is `backend`).
        hub: The push hub; `start()` switches it to replica mode.
        backend: The runtime's PostgreSQL backend.
        locks: The application's resume locks (one resume per session at a time).
        settings: Timings.
    """

    def __init__(
        self,
        runtime: Runtime,
        hub: PushHub,
        backend: PostgresBackend,
        locks: ResumeLocks,
        settings: ReplicaSettings | None = None,
    ) -> None:
        self._runtime = runtime
        self._hub = hub
        self._backend = backend
        self._locks = locks
        self.settings = settings if settings is not None else ReplicaSettings()
        self.id = backend.holder
        """This replica's name: its backend's lease holder name."""
        self.feed = StoreFeed(backend.events_after, hub)
        self._listener: Listener | None = None
        self._relay_queue: asyncio.Queue[str] = asyncio.Queue(_RELAY_QUEUE)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._background: list[asyncio.Task[None]] = []
        self._waiters: dict[int, asyncio.Event] = {}
        self._drains: dict[str, asyncio.Lock] = {}
        self._idle_since: dict[str, float] = {}
        self._unsubscribe: list[Any] = []
        self._closed = False

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Switch the hub to replica mode, listen for notices, start the relay and the sweep.

        Raises:
            PersistenceIOError: The listening connection could not be opened.
        """
        self._hub.use_replicas(self._relay)
        self._listener = await self._backend.listen(self._on_message, self._on_gap)
        loop = asyncio.get_running_loop()
        self._background = [
            loop.create_task(self._send_relayed(), name="dsh-replica-relay"),
            loop.create_task(self._sweep_forever(), name="dsh-replica-sweep"),
        ]
        self._unsubscribe.append(self._runtime.agents.subscribe(self._on_status))

    async def aclose(self) -> None:
        """Stop listening, relaying and sweeping (the runtime is closed by its owner); idempotent."""
        if self._closed:
            return
        self._closed = True
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        for task in (*self._background, *self._tasks):
            task.cancel()
        for task in (*self._background, *self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._listener is not None:
            await self._listener.aclose()

    @property
    def listening(self) -> bool:
        """Whether the notice connection listens now (the readiness check asks)."""
        return self._listener is not None and self._listener.connected

    @property
    def listener(self) -> Listener | None:
        """The listening connection (tests terminate it)."""
        return self._listener

    async def subscribe(self, session_ids: frozenset[str] | None, last_event_id: str | None) -> StoreSubscription:
        """A push stream of this replica (see `StoreFeed.subscribe`)."""
        return await self.feed.subscribe(session_ids, last_event_id)

    def _spawn(self, coro: Any, name: str) -> None:
        if self._closed:
            coro.close()
            return
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            _log.error("replicas: %s failed: %r", task.get_name(), task.exception())

    # ---------------------------------------------------------------- notices

    def _on_message(self, payload: str) -> None:
        try:
            message = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return  # not one of ours
        if not isinstance(message, dict):
            return
        kind, session_id = message.get("k"), message.get("s")
        if kind == "e" and isinstance(session_id, str) and isinstance(message.get("q"), int):
            self.feed.notice(session_id, message["q"])
        elif kind == "f" and message.get("o") != self.id:
            event, data = message.get("e"), message.get("d")
            if isinstance(event, str) and isinstance(data, dict):
                self._hub.publish(event, data, relayed=True)
        elif kind == "r" and isinstance(message.get("r"), int):
            if session_id is None:
                self._spawn(self._approval_notice(message["r"]), "dsh-replica-approval")
            elif isinstance(session_id, str) and self._runtime.agents.get(session_id) is not None:
                self._spawn(self.drain(session_id), "dsh-replica-drain")
        elif kind == "a" and isinstance(message.get("r"), int):
            waiter = self._waiters.get(message["r"])
            if waiter is not None:
                waiter.set()

    def _on_gap(self) -> None:
        # Notices sent while nobody listened are lost: read the store again.
        self.feed.refresh_all()
        for waiter in self._waiters.values():
            waiter.set()
        for agent in self._runtime.agents.list():
            self._spawn(self.drain(agent.id), "dsh-replica-drain")

    # ---------------------------------------------------------------- relay

    def _relay(self, event: str, data: dict[str, Any]) -> None:
        payload = orjson.dumps({"k": "f", "o": self.id, "e": event, "d": data}).decode()
        try:
            self._relay_queue.put_nowait(payload)
        except asyncio.QueueFull:
            _log.warning("replicas: the relay queue is full; a %s frame was not relayed", event)

    async def _send_relayed(self) -> None:
        while True:
            payload = await self._relay_queue.get()
            try:
                if not await self._backend.notify(payload):
                    _log.debug("replicas: a frame over the notice size limit was not relayed")
            except Exception as error:
                _log.warning("replicas: a frame was not relayed: %s", error)

    # ---------------------------------------------------------------- the holder's side

    async def drain(self, session_id: str, *, adopt: bool = False) -> None:
        """Do the session's pending requests in order, if this replica holds the session; with `adopt`
        (after taking the session) first the ones a previous holder accepted and left unfinished."""
        lock = self._drains.setdefault(session_id, asyncio.Lock())
        async with lock:
            agent = self._runtime.agents.get(session_id)
            if agent is None:
                return
            backend = self._backend
            for orphan in await backend.orphan_requests(session_id) if adopt else ():
                if await backend.adopt_request(orphan):
                    await self._redeliver(agent, orphan)
            while (row := await backend.claim_next_request(session_id)) is not None:
                await self._perform(agent, row)
        if not lock.locked():
            self._drains.pop(session_id, None)

    async def _perform(self, agent: Agent, row: RequestRow) -> None:
        if row.kind == "interrupt":
            agent.cancel("user", keep_inbox=True)
            await self._backend.answer_request(row.id, {"accepted": True}, done=True)
            return
        if row.kind != "prompt":
            await self._backend.answer_request(row.id, {"error": "unsupported"}, done=True)
            return
        await self._send(agent, row, None)

    async def _send(self, agent: Agent, row: RequestRow, message_id: str | None) -> None:
        body = row.body
        try:
            source = body.get("source")
            sent = await agent.send(
                body["content"], source if isinstance(source, Mapping) else None, message_id=message_id
            )
        except Exception as error:
            _log.warning('replicas: request %d for session "%s" failed: %s', row.id, agent.id, error)
            await self._backend.answer_request(row.id, {"error": "agent-busy"}, done=True)
            return
        if message_id is None:
            await self._backend.answer_request(row.id, {"messageId": sent}, done=False)
        result = agent.turn_result(sent)
        request_id = row.id

        def finished(_: asyncio.Future[Any]) -> None:
            self._spawn(self._backend.finish_request(request_id), "dsh-replica-finish")

        result.add_done_callback(finished)

    async def _redeliver(self, agent: Agent, row: RequestRow) -> None:
        """An unfinished request another replica accepted before it lost the session."""
        if row.kind != "prompt":
            # An interrupt: the lost holder's turn was closed by the crash rules when this one resumed.
            await self._backend.answer_request(row.id, {"accepted": True}, done=True)
            return
        answer = row.answer or {}
        message_id = answer.get("messageId")
        if not isinstance(message_id, str):
            await self._send(agent, row, None)  # accepted but never answered: do it as new
            return
        if message_id in _logged_messages(agent):
            await self._backend.finish_request(row.id)  # its turn started (and was closed as aborted)
            return
        await self._send(agent, row, message_id)

    async def _approval_notice(self, request_id: int) -> None:
        broker = self._runtime.services.approvals
        if broker is None:
            return
        row = await self._backend.get_request(request_id)
        if row is None or row.kind != "approval" or row.state != "pending":
            return
        approval_id, decision = row.body.get("id"), row.body.get("decision")
        if not any(request.id == approval_id for request in broker.pending()):
            return
        if await self._backend.claim_request(request_id) is None:
            return
        try:
            request = broker.decide(str(approval_id), decision)  # type: ignore[arg-type]
            answer: dict[str, Any] = {"id": request.id, "sessionId": request.session_id, "decision": decision}
        except ApprovalError:
            answer = {"notFound": True}
        await self._backend.answer_request(request_id, answer, done=True)

    # ---------------------------------------------------------------- the receiver's side

    async def take(self, session_id: str) -> bool:
        """Become the session's holder (resume it here) unless another live replica holds it."""
        rt = self._runtime
        async with self._locks.hold(session_id):
            if rt.agents.get(session_id) is None:
                try:
                    await rt.resume_agent(session_id)
                except LeaseHeldError:
                    return False
                except DshError as error:
                    if error.code != "SESSION_NOT_FOUND":  # not stored yet: its creator holds it
                        _log.warning('replicas: session "%s" could not be taken over: %s', session_id, error)
                    return False
        self.taken(session_id)
        return True

    def taken(self, session_id: str) -> None:
        """This replica now holds the session: do the requests waiting for it and the ones left unfinished."""
        self._spawn(self.drain(session_id, adopt=True), "dsh-replica-drain")

    async def prompt(self, session_id: str, content: list[dict[str, Any]], source: dict[str, Any]) -> str:
        """Have the holder queue a prompt; returns the message id it was given.

        Raises:
            WireError: `agent-busy` when no replica accepted it in `prompt_timeout_s`.
        """
        body = {"content": content, "source": source}
        answer = await self._forward(session_id, "prompt", body, self.settings.prompt_timeout_s, take_over=True)
        message_id = None if answer is None else answer.get("messageId")
        if not isinstance(message_id, str):
            raise WireError(
                "agent-busy",
                f'session "{session_id}" is busy',
                {"reason": "the replica holding this session did not accept the prompt"},
            )
        return message_id

    async def held_elsewhere(self, session_id: str) -> bool:
        """Whether another replica holds the session's lease now."""
        holder = await self._backend.lease_holder(session_id)
        return holder is not None and holder != self.id

    async def interrupt(self, session_id: str) -> None:
        """Have the holder cancel its running turn (nothing to do when nobody alive holds the session)."""
        holder = await self._backend.lease_holder(session_id)
        if holder is None or holder == self.id or self._backend.holder_gone(holder):
            return  # no live turn anywhere; a dead holder's turn is closed when the session is resumed
        await self._forward(session_id, "interrupt", {}, self.settings.reply_timeout_s, take_over=False)

    async def decide(self, approval_id: str, decision: str) -> dict[str, Any] | None:
        """Have the replica where the approval waits decide it; None when none has it pending."""
        body = {"id": approval_id, "decision": decision}
        answer = await self._forward(None, "approval", body, self.settings.reply_timeout_s, take_over=False)
        if answer is None or answer.get("notFound"):
            return None
        return answer

    async def _forward(
        self, session_id: str | None, kind: str, body: dict[str, Any], timeout_s: float, *, take_over: bool
    ) -> dict[str, Any] | None:
        backend, loop = self._backend, asyncio.get_running_loop()
        request_id = await backend.submit_request(session_id, kind, body)
        waiter = self._waiters[request_id] = asyncio.Event()
        deadline = loop.time() + timeout_s
        # The route has just found the holder alive; try to take the session only once a poll went by.
        take_from = loop.time() + self.settings.poll_s
        try:
            while True:
                row = await backend.get_request(request_id)
                if row is None:
                    return None
                if row.answer is not None:
                    return None if row.answer.get("withdrawn") else row.answer
                if row.state == "pending" and session_id is not None:
                    if self._runtime.agents.get(session_id) is not None:
                        await self.drain(session_id)  # this replica holds it now
                        continue
                    if take_over and loop.time() >= take_from and await self.take(session_id):
                        await self.drain(session_id, adopt=True)
                        continue
                remaining = deadline - loop.time()
                if remaining <= 0:
                    if await backend.withdraw_request(request_id):
                        return None
                    deadline = loop.time() + timeout_s  # accepted meanwhile: its answer is coming
                    continue
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(waiter.wait(), min(self.settings.poll_s, remaining))
                waiter.clear()
        finally:
            self._waiters.pop(request_id, None)

    # ---------------------------------------------------------------- the sweep

    def _on_status(self, agent: Any, status: str) -> None:
        if status == "idle":
            self._idle_since[agent.id] = time.monotonic()
        else:
            self._idle_since.pop(agent.id, None)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.sweep_s)
            try:
                await self.sweep()
            except Exception as error:
                _log.warning("replicas: the sweep failed: %s", error)

    async def sweep(self) -> None:
        """Release idle sessions; take up requests nobody works on."""
        if self.settings.idle_release_s > 0:
            await self._release_idle()
        backend = self._backend
        for session_id, holder, expired in await backend.stranded_requests(self.settings.poll_s):
            if self._runtime.agents.get(session_id) is not None:
                self._spawn(self.drain(session_id, adopt=True), "dsh-replica-drain")
            elif holder is None or expired or backend.holder_gone(holder):
                self._spawn(self.take(session_id), "dsh-replica-take")

    async def _release_idle(self) -> None:
        rt, now = self._runtime, time.monotonic()
        parents = {session.header.parent_session for session in rt.sessions.list()}
        for agent in rt.agents.list():
            if agent.session.header.origin == "subagent" or agent.busy or agent.status != "idle":
                continue
            since = self._idle_since.setdefault(agent.id, now)
            if now - since < self.settings.idle_release_s or agent.id in parents:
                continue
            self._idle_since.pop(agent.id, None)
            _log.info('replicas: session "%s" was idle for %.0f s; releasing it', agent.id, now - since)
            await agent.aclose(dispose_session=True)


def _logged_messages(agent: Agent) -> set[str]:
    """The ids of the user messages the agent's log holds."""
    found: set[str] = set()
    for event in agent.session.events:
        if event.type == "user/message" and isinstance(event.data, Mapping):
            message_id = event.data.get("id")
            if isinstance(message_id, str):
                found.add(message_id)
    return found
