"""`dsh.tool`: a type-hinted function becomes a tool whose schema, validation and descriptions come from it.

The schema of a function with an `int`, a `Literal`, a pydantic model and a documented docstring is
pinned by `tests/golden/function_tool_schema.json` (rewritten with `DSH_SNAPSHOT=refresh`). A wrong
argument is an errored result naming the field; a sync body runs in a worker thread, so the loop
keeps going meanwhile; a `ToolContext` parameter is filled by the loop and never shown to the model.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel, Field

import dsh
from dsh.agent.errors import ToolError
from dsh.agent.function_tool import FunctionTool, parse_docstring, tool
from dsh.agent.ids import SequentialIds
from dsh.agent.tools import Tool, ToolContext, ToolRegistry
from dsh.config import Config
from dsh.runtime import Runtime
from dsh.testing.stored_logs import StepClock
from tests.tools.helpers import GOLDEN, assert_golden
from tests.workspace.helpers import GUARD_S, call, result_blocks, result_texts, scripted


@dataclass
class Parcel:
    """A parcel (a dataclass return value)."""

    id: int


class Address(BaseModel):
    """Where to deliver."""

    street: str
    number: int = Field(ge=1)


def ship(
    count: int,
    speed: Literal["standard", "express"],
    address: Address,
    note: str | None = None,
    ctx: ToolContext | None = None,
) -> dict[str, object]:
    """Ship some parcels to an address.

    The parcels leave the warehouse today.

    Args:
        count: How many parcels to ship.
        speed: How fast they travel.
        address: Where they go.
        note: A note for the courier,
            printed on the label.
    """
    assert ctx is None or ctx.call_id
    return {"shipped": count, "speed": speed, "to": f"{address.number} {address.street}", "note": note}


def test_the_schema_of_a_hinted_function_matches_the_golden_file() -> None:
    """Name, description and parameters (int, Literal, a model, an optional) are the pinned ones; ctx is hidden."""
    made = tool(ship)
    assert isinstance(made, Tool)
    assert made.name == "ship"
    assert made.description == "Ship some parcels to an address.\n\nThe parcels leave the warehouse today."
    assert "ctx" not in made.parameters["properties"]
    entry = ToolRegistry([made]).schemas()[0]
    assert_golden(GOLDEN / "function_tool_schema.json", json.dumps(entry, indent=2) + "\n")


def test_docstrings_in_google_and_sphinx_style_describe_parameters() -> None:
    """`Args:` entries (continued lines joined) and `:param x:` lines both give parameter descriptions."""
    assert parse_docstring(ship.__doc__)[1]["note"] == "A note for the courier, printed on the label."

    def sphinx(path: str, depth: int = 1) -> str:
        """List a folder.

        :param path: The folder.
        :param depth: How deep to go.
        """
        return path

    made = tool(sphinx)
    assert made.description == "List a folder."
    assert made.parameters["properties"]["depth"] == {"default": 1, "description": "How deep to go.", "type": "integer"}


def test_functions_that_cannot_be_tools_are_refused_with_tool_invalid() -> None:
    """A parameter without a hint, `*args`/`**kwargs`, a positional-only parameter or a bad name is `TOOL_INVALID`."""

    def no_hint(x):  # type: ignore[no-untyped-def]
        return x

    def star(*items: int) -> int:
        return len(items)

    def positional(x: int, /) -> int:
        return x

    for function in (no_hint, star, positional):
        with pytest.raises(ToolError) as raised:
            tool(function)
        assert raised.value.code == "TOOL_INVALID"
    with pytest.raises(ToolError) as named:
        tool(name="has space")(star)
    assert named.value.code == "TOOL_INVALID"


def test_the_decorated_function_can_still_be_called() -> None:
    """`@dsh.tool` returns a tool that calls the function when called directly."""

    @dsh.tool
    def double(value: int) -> int:
        """Double a number."""
        return value * 2

    assert isinstance(double, FunctionTool)
    assert double(21) == 42


async def _run(tools: list[object], steps: list[dict[str, object]], tmp_path: Path) -> list:
    async with Runtime.open(
        Config(home=tmp_path / "home"), model=scripted(steps), ids=SequentialIds(), clock=StepClock(), tools=tools
    ) as rt:
        result = await asyncio.wait_for(rt.run("go"), GUARD_S)
        return list(rt.sessions.get(result.session_id).events)  # type: ignore[union-attr]


async def test_a_wrong_argument_is_an_errored_result_naming_the_field(tmp_path: Path) -> None:
    """Bad arguments never reach the body: the model is told which field is wrong and why."""
    bad = {"count": "many", "speed": "teleport", "address": {"street": "Main", "number": 0}, "extra": 1}
    events = await _run([ship], [call("ship", bad), {"text": "done"}], tmp_path)
    (text,) = result_texts(events)
    assert text.startswith("Error: invalid arguments for ship: ")
    for field in ("count:", "speed:", "address.number:", "extra:"):
        assert field in text


async def test_return_values_are_rendered_for_the_model_and_kept(tmp_path: Path) -> None:
    """A dict is shown as JSON and kept as `output`; a string is shown as it is; a model and None too."""

    def as_text() -> str:
        """Text."""
        return "plain words"

    def as_model() -> Address:
        """A model."""
        return Address(street="Elm", number=7)

    def as_dataclass() -> Parcel:
        """A dataclass."""
        return Parcel(3)

    def nothing() -> None:
        """Nothing."""

    arguments = {"count": 2, "speed": "express", "address": {"street": "Main", "number": 5}}
    steps = [
        call(name, arguments if name == "ship" else {})
        for name in ("ship", "as_text", "as_model", "as_dataclass", "nothing")
    ]
    events = await _run([ship, as_text, as_model, as_dataclass, nothing], [*steps, {"text": "done"}], tmp_path)
    texts = result_texts(events)
    assert json.loads(texts[0]) == {"shipped": 2, "speed": "express", "to": "5 Main", "note": None}
    assert texts[1:] == ["plain words", '{"street":"Elm","number":7}', '{"id":3}', "(no output)"]
    blocks = [data["message"]["content"][0] for data in result_blocks(events)]
    assert blocks[0]["output"] == {"shipped": 2, "speed": "express", "to": "5 Main", "note": None}
    assert "output" not in blocks[1]  # a string is exactly the text shown


async def test_an_exception_is_an_errored_result_and_its_traceback_stays_in_the_debug_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The model sees the exception's message; the traceback goes to the DEBUG log, never to the session."""

    def explode() -> None:
        """Fail."""
        raise ValueError("the warehouse is closed")

    caplog.set_level(logging.DEBUG, logger="dsh.agent")
    events = await _run([explode], [call("explode", {}), {"text": "done"}], tmp_path)
    (text,) = result_texts(events)
    assert text == "Error: the warehouse is closed"
    assert "Traceback" not in json.dumps([dict(event) for event in events])
    logged = [record for record in caplog.records if record.exc_info is not None]
    assert any("explode" in record.getMessage() for record in logged)


