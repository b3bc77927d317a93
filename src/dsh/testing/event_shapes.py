"""The data shapes the TypeScript harness declares for its events, and a check of logs against them.

Layer: testing (shipped). Every log pydsh writes must stay readable by the harness: each event is of a
type its vocabulary knows (`KNOWN_EVENT_TYPES`) with the data shape it declares for that type, or it
carries the envelope's `ignorable` marker. The shapes below restate the harness's declarations (its
`SessionEventMap` entries and the message, block and usage types they use) as `TypedDict`s that
pydantic checks strictly: a wrong type, a missing required key or a value outside a closed
vocabulary is a problem. Shapes of small log-only records (approvals, permission knobs, request
headers) are closed, so an unknown key is a problem too; message and content shapes stay open,
as the harness's interfaces are. A known type without a shape here is reported as well, so a test
that writes a new type has to say what it looks like.

    from dsh.testing.event_shapes import assert_harness_shapes

    assert_harness_shapes(session.events)      # raises AssertionError listing every problem
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any, Final, Literal, NotRequired

import orjson
from pydantic import ConfigDict, TypeAdapter, ValidationError, with_config
from typing_extensions import TypedDict

from dsh.session.events import KNOWN_EVENT_TYPES

__all__ = ["EVENT_SHAPES", "assert_harness_shapes", "event_problems", "log_problems"]

_OPEN: Final = ConfigDict(extra="allow", strict=True)
_CLOSED: Final = ConfigDict(extra="forbid", strict=True)


# ---------------------------------------------------------------- content and messages


@with_config(_OPEN)
class _Block(TypedDict):
    """Any content block: a `type`; the known ones are checked through `_KnownBlock`."""

    type: str


@with_config(_OPEN)
class _TextBlock(TypedDict):
    type: Literal["text", "reasoning"]
    text: str


@with_config(_OPEN)
class _ToolCallBlock(TypedDict):
    type: Literal["tool-call"]
    id: str
    name: str
    arguments: str


@with_config(_OPEN)
class _ToolResultBlock(TypedDict):
    type: Literal["tool-result"]
    toolCallId: str
    content: list[_Block]
    isError: NotRequired[bool]


@with_config(_OPEN)
class _Source(TypedDict):
    kind: str


@with_config(_OPEN)
class _ModelSource(TypedDict):
    kind: Literal["model"]
    provider: str
    model: str


@with_config(_OPEN)
class _ToolSource(TypedDict):
    kind: Literal["tool"]
    callId: str


@with_config(_OPEN)
class _UserMessage(TypedDict):
    id: str
    role: Literal["user"]
    content: list[_Block]
    source: _Source


@with_config(_OPEN)
class _AssistantMessage(TypedDict):
    id: str
    role: Literal["assistant"]
    content: list[_Block]
    source: _ModelSource


@with_config(_OPEN)
class _ToolResultMessage(TypedDict):
    id: str
    role: Literal["user"]
    content: list[_ToolResultBlock]
    source: _ToolSource


@with_config(_CLOSED)
class _TokenUsage(TypedDict):
    inputTokens: int
    outputTokens: int
    cacheReadTokens: NotRequired[int]
    cacheWriteTokens: NotRequired[int]
    reasoningTokens: NotRequired[int]


# ---------------------------------------------------------------- turns and steps


@with_config(_CLOSED)
class _TurnStart(TypedDict):
    turn: int


@with_config(_OPEN)
class _Reason(TypedDict):
    kind: Literal["completed", "aborted", "blocked", "error", "max-tokens", "interrupted"]


@with_config(_CLOSED)
class _TurnEnd(TypedDict):
    turn: int
    reason: _Reason


@with_config(_CLOSED)
class _Step(TypedDict):
    turn: int
    step: int


@with_config(_OPEN)
class _Chunk(TypedDict):
    type: str


@with_config(_CLOSED)
class _AssistantChunk(TypedDict):
    turn: int
    step: int
    chunk: _Chunk


@with_config(_CLOSED)
class _AssistantMessageData(TypedDict):
    turn: int
    step: int
    message: _AssistantMessage
    usage: NotRequired[_TokenUsage]
    interrupted: NotRequired[Literal[True]]


@with_config(_CLOSED)
class _ToolCall(TypedDict):
    turn: int
    step: int
    callId: str
    name: str
    arguments: str


@with_config(_CLOSED)
class _ErrorIdentity(TypedDict):
    name: str
    code: str


@with_config(_CLOSED)
class _ToolResult(TypedDict):
    turn: int
    step: int
    message: _ToolResultMessage
    error: NotRequired[_ErrorIdentity]
    meta: NotRequired[Any]


# ---------------------------------------------------------------- requests


@with_config(_CLOSED)
class _CallConfig(TypedDict):
    provider: str
    model: str
    reasoningEffort: NotRequired[str]
    temperature: NotRequired[float]
    maxTokens: NotRequired[int]
    stop: NotRequired[list[str]]


@with_config(_CLOSED)
class _ToolSchema(TypedDict):
    name: str
    description: str
    parameters: dict[str, Any]


@with_config(_CLOSED)
class _AdapterDefaults(TypedDict):
    reasoningEffort: NotRequired[Literal[True]]
    maxTokens: NotRequired[Literal[True]]


@with_config(_CLOSED)
class _EpochHeader(TypedDict):
    config: _CallConfig
    adapterDefaults: NotRequired[_AdapterDefaults]
    system: NotRequired[str]
    tools: NotRequired[list[_ToolSchema]]


@with_config(_CLOSED)
class _RequestHeader(TypedDict):
    header: _EpochHeader
    reason: Literal["initial", "resume", "change"]


@with_config(_CLOSED)
class _RequestContext(TypedDict):
    provider: str
    model: str
    contextWindow: NotRequired[int]


# ---------------------------------------------------------------- model-request retries


@with_config(_CLOSED)
class _LlmFailure(TypedDict):
    message: str
    code: str
    status: NotRequired[int]
    providerRetryAfterMs: NotRequired[int | float]
    requestId: NotRequired[str]


@with_config(_CLOSED)
class _LlmRetry(TypedDict):
    retryId: str
    turn: int
    step: int
    provider: str
    mode: Literal["normal"]
    policyKey: str
    retry: int
    maxRetries: int
    delayMs: int | float
    failure: _LlmFailure


@with_config(_CLOSED)
class _LlmRetryStarted(TypedDict):
    retryId: str
    turn: int
    step: int
    retry: int


# ---------------------------------------------------------------- approvals and permissions


@with_config(_CLOSED)
class _ApprovalAsked(TypedDict):
    id: str
    toolName: str
    callId: NotRequired[str]
    reason: NotRequired[str]


@with_config(_CLOSED)
class _ApprovalDecided(TypedDict):
    id: str
    outcome: Literal["allowed-once", "rejected", "cancelled", "unavailable"]


@with_config(_CLOSED)
class _ApprovalPolicy(TypedDict):
    policy: Literal["ask", "never"]
    source: NotRequired[Literal["delegation"]]


@with_config(_CLOSED)
class _SandboxMode(TypedDict):
    mode: Literal["read-only", "workspace-write", "danger-full-access"]
    source: NotRequired[Literal["delegation"]]


@with_config(_CLOSED)
class _PermissionPreset(TypedDict):
    preset: str


# ---------------------------------------------------------------- subagents and seeds


@with_config(_OPEN)
class _SubagentDescriptor(TypedDict):
    version: int
    mode: Literal["one-shot", "continuable"]
    provider: str
    label: NotRequired[str]
    agentProvider: NotRequired[str]
    agentModel: NotRequired[str]
    persona: NotRequired[str]


@with_config(_CLOSED)
class _EndSeed(TypedDict):
    pass


# ---------------------------------------------------------------- compaction and titles


@with_config(_CLOSED)
class _SeqRange(TypedDict):
    start: int
    end: int


@with_config(_CLOSED)
class _CompactionStart(TypedDict):
    compactionId: str
    sourceCommandId: NotRequired[str]
    turn: int | None


@with_config(_CLOSED)
class _CompactionSummary(TypedDict):
    compactionId: str
    sourceCommandId: NotRequired[str]
    summary: list[_TextBlock]
    rawOutput: NotRequired[list[_Block]]
    llmStreamCall: NotRequired[Literal[True]]
    shadowedRange: _SeqRange
    shadowedSeqs: list[int]
    shadowedTokenCount: int
    provider: str
    model: str
    maxTokens: NotRequired[int]
    usage: NotRequired[_TokenUsage]


@with_config(_CLOSED)
class _CompactionEnd(TypedDict):
    compactionId: str
    sourceCommandId: NotRequired[str]
    turn: int | None
    error: NotRequired[str]


@with_config(_CLOSED)
class _CompactionPrune(TypedDict):
    shadowedRange: _SeqRange
    shadowedSeqs: list[int]
    shadowedTokenCount: int


@with_config(_CLOSED)
class _Route(TypedDict):
    provider: str
    model: str


@with_config(_CLOSED)
class _TitleSource(TypedDict):
    kind: Literal["fallback", "provider", "user"]
    provider: NotRequired[str]
    model: NotRequired[_Route]


@with_config(_CLOSED)
class _SessionTitle(TypedDict):
    title: str
    messageSeqs: list[int]
    source: _TitleSource


@with_config(_CLOSED)
class _TitleLlmRequest(TypedDict):
    titleProvider: str
    messageSeqs: list[int]
    route: _Route
    system: str
    messages: list[_UserMessage]
    maxTokens: int


EVENT_SHAPES: Final[Mapping[str, Any]] = {
    "turn/start": _TurnStart,
    "turn/end": _TurnEnd,
    "step/start": _Step,
    "step/end": _Step,
    "user/message": _UserMessage,
    "assistant/chunk": _AssistantChunk,
    "assistant/message": _AssistantMessageData,
    "tool/call": _ToolCall,
    "tool/result": _ToolResult,
    "request/header": _RequestHeader,
    "request/context": _RequestContext,
    "llm/retry": _LlmRetry,
    "llm/retry-started": _LlmRetryStarted,
    "approval/asked": _ApprovalAsked,
    "approval/decided": _ApprovalDecided,
    "approval/policy": _ApprovalPolicy,
    "sandbox/mode": _SandboxMode,
    "permission/preset": _PermissionPreset,
    "subagent/descriptor": _SubagentDescriptor,
    "session/end-seed": _EndSeed,
    "compaction/start": _CompactionStart,
    "compaction/summary": _CompactionSummary,
    "compaction/end": _CompactionEnd,
    "compaction/prune": _CompactionPrune,
    "session/title": _SessionTitle,
    "session/title-llm-request": _TitleLlmRequest,
}
"""Event type → the `TypedDict` of its data, for every harness type pydsh writes."""

_KNOWN_BLOCKS: Final[Mapping[str, Any]] = {
    "text": _TextBlock,
    "reasoning": _TextBlock,
    "tool-call": _ToolCallBlock,
    "tool-result": _ToolResultBlock,
}


@functools.cache
def _adapter(shape: Any) -> TypeAdapter[Any]:
    return TypeAdapter(shape)


def _plain(value: Any) -> Any:
    """Plain dicts and lists (the frozen and lazy containers of stored events become JSON and back)."""
    return orjson.loads(orjson.dumps(value))


def _blocks(value: Any) -> Iterable[Mapping[str, Any]]:
    """Every content block nested in an event's data (message content and tool-result content)."""
    if isinstance(value, dict):
        if isinstance(value.get("type"), str) and value["type"] in _KNOWN_BLOCKS:
            yield value
        for item in value.values():
            yield from _blocks(item)
    elif isinstance(value, list):
        for item in value:
            yield from _blocks(item)


