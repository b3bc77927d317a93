"""Fixture writers and builders of raw stored logs, for persistence tests.

Layer: testing (shipped, importable). A `StoredLogWriter` stores stored facts directly in a backend's
storage, bypassing every check, so a test can build exactly the damaged, foreign or torn state it
needs; `write_stored_log` is the convenience entry point. `MemoryStoredLogWriter` is the
writer of the memory backend. The builders produce *valid* raw records by appending through a real
(unpublished) `Session`, so every record a test stores passes the same rules a live append does,
unless the test breaks it on purpose.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from dsh.json import thaw
from dsh.persistence.base import StorageBackend
from dsh.persistence.memory import MemoryStorage, StoredSession
from dsh.session.header import HeaderInit
from dsh.session.session import Session
from dsh.session.store import SessionStore
from dsh.testing.io_faults import IOFaultInjector

__all__ = [
    "BASE_TIME_MS",
    "ConformanceTarget",
    "MemoryStoredLogWriter",
    "StepClock",
    "StoredLogWriter",
    "append_closed_turn",
    "append_every_core_type",
    "append_note",
    "append_open_step",
    "build_records",
    "encode_record",
    "stored_header",
    "write_stored_log",
]

BASE_TIME_MS = 1_789_000_000_000
"""The epoch-millisecond start of the deterministic clocks used by the builders."""


class StoredLogWriter(Protocol):
    """Writes stored facts directly into a backend's storage, bypassing every check.

    Implementations exist per backend (memory here, JSONL in `dsh.testing.jsonl_writer`, SQLite in
    `dsh.testing.sqlite_writer`). They never validate: a test uses them to build exactly the
    damaged, foreign or torn state it needs.
    """

    async def write(self, session_id: str, header: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> None:
        """Store exactly this stored header record and these event records, replacing anything stored.

        Raises:
            ValueError: Only when the storage cannot represent the state at all (a SQL schema keyed
                by the header id cannot hold a header naming another id); tests treat that case as
                impossible for the backend.
        """

    async def append(self, session_id: str, records: Sequence[Mapping[str, Any]]) -> None:
        """Append records as an external writer would, producing a new revision."""

    async def damage_events(self, session_id: str) -> None:
        """Make the event region unreadable as corruption while the header stays listable."""

    async def snapshot(self, session_id: str) -> bytes:
        """An opaque dump of everything stored for the id (to prove a read path changed nothing)."""


@dataclass(frozen=True, slots=True)
class ConformanceTarget:
    """What a backend's conformance module provides.

    Attributes:
        make_backend: Returns a *new*, unopened backend instance over the same storage on each call.
        writer: The fixture writer for that storage.
        name: A short label for messages (`memory`, `jsonl-zstd`, `sqlite` ...).
        independent: Optional: builds a target over a *separate*, empty storage (used to prove that
            two stores with identical content never share a revision).
        io_faults: Optional: how to fail the backend's writes from the inside (`dsh.testing.io_faults`);
            the shipped backends need none, and without one the suite fails writes before the call.
    """

    make_backend: Callable[[], StorageBackend]
    writer: StoredLogWriter
    name: str
    independent: Callable[[], ConformanceTarget] | None = None
    io_faults: IOFaultInjector | None = None


# ---------------------------------------------------------------- encoding


def encode_record(record: Mapping[str, Any]) -> bytes:
    """Compact JSON with key order kept; integers beyond 64 bits fall back to the standard library."""
    try:
        return orjson.dumps(record)
    except TypeError:
        return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode()


class MemoryStoredLogWriter:
    """The `StoredLogWriter` of the memory backend: edits a `MemoryStorage` directly."""

    def __init__(self, storage: MemoryStorage) -> None:
        self.storage = storage

    async def write(self, session_id: str, header: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> None:
        """Replace the id's stored state (a new incarnation, so a new revision)."""
        self.storage.sessions[session_id] = StoredSession(
            encode_record(header), [encode_record(record) for record in records]
        )

    async def append(self, session_id: str, records: Sequence[Mapping[str, Any]]) -> None:
        """Append records behind the backend's back and bump the revision."""
        stored = self.storage.sessions[session_id]
        stored.lines.extend(encode_record(record) for record in records)
        stored.counter += 1

    async def damage_events(self, session_id: str) -> None:
        """Replace the first event record by bytes that are not JSON (the header stays intact)."""
        stored = self.storage.sessions[session_id]
        damaged = b'{"type":"turn/st\x00'
        stored.lines[:1] = [damaged]
        stored.counter += 1

    async def snapshot(self, session_id: str) -> bytes:
        """The header, every record, the incarnation and the counter."""
        stored = self.storage.sessions.get(session_id)
        if stored is None:
            return b""
        parts = [stored.header, *stored.lines, stored.incarnation.encode(), str(stored.counter).encode()]
        return b"\n".join(parts)


# ---------------------------------------------------------------- raw headers and records


def stored_header(session_id: str, *, created_at: int = BASE_TIME_MS, **fields: Any) -> dict[str, Any]:
    """A stored header record in upstream key order; `fields` use the stored (camelCase) names.

    A field given as None is left out; any other value (also an invalid one) is stored as given.
    """
    record: dict[str, Any] = {"type": "session", "version": 0, "id": session_id, "createdAt": created_at}
    order = ("cwd", "parentSession", "seedLength", "origin", "delegationDepth", "agentPreset")
    merged: dict[str, Any] = {"delegationDepth": 0, **fields}
    for key in order:
        if key in merged and merged[key] is not None:
            record[key] = merged[key]
    record.update({key: value for key, value in merged.items() if key not in order and value is not None})
    return record


