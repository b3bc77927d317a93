"""The model-visible contract of the default tools: the golden schema file, pinned phrases, argument models.

What the model is shown — names, descriptions, parameter schemas — is frozen by
`tests/golden/tool_schemas.json` (rewritten with `DSH_SNAPSHOT=refresh`), and each argument model
is checked against its literal parameters schema on a table of valid and invalid inputs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from dsh.agent.tools import Tool, ToolRegistry
from dsh.config import Config, SubagentConfig
from dsh.runtime import Runtime
from dsh.tools import AgentTool, default_tools
from tests.agent.helpers import open_runtime, script
from tests.tools.helpers import GOLDEN, assert_golden, schema_accepts

DEFAULT_NAMES = ["agent", "interrupt_agent", "list_agents", "send_message"]


def _schemas_text(registry: ToolRegistry) -> str:
    return json.dumps(registry.schemas(), indent=2, ensure_ascii=False) + "\n"


async def test_the_default_registry_matches_the_golden_schema_file(tmp_path: Path) -> None:
    """A runtime's default tool schemas are byte-equal to `tests/golden/tool_schemas.json`."""
    async with open_runtime(tmp_path, script([])) as rt:
        assert rt.tools.names() == tuple(DEFAULT_NAMES)
        assert_golden(GOLDEN / "tool_schemas.json", _schemas_text(rt.tools))


def test_the_workspace_tools_match_their_golden_schema_file(tmp_path: Path) -> None:
    """The six workspace tools' names, descriptions and parameters are byte-equal to their golden file."""
    from dsh.tools.workspace import WORKSPACE_TOOL_NAMES, workspace_tools

    registry = ToolRegistry(workspace_tools(tmp_path))
    assert registry.names() == WORKSPACE_TOOL_NAMES
    assert_golden(GOLDEN / "workspace_tool_schemas.json", _schemas_text(registry))
    for entry in registry.schemas():
        for prop in entry["parameters"]["properties"].values():
            assert list(prop) == [key for key in ("type", "description", "enum") if key in prop]
    bash = registry.get("bash")
    assert bash is not None
    assert "Background execution is not available; long-running commands must finish within the timeout." in (
        bash.description
    )


def test_runtime_tools_extend_the_default_set() -> None:
    """Tools passed to `Runtime.open` are offered next to the four default tools, not instead of them."""
    from tests.agent.helpers import EchoTool

    rt = Runtime.open(Config(database_url="memory:"), tools=[EchoTool()])
    assert rt.tools.names() == ("agent", "echo", "interrupt_agent", "list_agents", "send_message")


def test_schema_entries_keep_the_documented_key_order(tools: dict[str, Tool]) -> None:
    """Entries are `{name, description, parameters}`; properties order type, description, enum; no empty `required`."""
    for entry in ToolRegistry(list(tools.values())).schemas():
        assert list(entry) == ["name", "description", "parameters"]
        parameters = entry["parameters"]
        assert parameters["type"] == "object"
        assert parameters.get("required", None) != []
        for prop in parameters["properties"].values():
            order = [key for key in ("type", "description", "enum") if key in prop]
            assert list(prop) == order
    assert "required" not in tools["list_agents"].parameters


def test_list_agents_description_holds_the_pinned_phrases(tools: dict[str, Tool]) -> None:
    """The `list_agents` description names both sibling tools, promises the finish notice and calls ready resumable."""
    description = tools["list_agents"].description
    for phrase in ("send_message", "interrupt_agent", "you are told when one finishes", "resumable, not terminal"):
        assert phrase in description


def test_send_message_description_says_next_turn_and_never_mentions_jobs(tools: dict[str, Tool]) -> None:
    """The `send_message` description says the message becomes the next turn and speaks of no job ids or job output."""
    description = tools["send_message"].description
    assert "next turn" in description
    assert "job_output" not in description
    assert "job id" not in description


def test_interrupt_agent_description_names_the_current_turn_and_send_message(tools: dict[str, Tool]) -> None:
    """The `interrupt_agent` description says only the current turn stops and queued work waits for send_message."""
    description = tools["interrupt_agent"].description
    assert "current turn" in description
    assert "send_message" in description


def test_agent_tool_parameters_and_description_are_the_pinned_texts(tools: dict[str, Tool]) -> None:
    """The delegation tool's parameter texts, `required` list and description are exactly the pinned ones."""
    tool = tools["agent"]
    properties = tool.parameters["properties"]
    assert properties["description"] == {
        "type": "string",
        "description": "A short (3-5 word) label for the task, shown to the user and in list_agents.",
    }
    assert properties["prompt"]["description"] == (
        "The complete, self-contained task. The subagent does not see this conversation, "
        "so include everything it needs."
    )
    assert properties["run_in_background"] == {
        "type": "boolean",
        "description": "Start a continuable background subagent and return its id at once instead of waiting for "
        "its final answer. Defaults to false.",
    }
    assert tool.parameters["required"] == ["description", "prompt"]
    assert tool.description.startswith("Delegate a self-contained task to a subagent: a separate agent")
    assert tool.description.endswith("Use list_agents to recall the background subagents you started.")


