"""Structured output: children and top-level runs that must finish through `structured_output`.

Every test runs a real `Runtime` on a temporary home with the scripted model; the parent delegates
through an `agent` tool built with an output schema, and every event written is checked against the
harness's shapes.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from dsh import Config, Runtime
from dsh.agent.ids import SequentialIds
from dsh.agent.structured import StructuredOutput
from dsh.session.events import SessionEvent
from dsh.testing.event_shapes import assert_harness_shapes
from dsh.testing.stored_logs import StepClock
from dsh.tools import AgentTool
from tests.tools.helpers import result_text_of, scripted, stored, tool_results

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"verdict": {"type": "string", "enum": ["pass", "fail"]}, "issues": {"type": "array"}},
    "required": ["verdict", "issues"],
    "additionalProperties": False,
}
VALID = {"verdict": "pass", "issues": []}
INVALID = {"verdict": 5}


def _review(description: str = "Review") -> dict[str, Any]:
    return {"toolCalls": [{"name": "agent", "arguments": {"description": description, "prompt": "Review it."}}]}


def _report(arguments: Any) -> dict[str, Any]:
    return {"toolCalls": [{"name": "structured_output", "arguments": arguments}]}


@contextlib.asynccontextmanager
async def _runtime(home: Path, model: Any, *, attempts: int = 3) -> AsyncIterator[tuple[Runtime, list[SessionEvent]]]:
    """A runtime whose `agent` tool asks every child for `SCHEMA`; the list collects every event of every session."""
    written: list[SessionEvent] = []
    config = Config(home=home, agent={"structured_output_attempts": attempts})
    async with Runtime.open(
        config,
        model=model,
        ids=SequentialIds(),
        clock=StepClock(),
        subagent_tools=False,
        tools=[AgentTool(output_schema=SCHEMA)],
    ) as rt:
        rt.sessions.on_event(lambda _session, event: written.append(event))
        yield rt, written


def _child_id(data: Mapping[str, Any]) -> str:
    return str(result_text_of(data).split()[2])


async def test_an_invalid_call_is_explained_then_the_valid_object_reaches_the_parent(tmp_path: Path) -> None:
    """The child's invalid call is an errored result naming each violation; its second call succeeds, and the
    parent's `agent` result carries the validated object as output and as the JSON text the model sees."""
    model = scripted(
        {
            "main": {"steps": [_review(), {"match": {"lastToolResult": '"verdict":"pass"'}, "text": "REVIEWED"}]},
            "Review": {
                "steps": [
                    _report(INVALID),
                    {"match": {"lastToolResult": "does not match the output schema"}, **_report(VALID)},
                ]
            },
        }
    )
    async with _runtime(tmp_path, model) as (rt, written):
        parent = await rt.create_agent()
        result = await parent.turn_result(await parent.send("Get a review."))
        await rt.settle()
        [data] = tool_results(list(parent.session.events))
        child_id = data["message"]["content"][0]["output"]["childId"]
        _header, child_events = await stored(rt, child_id)
    model.assert_consumed()
    assert result.output == "REVIEWED"
    block = data["message"]["content"][0]
    assert block["isError"] is False
    assert block["output"]["structured"] == VALID
    assert result_text_of(data) == '{"verdict":"pass","issues":[]}'
    first, second = tool_results(child_events)
    told = result_text_of(first)
    assert told.startswith("Error: the result does not match the output schema (2 attempt(s) left): ")
    assert "$.verdict: 5 is not one of ['pass', 'fail']" in told
    assert "$: 'issues' is a required property" in told
    assert first["error"] == {"name": "ToolError", "code": "STRUCTURED_OUTPUT_INVALID"}
    assert result_text_of(second) == "Structured output recorded."
    assert second["message"]["content"][0]["output"] == {"recorded": True}
    # The valid call concluded the child's turn: no request after it.
    ends = [e.data for e in child_events if e.type == "turn/end"]
    assert [end["reason"]["kind"] for end in ends] == ["completed"]  # type: ignore[index]
    assert_harness_shapes(written)


