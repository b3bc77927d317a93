"""Repair keeps bytes: a torn tail is never removed silently and never destroyed.

Plain JSONL (`compression="none"`): a garbled line with no later `turn/end` starts a torn tail (the
TypeScript harness's rule); a later `turn/end` makes it corruption. Reads say a torn tail was found
(`torn_tail` on the persistence and the query observation), and the repair copies the removed bytes
beside the log (`session.jsonl.torn-<epoch ms>`, mode 0600) before truncating, then logs one WARNING
with the session, the bytes and the records removed (docs/storage-format.md#torn-tails-and-repair).
"""

from __future__ import annotations

import logging
import stat
from pathlib import Path

import orjson
import pytest

from dsh.persistence.errors import SessionCorruptionError
from dsh.persistence.jsonl import encode_batch
from dsh.query.service import SessionQuery
from dsh.session.header import SessionId
from dsh.testing.stored_logs import build_records, stored_header
from tests.helpers import tree_snapshot
from tests.persistence.helpers import closed_records, make_backend, make_writer, open_step_records, running


def _open_turn_with_messages() -> list[dict[str, object]]:
    """Nine events of an open turn: log-only events and surface messages mixed, as a real turn flushes them."""

    def build(session: object) -> None:
        append = session.append  # type: ignore[attr-defined]
        append("turn/start", {"turn": 1})
        user = {"id": "u1", "role": "user", "content": [{"type": "text", "text": "hi"}], "source": {"kind": "user"}}
        append("user/message", user, surface_op="append")
        append("step/start", {"turn": 1, "step": 1})
        append("request/context", {"provider": "p", "model": "m"})
        for text in ("wor", "king"):
            append("assistant/chunk", {"turn": 1, "step": 1, "chunk": {"type": "text-delta", "text": text}})
        message = {
            "id": "a1",
            "role": "assistant",
            "content": [{"type": "text", "text": "working"}],
            "source": {"kind": "model", "provider": "p", "model": "m"},
        }
        append("assistant/message", {"turn": 1, "step": 1, "message": message}, surface_op="append")
        append("step/end", {"turn": 1, "step": 1})
        append("step/start", {"turn": 1, "step": 2})

    return build_records(build)


async def test_a_garbled_line_mid_turn_is_flagged_and_its_intact_events_are_kept_beside_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The reported case: one garbled line mid-turn; reads flag it and the repair copies every later event first."""
    root = tmp_path / "sessions"
    writer = make_writer(root, "none")
    records = _open_turn_with_messages()
    await writer.write("s1", stored_header("s1"), records)
    path = Path(writer.path_of("s1"))
    lines = path.read_bytes().split(b"\n")
    lines[4] = b'{"type":"request/con'  # line 5 of 10 (header included) is garbled
    path.write_bytes(b"\n".join(lines))
    assert path.read_bytes().count(b"\n") == 10
    original = path.read_bytes()
    tail = b"\n".join(lines[4:])
    async with running(make_backend(root, "none")) as (coordinator, _):
        before = tree_snapshot(root)
        observation = await coordinator.inspect("s1")
        assert observation.torn_tail
        assert tree_snapshot(root) == before
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="dsh.persistence"):
            async with await coordinator.prepare("s1"):
                pass
    (copy,) = path.parent.glob("session.jsonl.torn-*")
    assert copy.read_bytes() == tail
    assert original == path.read_bytes()[: len(original) - len(tail)] + tail
    warnings = [record for record in caplog.records if record.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "5 complete records" in warnings[0].getMessage()


async def test_a_garbled_line_before_a_later_turn_end_is_corruption_and_nothing_is_cut(tmp_path: Path) -> None:
    """A garbled line followed by a `turn/end` lies in the committed region: refused, the file untouched."""
    root = tmp_path / "sessions"
    writer = make_writer(root, "none")
    records = closed_records()
    await writer.write("s1", stored_header("s1"), records)
    path = Path(writer.path_of("s1"))
    lines = path.read_bytes().split(b"\n")
    lines[2] = b"#garbage#"
    path.write_bytes(b"\n".join(lines))
    before = tree_snapshot(root)
    async with running(make_backend(root, "none")) as (coordinator, _):
        with pytest.raises(SessionCorruptionError, match="unparsable committed event at line 3"):
            await coordinator.inspect("s1")
        with pytest.raises(SessionCorruptionError):
            await coordinator.prepare("s1")
    assert tree_snapshot(root) == before


async def test_a_torn_tail_with_complete_records_is_copied_before_the_cut(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Garbage then log-only events: reads flag the torn tail; the repair keeps an exact 0600 copy, warns once."""
    root = tmp_path / "sessions"
    writer = make_writer(root, "none")
    records = open_step_records(calls=())
    kept = records[:-2]
    await writer.write("s1", stored_header("s1"), kept)
    path = Path(writer.path_of("s1"))
    clean = path.read_bytes()
    tail = b"#garbage#\n" + encode_batch(records[-2:])
    await writer.append_bytes("s1", tail)
    async with running(make_backend(root, "none")) as (coordinator, store):
        before = tree_snapshot(root)
        observation = await coordinator.inspect("s1")
        assert observation.torn_tail
        query = await SessionQuery(store, coordinator).observe_session(SessionId("s1"))
        assert query.torn_tail
        assert tree_snapshot(root) == before
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="dsh.persistence"):
            async with await coordinator.prepare("s1"):
                pass
    copies = list(path.parent.glob("session.jsonl.torn-*"))
    assert len(copies) == 1
    assert copies[0].read_bytes() == tail
    assert stat.S_IMODE(copies[0].stat().st_mode) == 0o600
    assert copies[0].name.removeprefix("session.jsonl.torn-").isdigit()
    assert path.read_bytes().startswith(clean)
    assert b"#garbage#" not in path.read_bytes()
    warnings = [record for record in caplog.records if record.levelno >= logging.WARNING]
    assert len(warnings) == 1
    text = warnings[0].getMessage()
    assert '"s1"' in text
    assert f"removed {len(tail)} bytes holding 2 complete records" in text
    async with running(make_backend(root, "none")) as (coordinator, _):
        again = await coordinator.inspect("s1")
        assert not again.torn_tail
        assert [event["seq"] for event in again.events] == list(range(len(again.events)))


