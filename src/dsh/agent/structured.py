"""Structured output: an agent that must finish by calling `structured_output` with a valid object.

Layer: agent. `StructuredOutput(schema)` is the `structured_output` tool, whose parameters are the
schema itself; put it in one agent's own tool registry and `bind` it to that agent, which adds a
completion guard (docs/agent.md#structured-output).
The contract follows the TypeScript harness's in-process subagent driver:

* a call whose arguments the schema refuses (checked with `jsonschema`, the schema's own draft) is
  an errored result, `STRUCTURED_OUTPUT_INVALID`, listing every violation with its JSON path, so
  the model can correct itself in its next step;
* a valid call is recorded (`Structured output recorded.`, output `{recorded: true}`) and concludes
  the turn: no further model request, and any later call of the same step is not run;
* an answer without the call gets a reminder and another step;
* each invalid call and each reminder uses one of `max_attempts`; when they are spent the turn ends
  with `turn/end {kind: "error", error: {code: "STRUCTURED_OUTPUT_MISSING"}}`.

The validated object is `StructuredOutput.value`; the subagent runtime hands it to the parent and
`Runtime.run(..., output_schema=...)` returns it as `TurnResult.structured`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, cast

from pydantic import RootModel

from dsh.agent.errors import ToolError
from dsh.agent.messages import text
from dsh.agent.tools import ToolContext

if TYPE_CHECKING:
    from dsh.agent.loop import Agent

__all__ = [
    "STRUCTURED_OUTPUT_INSTRUCTION",
    "STRUCTURED_OUTPUT_TOOL",
    "StructuredOutput",
    "check_output_schema",
]

STRUCTURED_OUTPUT_TOOL: Final = "structured_output"
"""The name of the tool an agent with an output schema must finish through."""

STRUCTURED_OUTPUT_INSTRUCTION: Final = (
    f"When your answer is complete, report it by calling the `{STRUCTURED_OUTPUT_TOOL}` tool once, with "
    "arguments that match its parameter schema exactly. A plain text answer does not count as your result: "
    "only that tool call does."
)
"""The system-prompt section of an agent with an output schema."""

_DESCRIPTION: Final = (
    "Report your final result as structured data. Call this exactly once, when your answer is complete; "
    "the arguments must match this tool's parameter schema exactly."
)
_REMINDER: Final = (
    f"You have not reported your result yet. Call the `{STRUCTURED_OUTPUT_TOOL}` tool with arguments that match "
    "its parameter schema; a plain text answer does not count."
)
_MAX_VIOLATIONS: Final = 20


def check_output_schema(schema: object) -> Mapping[str, Any]:
    """`schema` when it is a usable output schema: a JSON Schema object whose `type` is `"object"`.

    Raises:
        ValueError: Not an object-rooted schema, or a schema `jsonschema` finds invalid.
    """
    import jsonschema

    if not isinstance(schema, Mapping) or schema.get("type") != "object":
        raise ValueError('an output schema must be a JSON Schema object whose type is "object"')
    try:
        jsonschema.validators.validator_for(schema).check_schema(dict(schema))
    except jsonschema.SchemaError as error:
        raise ValueError(f"invalid output schema: {error.message}") from None
    return schema


class _AnyArguments(RootModel[Any]):
    """The arguments as sent: the schema, not pydantic, decides whether they are valid."""


class StructuredOutput:
    """The `structured_output` tool of one agent, and what it captured.

    Args:
        schema: The object-rooted JSON Schema the result must match.
        max_attempts: Invalid calls plus reminders allowed before the turn ends with
            `STRUCTURED_OUTPUT_MISSING`.

    Attributes:
        value: The validated object once a call was accepted, else None.
        attempts: Invalid calls and reminders so far.
    """

    name: Final = STRUCTURED_OUTPUT_TOOL
    description: Final = _DESCRIPTION
    args_model: Final = _AnyArguments
    output_schema: Final[Mapping[str, Any]] = {
        "type": "object",
        "properties": {"recorded": {"type": "boolean", "const": True}},
        "required": ["recorded"],
        "additionalProperties": False,
    }

    def __init__(self, schema: Mapping[str, Any], *, max_attempts: int = 3) -> None:
        import jsonschema

        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.parameters: Mapping[str, Any] = check_output_schema(schema)
        self.max_attempts = max_attempts
        self.value: Any = None
        self.captured = False
        self.attempts = 0
        self.last_problem: str | None = None
        self._validator = jsonschema.validators.validator_for(schema)(schema)
        self._agent: Agent | None = None

    def __repr__(self) -> str:
        return f"StructuredOutput(captured={self.captured}, attempts={self.attempts}/{self.max_attempts})"

    def problems(self, value: object) -> list[str]:
        """Every way `value` violates the schema, as `<json path>: <message>` (empty when it is valid)."""
        found = sorted(self._validator.iter_errors(cast(Any, value)), key=lambda error: list(error.absolute_path))
        return [f"{error.json_path}: {error.message}" for error in found[:_MAX_VIOLATIONS]]

    async def execute(self, args: Any, ctx: ToolContext) -> object:
        """Validate the arguments; record them and conclude the turn, or raise what is wrong.

        Raises:
            ToolError: `STRUCTURED_OUTPUT_INVALID` naming every violation and the attempts left.
        """
        value = args.root if isinstance(args, _AnyArguments) else args
        problems = self.problems(value)
        if problems:
            self.attempts += 1
            self.last_problem = "; ".join(problems)
            left = self.max_attempts - self.attempts
            tail = f"{left} attempt(s) left" if left > 0 else "no attempts left"
            if left <= 0 and self._agent is not None:
                self._agent.conclude_turn({"kind": "error", "error": self._exhausted()})
            raise ToolError(
                f"the result does not match the output schema ({tail}): " + "; ".join(problems),
                code="STRUCTURED_OUTPUT_INVALID",
                name=self.name,
            )
        self.value = value
        self.captured = True
        if self._agent is not None:
            self._agent.conclude_turn()
        return {"recorded": True}

    def render(self, args: Any, output: object) -> list[dict[str, Any]]:
        """`Structured output recorded.`"""
        return [text("Structured output recorded.")]

    def bind(self, agent: Agent) -> Callable[[], None]:
        """Enforce the contract on `agent`, whose tool registry holds this tool; returns an unbinder.

        The tool concludes `agent`'s turn on a valid call, and a completion guard reminds (or stops)
        an agent that answers without it. The registry is the caller's to build: a registry shared by
        other agents must never get this tool.
        """
        if agent.tools.get(self.name) is not self:
            raise ValueError(f"the agent's tool registry does not hold this {self.name} tool")
        self._agent = agent
        remove_guard = agent.add_completion_guard(self._guard)

        def unbind() -> None:
            remove_guard()
            self._agent = None

        return unbind

    def _guard(self, agent: Agent, turn: int) -> Mapping[str, Any] | str | None:
        if self.captured:
            return None
        self.attempts += 1
        self.last_problem = f"the answer did not call {STRUCTURED_OUTPUT_TOOL}"
        if self.attempts >= self.max_attempts:
            return self._exhausted()
        return _REMINDER

    def _exhausted(self) -> dict[str, Any]:
        tries = f"{self.attempts} attempt(s)"
        message = f"no valid {STRUCTURED_OUTPUT_TOOL} call after {tries}; last problem: {self.last_problem}"
        return {"code": "STRUCTURED_OUTPUT_MISSING", "message": message}