def event_problems(event: Mapping[str, Any]) -> list[str]:
    """What is wrong with one event (its envelope type and its data); `[]` when the harness can read it."""
    kind = event.get("type")
    seq = event.get("seq")
    where = f"event {seq} ({kind})"
    if event.get("ignorable") is True:
        return []
    if kind not in KNOWN_EVENT_TYPES:
        return [f"{where}: not a type of the harness's vocabulary, and not marked ignorable"]
    shape = EVENT_SHAPES.get(str(kind))
    if shape is None:
        return [f"{where}: no shape is declared here for this harness type"]
    data = _plain(event.get("data"))
    problems: list[str] = []
    try:
        _adapter(shape).validate_python(data)
    except ValidationError as error:
        for item in error.errors(include_url=False):
            path = ".".join(str(part) for part in item["loc"]) or "data"
            problems.append(f"{where}: {path}: {item['msg']}")
    if kind in ("user/message", "assistant/message", "tool/result"):
        for block in _blocks(data):
            try:
                _adapter(_KNOWN_BLOCKS[block["type"]]).validate_python(block)
            except ValidationError as error:
                for item in error.errors(include_url=False):
                    path = ".".join(str(part) for part in item["loc"]) or "block"
                    problems.append(f"{where}: {block['type']} block: {path}: {item['msg']}")
    return problems


def log_problems(events: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every problem of every event, in log order."""
    return [problem for event in events for problem in event_problems(event)]


def assert_harness_shapes(events: Iterable[Mapping[str, Any]]) -> None:
    """Raise `AssertionError` listing every event the harness could not read as it is."""
    problems = log_problems(events)
    if problems:
        raise AssertionError("events outside the harness's shapes:\n" + "\n".join(problems))