def test_default_tools_take_the_depth_cap_and_provider() -> None:
    """`default_tools` builds `agent` with the configured depth cap (default 3) and the given provider."""
    default = default_tools()[0]
    assert isinstance(default, AgentTool)
    assert (default.max_depth, default.provider) == (3, "spawn")
    custom = default_tools(SubagentConfig(max_depth=1), provider="fork")[0]
    assert isinstance(custom, AgentTool)
    assert (custom.max_depth, custom.provider) == (1, "fork")
    with pytest.raises(ValueError, match="maxDepth must be a non-negative"):
        AgentTool(max_depth=-1)


# (tool, arguments, valid): each row must be judged the same by the parameters schema and the model.
ARGUMENT_TABLE: list[tuple[str, Any, bool]] = [
    ("list_agents", {}, True),
    ("list_agents", {"scope": "children"}, True),
    ("list_agents", {"scope": "descendants"}, True),
    ("list_agents", {"scope": "descendants", "extra": 1}, True),
    ("list_agents", {"scope": "everyone"}, False),
    ("list_agents", {"scope": None}, False),
    ("list_agents", {"scope": 1}, False),
    ("list_agents", [], False),
    ("list_agents", "children", False),
    ("send_message", {"subagent_id": "c1", "message": "more"}, True),
    ("send_message", {"subagent_id": "c1", "message": "", "note": "ignored"}, True),
    ("send_message", {"subagent_id": "c1"}, False),
    ("send_message", {"message": "more"}, False),
    ("send_message", {"subagent_id": 7, "message": "more"}, False),
    ("send_message", {"subagent_id": "c1", "message": ["more"]}, False),
    ("send_message", {"subagent_id": None, "message": "more"}, False),
    ("interrupt_agent", {"agent_id": "c1"}, True),
    ("interrupt_agent", {"agent_id": "c1", "why": "stuck"}, True),
    ("interrupt_agent", {}, False),
    ("interrupt_agent", {"agent_id": 3}, False),
    ("interrupt_agent", {"agent_id": None}, False),
    ("agent", {"description": "Draft outline", "prompt": "Outline it."}, True),
    ("agent", {"description": "Draft outline", "prompt": "Outline it.", "run_in_background": True}, True),
    ("agent", {"description": "Draft outline", "prompt": "Outline it.", "run_in_background": False}, True),
    ("agent", {"description": "Draft outline", "prompt": "Outline it.", "model": "x"}, True),
    ("agent", {"description": "Draft outline"}, False),
    ("agent", {"prompt": "Outline it."}, False),
    ("agent", {"description": 5, "prompt": "Outline it."}, False),
    ("agent", {"description": "Draft outline", "prompt": None}, False),
    ("agent", {"description": "Draft outline", "prompt": "Outline it.", "run_in_background": None}, False),
    ("agent", {"description": "Draft outline", "prompt": "Outline it.", "run_in_background": [True]}, False),
]


def _model_accepts(tool: Tool, arguments: Any) -> bool:
    try:
        tool.args_model.model_validate(arguments)
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize(("name", "arguments", "valid"), ARGUMENT_TABLE)
def test_argument_model_agrees_with_the_parameters_schema(
    tools: dict[str, Tool], name: str, arguments: Any, valid: bool
) -> None:
    """The pydantic argument model and the model-visible parameters schema accept and refuse the same inputs."""
    tool = tools[name]
    assert schema_accepts(tool.parameters, arguments) is valid
    assert _model_accepts(tool, arguments) is valid


def test_every_tool_is_covered_by_the_argument_table(tools: dict[str, Tool]) -> None:
    """The table has at least one valid and one invalid input for every default tool."""
    for name in tools:
        judged = {valid for tool, _, valid in ARGUMENT_TABLE if tool == name}
        assert judged == {True, False}, name


@pytest.mark.parametrize("flag", ["true", 1, "yes"])
def test_the_argument_model_is_lax_about_a_boolean_spelled_loosely(tools: dict[str, Tool], flag: Any) -> None:
    """Lax mode: a boolean spelled as a string or a number is read, although the schema asks for true/false."""
    arguments = {"description": "Draft outline", "prompt": "Outline it.", "run_in_background": flag}
    assert schema_accepts(tools["agent"].parameters, arguments) is False
    assert tools["agent"].args_model.model_validate(arguments).run_in_background is True  # type: ignore[attr-defined]


def test_omitted_optional_arguments_take_their_defaults(tools: dict[str, Tool]) -> None:
    """`scope` defaults to children and `run_in_background` to false."""
    assert tools["list_agents"].args_model.model_validate({}).scope == "children"  # type: ignore[attr-defined]
    parsed = tools["agent"].args_model.model_validate({"description": "d", "prompt": "p"})
    assert parsed.run_in_background is False  # type: ignore[attr-defined]
