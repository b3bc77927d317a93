"""The model-visible surface of a session: which message events are current, after replaces.

Layer: session. Only `user/message`, `assistant/message` and `tool/result` are surface-eligible.
An `"append"` adds the event as a new node; a replace shadows a run of current nodes (named by the
seqs of its first and last node) and takes their place. Validation is a pure *plan* step; `commit`
applies a plan, so a refused event leaves the surface untouched. The same code folds surfaces from
stored logs and seeds (so logs written upstream fold the same way) and validates live appends.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from dsh.json import FrozenDict

__all__ = ["Surface", "SurfaceView"]


class SurfacePlan(NamedTuple):
    """A validated surface change: replace positions `[lo, hi)` of the node list with `seq`.

    Internal to the session layer (built for every surface event a session appends or a read
    validates, and never handed out), so it is the cheapest record to build, a tuple.
    """

    lo: int
    hi: int
    seq: int
    replace: bool


class SurfaceView:
    """Read-only view of a session's surface: current node seqs and the replace generation."""

    __slots__ = ("_surface",)

    def __init__(self, surface: Surface) -> None:
        self._surface = surface

    @property
    def nodes(self) -> tuple[int, ...]:
        """Seqs of the current surface nodes, in order."""
        return tuple(self._surface.nodes)

    @property
    def replace_generation(self) -> int:
        """How many replaces have been applied."""
        return self._surface.replace_generation


class Surface:
    """Mutable surface state owned by one session (or one read pipeline)."""

    __slots__ = ("nodes", "replace_generation")

    def __init__(self) -> None:
        self.nodes: list[int] = []
        self.replace_generation = 0

    def plan(self, record: Mapping[str, Any], log: Sequence[Mapping[str, Any]]) -> SurfacePlan | str | None:
        """Validate `record` against the current surface.

        Args:
            record: An event whose envelope and data were already checked.
            log: The events before `record`, indexable by seq (to inspect shadowed nodes).

        Returns:
            None for a log-only event, a plan for a surface event, or a problem text.
        """
        kind = record["type"]
        op = record.get("surfaceOp")
        seq = record["seq"]
        if op is None:
            if kind in ("user/message", "assistant/message", "tool/result"):
                return f'session event "{kind}" is surface-eligible and requires a surfaceOp marker'
            return None
        if op == "append":
            n = len(self.nodes)
            return SurfacePlan(n, n, seq, replace=False)
        start, end = op["start"], op["end"]
        try:
            lo = self.nodes.index(start)
            hi = self.nodes.index(end, lo)
        except ValueError:
            return f"surface replace: start {start} and end {end} must name current surface nodes in order"
        shadowed = self.nodes[lo : hi + 1]
        cited = set(record.get("sourceEventSeqs") or ())
        missing = [s for s in shadowed if s not in cited]
        if missing:
            listed = ", ".join(str(s) for s in missing)
            return f"surface replace: sourceEventSeqs must include every shadowed surface node; missing {listed}"
        if kind == "tool/result":
            problem = _tool_result_replace_problem(record, shadowed, log)
            if problem is not None:
                return problem
        return SurfacePlan(lo, hi + 1, seq, replace=True)

    def commit(self, plan: SurfacePlan | None) -> None:
        """Apply a plan produced by `plan` against the same state."""
        if plan is None:
            return
        if plan.replace:
            self.nodes[plan.lo : plan.hi] = [plan.seq]
            self.replace_generation += 1
        else:
            self.nodes.append(plan.seq)


def _tool_result_replace_problem(
    record: Mapping[str, Any], shadowed: list[int], log: Sequence[Mapping[str, Any]]
) -> str | None:
    if len(shadowed) != 1 or log[shadowed[0]]["type"] != "tool/result":
        return "surface replace: a tool/result replace must shadow exactly one tool/result node"
    old = log[shadowed[0]]["data"]["message"]
    new = record["data"]["message"]
    old_block, new_block = old["content"][0], new["content"][0]
    same_block = {**old_block, "content": new_block.get("content")} == dict(new_block)
    same_message = {**old, "content": new["content"]} == dict(new)
    if not (same_block and same_message):
        return "surface replace: a tool/result replace may change only content of its tool-result block"
    return None


def derive_messages(nodes: Sequence[int], log: Sequence[Mapping[str, Any]]) -> tuple[FrozenDict, ...]:
    """Project surface nodes to model messages (docs/glossary.md#surface)."""
    out: list[FrozenDict] = []
    for seq in nodes:
        event = log[seq]
        kind, data = event["type"], event["data"]
        if kind == "user/message":
            out.append(data)
        elif kind == "assistant/message":
            message = data["message"]
            if message.get("content"):
                out.append(message)
        else:
            out.append(data["message"])
    return tuple(out)
