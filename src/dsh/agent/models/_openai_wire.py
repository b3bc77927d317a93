"""The OpenAI chat-completions wire shapes: request building and streamed-chunk mapping.

Layer: agent (private to `dsh.agent.models.openai_compat`). Pure functions and one small state
machine; nothing here touches the network or imports the `openai` SDK, so the mapping can be tested
on plain dicts. `request_params` turns a `ModelRequest` into the keyword arguments of
`chat.completions.create`; `ChunkMapper` turns the provider's `chat.completion.chunk` objects (SDK
models or plain mappings) into dsh `ModelChunk`s (docs/agent.md#model-clients).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from dsh.agent.messages import text_of_blocks
from dsh.agent.model import (
    BlockEnd,
    BlockStart,
    BlockType,
    Finish,
    FinishKind,
    ModelChunk,
    ModelRequest,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
    UsageChunk,
)

__all__ = ["ChunkMapper", "MalformedStreamError", "chat_messages", "request_params", "tool_params"]

_FINISH_KINDS: Final[dict[str, FinishKind]] = {
    "stop": "stop",
    "tool_calls": "tool-calls",
    "length": "length",
    "content_filter": "content-filter",
}

_CONTENT_KEYS: Final = ("content", "reasoning_content", "reasoning", "tool_calls")


class MalformedStreamError(ValueError):
    """The endpoint streamed something that is not a usable chat-completion chunk."""


# ---------------------------------------------------------------- requests


def request_params(request: ModelRequest, *, default_max_tokens: int | None) -> dict[str, Any]:
    """The keyword arguments of `chat.completions.create` for one streamed request."""
    params: dict[str, Any] = {
        "model": request.model,
        "messages": chat_messages(request.system, request.messages),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    tools = tool_params(request.tools)
    if tools:
        # An empty `tools` list is refused by some endpoints; no tools means no key at all.
        params["tools"] = tools
    max_tokens = request.max_tokens if request.max_tokens is not None else default_max_tokens
    if max_tokens is not None:
        params["max_tokens"] = max_tokens
    if request.temperature is not None:
        params["temperature"] = request.temperature
    return params


def tool_params(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Neutral `{name, description, parameters}` schemas wrapped as OpenAI `function` tools."""
    return [
        {
            "type": "function",
            "function": {
                "name": tool["name"],
                "description": tool.get("description", ""),
                "parameters": tool.get("parameters", {"type": "object", "properties": {}}),
            },
        }
        for tool in tools
    ]


def chat_messages(system: str | None, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """dsh message frames (oldest first) as chat-completion messages, the system prompt leading."""
    out: list[dict[str, Any]] = []
    if system:
        out.append({"role": "system", "content": system})
    with_reasoning = _rounds_with_tool_calls(messages)
    for position, message in enumerate(messages):
        content = message.get("content")
        blocks = [b for b in content if isinstance(b, Mapping)] if isinstance(content, Sequence) else []
        if message.get("role") == "assistant":
            assistant = _assistant_message(blocks, keep_reasoning=position in with_reasoning)
            if assistant is not None:
                out.append(assistant)
            continue
        results = [b for b in blocks if b.get("type") == "tool-result"]
        if results:
            out.extend(
                {
                    "role": "tool",
                    "tool_call_id": str(block.get("toolCallId", "")),
                    "content": _result_text(block.get("content")),
                }
                for block in results
            )
            continue
        out.append({"role": "user", "content": text_of_blocks(blocks)})
    return out


def _rounds_with_tool_calls(messages: Sequence[Mapping[str, Any]]) -> set[int]:
    """Positions of the assistant messages whose reasoning goes back to the endpoint.

    DeepSeek's thinking mode with tool calls: between two user messages (tool results do not count),
    when the model called a tool, the `reasoning_content` of every assistant message there must be
    sent back in all later requests; in a round without tool calls it is left out (the API ignores
    it). Other OpenAI-compatible endpoints ignore the extra field.
    """
    keep: set[int] = set()
    round_: list[int] = []
    called = False

    def close() -> None:
        if called:
            keep.update(round_)

    for position, message in enumerate(messages):
        content = message.get("content")
        blocks = [b for b in content if isinstance(b, Mapping)] if isinstance(content, Sequence) else []
        if message.get("role") == "assistant":
            round_.append(position)
            called = called or any(block.get("type") == "tool-call" for block in blocks)
        elif not any(block.get("type") == "tool-result" for block in blocks):
            close()
            round_, called = [], False
    close()
    return keep


def _assistant_message(blocks: Sequence[Mapping[str, Any]], *, keep_reasoning: bool) -> dict[str, Any] | None:
    text = text_of_blocks(blocks)
    reasoning = (
        "".join(str(b.get("text", "")) for b in blocks if b.get("type") == "reasoning") if keep_reasoning else ""
    )
    calls = [
        {
            "id": str(block.get("id", "")),
            "type": "function",
            "function": {"name": str(block.get("name", "")), "arguments": _arguments_text(block.get("arguments"))},
        }
        for block in blocks
        if block.get("type") == "tool-call"
    ]
    if not text and not calls:
        # An assistant message with neither text nor calls (an interrupted reply that had only
        # reasoning) carries nothing the model can use, and endpoints refuse an empty one.
        return None
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    return message


def _arguments_text(arguments: object) -> str:
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments if arguments is not None else {}, ensure_ascii=False, separators=(",", ":"))


