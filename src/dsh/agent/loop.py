"""`Agent`: one live session driven by a model, its tools and a FIFO inbox (the turn/step loop).

Layer: agent. An agent owns one live `Session`. Messages sent to it wait in its inbox; a worker task
claims them one per turn, FIFO, so a follow-up sent during a running turn becomes the next turn and
never redirects the current one (docs/agent.md#inbox). A turn is a sequence of steps; a step is one
model request plus the dispatch of every tool call it returned. Each turn writes exactly the events
of docs/agent.md#turn-events, in order, and flushes at three points: before every model request,
before every tool body, and after `turn/end` (docs/agent.md#flush-points). `cancel()` aborts the
turn's signal and returns at once; the turn then closes itself with `turn/end {kind: "aborted"}`
(docs/agent.md#cancellation).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import orjson

from dsh.abort import AbortController, AbortSignal
from dsh.agent import _gate
from dsh.agent import titles as _titles
from dsh.agent._context import HeaderLog, KnobLog, context_message, granted_rules, header_of
from dsh.agent._loop_helpers import highest_turn_number, message_of, validation_summary
from dsh.agent._retry import StepRetries
from dsh.agent.assembler import MessageAssembler, ToolCall
from dsh.agent.compaction import AgentCompactor, CompactionResult, CompactionSettings
from dsh.agent.errors import AgentError, ModelError
from dsh.agent.ids import IdFactory
from dsh.agent.messages import Source, UserSource, source_json, text, text_of_blocks
from dsh.agent.model import ModelChunk, ModelClient, ModelRequest, RequestMeta, Usage, chunk_to_json
from dsh.agent.options import (
    AgentOptions,
    CancelCause,
    Delivery,
    InboxItem,
    TurnResult,
)
from dsh.agent.registry import AgentStatus, StatusListener
from dsh.agent.tools import Tool, ToolContext, ToolRegistry
from dsh.json import is_json
from dsh.session.events import SessionEvent
from dsh.session.session import Session
from dsh.session.store import SessionStore

if TYPE_CHECKING:
    from dsh.agent.approval import ApprovalRule
    from dsh.services import Services

__all__ = [
    "Agent",
    "AgentOptions",
    "CancelCause",
    "ChunkListener",
    "CompletionGuard",
    "InboxItem",
    "PreStepHook",
    "TurnResult",
]

_log = logging.getLogger("dsh.agent")

PreStepHook = Callable[["Agent", int, int], Awaitable[None] | None]
"""Called with `(agent, turn, step)` after `turn/start` and before every `step/start`."""

ChunkListener = Callable[["Agent", int, int, ModelChunk], None]
"""Called with `(agent, turn, step, chunk)` for every streamed chunk, logged or not."""

CompletionGuard = Callable[["Agent", int], "Mapping[str, Any] | str | None"]
"""Called with `(agent, turn)` when a turn would complete (an answer without tool calls): None lets it
complete, a string is a reminder the model gets as the next step's user message, and a mapping is the
`turn/end` error object the turn ends with instead (docs/agent.md#completion-guards)."""

_REMINDER_SOURCE: Final = {"kind": "plugin", "plugin": "pydsh/completion-guard", "form": "reminder"}

_CANCELLED_TEXT: Final = "Error: tool call was cancelled"
_NOT_RUN_TEXT: Final = "Error: not run: the turn was cancelled"
_CONCLUDED_TEXT: Final = "Error: not run: an earlier call of this step concluded the turn"


@dataclass(slots=True)
class _Turn:
    """The state of the running turn that `cancel()` and the dispatcher share."""

    number: int
    controller: AbortController = field(default_factory=AbortController)
    cause: CancelCause | None = None
    conclusion: dict[str, Any] | None = None  # set by `Agent.conclude_turn`: the turn ends after this step

    @property
    def signal(self) -> AbortSignal:
        return self.controller.signal

    def cancelled(self) -> bool:
        # A method, not a property: the answer flips across any await, and type checkers would
        # otherwise narrow a property read to a constant between two awaits.
        return self.cause is not None

    def cancel(self, cause: CancelCause) -> None:
        if self.cause is None:
            self.cause = cause
            self.controller.abort(AgentCancelled(cause))


class AgentCancelled(Exception):  # noqa: N818 - a signal reason, not an error raised to callers
    """The reason a turn's signal carries when the turn was cancelled."""

    def __init__(self, cause: CancelCause) -> None:
        super().__init__(f"the turn was cancelled ({cause})")
        self.cause = cause


class _FlushFailed(Exception):  # noqa: N818 - internal control flow
    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass(slots=True)
class _StepOutcome:
    """What a finished turn reports."""

    reason: dict[str, Any]
    output: str = ""
    usage: Usage | None = None


class Agent:
    """A live agent: its session, model client, tools, options and inbox. Start it with `start()`."""

    def __init__(
        self,
        session: Session,
        *,
        model: ModelClient,
        tools: ToolRegistry,
        sessions: SessionStore,
        services: Services,
        ids: IdFactory,
        options: AgentOptions,
    ) -> None:
        self._session = session
        self._model = model
        self._tools = tools
        self._sessions = sessions
        self._services = services
        self._ids = ids
        self._options = options
        self._inbox: deque[InboxItem] = deque()
        self._parked = False
        self._closing = False
        self._closed = False
        self._status: AgentStatus = "idle"
        self._turn: _Turn | None = None
        self._worker: asyncio.Task[None] | None = None
        self._work = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._listeners: list[StatusListener] = []
        self._hooks: list[PreStepHook] = []
        self._chunk_listeners: list[ChunkListener] = []
        self._guards: list[CompletionGuard] = []
        self._results: dict[str, asyncio.Future[TurnResult]] = {}
        self._last_turn: int | None = None  # the highest turn number in the log, scanned once
        self._headers = HeaderLog()
        self._knobs = KnobLog()
        self._granted: list[ApprovalRule] | None = None  # the session's "always" grants, folded once
        self._compactor = AgentCompactor(
            options.compaction or CompactionSettings(auto=False),
            session,
            ids,
            lambda: (self._model, self._options.model, self._options.system_prompt),
        )
        # Turns and manual compactions take turns: a compaction never runs inside someone else's turn.
        self._exclusive = asyncio.Lock()
        self._titles = _titles.TitleWriter(session, ids, lambda: (self._model, self._options.model))
        self.last_error: BaseException | None = None
        """The last flush failure (or unexpected turn failure), for callers that must know."""

    # ---------------------------------------------------------------- read surface

    @property
    def id(self) -> str:
        """The agent id (its session id)."""
        return self._session.id

    @property
    def session(self) -> Session:
        """The live session the agent writes."""
        return self._session

    @property
    def status(self) -> AgentStatus:
        """`running` from the claim of an inbox item to the flush after `turn/end`; `idle` otherwise."""
        return self._status

    @property
    def options(self) -> AgentOptions:
        """How the agent talks to its model."""
        return self._options

    @property
    def tools(self) -> ToolRegistry:
        """The tools the agent offers its model."""
        return self._tools

    @property
    def model_client(self) -> ModelClient:
        """The model client the agent streams from."""
        return self._model

    @property
    def closing(self) -> bool:
        """True once `aclose()` started: the agent accepts no more messages."""
        return self._closing

    @property
    def pending(self) -> int:
        """Inbox items not claimed yet (parked ones included)."""
        return len(self._inbox)

    @property
    def parked(self) -> bool:
        """True when a cancelled turn parked the inbox: no turn starts until the next `send()`."""
        return self._parked

    @property
    def busy(self) -> bool:
        """True while a turn runs or an unparked item waits."""
        return self._status == "running" or (bool(self._inbox) and not self._parked)

    def __repr__(self) -> str:
        return f"Agent(id={self.id!r}, status={self._status!r}, pending={len(self._inbox)})"

    def update_options(self, **changes: Any) -> AgentOptions:
        """Replace some options (e.g. `model=`); the next request uses them. Returns the new options."""
        self._options = dataclasses.replace(self._options, **changes)
        return self._options

    # ---------------------------------------------------------------- subscriptions

    def on_status(self, listener: StatusListener) -> Callable[[], None]:
        """Call `listener(agent, status)` on every status change; returns an idempotent unsubscribe."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    def on_chunk(self, listener: ChunkListener) -> Callable[[], None]:
        """Call `listener(agent, turn, step, chunk)` for every streamed chunk; returns an unsubscribe.

        Chunks reach listeners whether or not they are logged (`log_chunks`); a raising listener
        is logged and never disturbs the turn.
        """
        self._chunk_listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._chunk_listeners:
                self._chunk_listeners.remove(listener)

        return unsubscribe

    def add_pre_step_hook(self, hook: PreStepHook) -> Callable[[], None]:
        """Run `hook(agent, turn, step)` after `turn/start` and before every `step/start`; returns a remover."""
        self._hooks.append(hook)

        def remove() -> None:
            if hook in self._hooks:
                self._hooks.remove(hook)

        return remove

    def add_completion_guard(self, guard: CompletionGuard) -> Callable[[], None]:
        """Check every turn that would complete with `guard` (see `CompletionGuard`); returns a remover."""
        self._guards.append(guard)

        def remove() -> None:
            if guard in self._guards:
                self._guards.remove(guard)

        return remove

    def conclude_turn(self, reason: Mapping[str, Any] | None = None) -> bool:
        """End the running turn once the current step's tool calls are answered; True when a turn runs.

        Called by a tool body (the `structured_output` tool): the turn makes no further model request
        and ends with `reason` (default `{kind: "completed"}`); the step's later calls are not run.
        """
        turn = self._turn
        if turn is None:
            return False
        if turn.conclusion is None:
            turn.conclusion = dict(reason) if reason is not None else {"kind": "completed"}
        return True

    # ---------------------------------------------------------------- inbox

    def start(self) -> None:
        """Start the worker that claims inbox items (idempotent; needs a running loop)."""
        if self._worker is None and not self._closed:
            self._worker = asyncio.get_running_loop().create_task(self._work_loop(), name=f"dsh-agent-{self.id}")

    async def send(
        self,
        content: Sequence[Mapping[str, Any]] | str,
        source: Source | None = None,
        delivery: Delivery = "next-turn",
        *,
        message_id: str | None = None,
    ) -> str:
        """Queue a message; returns its id at acceptance, before its turn starts.

        A parked inbox (after a cancelled turn) wakes: the parked items run first, in FIFO order.
        `message_id` keeps an id given earlier (a request another replica accepted and then lost,
        docs/server.md#replicas); by default a new one is made.

        Raises:
            AgentError: `AGENT_CLOSING` when the agent is closing.
        """
        if self._closing:
            raise AgentError(f'agent "{self.id}" is closing', code="AGENT_CLOSING", session_id=self.id)
        if delivery != "next-turn":
            raise ValueError(f"unsupported delivery {delivery!r}; only 'next-turn' is supported")
        blocks = [text(content)] if isinstance(content, str) else [dict(block) for block in content]
        item = InboxItem(
            message_id if message_id is not None else self._ids.message(),
            tuple(blocks),
            source_json(source if source is not None else UserSource()),
            delivery,
        )
        self._inbox.append(item)
        self._parked = False
        self._idle.clear()
        self._work.set()
        self.start()
        return item.message_id

    def turn_result(self, message_id: str) -> asyncio.Future[TurnResult]:
        """A future resolved when the turn that claims `message_id` ends (or the item is dropped)."""
        future = self._results.get(message_id)
        if future is None:
            future = asyncio.get_running_loop().create_future()
            self._results[message_id] = future
        return future

    async def wait_idle(self) -> None:
        """Wait until no turn runs and nothing claimable waits (parked items do not count)."""
        await self._idle.wait()

    def cancel(self, cause: CancelCause = "user", *, keep_inbox: bool = True) -> bool:
        """Cancel the running turn and return at once; True when a turn was running.

        With `keep_inbox` the unclaimed items stay parked until the next `send()`; otherwise they
        are dropped. Agents this agent started keep running.
        """
        if not keep_inbox:
            self._drop_inbox()
        turn = self._turn
        if turn is None:
            return False
        if keep_inbox:
            self._parked = True
        turn.cancel(cause)
        return True

    async def aclose(self, *, cause: CancelCause = "disposed", dispose_session: bool = False) -> None:
        """Stop admission, end an open turn as aborted (`cause`), drop unclaimed items, stop the worker.

        Idempotent. A closed agent leaves the live agent registry (when it is the registered object
        for its id). The session stays live unless `dispose_session` (the runtime disposes every
        session itself when it closes).
        """
        if self._closed:
            return
        self._closing = True
        self._drop_inbox()
        if self._turn is not None:
            self._turn.cancel(cause)
        self._work.set()
        worker = self._worker
        if worker is not None:
            await asyncio.gather(worker, return_exceptions=True)
        await self._titles.aclose()
        self._closed = True
        self._idle.set()
        agents = self._services.agents
        if agents is not None:
            agents.unregister(self)
        if dispose_session:
            self._sessions.dispose(self._session)

    def context_estimate(self) -> int:
        """The estimated prompt tokens of this agent's next request, by the rule of docs/agent.md#compaction."""
        return self._compactor.estimate(self._tools.schemas())

    async def wait_title(self) -> None:
        """Wait for the background model-written title, when one is being asked for."""
        await self._titles.wait()

    async def compact(self, *, signal: AbortSignal | None = None) -> CompactionResult | None:
        """Compact the conversation now, between turns (docs/agent.md#compaction); None when nothing is worth it.

        Raises:
            AgentError: `AGENT_CLOSING`; `COMPACTION_FAILED` (the attempt is closed in the log, the
                conversation unchanged, the agent usable); `PERSISTENCE_FLUSH_FAILED`.
        """
        async with self._exclusive:
            if self._closing:
                raise AgentError(f'agent "{self.id}" is closing', code="AGENT_CLOSING", session_id=self.id)
            if self._last_turn is None:
                self._last_turn = highest_turn_number(self._session)
            try:
                signal = signal if signal is not None else AbortController().signal
                return await self._compactor.now(self._tools.schemas(), self._last_turn, signal)
            finally:
                try:
                    await self._sessions.flush(self._session)
                except Exception as error:
                    raise AgentError(
                        f'agent "{self.id}": the compaction could not be flushed: {error}',
                        code="PERSISTENCE_FLUSH_FAILED",
                        session_id=self.id,
                    ) from error

    # ---------------------------------------------------------------- the worker

    def _claimable(self) -> bool:
        return bool(self._inbox) and not self._parked and not self._closing

    async def _work_loop(self) -> None:
        try:
            while not self._closing:
                if not self._claimable():
                    self._work.clear()
                    self._idle.set()
                    await self._work.wait()
                    continue
                item = self._inbox.popleft()
                self._set_status("running")
                try:
                    async with self._exclusive:
                        result = await self._run_turn(item)
                finally:
                    self._set_status("idle")
                self._resolve(item.message_id, result)
        finally:
            self._idle.set()

    def _set_status(self, status: AgentStatus) -> None:
        if self._status == status:
            return
        self._status = status
        for listener in list(self._listeners):
            try:
                listener(self, status)
            except Exception:
                # Observers never change an agent's state.
                _log.exception('agent "%s": status listener raised', self.id)

    def _resolve(self, message_id: str, result: TurnResult) -> None:
        future = self._results.pop(message_id, None)
        if future is not None and not future.done():
            future.set_result(result)

    def _drop_inbox(self) -> None:
        while self._inbox:
            item = self._inbox.popleft()
            self._resolve(item.message_id, TurnResult(self.id, item.message_id, 0, "", "dropped", dropped=True))

    # ---------------------------------------------------------------- one turn

    async def _run_turn(self, item: InboxItem) -> TurnResult:
        if self._last_turn is None:
            self._last_turn = highest_turn_number(self._session)
        self._last_turn += 1
        number = self._last_turn
        turn = _Turn(number)
        self._turn = turn
        try:
            self._append("turn/start", {"turn": number})
            try:
                outcome = await self._steps(item, turn)
            except _FlushFailed as failure:
                self.last_error = failure.error
                outcome = _StepOutcome(
                    {"kind": "error", "error": {"code": "PERSISTENCE_FLUSH_FAILED", "message": str(failure.error)}}
                )
            except Exception as error:
                # A bug, not a model or tool failure (those are handled where they happen): the turn
                # still closes, so the log stays balanced and the agent stays usable.
                _log.exception('agent "%s": turn %d failed', self.id, number)
                self.last_error = error
                outcome = _StepOutcome(
                    {
                        "kind": "error",
                        "error": {"code": "AGENT_TURN_FAILED", "message": f"{type(error).__name__}: {error}"},
                    }
                )
            # Exactly `{turn, reason}`: the usage of each step travels on its `assistant/message`,
            # and the turn's total is their sum (docs/agent.md#token-usage).
            self._append("turn/end", {"turn": number, "reason": outcome.reason})
            try:
                await self._sessions.flush(self._session)
            except Exception as error:
                # The third flush point: record the failure, never a second `turn/end`.
                _log.error('agent "%s": flush after turn %d failed: %s', self.id, number, error)
                self.last_error = error
            reason = outcome.reason
            return TurnResult(
                self.id,
                item.message_id,
                number,
                outcome.output,
                str(reason.get("kind")),
                outcome.usage,
                reason.get("error") if reason.get("kind") == "error" else None,
            )
        finally:
            self._turn = None

    async def _steps(self, item: InboxItem, turn: _Turn) -> _StepOutcome:
        """Run steps until the model answers without tools; return the `turn/end` reason and the output."""
        options = self._options
        output = ""
        usage: Usage | None = None
        step = 0
        while True:
            step += 1
            if step > options.max_steps:
                message = f"the turn reached max_steps ({options.max_steps}) without a final answer"
                return _StepOutcome(
                    {"kind": "error", "error": {"code": "AGENT_MAX_STEPS", "message": message}}, output, usage
                )
            for hook in list(self._hooks):
                result = hook(self, turn.number, step)
                if result is not None:
                    await result
            if turn.cancelled():
                return _StepOutcome(_aborted(turn), output, usage)
            if step == 1 and options.permissions is not None:
                # After the pre-step hooks, so a one-shot child's descriptor stays the first event of its turn.
                self._knobs.note(self._session, options.permissions)
            self._append("step/start", {"turn": turn.number, "step": step})
            if step == 1:
                message_event = self._append(
                    "user/message",
                    {
                        "id": item.message_id,
                        "role": "user",
                        "content": [dict(b) for b in item.content],
                        "source": dict(item.source),
                    },
                )
                # Subagents keep the fallback: a model-written title for every child would cost a request each.
                model_titles = options.model_titles and options.subagent_depth is None
                self._titles.first_message(item, message_event.seq, model_titles=model_titles)
                if options.time_context:
                    self._append_context(turn.number, item)
            tools = self._tools.schemas()
            # Prune or compact first when the request would cross the threshold (docs/agent.md#compaction).
            await self._compactor.before_request(tools, turn.number, step, turn.signal)
            self._note_request_header(tools)
            self._note_request_context()
            try:
                await self._flush()
            except _FlushFailed:
                self._append("step/end", {"turn": turn.number, "step": step})
                raise
            if turn.cancelled():
                self._append("step/end", {"turn": turn.number, "step": step})
                return _StepOutcome(_aborted(turn), output, usage)
            assembler, chunk_seqs, failure = await self._stream_retrying(turn, step, tools)
            if assembler.usage is not None:
                usage = assembler.usage if usage is None else usage + assembler.usage
                self._compactor.observe(tools, assembler.usage)
            if failure is not None or turn.cancelled():
                # Keep what was streamed, marked interrupted, with no tool calls.
                partial = assembler.partial()
                if partial or chunk_seqs:
                    self._append_assistant(turn.number, step, partial, assembler, chunk_seqs, interrupted=True)
                self._append("step/end", {"turn": turn.number, "step": step})
                if turn.cancelled():
                    return _StepOutcome(_aborted(turn), output or assembler.text(), usage)
                assert failure is not None
                return _StepOutcome({"kind": "error", "error": failure.to_json()}, output, usage)
            finish = assembler.finish
            dispatch = finish not in ("length", "content-filter")
            content = assembler.content() if dispatch else assembler.partial()
            self._append_assistant(turn.number, step, content, assembler, chunk_seqs, interrupted=False)
            answer = text_of_blocks(content)
            if answer:
                output = answer
            calls = assembler.tool_calls() if dispatch else []
            if calls:
                await self._dispatch_all(turn, step, calls)
            self._append("step/end", {"turn": turn.number, "step": step})
            if turn.cancelled():
                return _StepOutcome(_aborted(turn), output, usage)
            if turn.conclusion is not None:
                return _StepOutcome(turn.conclusion, output, usage)
            if finish == "length":
                return _StepOutcome({"kind": "max-tokens"}, output, usage)
            if finish == "content-filter":
                return _StepOutcome({"kind": "blocked"}, output, usage)
            if not calls:
                verdict = self._completion_verdict(turn.number)
                if verdict is None:
                    return _StepOutcome({"kind": "completed"}, output, usage)
                if not isinstance(verdict, str):
                    return _StepOutcome({"kind": "error", "error": dict(verdict)}, output, usage)
                reminder = {"id": self._ids.message(), "role": "user", "content": [text(verdict)]}
                self._append("user/message", {**reminder, "source": dict(_REMINDER_SOURCE)})

    def _completion_verdict(self, turn: int) -> Mapping[str, Any] | str | None:
        for guard in list(self._guards):
            verdict = guard(self, turn)
            if verdict is not None:
                return verdict
        return None

    # ---------------------------------------------------------------- model

    async def _stream_retrying(
        self, turn: _Turn, step: int, tools: list[dict[str, Any]]
    ) -> tuple[MessageAssembler, list[int], ModelError | None]:
        """`_stream`, again after a retryable failure, under the client's retry policy (docs/agent.md#retries)."""
        retries = StepRetries(
            self._session,
            provider=self._model.provider,
            policy=getattr(self._model, "retry_policy", None),
            turn=turn.number,
            step=step,
        )

        async def flush() -> None:
            try:
                await self._flush()
            except _FlushFailed:
                self._append("step/end", {"turn": turn.number, "step": step})
                raise

        assembler, chunk_seqs, failure = await retries.run(
            lambda: self._stream(turn, step, tools), signal=turn.signal, flush=flush, label=self.id
        )
        return assembler if assembler is not None else MessageAssembler(), chunk_seqs, failure

    async def _stream(
        self, turn: _Turn, step: int, tools: list[dict[str, Any]]
    ) -> tuple[MessageAssembler, list[int], ModelError | None]:
        """Stream one model request into an assembler; returns the chunk seqs logged and any model failure."""
        options = self._options
        request = ModelRequest(
            model=options.model,
            system=options.system_prompt,
            # The frozen messages themselves: clients only read them, so nothing is copied per request.
            messages=self._session.derive_messages(),
            tools=tools,
            meta=RequestMeta(self.id, options.agent_key, turn.number, step),
            max_tokens=options.max_tokens,
            temperature=options.temperature,
        )
        assembler = MessageAssembler()
        chunk_seqs: list[int] = []
        stream = self._model.stream(request, signal=turn.signal)
        try:
            async for chunk in stream:
                assembler.feed(chunk)
                for listener in list(self._chunk_listeners):
                    try:
                        listener(self, turn.number, step, chunk)
                    except Exception:
                        _log.exception('agent "%s": chunk listener raised', self.id)
                if options.log_chunks:
                    event = self._append(
                        "assistant/chunk", {"turn": turn.number, "step": step, "chunk": chunk_to_json(chunk)}
                    )
                    chunk_seqs.append(event.seq)
                if turn.cancelled():
                    break
        except ModelError as error:
            if turn.cancelled():
                return assembler, chunk_seqs, None
            return assembler, chunk_seqs, error
        except Exception as error:
            # CancelledError is a BaseException and passes through: only this agent's own task
            # cancellation raises it here, and that must propagate.
            if turn.cancelled():
                return assembler, chunk_seqs, None
            _log.warning('agent "%s": model stream failed: %r', self.id, error)
            return assembler, chunk_seqs, ModelError(f"the model stream failed: {error}", code="MODEL_UNAVAILABLE")
        finally:
            # Close the stream now (an early `break` leaves it suspended), so an HTTP response is
            # released at once instead of whenever the generator is collected.
            close = getattr(stream, "aclose", None)
            if close is not None:
                try:
                    await close()
                except Exception as error:
                    _log.debug('agent "%s": closing the model stream raised %r', self.id, error)
        if not turn.cancelled() and assembler.finish is None:
            return (
                assembler,
                chunk_seqs,
                ModelError("the model stream ended without a finish", code="MODEL_UNAVAILABLE"),
            )
        return assembler, chunk_seqs, None

    def _append_assistant(
        self,
        turn: int,
        step: int,
        content: list[dict[str, Any]],
        assembler: MessageAssembler,
        chunk_seqs: list[int],
        *,
        interrupted: bool,
    ) -> SessionEvent:
        message = {
            "id": self._ids.message(),
            "role": "assistant",
            "content": content,
            "source": {"kind": "model", "provider": self._model.provider, "model": self._options.model},
        }
        data: dict[str, Any] = {"turn": turn, "step": step, "message": message}
        if assembler.usage is not None:
            data["usage"] = assembler.usage.to_json()
        if interrupted:
            data["interrupted"] = True
        return self._session.append("assistant/message", data, source_event_seqs=chunk_seqs or None)

    def _note_request_header(self, tools: list[dict[str, Any]]) -> None:
        """Write `request/header` at this agent's first request and whenever the header changed."""
        options = self._options
        header = header_of(
            provider=self._model.provider,
            model=options.model,
            max_tokens=options.max_tokens,
            temperature=options.temperature,
            system=options.system_prompt,
            tools=tools,
        )
        self._headers.note(self._session, header)

    def _append_context(self, turn: int, item: InboxItem) -> None:
        """The per-turn context message: the date and time, and the permissions in force."""
        zone = self._options.time_zone
        if zone is None:
            client_zone = item.source.get("clientTimeZone")
            zone = client_zone if isinstance(client_zone, str) else None
        message = context_message(
            self._ids.message(),
            now_ms=self._sessions.clock(),
            time_zone=zone,
            turn=turn,
            permissions=self._options.permissions,
        )
        self._append("user/message", message)

    def _note_request_context(self) -> None:
        """Write `request/context` when the provider or model differs from the last one in the log."""
        wanted = {"provider": self._model.provider, "model": self._options.model}
        last = self._session.request_context()
        if last is None or last.get("provider") != wanted["provider"] or last.get("model") != wanted["model"]:
            self._append("request/context", wanted)

    # ---------------------------------------------------------------- tools

    async def _dispatch_all(self, turn: _Turn, step: int, calls: list[ToolCall]) -> None:
        """Dispatch the calls one after another; after a cancellation the rest are answered as not run."""
        for call in calls:
            if turn.cancelled() or turn.conclusion is not None:
                text_ = _NOT_RUN_TEXT if turn.cancelled() else _CONCLUDED_TEXT
                self._append_result(turn.number, step, call, text_, is_error=True, call_seq=None)
                continue
            call_event = self._append(
                "tool/call",
                {"turn": turn.number, "step": step, "callId": call.id, "name": call.name, "arguments": call.arguments},
            )
            await self._dispatch(turn, step, call, call_event.seq)

    async def _dispatch(self, turn: _Turn, step: int, call: ToolCall, call_seq: int) -> None:
        tool = self._tools.get(call.name)
        if tool is None:
            self._append_result(
                turn.number, step, call, f'Error: unknown tool "{call.name}"', is_error=True, call_seq=call_seq
            )
            return
        try:
            parsed = orjson.loads(call.arguments) if call.arguments.strip() else {}
        except orjson.JSONDecodeError as error:
            text_ = f"Error: arguments are not valid JSON: {error}"
            self._append_result(turn.number, step, call, text_, is_error=True, call_seq=call_seq)
            return
        try:
            args = tool.args_model.model_validate(parsed)
        except Exception as error:
            text_ = f"Error: invalid arguments for {call.name}: {validation_summary(error)}"
            self._append_result(turn.number, step, call, text_, is_error=True, call_seq=call_seq)
            return
        context = ToolContext(
            agent=self,
            call_id=call.id,
            signal=turn.signal,
            services=self._services,
            permissions=self._options.permissions,
        )
        try:
            # The gate may ask someone (approval/asked, a flush, approval/decided); the flush below
            # then makes the decision durable before the body runs.
            refusal = await self._admit(tool, args, call, context)
            if refusal is None:
                await self._flush()
        except _FlushFailed as failure:
            self._append_result(
                turn.number, step, call, f"Error: not run: {failure.error}", is_error=True, call_seq=call_seq
            )
            raise
        if refusal is not None or turn.cancelled():
            text_ = _CANCELLED_TEXT if turn.cancelled() or refusal is None else refusal.text
            why = None if turn.cancelled() or refusal is None else refusal.error
            self._append_result(turn.number, step, call, text_, is_error=True, call_seq=call_seq, error=why)
            return
        body = asyncio.get_running_loop().create_task(tool.execute(args, context), name=f"dsh-tool-{call.name}")
        await self._await_body(turn, body)
        if turn.cancelled():
            self._append_result(turn.number, step, call, _CANCELLED_TEXT, is_error=True, call_seq=call_seq)
            return
        raised = body.exception()
        if raised is not None:
            # The model sees the message only; the traceback is for whoever reads the log at DEBUG.
            _log.debug('agent "%s": tool "%s" raised', self.id, call.name, exc_info=raised)
            code = getattr(raised, "code", None)
            details = {"name": type(raised).__name__, "code": code} if isinstance(code, str) else None
            message = f"Error: {message_of(raised)}"
            self._append_result(turn.number, step, call, message, is_error=True, call_seq=call_seq, error=details)
            return
        output = body.result()
        try:
            blocks = tool.render(args, output)
        except Exception as render_error:
            _log.exception('agent "%s": tool "%s" failed to render its output', self.id, call.name)
            self._append_result(
                turn.number, step, call, f"Error: {message_of(render_error)}", is_error=True, call_seq=call_seq
            )
            return
        # A plain string is exactly the text the model saw: keeping it again would only double the log.
        kept = output if is_json(output) and not isinstance(output, str) else None
        self._append_result(turn.number, step, call, blocks, is_error=False, call_seq=call_seq, output=kept)

    async def _admit(self, tool: Tool, args: Any, call: ToolCall, ctx: ToolContext) -> _gate.Refusal | None:
        """Pass the call through the approval gate (docs/tools.md#approvals); None when it may run."""
        permissions = self._options.permissions
        if permissions is None:
            return None
        if self._granted is None:
            self._granted = granted_rules(self._session)
        return await _gate.admit(
            tool=tool,
            args=args,
            call=call,
            ctx=ctx,
            session=self._session,
            permissions=permissions,
            granted=self._granted,
            label=self._options.agent_key,
            broker=self._services.approvals,
            ids=self._ids,
            flush=self._flush,
        )

    async def _await_body(self, turn: _Turn, body: asyncio.Task[object]) -> None:
        """Wait for a tool body; once the turn is cancelled give it the grace, then cancel its task."""
        aborted = asyncio.ensure_future(turn.signal.wait())
        try:
            await asyncio.wait({body, aborted}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            body.cancel()
            with contextlib.suppress(BaseException):
                await body
            raise
        finally:
            aborted.cancel()
        if not body.done():
            # The turn was cancelled while the body runs: it sees `ctx.signal` and gets the grace.
            await asyncio.wait({body}, timeout=self._options.cancel_grace_s)
            if not body.done():
                body.cancel()
            await asyncio.gather(body, return_exceptions=True)
        elif not body.cancelled():
            body.exception()  # mark the outcome as retrieved; it is reported through the result

    def _append_result(
        self,
        turn: int,
        step: int,
        call: ToolCall,
        content: str | list[dict[str, Any]],
        *,
        is_error: bool,
        call_seq: int | None,
        output: object = None,
        error: Mapping[str, Any] | None = None,
    ) -> None:
        blocks = [text(content)] if isinstance(content, str) else content
        result_block: dict[str, Any] = {
            "type": "tool-result",
            "toolCallId": call.id,
            "content": blocks,
            "isError": is_error,
        }
        if output is not None:
            result_block["output"] = output
        message = {
            "id": self._ids.message(),
            "role": "user",
            "source": {"kind": "tool", "callId": call.id},
            "content": [result_block],
        }
        data: dict[str, Any] = {"turn": turn, "step": step, "message": message}
        if error is not None:
            data["error"] = dict(error)
        self._session.append("tool/result", data, source_event_seqs=[call_seq] if call_seq is not None else None)

    # ---------------------------------------------------------------- session

    def _append(self, type_: str, data: Mapping[str, Any]) -> SessionEvent:
        return self._session.append(type_, data)

    async def _flush(self) -> None:
        try:
            await self._sessions.flush(self._session)
        except Exception as error:
            _log.error('agent "%s": flush failed: %s', self.id, error)
            raise _FlushFailed(error) from error


def _aborted(turn: _Turn) -> dict[str, Any]:
    return {"kind": "aborted", "reason": {"kind": turn.cause or "user"}}