async def test_a_sync_body_runs_in_a_thread_and_the_loop_keeps_going(tmp_path: Path) -> None:
    """While a sync tool waits for a task of the event loop, that task runs: the body is not on the loop."""
    released = threading.Event()
    seen: dict[str, bool] = {}

    def blocking() -> str:
        """Wait until the loop has done something."""
        seen["released"] = released.wait(GUARD_S)
        seen["off_loop"] = threading.current_thread() is not threading.main_thread()
        return "finished"

    async def release_soon() -> None:
        # Runs only if the loop is free while the body waits.
        while not started.is_set():
            await asyncio.sleep(0)
        released.set()

    started = threading.Event()

    def body() -> str:
        """Block."""
        started.set()
        return blocking()

    helper = asyncio.ensure_future(release_soon())
    events = await _run([tool(body, name="block")], [call("block", {}), {"text": "done"}], tmp_path)
    await helper
    assert seen == {"released": True, "off_loop": True}
    assert result_texts(events) == ["finished"]


async def test_an_async_function_gets_the_tool_context(tmp_path: Path) -> None:
    """An async function runs on the loop; its `ToolContext` parameter carries the call and the agent."""
    got: dict[str, object] = {}

    async def whoami(ctx: ToolContext) -> str:
        """Say who calls."""
        got["call"] = ctx.call_id
        got["agent"] = ctx.agent.id if ctx.agent is not None else None
        return "me"

    events = await _run([whoami], [call("whoami", {}, call_id="call-x"), {"text": "done"}], tmp_path)
    assert result_texts(events) == ["me"]
    assert got["call"] == "call-x"
    assert isinstance(got["agent"], str)


async def test_tools_are_given_per_runtime_and_per_agent_and_the_subagent_tools_can_be_left_out(tmp_path: Path) -> None:
    """`Runtime.open(tools=..., subagent_tools=False)` and `create_agent(tools=...)` decide what each agent has."""

    def shared() -> str:
        """Shared."""
        return "s"

    def own() -> str:
        """Own."""
        return "o"

    async with Runtime.open(
        Config(home=tmp_path / "home"), model=scripted([{"text": "a"}]), tools=[shared], subagent_tools=False
    ) as rt:
        assert rt.tools.names() == ("shared",)
        first = await rt.create_agent(tools=[own])
        second = await rt.create_agent()
        assert first.tools.names() == ("own", "shared")
        assert second.tools.names() == ("shared",)
        with pytest.raises(ToolError):
            await rt.create_agent(tools=[tool(own, name="shared")])


def test_the_worked_example_of_docs_tools_runs() -> None:
    """The function-tool example in docs/tools.md runs as written."""
    import re

    page = (Path(__file__).resolve().parents[2] / "docs" / "tools.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.DOTALL)
    assert blocks
    for block in blocks:
        exec(compile(block, "docs/tools.md", "exec"), {"__name__": "docs_tools_example"})
