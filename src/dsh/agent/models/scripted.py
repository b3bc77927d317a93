"""`ScriptedModelClient`: a keyless model that replays a script, for the demo, `--script` runs and tests.

Layer: agent. Each request is answered from the track of its `meta.agent_key`: a standing `on`
entry whose `match` fits answers without being used up, otherwise the head of `steps` is consumed
and must fit. The answer is streamed as real chunks (split by `chunkSize`), so the loop's assembler,
chunk logging and cancellation paths run exactly as they do against a network model. The format,
the placeholders and every failure code are described in docs/agent.md#scripted-model.

The client belongs to one event loop: gates are `asyncio.Event`s that bind to the loop that first
waits on them, and `release()` must be called on that loop.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import re
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import ValidationError

from dsh.abort import AbortSignal
from dsh.agent.errors import ModelError
from dsh.agent.messages import message_text, text_of_blocks
from dsh.agent.model import (
    BlockEnd,
    BlockStart,
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
from dsh.agent.models._script_schema import ModelScript, ScriptMatch, ScriptResponse, validation_message

__all__ = ["ModelScript", "ScriptedModelClient"]

_DEFAULT_USAGE: Final = Usage(input_tokens=10, output_tokens=5)
_PLACEHOLDER: Final = re.compile(r"\$\{(self|child:[^}]+)\}")
_STARTED: Final = re.compile(r"started subagent (\S+)")
_SHOWN_CHARS: Final = 200
"""Longest actual text quoted in a mismatch message; longer texts are cut with an ellipsis."""


@dataclass(slots=True)
class _Track:
    """The replay state of one agent key."""

    steps: deque[ScriptResponse]
    on: Sequence[ScriptResponse]
    consumed: int = 0
    requests: int = 0
    calls: int = 0


@dataclass(frozen=True, slots=True)
class _Call:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class _Answer:
    """A selected response with its placeholders resolved and its call ids assigned."""

    reasoning: str | None
    text: str | None
    calls: tuple[_Call, ...]
    finish: FinishKind
    usage: Usage
    chunk_size: int
    error: ModelError | None
    hold: str | None


@dataclass(frozen=True, slots=True)
class _Where:
    """Where in the script a request is being served, for error messages."""

    agent_key: str
    position: str
    request: int

    def __str__(self) -> str:
        return f'agent "{self.agent_key}" at {self.position} (request {self.request})'


class ScriptedModelClient:
    """A `ModelClient` that answers from a validated `ModelScript`.

    Build it with `from_file` (JSON, or YAML when PyYAML is installed), `from_dict`, or directly from a
    `ModelScript`. Call `assert_consumed()` at the end of a scripted run to prove every step was used.
    """

    provider: str = "scripted"

    def __init__(self, script: ModelScript) -> None:
        self._script = script
        self._tracks = {
            key: _Track(steps=deque(agent.steps), on=tuple(agent.on)) for key, agent in script.agents.items()
        }
        self._unknown_requests: dict[str, int] = {}
        self._gates: dict[str, asyncio.Event] = {}
        self._reached: dict[str, asyncio.Event] = {}

    @property
    def model(self) -> str:
        """The script's default model name (each request still names its own model)."""
        return self._script.model

    @classmethod
    def from_dict(cls, data: object, *, source: str = "<script>") -> ScriptedModelClient:
        """Validate parsed script data; a fault raises `ModelError(SCRIPT_INVALID)` naming its JSON path."""
        try:
            script = ModelScript.model_validate(data)
        except ValidationError as e:
            raise ModelError(f"invalid script {source}: {validation_message(e)}", code="SCRIPT_INVALID") from e
        return cls(script)

    @classmethod
    def from_file(cls, path: str | Path) -> ScriptedModelClient:
        """Load a JSON script, or a `.yaml`/`.yml` one when PyYAML (`pydsh[yaml]`) is installed."""
        path = Path(path)
        try:
            raw = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ModelError(f"cannot read script {path}: {e}", code="SCRIPT_INVALID") from e
        data = _parse_yaml(raw, path) if path.suffix.lower() in {".yaml", ".yml"} else _parse_json(raw, path)
        return cls.from_dict(data, source=str(path))

    def release(self, name: str) -> None:
        """Open the gate `name`: a stream held on it goes on; a later hold on it does not wait."""
        self._gate(name).set()

    def held(self, name: str) -> bool:
        """True once a stream has reached the hold `name` (whether or not the gate was open)."""
        return self._reached_event(name).is_set()

    async def wait_held(self, name: str) -> None:
        """Wait until a stream reaches the hold `name` (callers add their own hang guard)."""
        await self._reached_event(name).wait()

    def assert_consumed(self) -> None:
        """Raise `ModelError(SCRIPT_UNCONSUMED)` when any track has steps left (`on` entries never count)."""
        left = []
        for key, track in self._tracks.items():
            if not track.steps:
                continue
            first = track.consumed + 1
            steps = ", ".join(f"step {first + offset}: {_describe(step)}" for offset, step in enumerate(track.steps))
            count = len(track.steps)
            left.append(f'agent "{key}" has {count} step{"s" if count != 1 else ""} left ({steps})')
        if left:
            raise ModelError(f"script not consumed: {'; '.join(left)}", code="SCRIPT_UNCONSUMED")

    async def aclose(self) -> None:
        """Nothing to release: the script lives in memory."""

    async def stream(self, request: ModelRequest, *, signal: AbortSignal) -> AsyncIterator[ModelChunk]:
        """Select this request's response and stream it as chunks; raise `ModelError` on a script fault."""
        signal.throw_if_aborted()
        answer = self._answer(request)
        started = False
        index = 0
        prose: tuple[tuple[Literal["reasoning", "text"], str | None], ...] = (
            ("reasoning", answer.reasoning),
            ("text", answer.text),
        )
        for block_type, body in prose:
            if not body:
                continue
            yield _checked(signal, BlockStart(index, block_type))
            for piece in _pieces(body, answer.chunk_size):
                delta = ReasoningDelta(index, piece) if block_type == "reasoning" else TextDelta(index, piece)
                yield _checked(signal, delta)
                if not started:
                    # The hold comes after the first delta, so a turn cancelled while held has
                    # partial text to keep, as a real stream cancelled midway would.
                    started = True
                    await self._hold(answer.hold, signal)
            if answer.error is None:
                yield _checked(signal, BlockEnd(index, {"type": block_type, "text": body}))
            index += 1
        if not started:
            await self._hold(answer.hold, signal)
        if answer.error is not None:
            raise answer.error
        for call in answer.calls:
            yield _checked(signal, BlockStart(index, "tool-call"))
            for number, piece in enumerate(_pieces(call.arguments, answer.chunk_size) or [""]):
                yield _checked(signal, ToolCallDelta(index, call.id, piece, name=call.name if number == 0 else None))
            block = {"type": "tool-call", "id": call.id, "name": call.name, "arguments": call.arguments}
            yield _checked(signal, BlockEnd(index, block))
            index += 1
        yield _checked(signal, UsageChunk(answer.usage))
        yield _checked(signal, Finish(answer.finish))

    # -- selection ---------------------------------------------------------------------------------

    def _answer(self, request: ModelRequest) -> _Answer:
        key = request.meta.agent_key
        track = self._tracks.get(key)
        if track is None:
            count = self._unknown_requests[key] = self._unknown_requests.get(key, 0) + 1
            where = _Where(key, "step 1", count)
            known = ", ".join(_quote(name) for name in sorted(self._tracks)) or "none"
            raise ModelError(f"unknown script {where}: expected one of {known}", code="SCRIPT_UNKNOWN_AGENT")
        track.requests += 1
        view = _RequestView(request)
        for number, entry in enumerate(track.on, start=1):
            if entry.match is None or not _failures(entry.match, view):
                return self._resolve(entry, track, view, _Where(key, f"standing entry {number}", track.requests))
        where = _Where(key, f"step {track.consumed + 1}", track.requests)
        if not track.steps:
            got = f"got one with lastUser {view.shown_last_user}"
            raise ModelError(f"script exhausted for {where}: expected no more requests, {got}", code="SCRIPT_EXHAUSTED")
        head = track.steps[0]
        if head.match is not None and (failures := _failures(head.match, view)):
            raise ModelError(f"script mismatch for {where}: {'; '.join(failures)}", code="SCRIPT_MISMATCH")
        track.steps.popleft()
        track.consumed += 1
        return self._resolve(head, track, view, where)

    def _resolve(self, response: ScriptResponse, track: _Track, view: _RequestView, where: _Where) -> _Answer:
        def fill(value: str) -> str:
            return _PLACEHOLDER.sub(lambda found: _placeholder(found.group(1), view, where), value)

        calls = []
        for call in response.tool_calls:
            track.calls += 1
            if isinstance(call.arguments, str):
                arguments = fill(call.arguments)
            else:
                arguments = json.dumps(_fill_nested(call.arguments, fill), separators=(",", ":"), ensure_ascii=False)
            calls.append(_Call(call.id or f"call_{track.calls}", call.name, arguments))
        usage = _DEFAULT_USAGE
        if response.usage is not None:
            usage = Usage(
                response.usage.input_tokens,
                response.usage.output_tokens,
                response.usage.cache_read_tokens,
                response.usage.cache_write_tokens,
                response.usage.reasoning_tokens,
            )
        error = None
        if response.error is not None:
            error = ModelError(response.error.message, code=response.error.code)
        return _Answer(
            reasoning=fill(response.reasoning) if response.reasoning is not None else None,
            text=fill(response.text) if response.text is not None else None,
            calls=tuple(calls),
            finish=response.finish or ("tool-calls" if calls else "stop"),
            usage=usage,
            chunk_size=response.chunk_size,
            error=error,
            hold=response.hold,
        )

    # -- gates ---------------------------------------------------------------------------------------

    def _gate(self, name: str) -> asyncio.Event:
        gate = self._gates.get(name)
        if gate is None:
            gate = self._gates[name] = asyncio.Event()
        return gate

    def _reached_event(self, name: str) -> asyncio.Event:
        reached = self._reached.get(name)
        if reached is None:
            reached = self._reached[name] = asyncio.Event()
        return reached

    async def _hold(self, name: str | None, signal: AbortSignal) -> None:
        if name is None:
            return
        self._reached_event(name).set()
        gate = self._gate(name)
        if not gate.is_set():
            opened = asyncio.ensure_future(gate.wait())
            aborted = asyncio.ensure_future(signal.wait())
            try:
                await asyncio.wait({opened, aborted}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                # Both waiters are ours: whichever lost (or both, when this task is cancelled) is
                # cancelled here so no task outlives the hold.
                for waiter in (opened, aborted):
                    waiter.cancel()
                await asyncio.gather(opened, aborted, return_exceptions=True)
        signal.throw_if_aborted()


class _RequestView:
    """What `match` keys and placeholders read from one request's messages."""

    def __init__(self, request: ModelRequest) -> None:
        self.request = request
        self.last_user: Mapping[str, Any] | None = None
        self.last_tool_result: Mapping[str, Any] | None = None
        for message in reversed(request.messages):
            if message.get("role") != "user":
                continue
            kind = _source_kind(message)
            if kind == "tool":
                if self.last_tool_result is None:
                    self.last_tool_result = message
            elif kind == "plugin":
                continue  # context the harness adds (the time, the permissions), not what someone said
            elif self.last_user is None:
                self.last_user = message
            if self.last_user is not None and self.last_tool_result is not None:
                break

    @property
    def shown_last_user(self) -> str:
        return _shown(message_text(self.last_user)) if self.last_user is not None else "(no user message)"


def _failures(match: ScriptMatch, view: _RequestView) -> list[str]:
    """Each condition of `match` the request breaks, worded as expected against actual."""
    out = []
    if match.last_user is not None:
        actual = message_text(view.last_user) if view.last_user is not None else None
        if actual is None or match.last_user not in actual:
            got = _shown(actual) if actual is not None else "no user message"
            out.append(f"lastUser should contain {_quote(match.last_user)}, got {got}")
    if match.last_tool_result is not None:
        actual = message_text(view.last_tool_result) if view.last_tool_result is not None else None
        if actual is None or match.last_tool_result not in actual:
            got = _shown(actual) if actual is not None else "no tool result"
            out.append(f"lastToolResult should contain {_quote(match.last_tool_result)}, got {got}")
    if match.source is not None:
        kind = _source_kind(view.last_user) if view.last_user is not None else None
        if kind != match.source:
            got = _quote(kind) if kind is not None else "no user message"
            out.append(f"source should be {_quote(match.source)}, got {got}")
    if match.turn is not None and view.request.meta.turn != match.turn:
        out.append(f"turn should be {match.turn}, got {view.request.meta.turn}")
    if match.tools is not None:
        offered = [str(tool.get("name")) for tool in view.request.tools]
        missing = [name for name in match.tools if name not in offered]
        if missing:
            wanted = ", ".join(_quote(name) for name in missing)
            got = ", ".join(_quote(name) for name in offered) or "none"
            out.append(f"tools should include {wanted}, got {got}")
    return out


def _placeholder(body: str, view: _RequestView, where: _Where) -> str:
    if body == "self":
        if view.request.meta.session_id:
            return view.request.meta.session_id
        reason = "the request has no session id"
    else:
        label = body.removeprefix("child:")
        child = _child_id(view.request.messages, label)
        if child is not None:
            return child
        reason = f'expected a "started subagent <id>" result of an agent call with description {_quote(label)}'
        reason += ", found none in the conversation"
    raise ModelError(f"unresolved placeholder ${{{body}}} for {where}: {reason}", code="SCRIPT_PLACEHOLDER")


def _child_id(messages: Sequence[Mapping[str, Any]], label: str) -> str | None:
    """The id the newest `agent` call described as `label` reported in its `started subagent <id>` result."""
    results: dict[str, str] = {}
    for message in messages:
        if message.get("role") != "user" or _source_kind(message) != "tool":
            continue
        for block in _blocks(message):
            call_id = block.get("toolCallId")
            inner = block.get("content")
            if block.get("type") == "tool-result" and isinstance(call_id, str) and isinstance(inner, list | tuple):
                results[call_id] = text_of_blocks(inner)
    for message in reversed(messages):
        if message.get("role") != "assistant":
            continue
        for block in reversed(list(_blocks(message))):
            if block.get("type") != "tool-call" or block.get("name") != "agent":
                continue
            if _arguments(block).get("description") != label:
                continue
            found = _STARTED.search(results.get(str(block.get("id")), ""))
            if found is not None:
                return found.group(1)
    return None


def _blocks(message: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    content = message.get("content")
    if isinstance(content, list | tuple):
        yield from (block for block in content if isinstance(block, Mapping))


def _arguments(block: Mapping[str, Any]) -> Mapping[str, Any]:
    raw = block.get("arguments")
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return {}
    return raw if isinstance(raw, Mapping) else {}


def _source_kind(message: Mapping[str, Any]) -> str | None:
    source = message.get("source")
    kind = source.get("kind") if isinstance(source, Mapping) else None
    return kind if isinstance(kind, str) else None


def _fill_nested(value: Any, fill: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return fill(value)
    if isinstance(value, dict):
        return {key: _fill_nested(item, fill) for key, item in value.items()}
    if isinstance(value, list):
        return [_fill_nested(item, fill) for item in value]
    return value


def _checked(signal: AbortSignal, chunk: ModelChunk) -> ModelChunk:
    # Checked before every chunk leaves, so an abort stops the stream at the next chunk boundary.
    signal.throw_if_aborted()
    return chunk


def _pieces(value: str, size: int) -> list[str]:
    return [value[start : start + size] for start in range(0, len(value), size)]


def _quote(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


def _shown(value: str) -> str:
    if len(value) > _SHOWN_CHARS:
        value = value[:_SHOWN_CHARS] + "…"
    return _quote(value)


def _describe(step: ScriptResponse) -> str:
    """A short summary of a step for the SCRIPT_UNCONSUMED message."""
    parts = []
    if step.match is not None and step.match.last_user is not None:
        parts.append(f"lastUser {_shown(step.match.last_user)}")
    if step.text is not None:
        parts.append(f"text {_shown(step.text)}")
    if step.tool_calls:
        parts.append("calls " + ", ".join(call.name for call in step.tool_calls))
    if step.error is not None:
        parts.append(f"error {step.error.code}")
    if step.hold is not None:
        parts.append(f"hold {_quote(step.hold)}")
    return " ".join(parts) or "empty response"


def _parse_json(raw: str, path: Path) -> object:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise ModelError(
            f"invalid script {path}: not valid JSON at line {e.lineno} column {e.colno}: {e.msg}", code="SCRIPT_INVALID"
        ) from e


def _parse_yaml(raw: str, path: Path) -> object:
    try:
        # Imported by name: PyYAML is an optional extra and ships no type information.
        yaml = importlib.import_module("yaml")
    except ImportError as e:
        raise ModelError(
            f"cannot load YAML script {path}: PyYAML is not installed (install pydsh[yaml], or use a JSON script)",
            code="SCRIPT_INVALID",
        ) from e
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError as e:
        raise ModelError(f"invalid script {path}: not valid YAML: {e}", code="SCRIPT_INVALID") from e


# Shown under the name users import (docs/architecture.md#public-names).
ScriptedModelClient.__module__ = "dsh.agent.models"
