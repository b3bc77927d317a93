"""The harness-shape check itself: it accepts what the harness declares and names everything else.

The autouse fixture of this package runs it on every event the workspace, approval and instruction
tests write; these tests make sure it can fail.
"""

from __future__ import annotations

from typing import Any

import pytest

from dsh.session.events import KNOWN_EVENT_TYPES
from dsh.testing.event_shapes import EVENT_SHAPES, assert_harness_shapes, event_problems


def _event(kind: str, data: Any, **envelope: Any) -> dict[str, Any]:
    return {"type": kind, "seq": 3, "time": 1, "data": data, **envelope}


def test_every_declared_shape_is_of_a_known_type() -> None:
    """Shapes are only written for types of the harness's vocabulary."""
    assert set(EVENT_SHAPES) <= KNOWN_EVENT_TYPES


@pytest.mark.parametrize(
    ("event", "problem"),
    [
        (_event("dsh/private", {}), "not a type of the harness's vocabulary"),
        (_event("todo/write", {"todos": []}), "no shape is declared here"),
        (
            _event("approval/asked", {"id": "a", "toolName": "bash", "extra": 1}),
            "extra: Extra inputs are not permitted",
        ),
        (_event("approval/decided", {"id": "a", "outcome": "allowed-always"}), "outcome: Input should be"),
        (_event("sandbox/mode", {"mode": "off"}), "mode: Input should be"),
        (_event("turn/start", {"turn": "1"}), "turn: Input should be a valid integer"),
        (
            _event("turn/end", {"turn": 1, "reason": {"kind": "completed"}, "usage": {"inputTokens": 1}}),
            "usage: Extra inputs are not permitted",
        ),
        (
            _event("request/header", {"header": {"config": {"provider": "p"}}, "reason": "initial"}),
            "header.config.model",
        ),
        (
            _event("tool/call", {"turn": 1, "step": 1, "callId": "c", "name": "bash", "arguments": {"command": "ls"}}),
            "arguments: Input should be a valid string",
        ),
        (
            _event(
                "assistant/message",
                {
                    "turn": 1,
                    "step": 1,
                    "message": {
                        "id": "m",
                        "role": "assistant",
                        "content": [{"type": "tool-call", "id": "c", "name": "x"}],
                        "source": {"kind": "model", "provider": "p", "model": "m"},
                    },
                },
            ),
            "tool-call block: arguments: Field required",
        ),
    ],
)
def test_a_foreign_or_misshaped_event_is_named(event: dict[str, Any], problem: str) -> None:
    """An unknown type without the marker, a type without a shape and data off its shape are reported."""
    problems = event_problems(event)
    assert any(problem in found for found in problems), problems
    with pytest.raises(AssertionError, match="events outside the harness's shapes"):
        assert_harness_shapes([event])


def test_an_ignorable_event_and_well_shaped_events_pass() -> None:
    """The `ignorable` marker lets any type through; events in their declared shapes pass."""
    assert_harness_shapes(
        [
            _event("dsh/approval/rule", {"tool": "bash", "pattern": "ls", "action": "allow"}, ignorable=True),
            _event("approval/asked", {"id": "a", "toolName": "bash", "callId": "c", "reason": "asks"}),
            _event("approval/decided", {"id": "a", "outcome": "unavailable"}),
            _event("approval/policy", {"policy": "never", "source": "delegation"}),
            _event("permission/preset", {"preset": "workspace-write"}),
            _event(
                "request/header",
                {"header": {"config": {"provider": "p", "model": "m", "maxTokens": 5}}, "reason": "change"},
            ),
        ]
    )
