"""Older event shapes are migrated on read, one function per shape; refused shapes stay refused.

The migrations live in the read pipeline (`dsh.persistence._validation`): messages without ids get
`legacy-message:<session id>:<seq>`, `steering/message` becomes `user/message`, `turn/start` loses
its `trigger`, older `turn/end` reasons become current ones, and dsh's own older usage shapes (a
`turn/end` with the turn's usage, step usages counting cached input twice) become the harness's
disjoint step usage. The stored bytes never change, and a resumed session appends only current
shapes (docs/storage-format.md#older-event-shapes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import zstandard

from dsh.persistence._legacy_shapes import (
    LegacyShapeError,
    migrate_assistant_message_identity,
    migrate_steering_message,
    migrate_step_usage_cached_input,
    migrate_tool_result_identity,
    migrate_turn_end_reason,
    migrate_turn_end_usage,
    migrate_turn_start_trigger,
    migrate_usage_chunk_cached_input,
    migrate_user_message_identity,
)
from dsh.persistence.errors import SessionCorruptionError, SessionFormatUnsupportedError
from dsh.persistence.memory import MemoryBackend, MemoryStorage
from dsh.persistence.sqlite import SqliteBackend
from dsh.testing.jsonl_writer import frame_spans
from dsh.testing.sqlite_writer import SqliteStoredLogWriter
from dsh.testing.stored_logs import MemoryStoredLogWriter, stored_header
from dsh.testing.upstream_logs import UpstreamLogBuilder
from tests.helpers import tree_snapshot
from tests.persistence.helpers import make_backend, make_writer, plain, running, upstream_session


def _event(kind: str, seq: int, data: Any, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "seq": seq, "time": 100 + seq, "data": data, **extra}


def _no_ids(_seq: object) -> str | None:
    return None


def _assistant(usage: dict[str, Any], seq: int = 0) -> dict[str, Any]:
    message = {
        "id": "m",
        "role": "assistant",
        "content": [],
        "source": {"kind": "model", "provider": "p", "model": "m"},
    }
    return _event("assistant/message", seq, {"turn": 1, "step": 1, "message": message, "usage": usage})


def _usage_chunk(usage: dict[str, Any], seq: int = 0) -> dict[str, Any]:
    return _event("assistant/chunk", seq, {"turn": 1, "step": 1, "chunk": {"type": "usage", "usage": usage}})


# ---------------------------------------------------------------- one function per shape, literally


def test_turn_start_loses_its_trigger() -> None:
    """`{turn, trigger}` becomes `{turn}`; the envelope stays; a current `turn/start` is returned as it is."""
    old = _event("turn/start", 4, {"turn": 2, "trigger": {"kind": "message", "source": {"kind": "user"}}})
    assert migrate_turn_start_trigger(old, "s") == _event("turn/start", 4, {"turn": 2})
    current = _event("turn/start", 4, {"turn": 2})
    assert migrate_turn_start_trigger(current, "s") is current


@pytest.mark.parametrize(
    ("stored", "current"),
    [
        ({"kind": "aborted"}, {"kind": "aborted", "reason": {"kind": "legacy"}}),
        ({"kind": "disposed"}, {"kind": "aborted", "reason": {"kind": "disposed"}}),
        (
            {"kind": "error", "step": 2, "failure": {"message": "m", "code": "C", "requestId": "r"}},
            {"kind": "error", "error": {"message": "m", "code": "C", "requestId": "r"}},
        ),
        ({"kind": "error", "step": 0, "message": "m"}, {"kind": "error", "error": {"message": "m", "code": "UNKNOWN"}}),
        (
            {"kind": "error", "step": 1, "message": "m", "code": "X"},
            {"kind": "error", "error": {"message": "m", "code": "X"}},
        ),
    ],
)
def test_older_turn_end_reasons_become_current_ones(stored: dict[str, Any], current: dict[str, Any]) -> None:
    """A bare `aborted`, `disposed`, and `error` with `failure` or `message` map to the current reason literally."""
    old = _event("turn/end", 9, {"turn": 3, "reason": stored})
    assert migrate_turn_end_reason(old, "s") == _event("turn/end", 9, {"turn": 3, "reason": current})


def test_current_turn_end_reasons_are_left_alone() -> None:
    """Completed, aborted with a cause, error with an error object and unknown kinds pass through unchanged."""
    for reason in (
        {"kind": "completed"},
        {"kind": "aborted", "reason": {"kind": "user"}},
        {"kind": "error", "error": {"message": "m", "code": "C"}},
        {"kind": "paused-for-review"},
    ):
        record = _event("turn/end", 1, {"turn": 0, "reason": reason})
        assert migrate_turn_end_reason(record, "s") is record


def test_steering_messages_become_user_messages() -> None:
    """Flat steering gets a legacy id and role; wrapped steering keeps its message; turn goes, surfaceOp stays."""
    flat = _event("steering/message", 7, {"turn": 1, "content": [], "source": {"kind": "user"}}, surfaceOp="append")
    assert migrate_steering_message(flat, "sess") == _event(
        "user/message",
        7,
        {"content": [], "source": {"kind": "user"}, "id": "legacy-message:sess:7", "role": "user"},
        surfaceOp="append",
    )
    message = {"id": "w1", "role": "user", "content": [], "source": {"kind": "user"}}
    wrapped = _event("steering/message", 8, {"turn": 1, "message": message}, surfaceOp="append")
    assert migrate_steering_message(wrapped, "sess") == _event("user/message", 8, message, surfaceOp="append")


def test_messages_without_ids_get_legacy_ids() -> None:
    """User, assistant and tool-result messages stored before ids exist get `legacy-message:<id>:<seq>`."""
    user = _event("user/message", 1, {"content": [], "source": {"kind": "user"}}, surfaceOp="append")
    assert migrate_user_message_identity(user, "s")["data"] == {
        "content": [],
        "source": {"kind": "user"},
        "id": "legacy-message:s:1",
        "role": "user",
    }
    assistant = _event(
        "assistant/message",
        3,
        {"turn": 1, "step": 1, "content": [], "provenance": {"provider": "p", "model": "m"}, "usage": {}},
        surfaceOp="append",
    )
    assert migrate_assistant_message_identity(assistant, "s")["data"] == {
        "turn": 1,
        "step": 1,
        "usage": {},
        "message": {
            "id": "legacy-message:s:3",
            "role": "assistant",
            "content": [],
            "source": {"provider": "p", "model": "m", "kind": "model"},
        },
    }
    result = _event(
        "tool/result", 5, {"turn": 1, "step": 1, "callId": "c1", "content": [], "isError": True}, surfaceOp="append"
    )
    assert migrate_tool_result_identity(result, "s", _no_ids)["data"] == {
        "turn": 1,
        "step": 1,
        "message": {
            "id": "legacy-message:s:5",
            "role": "user",
            "content": [{"type": "tool-result", "toolCallId": "c1", "content": [], "isError": True}],
            "source": {"kind": "tool", "callId": "c1"},
        },
    }


def test_a_replacing_tool_result_keeps_the_id_of_what_it_replaces() -> None:
    """An old tool result that replaces seq 4 takes the message id of the event at seq 4."""
    replace = {"op": "replace", "start": 4, "end": 4}
    result = _event(
        "tool/result", 9, {"turn": 1, "step": 1, "callId": "c", "content": [], "isError": False}, surfaceOp=replace
    )
    migrated = migrate_tool_result_identity(result, "s", {4: "r-4"}.get)
    assert migrated["data"]["message"]["id"] == "r-4"
    assert migrate_tool_result_identity(result, "s", _no_ids)["data"]["message"]["id"] is None


def test_an_earlier_dsh_turn_end_loses_its_usage() -> None:
    """`{turn, reason, usage}` becomes `{turn, reason}`; a current `turn/end` is returned as it is."""
    old = _event("turn/end", 5, {"turn": 2, "reason": {"kind": "completed"}, "usage": {"inputTokens": 9}})
    assert migrate_turn_end_usage(old, "s") == _event("turn/end", 5, {"turn": 2, "reason": {"kind": "completed"}})
    current = _event("turn/end", 5, {"turn": 2, "reason": {"kind": "completed"}})
    assert migrate_turn_end_usage(current, "s") is current


def test_an_earlier_dsh_step_usage_becomes_disjoint_counts() -> None:
    """Inclusive `inputTokens` with `cachedInputTokens` become uncached input plus `cacheReadTokens`, on a
    step's message and on a logged usage chunk alike; current usages are returned as they are."""
    old = {"inputTokens": 1000, "outputTokens": 40, "cachedInputTokens": 768, "reasoningTokens": 9}
    new = {"inputTokens": 232, "outputTokens": 40, "cacheReadTokens": 768, "reasoningTokens": 9}
    assert migrate_step_usage_cached_input(_assistant(old, 3), "s") == _assistant(new, 3)
    assert migrate_usage_chunk_cached_input(_usage_chunk(old, 2), "s") == _usage_chunk(new, 2)
    for current in (_assistant(new), _assistant({"inputTokens": 3, "outputTokens": 1})):
        assert migrate_step_usage_cached_input(current, "s") is current
    chunk = _usage_chunk(new)
    assert migrate_usage_chunk_cached_input(chunk, "s") is chunk


