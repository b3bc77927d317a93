"""The in-process providers `spawn` and `fork`, and the one-shot driver they share.

Layer: subagent (private). A one-shot child is a fresh session (spawn) or one seeded with the
parent's completed turns (fork), run by an agent on the host. Its descriptor is written inside its
first turn by a pre-step hook, after `turn/start` and before `step/start`, so a child cancelled
before its first step has none. When the child's turn ends the driver reads the result from the own
suffix, closes the agent and disposes the session (after a flush): a finished one-shot child is cold,
lists as `inactive` and is never resumed (docs/subagents.md#one-shot-runs).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from dsh.abort import AbortError
from dsh.agent.messages import UserSource
from dsh.agent.model import TextDelta
from dsh.agent.structured import StructuredOutput
from dsh.agent.tools import ToolRegistry
from dsh.subagent._compose import (
    ChildComposer,
    closing_output,
    fork_prefix,
    last_turn_end,
    last_turn_error,
    one_shot_stop_reason,
    schema_note,
)
from dsh.subagent.depth import child_depth
from dsh.subagent.descriptor import SUBAGENT_DESCRIPTOR_TYPE
from dsh.subagent.providers import (
    ContinuablePreparation,
    ProviderCapabilities,
    SubagentRequest,
    SubagentResult,
    SubagentRun,
)

if TYPE_CHECKING:
    from dsh.agent.loop import Agent
    from dsh.agent.model import ModelChunk
    from dsh.session.session import Session

__all__ = ["InProcessProvider"]

_log = logging.getLogger("dsh.subagent")

_EVERY_CAPABILITY = ProviderCapabilities(
    output_schema=True, depth_limit=True, tool_filter=True, persona=True, continuable=True
)


class InProcessProvider:
    """A provider whose children are agents of this process (`spawn`, or `fork` with the parent's prefix)."""

    def __init__(self, name: str, *, inherits_parent_context: bool, composer: ChildComposer) -> None:
        self._name = name
        self._inherits = inherits_parent_context
        self._composer = composer

    @property
    def name(self) -> str:
        """`spawn` or `fork`."""
        return self._name

    @property
    def capabilities(self) -> ProviderCapabilities:
        """Every capability."""
        return _EVERY_CAPABILITY

    @property
    def inherits_parent_context(self) -> bool:
        """True for `fork`."""
        return self._inherits

    def __repr__(self) -> str:
        return f"InProcessProvider({self._name!r})"

    async def prepare_continuable(self, request: SubagentRequest) -> ContinuablePreparation:
        """Fork: the parent's prefix through its last `turn/end`; spawn: nothing."""
        if not self._inherits:
            return ContinuablePreparation()
        return ContinuablePreparation(seed=tuple(fork_prefix(request.parent.session.events)))

    async def start(self, request: SubagentRequest) -> SubagentRun:
        """Create, compose and start a one-shot child; returns once its prompt is accepted.

        Raises:
            AbortError: The request's signal was aborted before the child was published.
            SubagentError: `CONTINUATION_UNAVAILABLE` when the runtime has no agent host.
        """
        composer = self._composer
        host = composer.host()
        sessions = composer.sessions()
        signal = request.signal
        if signal is not None and signal.aborted:
            raise AbortError("subagent request was aborted before child publication", reason=signal.reason)
        parent = request.parent
        depth = child_depth(parent, request.max_depth)
        prefix = fork_prefix(parent.session.events) if self._inherits else []
        options = composer.options(
            host,
            parent=parent,
            agent_key=request.label or "one-shot",
            depth=depth,
            persona=request.persona,
            model=request.model or parent.options.model,
            max_tokens=parent.options.max_tokens,
            extra_system=schema_note(request.output_schema),
        )
        tools = composer.tools(host, request.tool_filter)
        structured = None
        if request.output_schema is not None:
            # The child's own registry: the host's default one is shared by every agent.
            structured = StructuredOutput(request.output_schema, max_attempts=options.structured_output_attempts)
            tools = ToolRegistry([*tools, structured])
        session = sessions.create(
            host.ids.session(),
            header=composer.header(parent, depth),
            seed=prefix or None,
            inherited_event_count=len(prefix),
        )
        # The creation window: the child is published but has no descriptor yet (listings omit it).
        try:
            agent = host.start_agent(session, options=options, tools=tools)
        except BaseException:
            sessions.dispose(session)
            raise
        driver = _OneShotDriver(agent, session, request, composer, structured)
        try:
            message_id = await agent.send(request.prompt, UserSource())
        except BaseException:
            await driver.release()
            raise
        driver.begin(message_id)
        return SubagentRun(session.id, driver.result, local_agent=agent, dispose=driver.dispose)


class _OneShotDriver:
    """Runs one one-shot child to its result, then releases it (agent closed, session disposed)."""

    def __init__(
        self,
        agent: Agent,
        session: Session,
        request: SubagentRequest,
        composer: ChildComposer,
        structured: StructuredOutput | None = None,
    ) -> None:
        self.agent = agent
        self._structured = structured
        self._unbind = structured.bind(agent) if structured is not None else (lambda: None)
        self.session = session
        self.result: asyncio.Future[SubagentResult] = asyncio.get_running_loop().create_future()
        self._composer = composer
        self._descriptor: Mapping[str, Any] | None = request.descriptor
        self._cancelled = False
        self._released = False
        self._release_error: BaseException | None = None
        self._streamed: list[str] = []
        self._task: asyncio.Task[None] | None = None
        self._remove_hook = agent.add_pre_step_hook(self._write_descriptor)
        self._remove_chunks = agent.on_chunk(self._on_chunk)
        signal = request.signal
        self._remove_abort: Callable[[], None] = (
            signal.add_callback(lambda _reason: self.cancel()) if signal is not None else lambda: None
        )

    def begin(self, message_id: str) -> None:
        """Start waiting for the turn that claims `message_id`."""
        self._task = asyncio.get_running_loop().create_task(
            self._drive(message_id), name=f"dsh-one-shot-{self.session.id}"
        )

    def _write_descriptor(self, agent: Agent, turn: int, step: int) -> None:
        # The first pre-step hook of the first turn; a run cancelled before it never gets a descriptor.
        self._remove_hook()
        # A parked or closing child was cancelled before this step (the runtime closing cancels
        # turns directly): it gets no descriptor either.
        if self._cancelled or self._descriptor is None or agent.parked or agent.closing:
            return
        agent.session.append(SUBAGENT_DESCRIPTOR_TYPE, self._descriptor)

    def _on_chunk(self, agent: Agent, turn: int, step: int, chunk: ModelChunk) -> None:
        if isinstance(chunk, TextDelta):
            self._streamed.append(chunk.text)

    def cancel(self) -> None:
        """Cancel the child's turn and drop anything it has not claimed (the driver then finishes)."""
        if self._cancelled:
            return
        self._cancelled = True
        self.agent.cancel("parent", keep_inbox=False)

    async def _drive(self, message_id: str) -> None:
        try:
            await self.agent.turn_result(message_id)
            await self.agent.wait_idle()
        finally:
            events = self.session.events
            own = events[self.session.inherited_event_count :]
            stop = one_shot_stop_reason(last_turn_end(own), cancelled=self._cancelled)
            structured = self._structured
            value = structured.value if structured is not None and structured.captured else None
            if structured is not None and not structured.captured and stop == "completed":
                stop = "error"  # a schema was asked for and never satisfied: the run did not finish
            outcome = SubagentResult(
                stop,
                closing_output(own, "".join(self._streamed)),
                structured=value,
                error=last_turn_error(own) if stop == "error" else None,
            )
            await self.release()
            if not self.result.done():
                self.result.set_result(outcome)

    async def release(self) -> None:
        """Close the agent, flush and dispose the session (once); failures are kept for `dispose()`."""
        if self._released:
            return
        self._released = True
        self._remove_abort()
        self._unbind()
        self._remove_chunks()
        self._remove_hook()
        agent, session = self.agent, self.session
        try:
            await agent.aclose(cause="parent")
            sessions = self._composer.sessions()
            if sessions.get(session.id) is session:
                try:
                    await sessions.flush(session)
                except Exception as error:
                    # Best effort: the disposal below retries the write and reports a failure itself.
                    _log.warning('subagent "%s": flush before disposal failed: %s', session.id, error)
                sessions.dispose(session)
        except Exception as error:
            _log.exception('subagent "%s": releasing the one-shot child failed', session.id)
            self._release_error = error
        finally:
            agents = self._composer.services.agents
            if agents is not None:
                agents.unregister(agent)

    async def dispose(self) -> None:
        """Cancel the run and wait until the child is released; raise what releasing it raised."""
        self.cancel()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        else:
            await self.release()
        if not self.result.done():
            self.result.set_result(SubagentResult("aborted"))
        if self._release_error is not None:
            raise self._release_error
