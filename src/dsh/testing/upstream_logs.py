"""Session logs in the TypeScript harness's default format, and the events a reader must see in them.

Layer: testing (shipped). The TypeScript harness writes a session log one flush batch at a time and,
by default, packs each run of three or more consecutive chunk deltas of one kind and one stream
block into a single row (docs/storage-format.md#compatibility-with-the-typescript-harness); its
earlier versions also stored a few events in older shapes. dsh only reads those logs, so the
fixtures here are built by our own packer from the rules, independently of the reader's expander:

* `pack_chunk_runs(batch)` turns one flush batch of event records into the storage records the
  harness writes (packed rows plus every other event verbatim). `JsonlLogWriter(...,
  pack_chunks=True)` applies it per batch.
* `UpstreamLogBuilder` builds one session: the records as stored (older shapes where a call asks for
  them), the events a reader must produce from them (`expected`), and the flush batches.

Nothing here validates; a test may build any state it needs.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from dsh.json import SAFE_INT_MAX
from dsh.testing.stored_logs import BASE_TIME_MS

__all__ = [
    "MIN_PACKED_RUN",
    "UpstreamLog",
    "UpstreamLogBuilder",
    "legacy_message_id",
    "pack_chunk_runs",
]

MIN_PACKED_RUN: Final = 3
"""The harness packs a run only when it holds at least this many deltas."""

_ROW_OF: Final = {
    "text-delta": "text-chunks",
    "reasoning-delta": "reasoning-chunks",
    "tool-call-delta": "tool-call-chunks",
}

Record = dict[str, Any]


def legacy_message_id(session_id: str, seq: int) -> str:
    """The id a reader gives a message stored without one: `legacy-message:<session id>:<seq>`."""
    return f"legacy-message:{session_id}:{seq}"


# --------------------------------------------------------------------------------------------------
# Packing


def _safe(value: object) -> bool:
    return type(value) is int and -SAFE_INT_MAX <= value <= SAFE_INT_MAX


def _number(value: object) -> bool:
    return type(value) is int or type(value) is float


def _delta_kind(record: Mapping[str, Any]) -> str | None:
    """The delta kind of an event the packer may fold, or None (the event is written as it is).

    Only exact shapes fold: envelope `{type, seq, time, data}` with integer seq and time, data
    `{turn, step, chunk}`, and a chunk that is exactly a text or reasoning delta `{type, index,
    text}` or a tool-call delta `{type, index, id, name?, argumentsDelta}`.
    """
    if record.get("type") != "assistant/chunk" or record.keys() != {"type", "seq", "time", "data"}:
        return None
    seq, time, data = record["seq"], record["time"], record["data"]
    if not (_safe(seq) and seq >= 0 and _safe(time)):
        return None
    if type(data) is not dict or data.keys() != {"turn", "step", "chunk"}:
        return None
    chunk = data["chunk"]
    if not (_number(data["turn"]) and _number(data["step"]) and type(chunk) is dict and _number(chunk.get("index"))):
        return None
    kind = chunk.get("type")
    if kind in ("text-delta", "reasoning-delta"):
        return kind if chunk.keys() == {"type", "index", "text"} and type(chunk["text"]) is str else None
    if kind == "tool-call-delta":
        keys = chunk.keys()
        shaped = keys == {"type", "index", "id", "argumentsDelta"} or (
            keys == {"type", "index", "id", "name", "argumentsDelta"} and type(chunk["name"]) is str
        )
        return kind if shaped and type(chunk["id"]) is str and type(chunk["argumentsDelta"]) is str else None
    return None


def _extends(last: Mapping[str, Any], record: Mapping[str, Any], kind: str) -> bool:
    """Whether `record` continues the run that ends with `last` (both of delta kind `kind`)."""
    if record["seq"] != last["seq"] + 1 or not _safe(record["time"] - last["time"]):
        return False
    a, b = last["data"], record["data"]
    if (a["turn"], a["step"], a["chunk"]["index"]) != (b["turn"], b["step"], b["chunk"]["index"]):
        return False
    if kind != "tool-call-delta":
        return True
    first, second = a["chunk"], b["chunk"]
    # A run keeps one call id and either no name or the same name on every member.
    return (
        first["id"] == second["id"]
        and ("name" in first) == ("name" in second)
        and first.get("name") == second.get("name")
    )


def _row(kind: str, run: Sequence[Mapping[str, Any]]) -> Record:
    first = run[0]
    data: Record = {
        "turn": first["data"]["turn"],
        "step": first["data"]["step"],
        "index": first["data"]["chunk"]["index"],
        "dt": [member["time"] - previous["time"] for previous, member in itertools.pairwise(run)],
    }
    if kind == "tool-call-delta":
        chunk = first["data"]["chunk"]
        data["id"] = chunk["id"]
        if "name" in chunk:
            data["name"] = chunk["name"]
        data["args"] = [member["data"]["chunk"]["argumentsDelta"] for member in run]
    else:
        data["texts"] = [member["data"]["chunk"]["text"] for member in run]
    return {"type": _ROW_OF[kind], "seq0": first["seq"], "time0": first["time"], "data": data}


def pack_chunk_runs(batch: Sequence[Mapping[str, Any]]) -> list[Record]:
    """The storage records the harness writes for one flush batch, in order.

    Each run of at least `MIN_PACKED_RUN` consecutive foldable deltas of one kind, one turn, step
    and block (and, for tool calls, one call id and one name or none) becomes one row; everything
    else, shorter runs included, is kept verbatim. Runs never cross batches: a run split by a flush
    packs on each side separately (or not at all, when a side is too short).
    """
    out: list[Record] = []
    run: list[Mapping[str, Any]] = []
    run_kind: str | None = None

    def close() -> None:
        if run_kind is not None and len(run) >= MIN_PACKED_RUN:
            out.append(_row(run_kind, run))
        else:
            out.extend(dict(member) for member in run)
        run.clear()

    for record in batch:
        kind = _delta_kind(record)
        if kind is None:
            close()
            run_kind = None
            out.append(dict(record))
            continue
        if kind == run_kind and run and _extends(run[-1], record, kind):
            run.append(record)
            continue
        close()
        run_kind = kind
        run.append(record)
    close()
    return out


# --------------------------------------------------------------------------------------------------
# Building whole logs


@dataclass
class UpstreamLog:
    """One session as the harness stores it, and what a reader must make of it.

    Attributes:
        session_id: The session id.
        stored: One record per event as the harness stored it (older shapes where asked), before
            packing; `JsonlLogWriter.write(..., pack_chunks=True)` packs them per batch.
        expected: The events a reader must produce (current shapes; legacy ids filled in).
        batches: The flush batches, as event counts (they add up to `len(stored)`).
    """

    session_id: str
    stored: list[Record] = field(default_factory=list)
    expected: list[Record] = field(default_factory=list)
    batches: list[int] = field(default_factory=list)


LegacyUser = Literal["identity", "steering", "steering-wrapped"]
LegacyEnd = Literal["bare-aborted", "disposed", "error-failure", "error-message"]


class UpstreamLogBuilder:
    """Appends events to one upstream-style session log; `build()` returns it.

    Every event gets the next seq and the builder's clock (`time`), which moves by `step_ms` per
    event unless a call passes `time=` (any value, also one earlier than the previous event).
    `flush()` ends a write batch. Calls with a `legacy=` argument store the event in an older
    shape and record the current shape a reader must migrate it to.
    """

    def __init__(self, session_id: str, *, time: int = BASE_TIME_MS, step_ms: int = 7) -> None:
        self.log = UpstreamLog(session_id)
        self.time = time
        self.step_ms = step_ms
        self._batch_start = 0

    @property
    def seq(self) -> int:
        """The seq the next event gets."""
        return len(self.log.expected)

    def add(
        self,
        kind: str,
        data: Any,
        *,
        stored: Record | None = None,
        surface: bool = False,
        time: int | None = None,
        stored_type: str | None = None,
    ) -> Record:
        """Append one event; `stored`/`stored_type` give the data and type it is stored with (older shapes)."""
        at = self.time if time is None else time
        self.time = at + self.step_ms
        event: Record = {"type": kind, "seq": self.seq, "time": at, "data": data}
        if surface:
            event["surfaceOp"] = "append"
        record = copy.deepcopy(event)
        if stored is not None:
            record["data"] = stored
        if stored_type is not None:
            record["type"] = stored_type
        self.log.expected.append(event)
        self.log.stored.append(record)
        return event

    def flush(self) -> None:
        """End the current write batch (a write-behind flush); an empty batch is not recorded."""
        if self.seq > self._batch_start:
            self.log.batches.append(self.seq - self._batch_start)
            self._batch_start = self.seq

    def build(self) -> UpstreamLog:
        """The log so far (the open batch is flushed)."""
        self.flush()
        return self.log

    # ---------------------------------------------------------------- turns and steps

    def turn_start(self, turn: int, *, trigger: Mapping[str, Any] | None = None) -> None:
        """`turn/start`; with `trigger`, stored in the older `{turn, trigger}` shape."""
        self.add("turn/start", {"turn": turn}, stored=None if trigger is None else {"turn": turn, "trigger": trigger})

    def turn_end(self, turn: int, *, legacy: LegacyEnd | None = None, kind: str = "completed") -> None:
        """`turn/end` with reason `kind`, or one of the older reasons (and the current reason it stands for)."""
        if legacy is None:
            self.add("turn/end", {"turn": turn, "reason": {"kind": kind}})
            return
        stored_reason: Record
        if legacy == "bare-aborted":
            stored_reason, reason = {"kind": "aborted"}, {"kind": "aborted", "reason": {"kind": "legacy"}}
        elif legacy == "disposed":
            stored_reason, reason = {"kind": "disposed"}, {"kind": "aborted", "reason": {"kind": "disposed"}}
        elif legacy == "error-failure":
            failure = {"message": "rate limited", "code": "MODEL_RATE_LIMITED", "status": 429}
            stored_reason, reason = (
                {"kind": "error", "step": 1, "failure": failure},
                {"kind": "error", "error": failure},
            )
        else:
            stored_reason = {"kind": "error", "step": 1, "message": "boom"}
            reason = {"kind": "error", "error": {"message": "boom", "code": "UNKNOWN"}}
        self.add("turn/end", {"turn": turn, "reason": reason}, stored={"turn": turn, "reason": stored_reason})

    def step_start(self, turn: int, step: int) -> None:
        """`step/start`."""
        self.add("step/start", {"turn": turn, "step": step})

    def step_end(self, turn: int, step: int) -> None:
        """`step/end`."""
        self.add("step/end", {"turn": turn, "step": step})

    # ---------------------------------------------------------------- messages

    def user(self, text: str, *, turn: int = 1, legacy: LegacyUser | None = None) -> None:
        """A user message; `legacy` stores it without an id, or as a flat or wrapped `steering/message`."""
        content = [{"type": "text", "text": text}]
        source = {"kind": "user"}
        if legacy is None:
            message = {"id": f"u{self.seq}", "role": "user", "content": content, "source": source}
            self.add("user/message", message, surface=True)
        elif legacy == "steering-wrapped":
            message = {"id": f"u{self.seq}", "role": "user", "content": content, "source": source}
            wrapped = {"turn": turn, "message": copy.deepcopy(message)}
            self.add("user/message", message, stored=wrapped, stored_type="steering/message", surface=True)
        else:
            message = {
                "content": content,
                "source": source,
                "id": legacy_message_id(self.log.session_id, self.seq),
                "role": "user",
            }
            stored = {"content": copy.deepcopy(content), "source": dict(source)}
            if legacy == "identity":
                self.add("user/message", message, stored=stored, surface=True)
            else:
                self.add(
                    "user/message",
                    message,
                    stored={"turn": turn, **stored},
                    stored_type="steering/message",
                    surface=True,
                )

    def assistant(self, turn: int, step: int, text: str, *, legacy: bool = False) -> None:
        """An assistant message; `legacy` stores the older `{turn, step, content, provenance}` shape."""
        content = [{"type": "text", "text": text}]
        message_id = legacy_message_id(self.log.session_id, self.seq) if legacy else f"a{self.seq}"
        source = {"kind": "model", "provider": "upstream", "model": "deepseek"}
        message = {"id": message_id, "role": "assistant", "content": content, "source": source}
        data = {"turn": turn, "step": step, "message": message}
        stored = None
        if legacy:
            provenance = {"provider": "upstream", "model": "deepseek"}
            stored = {"turn": turn, "step": step, "content": copy.deepcopy(content), "provenance": provenance}
        self.add("assistant/message", data, stored=stored, surface=True)

    def tool_call(self, turn: int, step: int, call_id: str, name: str, arguments: str) -> None:
        """`tool/call`."""
        self.add("tool/call", {"turn": turn, "step": step, "callId": call_id, "name": name, "arguments": arguments})

    def tool_result(self, turn: int, step: int, call_id: str, text: str, *, legacy: bool = False) -> None:
        """A tool result; `legacy` stores the older `{turn, step, callId, content, isError}` shape."""
        inner = [{"type": "text", "text": text}]
        message_id = legacy_message_id(self.log.session_id, self.seq) if legacy else f"r{self.seq}"
        block = {"type": "tool-result", "toolCallId": call_id, "content": inner, "isError": False}
        message = {"id": message_id, "role": "user", "content": [block], "source": {"kind": "tool", "callId": call_id}}
        stored = None
        if legacy:
            stored = {"turn": turn, "step": step, "callId": call_id, "content": copy.deepcopy(inner), "isError": False}
        self.add("tool/result", {"turn": turn, "step": step, "message": message}, stored=stored, surface=True)

    # ---------------------------------------------------------------- streamed chunks

    def chunk(self, turn: int, step: int, chunk: Mapping[str, Any], *, time: int | None = None) -> None:
        """One `assistant/chunk` with any chunk (block boundaries, usage, finish ... stay unpacked)."""
        self.add("assistant/chunk", {"turn": turn, "step": step, "chunk": dict(chunk)}, time=time)

    def deltas(
        self,
        turn: int,
        step: int,
        pieces: Sequence[str],
        *,
        kind: Literal["text", "reasoning"] = "text",
        index: int = 0,
        times: Sequence[int] | None = None,
    ) -> None:
        """A stream of text (or reasoning) deltas of one block; `times` sets each delta's time."""
        for position, piece in enumerate(pieces):
            chunk = {"type": f"{kind}-delta", "index": index, "text": piece}
            self.chunk(turn, step, chunk, time=None if times is None else times[position])

    def call_deltas(
        self,
        turn: int,
        step: int,
        call_id: str,
        pieces: Sequence[str],
        *,
        name: str | None = None,
        name_on: Literal["all", "first"] = "all",
        index: int = 0,
    ) -> None:
        """A stream of tool-call argument deltas; the name on every delta, only on the first, or nowhere."""
        for position, piece in enumerate(pieces):
            chunk: Record = {"type": "tool-call-delta", "index": index, "id": call_id}
            if name is not None and (name_on == "all" or position == 0):
                chunk["name"] = name
            chunk["argumentsDelta"] = piece
            self.chunk(turn, step, chunk)