@pytest.mark.parametrize(
    ("migrate", "record"),
    [
        (migrate_turn_start_trigger, _event("turn/start", 0, {"turn": 0, "trigger": {"kind": "message"}})),
        (migrate_turn_start_trigger, _event("turn/start", 0, {"turn": 1, "trigger": {"kind": ""}})),
        (migrate_turn_start_trigger, _event("turn/start", 0, {"turn": 1, "trigger": {"kind": "m"}, "x": 1})),
        (migrate_turn_end_reason, _event("turn/end", 0, {"turn": 1, "reason": {"kind": "disposed", "why": "x"}})),
        (migrate_turn_end_reason, _event("turn/end", 0, {"turn": 1, "reason": {"kind": "error", "message": "m"}})),
        (migrate_turn_end_reason, _event("turn/end", 0, {"turn": 0, "reason": {"kind": "aborted"}})),
        (migrate_turn_end_reason, _event("turn/end", 0, {"turn": 1, "reason": {"kind": "aborted"}, "extra": 1})),
        (migrate_steering_message, _event("steering/message", 0, {"content": [], "source": {}})),
        (migrate_steering_message, _event("steering/message", 0, {"turn": 1, "content": []})),
        (migrate_steering_message, _event("steering/message", 0, "text")),
        (migrate_turn_end_usage, _event("turn/end", 0, {"turn": 1, "reason": {"kind": "completed"}, "usage": 5})),
        (migrate_turn_end_usage, _event("turn/end", 0, {"turn": 1, "usage": {}})),
        (migrate_step_usage_cached_input, _assistant({"inputTokens": 3, "outputTokens": 1, "cachedInputTokens": 4})),
        (migrate_step_usage_cached_input, _assistant({"inputTokens": 3, "cachedInputTokens": 1})),
        (migrate_step_usage_cached_input, _assistant({"inputTokens": 3, "outputTokens": 1, "cachedInputTokens": -1})),
        (
            migrate_step_usage_cached_input,
            _assistant({"inputTokens": 3, "outputTokens": 1, "cachedInputTokens": 1, "cacheReadTokens": 1}),
        ),
        (
            migrate_usage_chunk_cached_input,
            _usage_chunk({"inputTokens": 1.5, "outputTokens": 1, "cachedInputTokens": 1}),
        ),
    ],
)
def test_a_record_that_is_almost_an_older_shape_is_refused(migrate: Any, record: dict[str, Any]) -> None:
    """A record that starts like an older shape but is not exactly it raises instead of being guessed at."""
    with pytest.raises(LegacyShapeError, match="malformed legacy"):
        migrate(record, "s")


