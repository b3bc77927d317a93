"""Delegation depth: how deep an agent runs, the depth of its next child, and the `max_depth` cap.

Layer: subagent. An agent's depth is the larger of its header's `delegation_depth` and the
`subagent_depth` option it was started with; a child runs one deeper. `max_depth` is an absolute cap
on the child's depth, checked before any provider work; 0 forbids delegation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from dsh.subagent.errors import SubagentDepthError

if TYPE_CHECKING:
    from dsh.agent.loop import Agent

__all__ = ["MAX_SAFE_INTEGER", "check_max_depth", "child_depth", "delegation_depth_of"]

MAX_SAFE_INTEGER: Final = 2**53 - 1
"""The largest depth JSON readers in other languages keep exactly."""


def _non_negative_safe_int(value: object) -> bool:
    return type(value) is int and 0 <= value <= MAX_SAFE_INTEGER


def delegation_depth_of(agent: Agent) -> int:
    """The depth `agent` runs at: `max(header.delegation_depth, options.subagent_depth or 0)`.

    Raises:
        ValueError: The agent's `subagent_depth` option is not a non-negative safe integer.
    """
    option = agent.options.subagent_depth
    if option is not None and not _non_negative_safe_int(option):
        raise ValueError("agent subagentDepth must be a non-negative safe integer")
    return max(agent.session.header.delegation_depth or 0, option or 0)


def check_max_depth(max_depth: object) -> None:
    """Refuse a `max_depth` that is neither None nor a non-negative safe integer (a bool is refused).

    Raises:
        ValueError: `subagent maxDepth must be a non-negative safe integer`.
    """
    if max_depth is not None and not _non_negative_safe_int(max_depth):
        raise ValueError("subagent maxDepth must be a non-negative safe integer")


def child_depth(parent: Agent, max_depth: int | None = None) -> int:
    """The depth of a new child of `parent`, checked against `max_depth` when one is given.

    Raises:
        ValueError: An invalid `max_depth` or parent depth option.
        OverflowError: The child depth would pass the largest safe integer.
        SubagentDepthError: The child depth exceeds `max_depth`.
    """
    check_max_depth(max_depth)
    depth = delegation_depth_of(parent) + 1
    if depth > MAX_SAFE_INTEGER:
        raise OverflowError("subagent depth would exceed the largest safe integer")
    if max_depth is not None and depth > max_depth:
        raise SubagentDepthError(attempted_depth=depth, max_depth=max_depth)
    return depth