def _result_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return text_of_blocks(content)
    return ""


# ---------------------------------------------------------------- responses


@dataclass(slots=True)
class _OpenBlock:
    index: int
    kind: BlockType
    parts: list[str]
    call_id: str = ""
    name: str | None = None

    def final(self) -> dict[str, Any]:
        joined = "".join(self.parts)
        if self.kind == "tool-call":
            return {"type": "tool-call", "id": self.call_id, "name": self.name or "", "arguments": joined}
        return {"type": self.kind, "text": joined}


class ChunkMapper:
    """Maps one response's stream of chat-completion chunks to dsh chunks.

    Blocks are numbered 0, 1, 2... in the order they first appear. The reasoning block ends when the
    answer (text or a tool call) begins; every other block ends when the finish reason arrives. Usage
    may come in its own chunk (`choices: []`) or with the finish; `UsageChunk` and `Finish` are
    emitted by `end()`, after the last provider chunk.
    """

    def __init__(self) -> None:
        self._next_index = 0
        self._reasoning: _OpenBlock | None = None
        self._text: _OpenBlock | None = None
        self._calls: dict[int, _OpenBlock] = {}
        self._closed_calls: set[int] = set()
        self._usage: Usage | None = None
        self._finish: FinishKind | None = None

    @property
    def finished(self) -> bool:
        """True once the provider sent a finish reason."""
        return self._finish is not None

    def feed(self, chunk: object) -> Iterator[ModelChunk]:
        """The dsh chunks one provider chunk yields; raises `MalformedStreamError` on a bad shape."""
        usage = _field(chunk, "usage")
        if usage is not None:
            self._usage = _usage(usage)
        choices = _field(chunk, "choices")
        if choices is None:
            choices = []
        if not isinstance(choices, Sequence) or isinstance(choices, str):
            raise MalformedStreamError(f"`choices` is not a list (got {type(choices).__name__})")
        for choice in choices:
            if _field(choice, "index") not in (0, None):
                continue  # only the first choice is ever requested
            yield from self._choice(choice)

    def end(self) -> Iterator[ModelChunk]:
        """The closing chunks after the provider's stream ended: open blocks, usage, finish."""
        if self._finish is None:
            raise MalformedStreamError("the stream ended without a finish reason")
        yield from self._close_all()
        if self._usage is not None:
            yield UsageChunk(self._usage)
        yield Finish(self._finish)

    def _choice(self, choice: object) -> Iterator[ModelChunk]:
        delta = _field(choice, "delta")
        if self._finish is not None:
            # Some servers repeat an empty choice after the finish; content there would be lost.
            if delta is not None and any(_field(delta, key) for key in _CONTENT_KEYS):
                raise MalformedStreamError("content arrived after the finish reason")
            return
        if delta is not None:
            reasoning = _optional_str(delta, "reasoning_content")
            if reasoning is None:
                reasoning = _optional_str(delta, "reasoning")
            if reasoning:
                yield from self._reasoning_delta(reasoning)
            content = _optional_str(delta, "content")
            if content:
                yield from self._text_delta(content)
            calls = _field(delta, "tool_calls")
            if calls is not None:
                if not isinstance(calls, Sequence) or isinstance(calls, str):
                    raise MalformedStreamError("`delta.tool_calls` is not a list")
                for call in calls:
                    yield from self._tool_call_delta(call)
        reason = _field(choice, "finish_reason")
        if reason is not None:
            kind = _FINISH_KINDS.get(reason) if isinstance(reason, str) else None
            if kind is None:
                raise MalformedStreamError(f"unsupported finish reason {reason!r}")
            self._finish = kind
            yield from self._close_all()

    def _open(self, kind: BlockType) -> tuple[_OpenBlock, BlockStart]:
        block = _OpenBlock(self._next_index, kind, [])
        self._next_index += 1
        return block, BlockStart(block.index, kind)

    def _reasoning_delta(self, text: str) -> Iterator[ModelChunk]:
        if self._reasoning is None:
            self._reasoning, start = self._open("reasoning")
            yield start
        self._reasoning.parts.append(text)
        yield ReasoningDelta(self._reasoning.index, text)

    def _text_delta(self, text: str) -> Iterator[ModelChunk]:
        yield from self._end_reasoning()
        if self._text is None:
            self._text, start = self._open("text")
            yield start
        self._text.parts.append(text)
        yield TextDelta(self._text.index, text)

    def _tool_call_delta(self, call: object) -> Iterator[ModelChunk]:
        position = _field(call, "index")
        if not isinstance(position, int) or isinstance(position, bool):
            raise MalformedStreamError("a tool-call delta has no integer `index`")
        if position in self._closed_calls:
            raise MalformedStreamError(f"tool call {position} continued after it ended")
        function = _field(call, "function")
        name = _optional_str(function, "name") if function is not None else None
        fragment = (_optional_str(function, "arguments") if function is not None else None) or ""
        call_id = _optional_str(call, "id")
        block = self._calls.get(position)
        if block is None:
            yield from self._end_reasoning()
            block, start = self._open("tool-call")
            # Some compatible servers omit the id; a stable stand-in keeps results matched to calls.
            block.call_id = call_id or f"call_{block.index}"
            block.name = name or None
            self._calls[position] = block
            block.parts.append(fragment)
            yield start
            yield ToolCallDelta(block.index, block.call_id, fragment, name=block.name)
            return
        announce = None
        if name and block.name is None:
            block.name = announce = name
        if not fragment and announce is None:
            return
        block.parts.append(fragment)
        yield ToolCallDelta(block.index, block.call_id, fragment, name=announce)

    def _end_reasoning(self) -> Iterator[ModelChunk]:
        if self._reasoning is not None:
            block, self._reasoning = self._reasoning, None
            yield BlockEnd(block.index, block.final())

    def _close_all(self) -> Iterator[ModelChunk]:
        blocks = [b for b in (self._reasoning, self._text) if b is not None]
        blocks.extend(self._calls.values())
        for block in sorted(blocks, key=lambda b: b.index):
            if block.kind == "tool-call" and not block.name:
                raise MalformedStreamError(f"tool call {block.call_id!r} has no function name")
            yield BlockEnd(block.index, block.final())
        self._closed_calls.update(self._calls)
        self._reasoning = self._text = None
        self._calls = {}


