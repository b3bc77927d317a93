"""`tool`: turn a type-hinted Python function (sync or async) into a model-facing tool.

Layer: agent. The function's name is the tool's name, its docstring's summary and body the
description, and its parameters become the arguments: their JSON Schema and their validation both
come from the type hints through one pydantic model, and each parameter's description from the
docstring (`Args:` in Google style, or `:param name:` lines). A parameter annotated `ToolContext` is
filled by the loop and never shown to the model. A sync body runs in a worker thread, so it never
blocks the event loop. The return value is rendered for the model: a string as it is, anything else
(JSON values, pydantic models, dataclasses) as JSON; an exception becomes an errored result showing
its message (docs/tools.md#function-tools). The `Tool` protocol stays for tools that need more.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
import re
import typing
from collections.abc import Callable, Mapping
from typing import Any, Final, overload

import orjson

from dsh.agent.errors import ToolError
from dsh.agent.messages import text
from dsh.agent.tools import ToolContext

__all__ = ["FunctionTool", "parse_docstring", "tool"]

_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
_SECTION: Final = re.compile(
    r"^(Args|Arguments|Parameters|Params|Returns|Return|Yields|Raises|Examples|Example|Notes|Note|Attributes)\s*:\s*$"
)
_ARG_LINE: Final = re.compile(r"^(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_SPHINX_PARAM: Final = re.compile(r"^:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$")
_NO_OUTPUT: Final = "(no output)"


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """`(description, {parameter: description})` from a Google-style or Sphinx-style docstring.

    The description is the text before the first section heading (`Args:`, `Returns:`, ...) with
    `:param:` lines left out; parameter texts that continue on indented lines are joined.
    """
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    description: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    for line in lines:
        stripped = line.strip()
        heading = _SECTION.match(stripped) if not line.startswith((" ", "\t")) else None
        if heading is not None:
            section = heading.group(1)
            current = None
            continue
        sphinx = _SPHINX_PARAM.match(stripped)
        if sphinx is not None:
            current = sphinx.group(1)
            params[current] = sphinx.group(2).strip()
            continue
        if section is None:
            if current is not None and line.startswith((" ", "\t")) and stripped:
                params[current] = f"{params[current]} {stripped}".strip()
            else:
                current = None
                description.append(line)
            continue
        if section in ("Args", "Arguments", "Parameters", "Params"):
            indent = len(line) - len(line.lstrip())
            match = _ARG_LINE.match(stripped)
            if match is not None and (current is None or indent <= _arg_indent(lines, section)):
                current = match.group(1).lstrip("*")
                params[current] = match.group(2).strip()
            elif current is not None and stripped:
                params[current] = f"{params[current]} {stripped}".strip()
    return "\n".join(description).strip(), params


def _arg_indent(lines: list[str], section: str) -> int:
    """The indentation of the first entry of `section` (entries of an `Args:` block line up)."""
    inside = False
    for line in lines:
        if line.strip().rstrip(":").strip() == section and line.strip().endswith(":"):
            inside = True
            continue
        if inside and line.strip():
            return len(line) - len(line.lstrip())
    return 0


class FunctionTool:
    """A tool made from a function by `tool`; calling it calls the function.

    Attributes:
        name: The name the model calls it by.
        description: What the model is told the tool does.
        parameters: The JSON Schema of the arguments (no `title`s, no `$ref`s unless a model is recursive).
        args_model: The pydantic model arguments are validated with (unknown arguments are refused).
        output_schema: The JSON Schema of the return annotation, when there is one.
        function: The wrapped function.
    """

    def __init__(
        self, function: Callable[..., Any], *, name: str | None = None, description: str | None = None
    ) -> None:
        from pydantic import ConfigDict, Field, create_model

        if not callable(function):
            raise ToolError("tool() needs a function", code="TOOL_INVALID")
        tool_name = name if name is not None else getattr(function, "__name__", "")
        if not _NAME.fullmatch(tool_name):
            raise ToolError(
                f"invalid tool name {tool_name!r}: use 1-64 letters, digits, _ or -",
                code="TOOL_INVALID",
                name=tool_name,
            )
        summary, documented = parse_docstring(inspect.getdoc(function))
        try:
            hints = typing.get_type_hints(function, include_extras=True)
        except Exception as error:
            raise ToolError(
                f'tool "{tool_name}": its type hints cannot be resolved: {error}', code="TOOL_INVALID", name=tool_name
            ) from error
        fields: dict[str, Any] = {}
        self._context_parameter: str | None = None
        for parameter in inspect.signature(function).parameters.values():
            if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                raise ToolError(
                    f'tool "{tool_name}": *args and **kwargs cannot be tool arguments',
                    code="TOOL_INVALID",
                    name=tool_name,
                )
            if parameter.kind is inspect.Parameter.POSITIONAL_ONLY:
                raise ToolError(
                    f'tool "{tool_name}": positional-only parameter "{parameter.name}" cannot be a tool argument',
                    code="TOOL_INVALID",
                    name=tool_name,
                )
            annotation = hints.get(parameter.name, inspect.Parameter.empty)
            if _is_context(annotation):
                self._context_parameter = parameter.name
                continue
            if annotation is inspect.Parameter.empty:
                raise ToolError(
                    f'tool "{tool_name}": parameter "{parameter.name}" needs a type hint',
                    code="TOOL_INVALID",
                    name=tool_name,
                )
            default = ... if parameter.default is inspect.Parameter.empty else parameter.default
            fields[parameter.name] = (annotation, Field(default, description=documented.get(parameter.name)))
        model_name = "".join(part.capitalize() for part in re.split(r"[_-]", tool_name) if part) + "Args"
        try:
            self.args_model = create_model(model_name, __config__=ConfigDict(extra="forbid"), **fields)
            schema = self.args_model.model_json_schema()
        except Exception as error:
            raise ToolError(
                f'tool "{tool_name}": its parameters cannot be described as JSON Schema: {error}',
                code="TOOL_INVALID",
                name=tool_name,
            ) from error
        self.name = tool_name
        self.description = description if description is not None else summary
        self.parameters: Mapping[str, Any] = _clean_schema(schema)
        self.output_schema: Mapping[str, Any] | None = _output_schema(hints.get("return", inspect.Parameter.empty))
        self.function = function
        self._is_async = inspect.iscoroutinefunction(function)
        functools.update_wrapper(self, function)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the wrapped function directly."""
        return self.function(*args, **kwargs)

    def __repr__(self) -> str:
        return f"FunctionTool(name={self.name!r})"

    async def execute(self, args: Any, ctx: ToolContext) -> object:
        """Call the function with the validated arguments (and `ctx` where it asks for it).

        A sync function runs in a worker thread. The result is returned as JSON (a string stays a string).
        """
        values = {name: getattr(args, name) for name in type(args).model_fields}
        if self._context_parameter is not None:
            values[self._context_parameter] = ctx
        if self._is_async:
            result = await self.function(**values)
        else:
            result = await asyncio.to_thread(self.function, **values)
        return _jsonable(result)

    def render(self, args: Any, output: object) -> list[dict[str, Any]]:
        """A string as it is, `(no output)` for None, anything else as JSON text."""
        if output is None:
            return [text(_NO_OUTPUT)]
        if isinstance(output, str):
            return [text(output)]
        return [text(orjson.dumps(output).decode())]