async def write_stored_log(
    writer: StoredLogWriter,
    session_id: str,
    records: Sequence[Mapping[str, Any]] = (),
    *,
    header: Mapping[str, Any] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """Store `records` under `session_id` with `header` (default: `stored_header(session_id, **fields)`).

    Returns:
        The stored header record.
    """
    record = dict(header) if header is not None else stored_header(session_id, **fields)
    await writer.write(session_id, record, records)
    return record


class StepClock:
    """A deterministic epoch-ms clock that advances `step` per read."""

    def __init__(self, start: int = BASE_TIME_MS, step: int = 1) -> None:
        self.now = start
        self.step = step

    def __call__(self) -> int:
        value = self.now
        self.now += self.step
        return value


def build_records(build: Callable[[Session], object], *, session_id: str = "scratch") -> list[dict[str, Any]]:
    """Valid raw records: run `build` on a fresh unpublished session and thaw its events."""
    counter: Iterator[int] = itertools.count()
    store = SessionStore(clock=StepClock(), id_factory=lambda: f"scratch-{next(counter)}")
    session = store.prepare(session_id, header=HeaderInit())
    build(session)
    return [thaw(event) for event in session.events]


# ---------------------------------------------------------------- event builders (through a real Session)


def _user(text: str, message_id: str) -> dict[str, Any]:
    return {"id": message_id, "role": "user", "content": [{"type": "text", "text": text}], "source": {"kind": "user"}}


def _assistant(text: str, message_id: str, calls: Sequence[str] = ()) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": text}]
    content.extend({"type": "tool-call", "id": call, "name": "lookup", "arguments": "{}"} for call in calls)
    return {
        "id": message_id,
        "role": "assistant",
        "content": content,
        "source": {"kind": "model", "provider": "scripted", "model": "test"},
    }


def _tool_result(call_id: str, message_id: str, text: str) -> dict[str, Any]:
    block = {"type": "tool-result", "toolCallId": call_id, "content": [{"type": "text", "text": text}]}
    return {"id": message_id, "role": "user", "source": {"kind": "tool", "callId": call_id}, "content": [block]}


def append_closed_turn(session: Session, turn: int, *, text: str = "hello") -> None:
    """Append one complete turn: user message, one step with an assistant message, `turn/end`."""
    session.append("turn/start", {"turn": turn})
    session.append("user/message", _user(text, f"u{turn}-{session.seq}"))
    session.append("step/start", {"turn": turn, "step": 1})
    session.append(
        "assistant/message", {"turn": turn, "step": 1, "message": _assistant("ok", f"a{turn}-{session.seq}")}
    )
    session.append("step/end", {"turn": turn, "step": 1})
    session.append("turn/end", {"turn": turn, "reason": {"kind": "completed"}})


def append_open_step(session: Session, turn: int, *, calls: Sequence[str] = (), started: Sequence[str] = ()) -> None:
    """Append a turn left open inside a step: an assistant message naming `calls`, `tool/call`s for `started`."""
    session.append("turn/start", {"turn": turn})
    session.append("step/start", {"turn": turn, "step": 1})
    session.append("assistant/chunk", {"turn": turn, "step": 1, "chunk": {"type": "text-delta", "text": "wor"}})
    if calls:
        message = _assistant("calling", f"a{turn}-{session.seq}", calls)
        session.append("assistant/message", {"turn": turn, "step": 1, "message": message})
    for call in started:
        session.append("tool/call", {"turn": turn, "step": 1, "callId": call, "name": "lookup", "arguments": "{}"})


def append_note(session: Session, index: int) -> None:
    """Append one small log-only event (a `session/title`), e.g. to feed the batching window."""
    session.append("session/title", {"title": f"note {index}", "messageSeqs": [], "source": {"kind": "user"}})


def append_every_core_type(session: Session) -> None:
    """Append one event of every appendable core type, as one complete turn."""
    session.append("request/context", {"provider": "scripted", "model": "test", "contextWindow": 128000})
    session.append("turn/start", {"turn": 1})
    session.append("user/message", _user("list the files", "u1"))
    session.append("step/start", {"turn": 1, "step": 1})
    session.append("assistant/chunk", {"turn": 1, "step": 1, "chunk": {"type": "text-delta", "text": "Let"}})
    message = _assistant("Let me look.", "a1", ["call-1"])
    session.append("assistant/message", {"turn": 1, "step": 1, "message": message, "usage": {"inputTokens": 12}})
    session.append("tool/call", {"turn": 1, "step": 1, "callId": "call-1", "name": "lookup", "arguments": "{}"})
    result = _tool_result("call-1", "r1", "a.txt b.txt")
    session.append("tool/result", {"turn": 1, "step": 1, "message": result}, source_event_seqs=[6])
    session.append("step/end", {"turn": 1, "step": 1})
    session.append("session/title", {"title": "Files", "messageSeqs": [2], "source": {"kind": "fallback"}})
    descriptor = {"version": 2, "mode": "one-shot", "provider": "scripted", "label": "worker"}
    session.append("subagent/descriptor", descriptor)
    session.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})


# Shown under the name users import (docs/architecture.md#public-names).
ConformanceTarget.__module__ = "dsh.testing"
MemoryStoredLogWriter.__module__ = "dsh.testing"
StoredLogWriter.__module__ = "dsh.testing"