async def test_a_bare_crash_fragment_is_cut_without_a_copy(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A final fragment without a newline holds no complete record: cut with no copy, still one WARNING."""
    root = tmp_path / "sessions"
    writer = make_writer(root, "none")
    records = open_step_records(started=("call-1",))
    await writer.write("s1", stored_header("s1"), records)
    fragment = b'{"type":"tool/result","seq":'
    await writer.append_bytes("s1", fragment)
    with caplog.at_level(logging.WARNING, logger="dsh.persistence"):
        async with running(make_backend(root, "none")) as (coordinator, _):
            assert (await coordinator.inspect("s1")).torn_tail
            async with await coordinator.prepare("s1"):
                pass
    path = Path(writer.path_of("s1"))
    assert list(path.parent.glob("*.torn-*")) == []
    warnings = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert f"removed {len(fragment)} bytes holding 0 complete records" in warnings[0]
    assert "appended 3 closing events" in warnings[0]


async def test_a_repair_that_only_closes_a_turn_warns_once(
    tmp_path: Path, compression: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An interrupted turn without a torn tail: the repair appends closers and logs exactly one WARNING."""
    root = tmp_path / "sessions"
    writer = make_writer(root, compression)
    await writer.write("s1", stored_header("s1"), open_step_records())
    with caplog.at_level(logging.WARNING, logger="dsh.persistence"):
        async with running(make_backend(root, compression)) as (coordinator, _):
            assert not (await coordinator.inspect("s1")).torn_tail
            async with await coordinator.prepare("s1"):
                pass
    warnings = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "removed 0 bytes holding 0 complete records" in warnings[0]


async def test_a_clean_log_is_not_flagged_and_not_repaired(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A log of complete turns has no torn tail, and preparing it writes and logs nothing."""
    root = tmp_path / "sessions"
    writer = make_writer(root, "none")
    await writer.write("s1", stored_header("s1"), closed_records(2))
    before = tree_snapshot(root)
    with caplog.at_level(logging.WARNING, logger="dsh.persistence"):
        async with running(make_backend(root, "none")) as (coordinator, _):
            assert not (await coordinator.inspect("s1")).torn_tail
            async with await coordinator.prepare("s1"):
                pass
    assert tree_snapshot(root) == before
    assert [record for record in caplog.records if record.levelno >= logging.WARNING] == []


async def test_a_torn_zstd_frame_recovers_its_records_without_a_copy(tmp_path: Path) -> None:
    """A torn final zstd frame keeps its complete records by rewriting them, so there is nothing to copy."""
    root = tmp_path / "sessions"
    writer = make_writer(root, "zstd")
    records = open_step_records(calls=())
    await writer.write("s1", stored_header("s1"), records, batches=[len(records) - 2, 2])
    await writer.tear("s1", "last-block")
    async with running(make_backend(root, "zstd")) as (coordinator, _):
        assert (await coordinator.inspect("s1")).torn_tail
        async with await coordinator.prepare("s1"):
            pass
    path = Path(writer.path_of("s1"))
    assert list(path.parent.glob("*.torn-*")) == []
    async with running(make_backend(root, "zstd")) as (coordinator, _):
        events = (await coordinator.inspect("s1")).events
    assert [orjson.loads(orjson.dumps(event))["type"] for event in events][: len(records) - 2] == [
        record["type"] for record in records[:-2]
    ]
