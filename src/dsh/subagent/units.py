"""The `subagent` identity unit and the `subagentTiming` unit.

Layer: subagent. Both are pure projection units: no I/O, JSON-only state, the same state object for
events they ignore, and they never raise — a malformed, unknown-version or missing descriptor folds
to "no value" (`{}` state, `null` view), which the listing's four-state mapping turns into a row.
The identity unit is last-wins over the whole log and carries the descriptor's `seq`, so consumers
can prove it belongs to the child's own suffix (the unit cannot see the header or the cut). The
timing unit measures settled turn time since the last descriptor (every descriptor resets it, so
turns inherited from a fork seed never count); an event whose `time` is not an integer is ignored,
and the settled total is clamped to the safe-integer range so the state stays lossless JSON. Their
state and view schemas are strict and closed (`dsh.subagent._unit_schemas`).
"""

from __future__ import annotations

from typing import Any, Final

from dsh.json import SAFE_INT_MAX, JsonValue
from dsh.projection.unit import ClientView, ProjectionUnit
from dsh.session.events import SessionEvent
from dsh.subagent._unit_schemas import IDENTITY_STATE, IDENTITY_VIEW, TIMING_STATE, TIMING_VIEW

__all__ = [
    "SUBAGENT_IDENTITY_KEY",
    "SUBAGENT_TIMING_KEY",
    "subagent_identity_unit",
    "subagent_timing_unit",
]

SUBAGENT_IDENTITY_KEY: Final = "subagent"
SUBAGENT_TIMING_KEY: Final = "subagentTiming"
SUBAGENT_UNIT_VERSION: Final = 2

_DESCRIPTOR_TYPE: Final = "subagent/descriptor"
"""`dsh.subagent.descriptor.SUBAGENT_DESCRIPTOR_TYPE` again: that module (and its dataclasses) loads when
a descriptor is folded, not whenever the units are registered (docs/architecture.md#import-cost)."""


def _identity_init() -> dict[str, Any]:
    return {}


def _identity_apply(state: dict[str, Any], event: SessionEvent) -> dict[str, Any]:
    if event.type != _DESCRIPTOR_TYPE:
        return state
    from dsh.subagent.descriptor import parse_descriptor

    try:
        descriptor = parse_descriptor(event.data)
    except Exception:
        descriptor = None
    if descriptor is None:
        # Reset, last-wins: a bad or unsupported descriptor erases an earlier good one.
        return state if not state else {}
    identity: dict[str, JsonValue] = {"mode": descriptor.mode}
    if descriptor.label is not None:
        identity["label"] = descriptor.label
    identity["seq"] = event.seq
    return {"identity": identity}


def _identity_render(state: object) -> dict[str, Any] | None:
    # Never raise: anything but a wrapped identity object renders as the `null` sentinel.
    identity = state.get("identity") if isinstance(state, dict) else None
    return identity if isinstance(identity, dict) else None


def subagent_identity_unit() -> ProjectionUnit[Any, Any]:
    """The `subagent` unit: host state `{}` / `{"identity": {mode, label?, seq}}`, view identity or `null`."""
    return ProjectionUnit(
        key=SUBAGENT_IDENTITY_KEY,
        state_version=SUBAGENT_UNIT_VERSION,
        init=_identity_init,
        apply=_identity_apply,
        state_schema=IDENTITY_STATE,
        view=ClientView(render=_identity_render, schema=IDENTITY_VIEW),
        event_types=frozenset({_DESCRIPTOR_TYPE}),
    )


# ------------------------------------------------------------------------------------------ timing


def _timing_init() -> dict[str, Any]:
    return {"descriptorSeen": False, "settledMs": 0}


def _timing_apply(state: dict[str, Any], event: SessionEvent) -> dict[str, Any]:
    try:
        t = event.time
        if type(t) is not int:
            return state
        kind = event.type
        active = state.get("active")
        if kind == "turn/start":
            if state.get("descriptorSeen"):
                return {**state, "active": {"since": t, "through": t}}
            return {**state, "pendingTurnStart": t}
        if kind == _DESCRIPTOR_TYPE:
            since = active["since"] if active is not None else state.get("pendingTurnStart")
            reset: dict[str, Any] = {"descriptorSeen": True, "settledMs": 0}
            if since is not None:
                reset["active"] = {"since": since, "through": t}
            return reset
        if kind == "turn/end":
            if not state.get("descriptorSeen"):
                if "pendingTurnStart" not in state:
                    return state
                return {key: value for key, value in state.items() if key != "pendingTurnStart"}
            if active is None:
                return state
            # Clamped so the state stays lossless JSON (a safe integer) whatever the event times are.
            settled = min(SAFE_INT_MAX, state["settledMs"] + max(0, t - active["since"]))
            return {key: value for key, value in state.items() if key != "active"} | {"settledMs": settled}
        if active is not None and active["through"] != t:
            return {**state, "active": {"since": active["since"], "through": t}}
        return state
    except Exception:
        # Never raise: an unexpected state shape leaves the fold where it was.
        return state


def _timing_render(state: object) -> dict[str, Any]:
    # Never raise: a state that is not an object renders as the init value (the view is never null).
    if not isinstance(state, dict):
        return {"settledMs": 0}
    view: dict[str, Any] = {"settledMs": state.get("settledMs", 0)}
    active = state.get("active")
    if isinstance(active, dict):
        view["active"] = {"since": active.get("since"), "through": active.get("through")}
    return view


def subagent_timing_unit() -> ProjectionUnit[Any, Any]:
    """The `subagentTiming` unit: settled work time and the active interval since the descriptor."""
    return ProjectionUnit(
        key=SUBAGENT_TIMING_KEY,
        state_version=SUBAGENT_UNIT_VERSION,
        init=_timing_init,
        apply=_timing_apply,
        state_schema=TIMING_STATE,
        view=ClientView(render=_timing_render, schema=TIMING_VIEW),
    )
