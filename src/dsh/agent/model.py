"""The model-client contract: requests, streamed chunks and the `ModelClient` protocol.

Layer: agent. A model client turns one `ModelRequest` into a stream of `ModelChunk`s; it never
builds messages (the loop's `MessageAssembler` does, docs/agent.md#model-clients). Chunks use the
upstream stream vocabulary so that, when the loop logs them as `assistant/chunk` events, the log
stays readable by the TypeScript harness: `block-start`, `text-delta`, `reasoning-delta`,
`tool-call-delta`, `block-end`, `usage` and `finish`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from dsh.abort import AbortSignal

__all__ = [
    "BlockEnd",
    "BlockStart",
    "BlockType",
    "Finish",
    "FinishKind",
    "ModelChunk",
    "ModelClient",
    "ModelRequest",
    "ReasoningDelta",
    "RequestMeta",
    "RetryPolicy",
    "TextDelta",
    "ToolCallDelta",
    "Usage",
    "UsageChunk",
    "chunk_to_json",
]

BlockType = Literal["text", "reasoning", "tool-call"]
"""The content block a stream index carries."""

FinishKind = Literal["stop", "tool-calls", "length", "content-filter"]
"""Why the model stopped: answered, asked for tools, hit its output limit, or was filtered."""


@dataclass(frozen=True, slots=True)
class Usage:
    """Token accounting of one model request, in disjoint counts (docs/agent.md#token-usage).

    `input_tokens` is the uncached input only; input read from the provider's prompt cache is
    `cache_read_tokens` and input written to it `cache_write_tokens`, so the billed input is the
    sum of the three. A provider that folds cache hits into its prompt count (DeepSeek's and
    OpenAI's `prompt_tokens`) has them subtracted by its client. This is the TypeScript harness's
    `TokenUsage`, and `to_json` is its stored shape.
    """

    input_tokens: int
    output_tokens: int
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    reasoning_tokens: int | None = None

    def to_json(self) -> dict[str, int]:
        """`{inputTokens, outputTokens, cacheReadTokens?, cacheWriteTokens?, reasoningTokens?}`."""
        out = {"inputTokens": self.input_tokens, "outputTokens": self.output_tokens}
        if self.cache_read_tokens is not None:
            out["cacheReadTokens"] = self.cache_read_tokens
        if self.cache_write_tokens is not None:
            out["cacheWriteTokens"] = self.cache_write_tokens
        if self.reasoning_tokens is not None:
            out["reasoningTokens"] = self.reasoning_tokens
        return out

    @property
    def billed_input_tokens(self) -> int:
        """Every input token the request was billed for: uncached, cache reads and cache writes."""
        return self.input_tokens + (self.cache_read_tokens or 0) + (self.cache_write_tokens or 0)

    def __add__(self, other: Usage) -> Usage:
        def plus(a: int | None, b: int | None) -> int | None:
            return None if a is None and b is None else (a or 0) + (b or 0)

        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            plus(self.cache_read_tokens, other.cache_read_tokens),
            plus(self.cache_write_tokens, other.cache_write_tokens),
            plus(self.reasoning_tokens, other.reasoning_tokens),
        )


@dataclass(frozen=True, slots=True)
class BlockStart:
    """A content block opens at `index`."""

    index: int
    block_type: BlockType


@dataclass(frozen=True, slots=True)
class TextDelta:
    """More answer text for the text block at `index`."""

    index: int
    text: str


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """More reasoning text for the reasoning block at `index`."""

    index: int
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A fragment of a tool call's raw JSON arguments; the first fragment of a call carries its name."""

    index: int
    id: str
    arguments_delta: str
    name: str | None = None


@dataclass(frozen=True, slots=True)
class BlockEnd:
    """The block at `index` is complete; `block` is its final content block (authoritative)."""

    index: int
    block: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class UsageChunk:
    """The request's token usage (usually just before `Finish`)."""

    usage: Usage


@dataclass(frozen=True, slots=True)
class Finish:
    """The stream's last chunk: why the model stopped."""

    kind: FinishKind


ModelChunk = BlockStart | TextDelta | ReasoningDelta | ToolCallDelta | BlockEnd | UsageChunk | Finish
"""One streamed chunk."""


def chunk_to_json(chunk: ModelChunk) -> dict[str, Any]:
    """The upstream JSON shape of a chunk, as the `chunk` of an `assistant/chunk` event."""
    match chunk:
        case BlockStart(index, block_type):
            return {"type": "block-start", "index": index, "blockType": block_type}
        case TextDelta(index, text):
            return {"type": "text-delta", "index": index, "text": text}
        case ReasoningDelta(index, text):
            return {"type": "reasoning-delta", "index": index, "text": text}
        case ToolCallDelta(index, call_id, arguments_delta, name):
            out: dict[str, Any] = {"type": "tool-call-delta", "index": index, "id": call_id}
            if name is not None:
                out["name"] = name
            out["argumentsDelta"] = arguments_delta
            return out
        case BlockEnd(index, block):
            return {"type": "block-end", "index": index, "block": dict(block)}
        case UsageChunk(usage):
            return {"type": "usage", "usage": usage.to_json()}
        case Finish(kind):
            return {"type": "finish", "reason": {"kind": kind}}
    raise TypeError(f"not a model chunk: {chunk!r}")


@dataclass(frozen=True, slots=True)
class RequestMeta:
    """Who is asking: the session, the script track (`main`, a child's label, or `one-shot`), turn and step."""

    session_id: str
    agent_key: str
    turn: int
    step: int


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """One model request.

    Attributes:
        model: The model name the request is for.
        system: The system prompt, if any.
        messages: The conversation as dsh message frames (`user`, `assistant`, tool results), oldest first.
        tools: The neutral tool schemas offered, `{name, description, parameters}`.
        max_tokens: The output limit, if any.
        temperature: The sampling temperature, if set.
        meta: Who is asking.
    """

    model: str
    system: str | None
    messages: Sequence[Mapping[str, Any]]
    tools: Sequence[Mapping[str, Any]]
    meta: RequestMeta
    max_tokens: int | None = None
    temperature: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How the agent loop retries a model request whose stream broke (docs/agent.md#retries).

    The harness's `normal` retry mode: at most `max_retries` retries per step, each after a delay
    that doubles from `initial_delay_ms` up to `max_delay_ms`, spread by `jitter_ratio` either way.
    A provider's `Retry-After` replaces the delay when it is within `max_delay_ms`; a longer one
    ends the retries. A model client declares its policy as a `retry_policy` attribute; a client
    without one is never retried by the loop.
    """

    max_retries: int = 2
    initial_delay_ms: float = 500.0
    max_delay_ms: float = 10_000.0
    jitter_ratio: float = 0.1

    def __post_init__(self) -> None:
        if self.max_retries < 0 or self.initial_delay_ms < 0 or self.max_delay_ms < self.initial_delay_ms:
            raise ValueError(f"invalid retry policy {self!r}")
        if not 0 <= self.jitter_ratio <= 1:
            raise ValueError(f"invalid retry policy {self!r}: jitter_ratio must lie in [0, 1]")

    @property
    def key(self) -> str:
        """The harness's `policyKey`: every field that changes behaviour, as compact JSON."""
        return json.dumps(
            ["normal", self.max_retries, self.initial_delay_ms, self.max_delay_ms, self.jitter_ratio],
            separators=(",", ":"),
        )

    def delay_ms(self, retry: int, sample: float) -> float:
        """The delay before retry number `retry` (from 1), for a random `sample` in [0, 1]."""
        exponential = min(self.initial_delay_ms * 2.0 ** min(retry - 1, 64), self.max_delay_ms)
        spread = 1 - self.jitter_ratio + 2 * self.jitter_ratio * sample
        return min(exponential * spread, self.max_delay_ms)


@runtime_checkable
class ModelClient(Protocol):
    """A model endpoint: `stream` one request as chunks; `aclose` releases connections."""

    provider: str

    def stream(self, request: ModelRequest, *, signal: AbortSignal) -> AsyncIterator[ModelChunk]:
        """Stream the answer to `request`; raise `ModelError` on failure; stop promptly when `signal` aborts."""

    async def aclose(self) -> None:
        """Release the client's resources."""