def _field(value: object, name: str) -> Any:
    """A field of an SDK model (declared or extra) or of a plain mapping; None when absent."""
    if isinstance(value, Mapping):
        return value.get(name)
    try:
        return getattr(value, name, None)
    except Exception:
        return None


def _optional_str(value: object, name: str) -> str | None:
    found = _field(value, name)
    if found is None or isinstance(found, str):
        return found
    raise MalformedStreamError(f"`{name}` is not a string (got {type(found).__name__})")


def _count(value: object, name: str) -> int | None:
    found = _field(value, name)
    if found is None:
        return None
    if isinstance(found, bool) or not isinstance(found, int) or found < 0:
        raise MalformedStreamError(f"usage `{name}` is not a non-negative integer")
    return found


def _usage(usage: object) -> Usage:
    """The provider's usage in disjoint counts (docs/agent.md#token-usage).

    Both DeepSeek and OpenAI count cache hits inside `prompt_tokens`. DeepSeek names them
    `prompt_cache_hit_tokens` and the rest `prompt_cache_miss_tokens`; OpenAI names them
    `prompt_tokens_details.cached_tokens`. The uncached input is DeepSeek's miss count when it is
    given, otherwise `prompt_tokens` minus the hits.
    """
    prompt = _count(usage, "prompt_tokens")
    completion = _count(usage, "completion_tokens")
    cached = _count(usage, "prompt_cache_hit_tokens")
    if cached is None:
        details = _field(usage, "prompt_tokens_details")
        cached = _count(details, "cached_tokens") if details is not None else None
    completion_details = _field(usage, "completion_tokens_details")
    reasoning = _count(completion_details, "reasoning_tokens") if completion_details is not None else None
    uncached = _count(usage, "prompt_cache_miss_tokens")
    if uncached is None:
        uncached = prompt or 0
        if cached is not None:
            if cached > uncached:
                raise MalformedStreamError(
                    f"usage counts {cached} cached prompt tokens but only {uncached} prompt tokens"
                )
            uncached -= cached
    return Usage(uncached, completion or 0, cached, None, reasoning)