# ---------------------------------------------------------------- whole logs through the coordinator


async def test_a_legacy_upstream_log_reads_as_its_current_form(tmp_path: Path, compression: str) -> None:
    """A packed log full of older shapes loads to exactly the current events, and lists like the current log."""
    legacy = upstream_session(legacy=True)
    root = tmp_path / "sessions"
    writer = make_writer(root, compression)
    await writer.write(
        legacy.session_id, stored_header(legacy.session_id), legacy.stored, batches=legacy.batches, pack_chunks=True
    )
    await writer.write("current", stored_header("current"), legacy.expected)
    async with running(make_backend(root, compression)) as (coordinator, _):
        observation = await coordinator.inspect(legacy.session_id)
        assert plain(observation.events) == legacy.expected
        assert observation.synthetic_tail == 0
        listing = await coordinator.list()
        assert [row.header.id for row in listing.rows] == ["current", legacy.session_id]
        typed = await coordinator.read_events(legacy.session_id, types={"user/message", "turn/end"})
        assert plain(typed.events) == [e for e in legacy.expected if e["type"] in ("user/message", "turn/end")]


async def test_every_older_turn_end_and_message_shape_loads_and_folds(tmp_path: Path, compression: str) -> None:
    """Each older turn ending and message shape loads as its current form; closers and listing see that form."""
    b = UpstreamLogBuilder("s1")
    shapes: list[Any] = ["bare-aborted", "disposed", "error-failure", "error-message"]
    users: list[Any] = ["identity", "steering", "steering-wrapped", None]
    for turn, (end, user) in enumerate(zip(shapes, users, strict=True), start=1):
        b.turn_start(turn, trigger={"kind": "message", "source": {"kind": "user"}})
        b.user(f"q{turn}", turn=turn, legacy=user)
        b.step_start(turn, 1)
        b.deltas(turn, 1, ["a", "b", "c"])
        b.assistant(turn, 1, "ok", legacy=True)
        b.tool_call(turn, 1, f"c{turn}", "ls", "{}")
        b.tool_result(turn, 1, f"c{turn}", "out", legacy=True)
        b.step_end(turn, 1)
        b.turn_end(turn, legacy=end)
        b.flush()
    b.turn_start(5, trigger={"kind": "retry"})
    log = b.build()
    root = tmp_path / "sessions"
    writer = make_writer(root, compression)
    await writer.write("s1", stored_header("s1"), log.stored, batches=log.batches, pack_chunks=True)
    await writer.write("s2", stored_header("s2"), log.expected)
    async with running(make_backend(root, compression)) as (coordinator, _):
        legacy = await coordinator.inspect("s1")
        current = await coordinator.inspect("s2")
        assert plain(legacy.events)[: len(log.expected)] == log.expected
        assert plain(legacy.events) == plain(current.events)
        assert legacy.synthetic_tail == current.synthetic_tail == 1  # the open turn 5 gets its turn/end
        assert [row.header.id for row in (await coordinator.list()).rows] == ["s1", "s2"]


