"""Context compaction: keep a long session's next request under its model's context window.

Layer: agent. Before every model request the loop asks `Compactor.before_request` whether the
prompt it is about to send would exceed `threshold` (0.8) of the model's context window. If so it
first **prunes** large tool results outside the retained tail (a `compaction/prune` shadow-price
event, then a `tool/result` replacing the node with head + marker + tail of its text); if that does
not bring the estimate under the threshold it **summarises**: `compaction/start {compactionId, turn}`,
one model request that condenses the oldest surface span, `compaction/summary {...}`, a `user/message`
that replaces the span on the surface (source `{kind: "plugin", plugin: "compact", compactionId}`),
and `compaction/end {compactionId, turn, error?}` — the TypeScript harness's events and order, so
the harness, resuming the session, sees it compacted the same way. The log keeps every event;
only the surface changes, so a resumed session rebuilds the same model context.

**The estimate** (no tokenizer ships here) is deterministic: the UTF-8 bytes of the request's
system prompt, tool schemas and messages as compact JSON, divided by *bytes per token*. That ratio
starts at 4.0 and is calibrated by the last reported usage: after every request that reported
usage it becomes `prompt bytes / billed input tokens` of that request (clamped to 1 to 16). A resumed
agent calibrates from the log's last `assistant/message` with usage, rebuilding the surface that
request was sent (docs/agent.md#compaction).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from dsh.abort import AbortSignal
from dsh.agent.assembler import MessageAssembler
from dsh.agent.errors import AgentError, ModelError
from dsh.agent.ids import IdFactory
from dsh.agent.messages import message_text
from dsh.agent.model import ModelClient, ModelRequest, RequestMeta, Usage
from dsh.session.events import SessionEvent, SurfaceReplace
from dsh.session.session import Session
from dsh.session.surface import Surface, derive_messages

__all__ = [
    "COMPACT_PLUGIN",
    "AgentCompactor",
    "DEFAULT_CONTEXT_WINDOWS",
    "PRUNE_MARKER",
    "CompactionResult",
    "CompactionSettings",
    "Compactor",
    "PromptMeter",
]

_log = logging.getLogger("dsh.agent")

COMPACT_PLUGIN: Final = "compact"
"""The `plugin` of the replacement message's source (the harness's checkpoint marker)."""

PRUNE_MARKER: Final = "\n\n[... tool result middle pruned ...]\n\n"

DEFAULT_CONTEXT_WINDOWS: Final[Mapping[str, int]] = {"deepseek-chat": 131_072, "deepseek-reasoner": 131_072}
"""DeepSeek's context length (128K tokens) for its two API models."""

DEFAULT_BYTES_PER_TOKEN: Final = 4.0

COMPACTION_INSTRUCTION: Final = "\n".join(
    [
        "Stop working on the task for a moment: write a checkpoint of the conversation above, so that "
        "someone who sees only the checkpoint can carry on the work without losing anything essential.",
        "",
        "Use these Markdown sections, in this order, with short bullet points; write (none) under a section "
        "with nothing to say:",
        "## Goal — what the user asked for, and how the request changed; quote exact wording that matters",
        "## Facts — technologies, conventions, decisions and their reasons",
        "## Files — each path that matters and what was done to it",
        "## Problems — errors met and how they were fixed",
        "## Open work — what was asked and is not done yet",
        "## Now — what was being done when this checkpoint was written, and the next step",
        "",
        "Keep file paths, commands, identifiers, error messages and numbers exactly as they appeared. "
        "If the conversation starts with an earlier checkpoint, merge it into this one instead of copying it. "
        "Do not call tools, and do not mention this request or the checkpoint itself.",
    ]
)

CHECKPOINT_PREAMBLE: Final = (
    "The earlier part of this conversation was condensed into the checkpoint below to free context. "
    "Treat it as established background and continue from the messages that follow it."
)