async def test_a_child_that_spends_its_attempts_stops_with_the_documented_reason(tmp_path: Path) -> None:
    """Three invalid calls with three attempts: the child's turn ends STRUCTURED_OUTPUT_MISSING and the parent's
    `agent` call is an errored result saying so."""
    model = scripted(
        {
            "main": {"steps": [_review(), {"text": "GAVE UP"}]},
            "Review": {"steps": [_report(INVALID), _report({"verdict": "maybe", "issues": []}), _report("[1]")]},
        }
    )
    async with _runtime(tmp_path, model) as (rt, written):
        parent = await rt.create_agent()
        await parent.turn_result(await parent.send("Get a review."))
        await rt.settle()
        [data] = tool_results(list(parent.session.events))
    model.assert_consumed()
    text = result_text_of(data)
    assert data["message"]["content"][0]["isError"] is True
    assert (
        " stopped before finishing (error): no valid structured_output call after 3 attempt(s); last problem: " in text
    )
    assert "[1] is not of type 'object'" in text
    errors = [e.data["reason"] for e in written if e.type == "turn/end" and e.data["reason"]["kind"] == "error"]  # type: ignore[index]
    assert [reason["error"]["code"] for reason in errors] == ["STRUCTURED_OUTPUT_MISSING"]
    assert_harness_shapes(written)


async def test_a_plain_answer_gets_a_reminder_and_another_step(tmp_path: Path) -> None:
    """A child answering in plain text is reminded in a user message from the completion guard, then reports."""
    model = scripted(
        {
            "main": {"steps": [_review(), {"text": "OK"}]},
            "Review": {
                "steps": [
                    {"text": "Looks good to me."},
                    _report(VALID),
                ]
            },
        }
    )
    async with _runtime(tmp_path, model) as (rt, written):
        parent = await rt.create_agent()
        await parent.turn_result(await parent.send("Get a review."))
        await rt.settle()
        [data] = tool_results(list(parent.session.events))
    model.assert_consumed()
    assert data["message"]["content"][0]["output"]["structured"] == VALID
    reminders = [e for e in written if e.type == "user/message" and e.data["source"].get("form") == "reminder"]  # type: ignore[index, union-attr]
    assert len(reminders) == 1
    assert "You have not reported your result yet" in reminders[0].data["content"][0]["text"]  # type: ignore[index]
    assert_harness_shapes(written)


async def test_calls_after_the_accepted_one_in_the_same_step_are_not_run(tmp_path: Path) -> None:
    """The valid call concludes the turn: a later call of the same message gets a not-run result."""
    both = {
        "toolCalls": [
            {"name": "structured_output", "arguments": VALID},
            {"name": "structured_output", "arguments": {"verdict": "fail", "issues": ["late"]}},
        ]
    }
    model = scripted({"main": {"steps": [both]}})
    async with Runtime.open(Config(home=tmp_path), model=model, ids=SequentialIds(), clock=StepClock()) as rt:
        result = await rt.run("Review it.", output_schema=SCHEMA)
        events = list(rt.sessions.get(result.session_id).events)  # type: ignore[union-attr]
    assert (result.stop_reason, result.structured) == ("completed", VALID)
    texts = [result_text_of(data) for data in tool_results(events)]
    assert texts == [
        "Structured output recorded.",
        "Error: not run: an earlier call of this step concluded the turn",
    ]
    assert_harness_shapes(events)


async def test_a_top_level_run_returns_the_validated_object(tmp_path: Path) -> None:
    """`rt.run(..., output_schema=...)` gives the agent the tool and the instruction and returns the object."""
    model = scripted({"main": {"steps": [_report(INVALID), _report(VALID)]}})
    async with Runtime.open(Config(home=tmp_path), model=model, ids=SequentialIds(), clock=StepClock()) as rt:
        result = await rt.run("Review it.", output_schema=SCHEMA)
        assert "structured_output" not in rt.tools  # given to that agent only
    model.assert_consumed()
    assert result.structured == VALID
    assert result.stop_reason == "completed"


async def test_a_top_level_run_without_a_valid_call_ends_with_an_error(tmp_path: Path) -> None:
    """Plain answers until the attempts run out end the turn `STRUCTURED_OUTPUT_MISSING` with no object."""
    model = scripted({"main": {"steps": [{"text": "a"}, {"text": "b"}]}})
    config = Config(home=tmp_path, agent={"structured_output_attempts": 2})
    async with Runtime.open(config, model=model, ids=SequentialIds(), clock=StepClock()) as rt:
        result = await rt.run("Review it.", output_schema=SCHEMA)
    assert result.stop_reason == "error"
    assert result.structured is None
    assert result.error is not None
    assert result.error["code"] == "STRUCTURED_OUTPUT_MISSING"
    assert "did not call structured_output" in result.error["message"]


@pytest.mark.parametrize(
    "schema",
    [{"type": "array"}, "not a schema", {"type": "object", "properties": {"a": {"type": 12}}}],
)
def test_unusable_output_schemas_are_refused(schema: Any) -> None:
    """A schema that is not object-rooted, or that jsonschema finds invalid, is refused at once."""
    with pytest.raises(ValueError, match="output schema"):
        StructuredOutput(schema)