async def test_reading_and_resuming_never_rewrite_the_stored_shapes(tmp_path: Path) -> None:
    """Inspect and prepare of a closed legacy log leave its bytes as they were; new events are current shapes."""
    legacy = upstream_session(legacy=True, turns=1)
    root = tmp_path / "sessions"
    writer = make_writer(root, "none")
    await writer.write(legacy.session_id, stored_header(legacy.session_id), legacy.stored, batches=legacy.batches)
    path = writer.path_of(legacy.session_id)
    before = tree_snapshot(root)
    original = Path(path).read_bytes()
    async with running(make_backend(root, "none")) as (coordinator, store):
        await coordinator.inspect(legacy.session_id)
        assert tree_snapshot(root) == before
        prepared = await coordinator.prepare(legacy.session_id)
        assert tree_snapshot(root) == before
        session = prepared.publish()
        session.append("turn/start", {"turn": 2})
        user = {"id": "u-new", "role": "user", "content": [], "source": {"kind": "user"}}
        session.append("user/message", user, surface_op="append")
        session.append("turn/end", {"turn": 2, "reason": {"kind": "aborted", "reason": {"kind": "user"}}})
        appended = plain(session.events[len(legacy.expected) :])
        await store.flush(session)
    data = Path(path).read_bytes()
    assert data.startswith(original)
    lines = data.rstrip(b"\n").split(b"\n")
    assert [orjson.loads(line) for line in lines[-len(appended) :]] == appended
    assert b"steering/message" in data
    async with running(make_backend(root, "none")) as (coordinator, _):
        assert plain((await coordinator.inspect(legacy.session_id)).events) == legacy.expected + appended


def _plaintext(path: str) -> bytes:
    data = Path(path).read_bytes()
    if path.endswith(".zstd"):
        data = zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True).read()
    return data