@dataclass(frozen=True, slots=True)
class CompactionSettings:
    """When and how an agent compacts (docs/agent.md#compaction).

    Attributes:
        auto: Compact automatically before a request that would cross the threshold.
        threshold: The share of the context window a request may fill (0 < threshold <= 1).
        retain: The share of the window kept verbatim at the end of the conversation.
        context_windows: Model name → context window in tokens; a model not listed is never compacted
            automatically (manual compaction still works).
        summary_max_tokens: The output limit of the summary request.
        prune_threshold_chars: A tool result longer than this (in characters) may be pruned.
        prune_head_chars: Characters kept from the start of a pruned result.
        prune_tail_chars: Characters kept from its end.
    """

    auto: bool = True
    threshold: float = 0.8
    retain: float = 0.16
    context_windows: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_CONTEXT_WINDOWS))
    summary_max_tokens: int = 8192
    prune_threshold_chars: int = 8192
    prune_head_chars: int = 4096
    prune_tail_chars: int = 1024

    def window(self, model: str) -> int | None:
        """The context window of `model`, if known."""
        return self.context_windows.get(model)


@dataclass(frozen=True, slots=True)
class CompactionResult:
    """What one compaction wrote.

    Attributes:
        compaction_id: The id shared by its `compaction/*` events and the replacement message.
        start_seq: The seq of `compaction/start`.
        summary_seq: The seq of `compaction/summary`.
        end_seq: The seq of `compaction/end`.
        summary: The summary text.
        shadowed_seqs: The surface nodes the summary replaced, in surface order.
        shadowed_tokens: Their estimated size in tokens.
        pruned: How many tool results were pruned before the summary (by an automatic compaction).
    """

    compaction_id: str
    start_seq: int
    summary_seq: int
    end_seq: int
    summary: str
    shadowed_seqs: tuple[int, ...]
    shadowed_tokens: int
    pruned: int = 0

    def to_json(self) -> dict[str, Any]:
        """`{compactionId, startSeq, summarySeq, endSeq, summary, shadowedSeqs, shadowedTokenCount, pruned}`."""
        return {
            "compactionId": self.compaction_id,
            "startSeq": self.start_seq,
            "summarySeq": self.summary_seq,
            "endSeq": self.end_seq,
            "summary": self.summary,
            "shadowedSeqs": list(self.shadowed_seqs),
            "shadowedTokenCount": self.shadowed_tokens,
            "pruned": self.pruned,
        }


def _json_bytes(value: object) -> int:
    return len(orjson.dumps(value))


class PromptMeter:
    """The deterministic prompt-size estimate: JSON bytes / bytes per token, calibrated by reported usage."""

    __slots__ = ("bytes_per_token", "calibrated")

    def __init__(self, bytes_per_token: float = DEFAULT_BYTES_PER_TOKEN) -> None:
        self.bytes_per_token = bytes_per_token
        self.calibrated = False

    @staticmethod
    def prompt_bytes(
        system: str | None, tools: Sequence[Mapping[str, Any]], messages: Sequence[Mapping[str, Any]]
    ) -> int:
        """The UTF-8 bytes of a request's system prompt, tool schemas and messages (compact JSON)."""
        size = len(system.encode("utf-8")) if system else 0
        if tools:
            size += _json_bytes(list(tools))
        return size + sum(_json_bytes(message) for message in messages)

    def tokens(self, size: int) -> int:
        """`size` bytes in tokens."""
        return math.ceil(size / self.bytes_per_token)

    def observe(self, prompt_bytes: int, usage: Usage) -> None:
        """Calibrate with one request's prompt bytes and its reported usage."""
        billed = usage.billed_input_tokens
        if billed > 0 and prompt_bytes > 0:
            self.bytes_per_token = min(16.0, max(1.0, prompt_bytes / billed))
            self.calibrated = True


def _surface_before(session: Session, seq: int) -> list[int]:
    """The surface nodes as they were just before event `seq` (the request that event answered)."""
    surface = Surface()
    events = session.events
    log: Any = events
    for index in range(seq):
        plan = surface.plan(events[index], log)
        if isinstance(plan, str):
            continue
        surface.commit(plan)
    return surface.nodes


