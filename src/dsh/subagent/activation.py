"""`Activation`: one residency of a continuable child in this process, and the notice its parent gets.

Layer: subagent. A continuable child has at most one Activation at a time. It is `running` while
its agent runs or accepted messages wait (parked ones included), `waiting` while it owns live child
Activations, and `settled` otherwise; a settled Activation is disposed, its parent is told, and a
later message resumes the child cold (docs/subagents.md#settlement-and-the-parent-notice). The
Activation holds state only; the continuation manager drives its transitions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal

from dsh.agent.messages import text
from dsh.subagent.errors import SubagentError

if TYPE_CHECKING:
    from dsh.agent.loop import Agent
    from dsh.subagent.providers import StopReason

__all__ = ["Activation", "ActivationState", "ActivationStatus", "settled_notice"]

ActivationStatus = Literal["running", "waiting", "settled"]


class ActivationState(StrEnum):
    """The lifecycle of an Activation: `active` → `disposing` → `disposed`."""

    ACTIVE = "active"
    DISPOSING = "disposing"
    DISPOSED = "disposed"


class Activation:
    """A resident continuable child: its agent, durable parent, owner Activation and live ancestry.

    Attributes:
        child_id: The child's session (and agent) id.
        agent: The child's live agent.
        parent_id: The durable parent session id from the child's header.
        provider: The provider named by the child's descriptor.
        run_id: Pairs this residency's `subagent/start` and `subagent/end` notifications.
        owner: The parent's Activation when the parent is itself a resident continuable child.
        ancestry: The ids of the live agents above the child (its parent first).
        epoch_start: The first seq this residency wrote; its outcome is read from there on.
        announced: True once a message for the child was accepted, so its parent is told when it settles.
        teardown_error: `ACTIVATION_TEARDOWN_FAILED` when releasing the agent or session failed.
    """

    def __init__(
        self,
        agent: Agent,
        *,
        parent_id: str,
        provider: str,
        run_id: str,
        owner: Activation | None,
        ancestry: tuple[str, ...],
        on_change: Callable[[], None],
    ) -> None:
        self.agent = agent
        self.child_id = agent.id
        self.parent_id = parent_id
        self.provider = provider
        self.run_id = run_id
        self.owner = owner
        self.ancestry = ancestry
        self.epoch_start = agent.session.seq
        self.announced = False
        self.children: list[Activation] = []
        self.state = ActivationState.ACTIVE
        self.changed = asyncio.Event()
        self.disposed = asyncio.Event()
        self.teardown: asyncio.Task[None] | None = None
        self.watcher: asyncio.Task[None] | None = None
        self.teardown_error: SubagentError | None = None
        self._on_change = on_change
        self._unsubscribe = agent.on_status(lambda _agent, _status: self.touch())

    @property
    def status(self) -> ActivationStatus:
        """`running`, `waiting` or `settled` (computed from the agent and the owned children now)."""
        if self.agent.status == "running" or self.agent.pending > 0:
            return "running"
        if any(child.state is not ActivationState.DISPOSED for child in self.children):
            return "waiting"
        return "settled"

    @property
    def resident(self) -> bool:
        """True until disposal starts."""
        return self.state is ActivationState.ACTIVE

    def touch(self) -> None:
        """Something this Activation's status depends on changed: wake its watcher and the manager."""
        self.changed.set()
        self._on_change()

    def detach(self) -> None:
        """Stop listening to the agent's status."""
        self._unsubscribe()

    def __repr__(self) -> str:
        return f"Activation(child_id={self.child_id!r}, state={self.state.value!r})"


_FIRST_LINES: Mapping[str, str] = {
    "completed": "Subagent {id} finished and will do no further work unless it is sent more.",
    "aborted": "Subagent {id} was stopped before it finished.",
    "max-tokens": "Subagent {id} ran out of room before it finished.",
    "refusal": "Subagent {id} declined the task.",
    "error": "Subagent {id} failed before it finished.",
}


def settled_notice(
    child_id: str, stop_reason: StopReason | str, output: Sequence[Mapping[str, Any]]
) -> tuple[str, list[dict[str, Any]]]:
    """The notice a parent gets when its child settles: `(summary, content blocks)`.

    The summary is the first line (what happened, by stop reason); the content continues with the
    child's closing message, or says there is none.
    """
    template = _FIRST_LINES.get(stop_reason)
    summary = (
        template.format(id=child_id)
        if template is not None
        else f"Subagent {child_id} ended abnormally ({stop_reason})."
    )
    if not output:
        return summary, [text(f"{summary}\nIt left no closing message.")]
    return summary, [text(f"{summary}\nIts closing message:\n"), *(dict(block) for block in output)]