@pytest.mark.parametrize(("compression", "torn"), [("none", False), ("zstd", False), ("zstd", True)])
async def test_crash_repair_of_a_migrated_log_appends_current_closers_and_keeps_older_lines(
    tmp_path: Path, compression: str, torn: bool
) -> None:
    """A crashed legacy log (torn final frame or not) gets current-shape closers; its older lines stay as stored."""
    log = upstream_session(legacy=True, open_turn=True, turns=1)
    root = tmp_path / "sessions"
    writer = make_writer(root, compression)
    await writer.write(log.session_id, stored_header(log.session_id), log.stored, batches=log.batches, pack_chunks=True)
    path = writer.path_of(log.session_id)
    before = _plaintext(path)
    if torn:
        # The final frame holds the flat steering message; tear it after a fragment of one more line.
        data = Path(path).read_bytes()
        start, end = frame_spans(data)[-1]
        last = zstandard.ZstdDecompressor().decompress(data[start:end])
        assert b'"steering/message"' in last
        frame = zstandard.ZstdCompressor(level=3, write_checksum=True).compress(last + b'{"type":"step/e')
        Path(path).write_bytes(data[:start] + frame[:-3])
    async with running(make_backend(root, compression)) as (coordinator, _):
        observation = await coordinator.inspect(log.session_id)
        assert plain(observation.events[: len(log.expected)]) == log.expected
        closers = plain(observation.events[len(log.expected) :])
        assert [(event["type"], event["data"]) for event in closers] == [
            ("step/end", {"turn": 1, "step": 2}),
            ("turn/end", {"turn": 1, "reason": {"kind": "interrupted"}}),
        ]
        async with await coordinator.prepare(log.session_id):
            pass
    after = _plaintext(path)
    if not torn:
        assert after.startswith(before)
    lines = [orjson.loads(line) for line in after.rstrip(b"\n").split(b"\n")[1:]]
    assert [line["type"] for line in lines].count("steering/message") == 1  # never rewritten as a user message
    assert not any("legacy-message:" in orjson.dumps(line).decode() for line in lines)
    assert lines[-2:] == closers
    async with running(make_backend(root, compression)) as (coordinator, _):
        again = await coordinator.inspect(log.session_id)
    assert plain(again.events) == log.expected + closers
    assert again.synthetic_tail == 0


@pytest.mark.parametrize(
    "refused",
    [
        {"type": "request/header-delta", "data": {"delta": {}}},
        {"type": "mode/set", "data": {"mode": "plan"}},
        {"type": "request/header", "data": {"reason": "fallback", "header": {}}},
    ],
)
async def test_shapes_upstream_refuses_stay_refused(tmp_path: Path, refused: dict[str, Any]) -> None:
    """Retired vocabulary with no migration is format-unsupported, even after a malformed older shape."""
    root = tmp_path / "sessions"
    b = UpstreamLogBuilder("s1")
    b.turn_start(1, trigger={"kind": "message"})
    b.add("turn/start", {"turn": 1}, stored={"turn": 0, "trigger": {"kind": "m"}})  # malformed older shape
    records = [*b.build().stored, {"seq": 2, "time": 5, **refused}]
    await make_writer(root, "none").write("s1", stored_header("s1"), records)
    async with running(make_backend(root, "none")) as (coordinator, _):
        with pytest.raises(SessionFormatUnsupportedError) as caught:
            await coordinator.inspect("s1")
    assert caught.value.seq == 2
    assert caught.value.event_type == refused["type"]