def _node_messages(session: Session, nodes: Sequence[int]) -> list[Mapping[str, Any] | None]:
    """The model message of each node (None for an assistant message without content, which is not sent)."""
    log: Any = session.events
    out: list[Mapping[str, Any] | None] = []
    for seq in nodes:
        messages = derive_messages((seq,), log)
        out.append(messages[0] if messages else None)
    return out


@dataclass(slots=True)
class _Prune:
    seq: int
    before: int
    after: int


class Compactor:
    """One agent's compaction: the meter, the automatic check and the compaction itself."""

    def __init__(self, settings: CompactionSettings) -> None:
        self.settings = settings
        self.meter = PromptMeter()
        self._calibration_checked = False
        # The JSON size of each surface node's message, measured once: a node's event never changes.
        self._sizes: dict[int, int] = {}
        self._last_measure: tuple[tuple[int, int, int], int] = ((-1, -1, -1), 0)
        self._failed_turn: int | None = None  # the turn whose automatic summary failed

    # ---------------------------------------------------------------- measuring

    def calibrate_from_log(self, session: Session, system: str | None, tools: Sequence[Mapping[str, Any]]) -> None:
        """Calibrate once from the log's last request with usage (a resumed agent)."""
        if self._calibration_checked or self.meter.calibrated:
            self._calibration_checked = True
            return
        self._calibration_checked = True
        events = session.events
        for index in range(len(events) - 1, -1, -1):
            event = events[index]
            if event.type != "assistant/message":
                continue
            data = event.data
            usage = data.get("usage") if isinstance(data, Mapping) else None
            if not isinstance(usage, Mapping):
                continue
            nodes = _surface_before(session, event.seq)
            counts = [usage.get(key) for key in ("inputTokens", "cacheReadTokens", "cacheWriteTokens")]
            billed = sum(value for value in counts if type(value) is int)
            self.meter.observe(self.prompt_bytes(session, system, tools, nodes), Usage(billed, 0))
            return

    def forget_calibration(self) -> None:
        """Calibrate from the log again at the next estimate."""
        self._calibration_checked = False
        self.meter.calibrated = False

    def prompt_bytes(
        self,
        session: Session,
        system: str | None,
        tools: Sequence[Mapping[str, Any]],
        nodes: Sequence[int] | None = None,
    ) -> int:
        """`PromptMeter.prompt_bytes` of the request the surface (or `nodes`) makes, each node measured once."""
        size = PromptMeter.prompt_bytes(system, tools, ())
        current = nodes is None
        chosen: Sequence[int] = session.surface.nodes if nodes is None else nodes
        key = (session.surface.replace_generation, len(chosen), chosen[-1] if chosen else -1)
        if current and key == self._last_measure[0]:
            # The same surface as the last measure (nothing appended or replaced since): its sum again.
            return size + self._last_measure[1]
        total = 0
        sizes = self._sizes
        log: Any = session.events
        for seq in chosen:
            known = sizes.get(seq)
            if known is None:
                messages = derive_messages((seq,), log)
                known = sizes[seq] = _json_bytes(messages[0]) if messages else 0
            total += known
        if current:
            self._last_measure = (key, total)
        return size + total

    def observe(self, session: Session, system: str | None, tools: Sequence[Mapping[str, Any]], usage: Usage) -> None:
        """Calibrate with the request the surface just made and the usage the model reported for it."""
        self.meter.observe(self.prompt_bytes(session, system, tools), usage)
        self._calibration_checked = True

    def estimate(self, session: Session, system: str | None, tools: Sequence[Mapping[str, Any]]) -> int:
        """The estimated tokens of the request the session's surface makes now."""
        return self.meter.tokens(self.prompt_bytes(session, system, tools))

    def threshold_tokens(self, model: str) -> int | None:
        """The token budget a request of `model` may fill, or None when its window is unknown."""
        window = self.settings.window(model)
        return None if window is None else math.floor(window * self.settings.threshold)

    # ---------------------------------------------------------------- pruning

    def _prune_text(self, text: str) -> str | None:
        s = self.settings
        if len(text) <= s.prune_threshold_chars:
            return None
        return text[: s.prune_head_chars] + PRUNE_MARKER + text[len(text) - s.prune_tail_chars :]

    def prune(self, session: Session, nodes: Sequence[int]) -> list[_Prune]:
        """Prune every over-long text of the tool results among `nodes` (each: shadow price, then the replacement)."""
        events = session.events
        done: list[_Prune] = []
        for seq in nodes:
            event = events[seq]
            if event.type != "tool/result":
                continue
            data: Any = event.data
            message = data["message"]
            block = message["content"][0]
            inner = block.get("content")
            if not isinstance(inner, Sequence):
                continue
            changed = False
            pruned_inner: list[Any] = []
            for item in inner:
                if isinstance(item, Mapping) and item.get("type") == "text" and isinstance(item.get("text"), str):
                    cut = self._prune_text(item["text"])
                    if cut is not None:
                        pruned_inner.append({**item, "text": cut})
                        changed = True
                        continue
                pruned_inner.append(item)
            if not changed:
                continue
            before = len(message_text(message))
            new_message = {**message, "content": [{**block, "content": pruned_inner}, *message["content"][1:]]}
            session.append(
                "compaction/prune",
                {
                    "shadowedRange": {"start": seq, "end": seq},
                    "shadowedSeqs": [seq],
                    "shadowedTokenCount": self.meter.tokens(_json_bytes(message)),
                },
            )
            replacement = session.append(
                "tool/result",
                {**data, "message": new_message},
                surface_op=SurfaceReplace(seq, seq),
                source_event_seqs=[seq],
            )
            done.append(_Prune(replacement.seq, before, len(message_text(new_message))))
        return done

    # ---------------------------------------------------------------- range selection

    def select_range(self, session: Session, model: str, *, retain_tokens: int | None = None) -> list[int]:
        """The oldest surface span worth summarising, keeping a tail of about `retain` of the window
        (with `retain_tokens=0`: the newest exchange, from the last prompt on).

        The tail never starts with a tool result, so every tool call stays with its result. Empty
        when nothing useful can be summarised (no span, or only an earlier summary).
        """
        nodes = list(session.surface.nodes)
        if retain_tokens is None:
            window = self.settings.window(model)
            retain_tokens = math.floor(window * self.settings.retain) if window is not None else 0
        events = session.events
        cut = len(nodes)
        kept = 0
        while cut > 0:
            size = self.meter.tokens(self.prompt_bytes(session, None, (), (nodes[cut - 1],)))
            if kept + size > retain_tokens:
                break
            kept += size
            cut -= 1
        if retain_tokens == 0:
            # On request: everything before the newest exchange (the last prompt someone sent).
            prompts = [i for i, seq in enumerate(nodes) if _is_prompt(events[seq])]
            cut = prompts[-1] if prompts else cut
        # A tail must keep something to answer, and must not start inside a step's tool results.
        cut = min(cut, len(nodes) - 1) if nodes else 0
        while cut > 0 and events[nodes[cut]].type == "tool/result":
            cut -= 1
        span = nodes[:cut]
        if not span or (len(span) == 1 and _is_checkpoint(events[span[0]])):
            return []
        return span

    # ---------------------------------------------------------------- the compaction

    async def before_request(
        self,
        session: Session,
        *,
        client: ModelClient,
        model: str,
        system: str | None,
        tools: Sequence[Mapping[str, Any]],
        meta: RequestMeta,
        turn: int,
        signal: AbortSignal,
        message_id: Callable[[], str],
        compaction_id: Callable[[], str],
    ) -> CompactionResult | None:
        """Prune and compact when the next request would cross the threshold; a failure only logs.

        Returns the compaction's result when a summary was written, else None.
        """
        if not self.settings.auto:
            return None
        budget = self.threshold_tokens(model)
        if budget is None:
            return None
        self.calibrate_from_log(session, system, tools)
        if self.estimate(session, system, tools) <= budget:
            return None
        # Old tool results first: the span a summary would replace, else everything but the newest node.
        old = self.select_range(session, model) or list(session.surface.nodes)[:-1]
        pruned = self.prune(session, old)
        if pruned and self.estimate(session, system, tools) <= budget:
            _log.info('session "%s": pruned %d tool results before the request', session.id, len(pruned))
            return None
        if self._failed_turn == turn:
            return None  # one failed summary per turn: the turn's later steps do not pay for another
        try:
            result = await self.compact(
                session,
                client=client,
                model=model,
                system=system,
                tools=tools,
                meta=meta,
                turn=turn,
                signal=signal,
                message_id=message_id,
                compaction_id=compaction_id,
            )
        except AgentError as error:
            _log.warning('session "%s": automatic compaction failed: %s', session.id, error)
            self._failed_turn = turn
            return None
        if result is not None and pruned:
            result = CompactionResult(
                result.compaction_id,
                result.start_seq,
                result.summary_seq,
                result.end_seq,
                result.summary,
                result.shadowed_seqs,
                result.shadowed_tokens,
                len(pruned),
            )
        return result

    async def compact(
        self,
        session: Session,
        *,
        client: ModelClient,
        model: str,
        system: str | None,
        tools: Sequence[Mapping[str, Any]],
        meta: RequestMeta,
        turn: int | None,
        signal: AbortSignal,
        message_id: Callable[[], str],
        compaction_id: Callable[[], str],
        retain_tokens: int | None = None,
    ) -> CompactionResult | None:
        """Summarise the oldest surface span now; None when there is nothing useful to summarise.

        Raises:
            AgentError: `COMPACTION_FAILED` when the summary request failed or returned no text; the
                attempt is closed in the log (`compaction/end` with `error`) and the surface is unchanged.
        """
        self.calibrate_from_log(session, system, tools)
        span = self.select_range(session, model, retain_tokens=retain_tokens)
        if not span:
            return None
        ident = compaction_id()
        start = session.append("compaction/start", {"compactionId": ident, "turn": turn})
        messages = [m for m in _node_messages(session, span) if m is not None]
        instruction = {
            "id": message_id(),
            "role": "user",
            "content": [{"type": "text", "text": COMPACTION_INSTRUCTION}],
            "source": {"kind": "plugin", "plugin": "pydsh/compaction"},
        }
        request = ModelRequest(
            model=model,
            system=system,
            messages=[*messages, instruction],
            tools=list(tools),
            meta=meta,
            max_tokens=self.settings.summary_max_tokens,
        )
        try:
            assembler = await _summarise(client, request, signal)
        except Exception as error:
            reason = str(error) if isinstance(error, ModelError) else f"{type(error).__name__}: {error}"
            end_data: dict[str, Any] = {"compactionId": ident, "turn": turn, "error": reason}
            session.append("compaction/end", end_data)
            raise AgentError(
                f'compaction of session "{session.id}" failed: {reason}',
                code="COMPACTION_FAILED",
                session_id=session.id,
            ) from error
        raw = assembler.content()
        summary_blocks = [dict(block) for block in raw if block.get("type") == "text"]
        summary = "".join(block["text"] for block in summary_blocks)
        shadowed_tokens = self.meter.tokens(sum(_json_bytes(m) for m in messages))
        data: dict[str, Any] = {
            "compactionId": ident,
            "summary": summary_blocks,
            "rawOutput": [dict(block) for block in raw],
            "llmStreamCall": True,
            "shadowedRange": {"start": span[0], "end": span[-1]},
            "shadowedSeqs": list(span),
            "shadowedTokenCount": shadowed_tokens,
            "provider": client.provider,
            "model": model,
            "maxTokens": self.settings.summary_max_tokens,
        }
        if assembler.usage is not None:
            data["usage"] = assembler.usage.to_json()
        summary_event = session.append("compaction/summary", data)
        session.append(
            "user/message",
            {
                "id": message_id(),
                "role": "user",
                "content": [
                    {"type": "text", "text": f"{CHECKPOINT_PREAMBLE}\n\n<compacted-summary>"},
                    *summary_blocks,
                    {"type": "text", "text": "</compacted-summary>"},
                ],
                "source": {"kind": "plugin", "plugin": COMPACT_PLUGIN, "compactionId": ident},
            },
            surface_op=SurfaceReplace(span[0], span[-1]),
            source_event_seqs=list(span),
        )
        end = session.append("compaction/end", {"compactionId": ident, "turn": turn})
        return CompactionResult(ident, start.seq, summary_event.seq, end.seq, summary, tuple(span), shadowed_tokens)


