"""The continuation manager: continuable starts, follow-ups, cold resume, interrupts, settlement and drain.

Layer: subagent (private; `SubagentRuntime` is its only user). It owns the resident Activations,
one lock per child id (routing a message, installing an Activation and deciding to dispose one are
serialized per child), and admission (open until the runtime drains). Descriptions of every
operation are in docs/subagents.md.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dsh.agent.messages import NoticeSource, Source, UserSource, text_of_blocks
from dsh.subagent._compose import (
    ChildComposer,
    closing_output,
    descriptor_record,
    epoch_stop_reason,
    last_turn_end,
)
from dsh.subagent._sync import KeyedLocks, wait_or_abort
from dsh.subagent.activation import Activation, ActivationState, settled_notice
from dsh.subagent.authority import AncestorAuthority, Authority, UserAuthority
from dsh.subagent.depth import check_max_depth, child_depth
from dsh.subagent.descriptor import ContinuableDescriptor, fold_descriptor_for_resume, snapshot_descriptor
from dsh.subagent.errors import SubagentDescriptorError, SubagentError
from dsh.subagent.providers import ContinuableSpec, ContinuableStarted, SubagentProvider, SubagentRequest

if TYPE_CHECKING:
    from dsh.abort import AbortSignal
    from dsh.agent.loop import Agent, CancelCause
    from dsh.agent.registry import AgentRegistry
    from dsh.persistence.base import PreparedSession, SessionPersistence
    from dsh.services import Services
    from dsh.subagent.providers import StopReason

__all__ = ["ContinuationManager"]

_log = logging.getLogger("dsh.subagent")

Emit = Callable[[dict[str, Any]], None]


def _throw_if_aborted(signal: AbortSignal | None) -> None:
    """Raise the signal's own reason: a caller's cancellation is never translated into a code."""
    if signal is not None:
        signal.throw_if_aborted()


def _not_resumable(child_id: str, cause: BaseException | None = None) -> SubagentError:
    return SubagentError(
        f'subagent "{child_id}" has no supported continuation state and cannot be resumed; '
        "do not retry send_message with this id",
        "NOT_RESUMABLE",
        cause,
    )


def _unavailable(child_id: str, cause: BaseException | None = None) -> SubagentError:
    return SubagentError(f'subagent "{child_id}" is unavailable', "NOT_RESUMABLE", cause)


class ContinuationManager:
    """Resident continuable children and every operation that creates, routes to or disposes them."""

    def __init__(
        self,
        services: Services,
        composer: ChildComposer,
        *,
        provider_of: Callable[[str], SubagentProvider | None],
        emit: Emit,
    ) -> None:
        self.services = services
        self._composer = composer
        self._provider_of = provider_of
        self._emit = emit
        self._activations: dict[str, Activation] = {}
        self._tearing_down: set[Activation] = set()
        self._locks = KeyedLocks()
        self._draining = False
        self._tick = asyncio.Event()

    # ---------------------------------------------------------------- reads

    @property
    def draining(self) -> bool:
        """True once admission closed."""
        return self._draining

    def activation(self, child_id: str) -> Activation | None:
        """The resident Activation of a continuable child (also while it is being disposed)."""
        return self._activations.get(child_id)

    def _pending(self) -> bool:
        """An Activation is being disposed, or is settled and about to be."""
        if self._tearing_down:
            return True
        return any(act.resident and act.status == "settled" for act in self._activations.values())

    async def settled(self) -> None:
        """Wait until no Activation is settled-but-resident or mid-teardown (notices are then delivered)."""
        while self._pending():
            tick = self._tick
            await tick.wait()

    def _notify(self) -> None:
        tick, self._tick = self._tick, asyncio.Event()
        tick.set()

    # ---------------------------------------------------------------- checks

    def _agents(self) -> AgentRegistry[Agent]:
        agents = self.services.agents
        if agents is None:
            raise SubagentError(
                "continuable subagents require the live agent registry (services.agents)", "CONTINUATION_UNAVAILABLE"
            )
        return agents

    def _persistence(self) -> SessionPersistence:
        persistence = self.services.persistence
        if persistence is None:
            raise SubagentError("continuable subagents require session persistence", "PERSISTENCE_UNAVAILABLE")
        return persistence

    def _owner_of(self, parent: Agent) -> Activation | None:
        """The parent's own Activation, when the parent is a resident continuable child itself."""
        act = self._activations.get(parent.id)
        return act if act is not None and act.agent is parent else None

    def _admit(self, parent: Agent) -> None:
        if self._draining:
            raise SubagentError("the subagent runtime is draining and admits no new subagent work", "DRAINING")
        owner = self._owner_of(parent)
        if owner is not None and not owner.resident:
            raise SubagentError(
                f'subagent "{parent.id}" is closing and cannot start or reach children', "ACTIVATION_CLOSING"
            )

    def _check_free(self, child_id: str) -> None:
        agents, sessions = self.services.agents, self.services.sessions
        if (agents is not None and agents.get(child_id) is not None) or (
            sessions is not None and sessions.get(child_id) is not None
        ):
            raise SubagentError(f'subagent "{child_id}" already exists', "DUPLICATE_CHILD")

    def _authorize(self, parent: Agent, child_id: str, durable_parent: str | None) -> None:
        if self._agents().get(parent.id) is not parent:
            raise SubagentError("delivery requires the exact live parent agent", "UNAUTHORIZED")
        if durable_parent != parent.id:
            raise SubagentError(f'subagent "{child_id}" belongs to another parent session', "UNAUTHORIZED")

    # ---------------------------------------------------------------- start

    async def start(self, spec: ContinuableSpec) -> ContinuableStarted:
        """Create a continuable child, queue its prompt, return at acceptance.

        See docs/subagents.md#continuable-children-and-activations.
        """
        self._agents()
        host = self._composer.host()
        parent = spec.parent
        self._admit(parent)
        persistence = self._persistence()
        check_max_depth(spec.max_depth)
        child_id = spec.child_id if spec.child_id is not None else host.ids.session()
        self._check_free(child_id)
        depth = child_depth(parent, spec.max_depth)
        model = spec.model or parent.options.model
        descriptor = snapshot_descriptor(
            "continuable",
            provider=spec.provider,
            label=spec.label,
            agent_provider=parent.model_client.provider,
            agent_model=model,
            persona=spec.persona,
            tool_filter=spec.tool_filter,
        )
        provider = self._provider_of(spec.provider)
        if provider is None:
            raise SubagentError(f'no subagent provider named "{spec.provider}" is registered', "NO_PROVIDER")
        if not provider.capabilities.continuable:
            raise SubagentError(
                f'subagent provider "{spec.provider}" does not support continuable children', "UNSUPPORTED_CAPABILITY"
            )
        request = SubagentRequest(
            parent=parent,
            prompt=spec.prompt,
            label=spec.label,
            max_depth=spec.max_depth,
            tool_filter=spec.tool_filter,
            persona=spec.persona,
            model=spec.model,
            signal=spec.signal,
            descriptor=descriptor,
        )
        preparation = await provider.prepare_continuable(request)
        _throw_if_aborted(spec.signal)
        self._admit(parent)
        prefix: list[Mapping[str, Any]] = list(preparation.seed)
        sessions = self._composer.sessions()
        seed = [*prefix, descriptor_record(len(prefix), sessions.clock(), descriptor)]
        async with self._locks.hold(child_id):
            _throw_if_aborted(spec.signal)
            self._admit(parent)
            self._check_free(child_id)
            if spec.child_id is not None:
                # A reserved id must not name a stored session either (a revision probe reads no log).
                try:
                    stored = await persistence.revision(child_id, signal=spec.signal)
                except Exception:
                    _throw_if_aborted(spec.signal)
                    raise
                if stored is not None:
                    raise SubagentError(f'subagent "{child_id}" already exists', "DUPLICATE_CHILD")
                _throw_if_aborted(spec.signal)
                self._admit(parent)
                self._check_free(child_id)
            # From here to acceptance nothing awaits: the child is published, started and handed its
            # prompt in one step, so no caller cancellation can leave half a child behind.
            options = self._composer.options(
                host,
                parent=parent,
                agent_key=spec.label,
                depth=depth,
                persona=spec.persona,
                model=model,
                max_tokens=parent.options.max_tokens,
            )
            tools = self._composer.tools(host, spec.tool_filter)
            session = sessions.create(
                child_id, header=self._composer.header(parent, depth), seed=seed, inherited_event_count=len(prefix)
            )
            try:
                agent = host.start_agent(session, options=options, tools=tools)
            except BaseException:
                sessions.dispose(session)
                raise
            act = self._install(agent, parent=parent, provider=spec.provider)
            try:
                # An abort raised in the creation window (by a listener of the child's publication or
                # of `subagent/start`) still owns the operation: nothing has been accepted yet.
                _throw_if_aborted(spec.signal)
                message_id = await agent.send(spec.prompt, UserSource())
            except BaseException:
                await self._rollback(act)
                raise
            act.announced = True
        return ContinuableStarted(child_id, message_id)

    def _install(self, agent: Agent, *, parent: Agent, provider: str) -> Activation:
        """Make `agent` a resident Activation: ownership, `subagent/start`, the settlement watcher."""
        owner = self._owner_of(parent)
        act = Activation(
            agent,
            parent_id=parent.id,
            provider=provider,
            run_id=self._composer.host().ids.run(),
            owner=owner,
            ancestry=(parent.id, *owner.ancestry) if owner is not None else (parent.id,),
            on_change=self._notify,
        )
        self._activations[act.child_id] = act
        if owner is not None:
            owner.children.append(act)
            owner.touch()
        self._emit({"type": "subagent/start", **self._identity(act)})
        act.watcher = asyncio.get_running_loop().create_task(self._watch(act), name=f"dsh-settle-{act.child_id}")
        return act

    @staticmethod
    def _identity(act: Activation) -> dict[str, Any]:
        return {
            "runId": act.run_id,
            "provider": act.provider,
            "parentSessionId": act.parent_id,
            "childSessionId": act.child_id,
            "local": True,
        }

    async def _rollback(self, act: Activation) -> None:
        """Undo an install whose prompt was not accepted: no Activation, no agent, no ownership, no end."""
        act.detach()
        self._activations.pop(act.child_id, None)
        if act.owner is not None and act in act.owner.children:
            act.owner.children.remove(act)
            act.owner.touch()
        if act.watcher is not None:
            act.watcher.cancel()
        await act.agent.aclose(cause="parent")
        self._agents().unregister(act.agent)
        sessions = self.services.sessions
        if sessions is not None:
            sessions.dispose(act.agent.session)
        act.state = ActivationState.DISPOSED
        act.disposed.set()
        self._notify()

    # ---------------------------------------------------------------- follow-up and cold resume

    async def followup(
        self,
        parent: Agent,
        child_id: str,
        content: Sequence[Mapping[str, Any]] | str,
        *,
        source: Source,
        signal: AbortSignal | None = None,
    ) -> str:
        """Queue `content` as the child's next turn, resuming it cold when it is not resident."""
        self._agents()
        self._admit(parent)
        while True:
            async with self._locks.hold(child_id):
                act = self._activations.get(child_id)
                if act is None:
                    return await self._resume(parent, child_id, content, source, signal)
                if act.resident:
                    _throw_if_aborted(signal)
                    self._admit(parent)
                    if act.agent.closing:
                        raise SubagentError(f'subagent "{child_id}" is closing', "ACTIVATION_CLOSING")
                    self._authorize(parent, child_id, act.parent_id)
                    message_id = await act.agent.send(content, source)
                    act.announced = True
                    return message_id
                disposed = act.disposed
            # Disposal is under way: wait for it, then route again (the child is resumed cold).
            await wait_or_abort(disposed, signal)

    async def _resume(
        self,
        parent: Agent,
        child_id: str,
        content: Sequence[Mapping[str, Any]] | str,
        source: Source,
        signal: AbortSignal | None,
    ) -> str:
        """Cold resume: one `prepare` is the only read; the first own descriptor decides.

        See docs/subagents.md#follow-up-and-cold-resume.
        """
        persistence = self._persistence()
        self._composer.host()  # refuse before the read when this runtime cannot run agents
        try:
            prepared = await persistence.prepare(child_id, signal=signal)
        except Exception as error:
            _throw_if_aborted(signal)
            raise _unavailable(child_id, error) from error
        try:
            _throw_if_aborted(signal)
            self._admit(parent)
            observation = prepared.observation
            header = observation.header
            if header.origin != "subagent":
                raise _not_resumable(child_id)
            self._authorize(parent, child_id, header.parent_session)
            own = observation.events[observation.inherited_event_count :]
            try:
                descriptor = fold_descriptor_for_resume(own)
            except SubagentDescriptorError as error:
                raise _not_resumable(child_id, error) from error
            if not isinstance(descriptor, ContinuableDescriptor):
                raise _not_resumable(child_id)
            try:
                agent = self._materialize(prepared, descriptor, header.delegation_depth, parent)
            except SubagentError:
                raise
            except Exception as error:
                _throw_if_aborted(signal)
                raise _unavailable(child_id, error) from error
        except BaseException:
            # A no-op once the session was published (the live writer owns it then).
            await prepared.close()
            raise
        act = self._install(agent, parent=parent, provider=descriptor.provider)
        try:
            _throw_if_aborted(signal)  # an abort in the creation window still owns the operation
            message_id = await agent.send(content, source)
        except BaseException:
            await self._rollback(act)
            raise
        act.announced = True
        return message_id

    def _materialize(
        self, prepared: PreparedSession, descriptor: ContinuableDescriptor, depth: int, parent: Agent
    ) -> Agent:
        """Publish a prepared child and start its agent, composed from the descriptor (no second read)."""
        host = self._composer.host()
        options = self._composer.options(
            host,
            parent=parent,
            agent_key=descriptor.label,
            depth=depth,
            persona=descriptor.persona,
            model=descriptor.agent_model,
        )
        tools = self._composer.tools(host, descriptor.tool_filter)
        session = prepared.publish()
        try:
            return host.start_agent(session, options=options, tools=tools)
        except BaseException:
            self._composer.sessions().dispose(session)
            raise

    # ---------------------------------------------------------------- interrupt

    async def interrupt(self, target_id: str, authority: Authority) -> None:
        """Cancel the target's current turn and keep its inbox; returns once accepted.

        See docs/subagents.md#interrupt-and-authority.
        """
        agents = self.services.agents
        if agents is None:
            return
        caller: Agent | None = None
        if isinstance(authority, AncestorAuthority):
            caller = authority.agent
            if agents.get(caller.id) is not caller:
                raise SubagentError("interrupt requires the exact live calling agent", "UNAUTHORIZED")
            if caller.id == target_id:
                raise SubagentError(f'agent "{target_id}" cannot interrupt itself', "UNAUTHORIZED")
        act = self._activations.get(target_id)
        if act is None:
            return
        cause: CancelCause
        if isinstance(authority, UserAuthority):
            if act.parent_id != authority.parent_session_id:
                raise SubagentError(f'subagent "{target_id}" belongs to another parent session', "UNAUTHORIZED")
            cause = "user"
        else:
            assert caller is not None
            if caller.id not in act.ancestry:
                raise SubagentError(
                    f'agent "{target_id}" is not a live descendant of agent "{caller.id}"', "UNAUTHORIZED"
                )
            cause = "parent"
        if act.resident:
            act.agent.cancel(cause, keep_inbox=True)

    # ---------------------------------------------------------------- settlement and disposal

    async def _watch(self, act: Activation) -> None:
        """Dispose the Activation once it settles; a message that arrives first keeps it resident."""
        while act.resident:
            await act.changed.wait()
            act.changed.clear()
            if not act.resident or act.status != "settled":
                continue
            async with self._locks.hold(act.child_id):
                # Decided under the child lock: a follow-up routed first makes it `running` again.
                if act.resident and act.status == "settled":
                    self._begin_teardown(act, "parent")

    def _begin_teardown(self, act: Activation, cause: CancelCause) -> asyncio.Task[None]:
        """Install the disposal (the admission cutoff for this child) and start it, once."""
        if act.teardown is None:
            act.state = ActivationState.DISPOSING
            self._tearing_down.add(act)
            act.teardown = asyncio.get_running_loop().create_task(
                self._teardown(act, cause), name=f"dsh-dispose-{act.child_id}"
            )
            act.touch()
        return act.teardown

    async def _dispose(self, act: Activation, cause: CancelCause) -> None:
        async with self._locks.hold(act.child_id):
            task = self._begin_teardown(act, cause)
        await asyncio.gather(task, return_exceptions=True)

    async def _teardown(self, act: Activation, cause: CancelCause) -> None:
        """Dispose in order: cancel, children first, idle, flush, outcome, handle, removal, notice, ownership, end."""
        try:
            stop_reason, output = await self._release(act, cause)
        except Exception as error:
            # A bug rather than a failing boundary; the Activation must still leave, or settling never ends.
            _log.exception('subagent "%s": disposal failed', act.child_id)
            act.teardown_error = SubagentError(
                f'disposing subagent "{act.child_id}" failed', "ACTIVATION_TEARDOWN_FAILED", error
            )
            stop_reason, output = "error", ()
        try:
            act.detach()
            if self._activations.get(act.child_id) is act:
                del self._activations[act.child_id]
            await self._send_notice(act, stop_reason, output)
            if act.owner is not None and act in act.owner.children:
                act.owner.children.remove(act)
                act.owner.touch()
            end: dict[str, Any] = {
                "type": "subagent/end",
                **self._identity(act),
                "stopReason": stop_reason,
                "hasOutput": bool(output),
            }
            closing = text_of_blocks(output)
            if closing:
                end["lastAssistantMessage"] = closing
            self._emit(end)
        finally:
            act.state = ActivationState.DISPOSED
            act.disposed.set()
            self._tearing_down.discard(act)
            act.touch()
            watcher = act.watcher
            if watcher is not None and watcher is not asyncio.current_task():
                watcher.cancel()

    async def _release(self, act: Activation, cause: CancelCause) -> tuple[StopReason, Sequence[Mapping[str, Any]]]:
        """Stop the agent and its children, capture the epoch's outcome, release agent and session."""
        agent = act.agent
        session = agent.session
        dropped = agent.pending > 0
        agent.cancel(cause, keep_inbox=False)
        for child in list(act.children):
            await self._dispose(child, cause)
        await agent.wait_idle()
        sessions = self.services.sessions
        if sessions is not None and sessions.get(session.id) is session:
            try:
                await sessions.flush(session)
            except Exception as error:
                # Best effort: disposing the session below retries the write and reports its own failure.
                _log.warning('subagent "%s": flush before disposal failed: %s', act.child_id, error)
        events = session.events[act.epoch_start :]
        stop_reason: StopReason = epoch_stop_reason(last_turn_end(events), dropped_work=dropped)
        output: Sequence[Mapping[str, Any]] = closing_output(events)
        failures: list[BaseException] = []
        try:
            await agent.aclose(cause=cause)
        except Exception as error:
            failures.append(error)
        try:
            agents = self.services.agents
            if agents is not None:
                agents.unregister(agent)
            if sessions is not None and sessions.get(session.id) is session:
                sessions.dispose(session)
        except Exception as error:
            failures.append(error)
        if failures:
            act.teardown_error = SubagentError(
                f'disposing subagent "{act.child_id}" failed', "ACTIVATION_TEARDOWN_FAILED", failures[0]
            )
            _log.error("%s", act.teardown_error, exc_info=failures[0])
            return "error", ()
        return stop_reason, output

    async def _send_notice(self, act: Activation, stop_reason: StopReason, output: Sequence[Mapping[str, Any]]) -> None:
        """Queue the settlement notice as the parent's next turn; dropped when nobody would read it."""
        if not act.announced or self._draining:
            # A closing runtime drops every inbox it has not run: a notice would only wake a parent
            # that is being closed.
            return
        agents = self.services.agents
        parent = agents.get(act.parent_id) if agents is not None else None
        if parent is None or parent.closing:
            return
        owner = self._owner_of(parent)
        if owner is not None and not owner.resident:
            return  # the parent is being disposed; its unclaimed inbox is dropped with it
        summary, content = settled_notice(act.child_id, stop_reason, output)
        try:
            await parent.send(content, NoticeSource(act.child_id, summary))
        except Exception as error:
            _log.warning('subagent "%s": the settlement notice to "%s" failed: %s', act.child_id, parent.id, error)

    # ---------------------------------------------------------------- drain

    async def drain(self) -> None:
        """Close admission and dispose every Activation child-first (open turns end as `disposed`).

        Raises:
            SubagentError: `ACTIVATION_TEARDOWN_FAILED` when disposing an Activation failed (after all were disposed).
        """
        self._draining = True
        failed: list[SubagentError] = []
        while self._activations or self._tearing_down:
            roots = [
                act
                for act in self._activations.values()
                if act.owner is None or act.owner.state is ActivationState.DISPOSED
            ]
            if roots:
                for root in roots:
                    await self._dispose(root, "disposed")
                    if root.teardown_error is not None:
                        failed.append(root.teardown_error)
            else:
                await asyncio.gather(
                    *(act.teardown for act in list(self._tearing_down) if act.teardown is not None),
                    return_exceptions=True,
                )
        if failed:
            raise failed[0]
