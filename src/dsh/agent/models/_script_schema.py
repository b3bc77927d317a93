"""The validated shape of a model script, for `ScriptedModelClient`.

Layer: agent (an edge: pydantic checks a hand-written file once, at load). The models mirror the
script format of docs/agent.md#scripted-model field by field: the file's camelCase keys are the
aliases, types are strict (a `"2"` is not a turn number, `true` is not a count) and unknown keys are
refused, so a typo fails at load with its JSON path instead of silently never matching.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from dsh.agent.errors import ModelError

__all__ = [
    "ModelScript",
    "ScriptAgent",
    "ScriptError",
    "ScriptMatch",
    "ScriptResponse",
    "ScriptToolCall",
    "ScriptUsage",
    "validation_message",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, alias_generator=to_camel)


class ScriptMatch(_Strict):
    """Conditions a request must meet; every given key must hold."""

    last_user: str | None = None
    last_tool_result: str | None = None
    source: str | None = None
    turn: int | None = None
    tools: list[str] | None = None


class ScriptToolCall(_Strict):
    """One tool call the scripted model asks for."""

    id: str | None = Field(default=None, min_length=1)
    name: str = Field(min_length=1)
    arguments: Any = Field(default_factory=dict)

    @field_validator("arguments")
    @classmethod
    def _object_or_string(cls, value: Any) -> Any:
        # Checked by hand rather than as a `dict | str` union: a union's error paths carry the
        # member names, and the path in a SCRIPT_INVALID message must be the file's own path.
        if not isinstance(value, dict | str):
            raise ValueError("arguments must be an object or a string")
        try:
            # A YAML script can hold values JSON has no form for (dates, sets); refuse them at load.
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise ValueError(f"arguments must be plain JSON: {e}") from e
        return value


class ScriptUsage(_Strict):
    """The token usage a response reports, in disjoint counts (docs/agent.md#token-usage)."""

    input_tokens: int = Field(ge=0)
    output_tokens: int = Field(ge=0)
    cache_read_tokens: int | None = Field(default=None, ge=0)
    cache_write_tokens: int | None = Field(default=None, ge=0)
    reasoning_tokens: int | None = Field(default=None, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _no_inclusive_cache_count(cls, value: Any) -> Any:
        # The older spelling counted cached input inside `inputTokens`; guessing which one a script
        # means would skew every total, so it is refused with the replacement.
        if isinstance(value, dict) and "cachedInputTokens" in value:
            raise ValueError(
                "cachedInputTokens is no longer a usage field: give cached input as cacheReadTokens "
                "and only the uncached input as inputTokens"
            )
        return value


class ScriptError(_Strict):
    """A simulated model failure: the stream raises `ModelError(message, code=code)`."""

    code: str
    message: str

    @field_validator("code")
    @classmethod
    def _model_code(cls, value: str) -> str:
        # Only the codes a real endpoint produces: a script must not fake its own SCRIPT_* failures.
        if not value.startswith("MODEL_") or value not in ModelError.codes:
            known = ", ".join(sorted(code for code in ModelError.codes if code.startswith("MODEL_")))
            raise ValueError(f"error code must be one of {known}, got {value!r}")
        return value


class ScriptResponse(_Strict):
    """One scripted answer: a step (used once) or a standing `on` entry (reusable)."""

    match: ScriptMatch | None = None
    text: str | None = None
    reasoning: str | None = None
    tool_calls: list[ScriptToolCall] = Field(default_factory=list)
    finish: Literal["stop", "tool-calls", "length", "content-filter"] | None = None
    usage: ScriptUsage | None = None
    chunk_size: int = Field(default=16, ge=1)
    error: ScriptError | None = None
    hold: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _error_streams_text_only(self) -> ScriptResponse:
        # A failing response models a broken stream: it may show partial text first, but it never
        # completes tool calls, reports usage or finishes.
        if self.error is not None and (self.tool_calls or self.finish is not None or self.usage is not None):
            raise ValueError("a response with error cannot also have toolCalls, finish or usage")
        return self


class ScriptAgent(_Strict):
    """The track of one agent key: consumed `steps` and standing `on` entries."""

    steps: list[ScriptResponse] = Field(default_factory=list)
    on: list[ScriptResponse] = Field(default_factory=list)


class ModelScript(_Strict):
    """A whole script: format version, the default model name, and one track per agent key."""

    version: Literal[1]
    model: str = Field(min_length=1)
    agents: dict[str, ScriptAgent]


def _json_path(loc: tuple[int | str, ...]) -> str:
    path = "$"
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part.isidentifier():
            path += f".{part}"
        else:
            # Agent keys are labels such as "Draft outline": bracket notation keeps the path readable.
            path += f'["{part}"]'
    return path


def validation_message(error: ValidationError, *, limit: int = 5) -> str:
    """The faults of a failed validation as `<JSON path>: <reason>` items joined by `; `."""
    items = []
    for fault in error.errors()[:limit]:
        reason = str(fault["msg"]).removeprefix("Value error, ")
        items.append(f"{_json_path(tuple(fault['loc']))}: {reason}")
    more = error.error_count() - limit
    if more > 0:
        items.append(f"and {more} more")
    return "; ".join(items)


# Shown under the name users import (docs/architecture.md#public-names).
ModelScript.__module__ = "dsh.agent.models"