Route = Callable[[], tuple[ModelClient, str, "str | None"]]
"""What an agent's summary requests go to now: its model client, model name and system prompt."""


class AgentCompactor:
    """A `Compactor` bound to one agent: its session, its ids and the route its requests take."""

    def __init__(self, settings: CompactionSettings, session: Session, ids: IdFactory, route: Route) -> None:
        self.compactor = Compactor(settings)
        self._session = session
        self._ids = ids
        self._route = route

    def _call(self, turn: int, step: int) -> dict[str, Any]:
        client, model, system = self._route()
        return {
            "client": client,
            "model": model,
            "system": system,
            "meta": RequestMeta(self._session.id, "compaction", turn, step),
            "message_id": self._ids.message,
            "compaction_id": self._ids.run,
        }

    def estimate(self, tools: Sequence[Mapping[str, Any]]) -> int:
        """The estimated prompt tokens of the agent's next request."""
        _, _, system = self._route()
        self.compactor.calibrate_from_log(self._session, system, tools)
        return self.compactor.estimate(self._session, system, tools)

    def observe(self, tools: Sequence[Mapping[str, Any]], usage: Usage) -> None:
        """Calibrate with the request just sent (the surface has not changed since) and its reported usage.

        A model without a context window is never checked, so its agent does not measure every request:
        an estimate asked for later calibrates from the log instead, which gives the same ratio.
        """
        _, model, system = self._route()
        if self.compactor.threshold_tokens(model) is None:
            self.compactor.forget_calibration()
            return
        self.compactor.observe(self._session, system, tools, usage)

    async def before_request(
        self, tools: Sequence[Mapping[str, Any]], turn: int, step: int, signal: AbortSignal
    ) -> CompactionResult | None:
        """`Compactor.before_request` for the agent's next request in `turn`, `step`."""
        call = self._call(turn, step)
        return await self.compactor.before_request(self._session, tools=tools, turn=turn, signal=signal, **call)

    async def now(
        self, tools: Sequence[Mapping[str, Any]], last_turn: int, signal: AbortSignal
    ) -> CompactionResult | None:
        """A compaction on request: everything before the newest exchange (`turn: null` on its events)."""
        call = self._call(last_turn, 0)
        return await self.compactor.compact(
            self._session, tools=tools, turn=None, signal=signal, retain_tokens=0, **call
        )