async def test_a_malformed_older_shape_is_corruption_after_earlier_defects(tmp_path: Path) -> None:
    """A malformed steering message is `SESSION_CORRUPT`; a defect in an earlier event is reported first."""
    root = tmp_path / "sessions"
    steering = {
        "type": "steering/message",
        "seq": 2,
        "time": 3,
        "data": {"turn": 1, "text": "hi"},
        "surfaceOp": "append",
    }
    start = {"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1}}
    writer = make_writer(root, "none")
    await writer.write(
        "s1",
        stored_header("s1"),
        [start, {"type": "step/start", "seq": 1, "time": 2, "data": {"turn": 1, "step": 1}}, steering],
    )
    await writer.write(
        "s2", stored_header("s2"), [start, {"type": "step/start", "seq": 1, "time": 2, "data": {}}, steering]
    )
    async with running(make_backend(root, "none")) as (coordinator, _):
        with pytest.raises(SessionCorruptionError, match="malformed legacy steering/message at seq 2"):
            await coordinator.inspect("s1")
        with pytest.raises(SessionCorruptionError, match="step/start"):
            await coordinator.inspect("s2")


async def test_an_unresolved_replaced_message_id_is_corruption(tmp_path: Path) -> None:
    """An old tool result replacing an event that carries no message cannot get an id: `SESSION_CORRUPT`."""
    root = tmp_path / "sessions"
    b = UpstreamLogBuilder("s1")
    b.turn_start(1)
    b.step_start(1, 1)
    stored = {"turn": 1, "step": 1, "callId": "c", "content": [], "isError": False}
    b.add("tool/result", {}, stored=stored)
    log = b.build()
    log.stored[2]["surfaceOp"] = {"op": "replace", "start": 1, "end": 1}
    log.stored[2]["sourceEventSeqs"] = [1]
    await make_writer(root, "none").write("s1", stored_header("s1"), log.stored)
    async with running(make_backend(root, "none")) as (coordinator, _):
        with pytest.raises(SessionCorruptionError, match="message id"):
            await coordinator.inspect("s1")


async def test_a_replacing_tool_result_inherits_the_replaced_message_id(tmp_path: Path, compression: str) -> None:
    """An old tool result replacing a current one keeps that one's id and folds as a valid surface replace."""
    root = tmp_path / "sessions"
    b = UpstreamLogBuilder("s1")
    b.turn_start(1)
    b.step_start(1, 1)
    b.tool_call(1, 1, "c1", "ls", "{}")
    b.tool_result(1, 1, "c1", "long output")
    replaced = b.log.expected[-1]
    message = {**replaced["data"]["message"]}
    message["content"] = [{**message["content"][0], "content": [{"type": "text", "text": "[pruned]"}]}]
    stored = {"turn": 1, "step": 1, "callId": "c1", "content": [{"type": "text", "text": "[pruned]"}], "isError": False}
    event = b.add("tool/result", {"turn": 1, "step": 1, "message": message}, stored=stored)
    for record in (event, b.log.stored[-1]):
        record["surfaceOp"] = {"op": "replace", "start": 3, "end": 3}
        record["sourceEventSeqs"] = [3]
    b.step_end(1, 1)
    b.turn_end(1)
    log = b.build()
    await make_writer(root, compression).write("s1", stored_header("s1"), log.stored)
    async with running(make_backend(root, compression)) as (coordinator, _):
        events = plain((await coordinator.inspect("s1")).events)
    assert events == log.expected
    assert events[4]["data"]["message"]["id"] == "r3"


def _earlier_dsh_log() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One turn as dsh wrote it before usage moved to the step alone, and the same turn in current shapes."""
    old_usage = {"inputTokens": 120, "outputTokens": 7, "cachedInputTokens": 100}
    new_usage = {"inputTokens": 20, "outputTokens": 7, "cacheReadTokens": 100}
    message = {
        "id": "a1",
        "role": "assistant",
        "content": [],
        "source": {"kind": "model", "provider": "p", "model": "m"},
    }
    user = {"id": "u1", "role": "user", "content": [{"type": "text", "text": "hi"}], "source": {"kind": "user"}}
    reason = {"kind": "completed"}

    def log(usage: dict[str, Any], end: dict[str, Any]) -> list[dict[str, Any]]:
        return [
            _event("turn/start", 0, {"turn": 1}),
            _event("step/start", 1, {"turn": 1, "step": 1}),
            _event("user/message", 2, user, surfaceOp="append"),
            _event("request/context", 3, {"provider": "p", "model": "m"}),
            _event("assistant/chunk", 4, {"turn": 1, "step": 1, "chunk": {"type": "usage", "usage": usage}}),
            _event("assistant/chunk", 5, {"turn": 1, "step": 1, "chunk": {"type": "finish", "reason": reason}}),
            _event(
                "assistant/message",
                6,
                {"turn": 1, "step": 1, "message": message, "usage": usage},
                surfaceOp="append",
                sourceEventSeqs=[4, 5],
            ),
            _event("step/end", 7, {"turn": 1, "step": 1}),
            _event("turn/end", 8, end),
        ]

    stored = log(old_usage, {"turn": 1, "reason": reason, "usage": old_usage})
    return stored, log(new_usage, {"turn": 1, "reason": reason})


async def test_an_earlier_dsh_log_reads_with_the_harness_usage_shapes(tmp_path: Path, compression: str) -> None:
    """A log of an earlier dsh (usage on `turn/end`, `cachedInputTokens` on step usages and usage chunks) reads
    as current events from JSONL, SQLite and memory alike, whole and typed."""
    stored, expected = _earlier_dsh_log()
    root = tmp_path / "sessions"
    await make_writer(root, compression).write("old", stored_header("old"), stored)
    sqlite_path = tmp_path / "s.sqlite3"
    async with SqliteBackend(sqlite_path):
        pass
    await SqliteStoredLogWriter(sqlite_path).write("old", stored_header("old"), stored)
    storage = MemoryStorage()
    await MemoryStoredLogWriter(storage).write("old", stored_header("old"), stored)
    wanted = {"assistant/message", "turn/end", "assistant/chunk"}
    for backend in (make_backend(root, compression), SqliteBackend(sqlite_path), MemoryBackend(storage)):
        async with running(backend) as (coordinator, _):
            assert plain((await coordinator.inspect("old")).events) == expected, backend
            typed = await coordinator.read_events("old", types=wanted, from_seq=5)
            assert plain(typed.events) == [e for e in expected if e["type"] in wanted and e["seq"] >= 5]


async def test_resuming_an_earlier_dsh_log_keeps_its_lines_and_appends_current_shapes(tmp_path: Path) -> None:
    """Reading and resuming never rewrite the older lines; what the resumed session appends is current."""
    stored, _ = _earlier_dsh_log()
    root = tmp_path / "sessions"
    writer = make_writer(root, "none")
    await writer.write("old", stored_header("old"), stored)
    original = Path(writer.path_of("old")).read_bytes()
    async with running(make_backend(root, "none")) as (coordinator, store):
        prepared = await coordinator.prepare("old")
        prepared.publish()
        session = prepared.session
        session.append("turn/start", {"turn": 2})
        session.append("turn/end", {"turn": 2, "reason": {"kind": "completed"}})
        await store.flush(session)
    text = Path(writer.path_of("old")).read_bytes()
    assert text.startswith(original)
    added = [orjson.loads(line) for line in text[len(original) :].splitlines()]
    assert [r["type"] for r in added] == ["session/end-seed", "turn/start", "turn/end"]
    assert b"cachedInputTokens" not in text[len(original) :]


async def test_typed_reads_migrate_the_selected_records(tmp_path: Path) -> None:
    """A backend with typed reads (memory) hands back migrated records for the requested types."""
    b = UpstreamLogBuilder("s1")
    b.turn_start(1, trigger={"kind": "message"})
    b.user("hi", legacy="identity")
    b.step_start(1, 1)
    b.assistant(1, 1, "hello", legacy=True)
    b.tool_call(1, 1, "c1", "ls", "{}")
    b.tool_result(1, 1, "c1", "out", legacy=True)
    b.step_end(1, 1)
    b.turn_end(1, legacy="error-failure")
    legacy = b.build()
    storage = MemoryStorage()
    await MemoryStoredLogWriter(storage).write("s1", stored_header("s1"), legacy.stored)
    wanted = {"turn/start", "assistant/message", "tool/result", "turn/end"}
    async with running(MemoryBackend(storage)) as (coordinator, _):
        typed = await coordinator.read_events("s1", types=wanted, from_seq=1)
        assert plain(typed.events) == [e for e in legacy.expected if e["type"] in wanted and e["seq"] >= 1]
        assert plain((await coordinator.inspect("s1")).events) == legacy.expected


def test_the_legacy_fixture_really_holds_every_older_shape() -> None:
    """The generated legacy session stores steering (both forms), triggers, id-less messages and old reasons."""
    stored = upstream_session(legacy=True).stored
    assert any(r["type"] == "steering/message" and "message" in r["data"] for r in stored)
    assert any(r["type"] == "steering/message" and "content" in r["data"] for r in stored)
    assert any(r["type"] == "turn/start" and "trigger" in r["data"] for r in stored)
    assert any(r["type"] == "user/message" and "id" not in r["data"] for r in stored)
    assert any(r["type"] == "assistant/message" and "provenance" in r["data"] for r in stored)
    assert any(r["type"] == "tool/result" and "callId" in r["data"] for r in stored)
    reasons = [r["data"]["reason"] for r in stored if r["type"] == "turn/end"]
    assert {"kind": "disposed"} in reasons
    assert {"kind": "error", "step": 1, "message": "boom"} in reasons