@overload
def tool(function: Callable[..., Any], /) -> FunctionTool: ...
@overload
def tool(
    *, name: str | None = None, description: str | None = None
) -> Callable[[Callable[..., Any]], FunctionTool]: ...
def tool(
    function: Callable[..., Any] | None = None, /, *, name: str | None = None, description: str | None = None
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Make a tool of a type-hinted function: `@tool` or `@tool(name=..., description=...)`.

    Raises:
        ToolError: `TOOL_INVALID` when a parameter has no type hint, is `*args`/`**kwargs` or
            positional-only, a hint cannot be described as JSON Schema, or the name is unusable.
    """
    if function is not None:
        return FunctionTool(function, name=name, description=description)
    return lambda inner: FunctionTool(inner, name=name, description=description)


# ---------------------------------------------------------------- schemas and values


def _is_context(annotation: object) -> bool:
    """`ToolContext`, or `ToolContext | None` (a function that also runs outside a tool call)."""
    if annotation is ToolContext:
        return True
    arguments = typing.get_args(annotation)
    return ToolContext in arguments and all(item in (ToolContext, type(None)) for item in arguments)


def _clean_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The model-visible schema: `title`s dropped, `$ref`s to non-recursive definitions inlined."""
    definitions: Mapping[str, Any] = schema.get("$defs", {})
    recursive = {name for name in definitions if _refers_to(definitions, name, name, set())}

    def walk(node: Any, trail: frozenset[str]) -> Any:
        if isinstance(node, list):
            return [walk(item, trail) for item in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            target = ref.removeprefix("#/$defs/")
            if target not in recursive and target not in trail and target in definitions:
                merged = {**copy.deepcopy(definitions[target]), **{k: v for k, v in node.items() if k != "$ref"}}
                return walk(merged, trail | {target})
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in ("title", "$defs"):
                continue
            if key == "properties" and isinstance(value, dict):
                out[key] = {name: walk(item, trail) for name, item in value.items()}
            else:
                out[key] = walk(value, trail)
        return out

    cleaned: dict[str, Any] = walk(dict(schema), frozenset())
    if recursive:
        cleaned["$defs"] = {name: walk(definitions[name], frozenset()) for name in sorted(recursive)}
    cleaned.setdefault("properties", {})
    return cleaned


def _refers_to(definitions: Mapping[str, Any], start: str, target: str, seen: set[str]) -> bool:
    """Whether definition `start` reaches `target` through `$ref`s."""
    found: list[str] = []

    def collect(node: Any) -> None:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                found.append(ref.removeprefix("#/$defs/"))
            for value in node.values():
                collect(value)
        elif isinstance(node, list):
            for value in node:
                collect(value)

    collect(definitions.get(start, {}))
    for name in found:
        if name == target:
            return True
        if name not in seen:
            seen.add(name)
            if _refers_to(definitions, name, target, seen):
                return True
    return False


def _output_schema(annotation: object) -> Mapping[str, Any] | None:
    if annotation is inspect.Parameter.empty or annotation is None or annotation is type(None):
        return None
    from pydantic import TypeAdapter

    try:
        adapter: TypeAdapter[Any] = TypeAdapter(annotation)  # type: ignore[arg-type]
        return _clean_schema(adapter.json_schema(mode="serialization"))
    except Exception:
        return None  # an output schema is informative only: a type pydantic cannot describe has none


def _jsonable(value: object) -> object:
    """The JSON form of a return value: pydantic models, dataclasses, paths, dates ... converted."""
    if value is None or isinstance(value, str | bool | int | float):
        return value
    from pydantic_core import to_jsonable_python

    try:
        return to_jsonable_python(value)
    except Exception:
        return str(value)