def _is_prompt(event: SessionEvent) -> bool:
    """A `user/message` someone sent (not a tool result, not a plugin's context or checkpoint)."""
    if event.type != "user/message":
        return False
    source = event.data.get("source") if isinstance(event.data, Mapping) else None
    return not (isinstance(source, Mapping) and source.get("kind") == "plugin")


def _is_checkpoint(event: SessionEvent) -> bool:
    if event.type != "user/message":
        return False
    source = event.data.get("source") if isinstance(event.data, Mapping) else None
    return isinstance(source, Mapping) and source.get("kind") == "plugin" and source.get("plugin") == COMPACT_PLUGIN


async def _summarise(client: ModelClient, request: ModelRequest, signal: AbortSignal) -> MessageAssembler:
    """Stream the summary request; raise `ModelError` unless it finished with text."""
    assembler = MessageAssembler()
    stream = client.stream(request, signal=signal)
    try:
        async for chunk in stream:
            assembler.feed(chunk)
    finally:
        close = getattr(stream, "aclose", None)
        if close is not None:
            try:
                await close()
            except Exception as error:
                _log.debug("closing the summary stream raised %r", error)
    if assembler.finish is None:
        raise ModelError("the summary stream ended without finishing", code="MODEL_UNAVAILABLE")
    if assembler.finish == "length":
        raise ModelError("the summary was cut off at its output limit", code="MODEL_UNAVAILABLE")
    if not any(block.get("type") == "text" and str(block.get("text", "")).strip() for block in assembler.content()):
        raise ModelError("the summary request returned no text", code="MODEL_UNAVAILABLE")
    return assembler
