"""Cold reads: the validation pipeline, listing, typed reads, shared loads and cancellation.

A stored log is checked once on its way in (refusals first, then shape) and never changed by a read
(docs/architecture.md#read-path, docs/architecture.md#cancellation).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping
from typing import Any

import pytest

from dsh.abort import AbortController
from dsh.errors import ConfigError
from dsh.persistence import _validation as validation
from dsh.persistence.coordinator import PersistenceCoordinator
from dsh.persistence.errors import (
    OperationCancelledError,
    SessionCorruptionError,
    SessionFormatUnsupportedError,
)
from dsh.persistence.memory import MemoryBackend, MemoryStorage
from dsh.session.session import EventsView
from dsh.session.store import SessionStore
from dsh.session.stored import StoredEvents
from dsh.testing.faulty import FaultyBackend
from dsh.testing.stored_logs import (
    MemoryStoredLogWriter,
    append_closed_turn,
    append_note,
    build_records,
    stored_header,
    write_stored_log,
)
from dsh.testing.timer import ManualTimer


def notes(count: int) -> list[dict[str, Any]]:
    """`count` valid `session/title` records."""

    def build(session: Any) -> None:
        for index in range(count):
            append_note(session, index)

    return build_records(build)


class LocatedMemory(MemoryBackend):
    """A memory backend that pretends its sessions live at a path, to check `(raw log: ...)` suffixes."""

    def locate(self, header: Mapping[str, Any]) -> str | None:
        """A fake artifact path derived from the id."""
        return f"/logs/{header['id']}.jsonl"


async def test_live_view_shares_the_session_log(coordinator: PersistenceCoordinator, store: SessionStore) -> None:
    """inspect of a live id returns the session's O(1) events view, never a copy."""
    session = store.create("s1")
    append_note(session, 0)
    observation = await coordinator.inspect("s1")
    assert isinstance(observation.events, EventsView)
    assert observation.events.backing is session.events.backing


async def test_cold_events_are_frozen_lazily(
    coordinator: PersistenceCoordinator, writer: MemoryStoredLogWriter
) -> None:
    """A cold observation carries StoredEvents: validated eagerly, frozen on access."""
    await write_stored_log(writer, "s1", notes(3))
    observation = await coordinator.inspect("s1")
    assert isinstance(observation.events, StoredEvents)
    assert observation.events.type_at(2) == "session/title"
    assert observation.events[1] is observation.events[1]


async def test_large_logs_are_validated_off_the_loop(
    coordinator: PersistenceCoordinator, writer: MemoryStoredLogWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A log over the threshold is validated in a worker thread, a small one on the loop thread."""
    threads: list[int] = []
    original = validation.validate_log

    def spy(*args: Any) -> validation.ValidatedLog:
        threads.append(threading.get_ident())
        return original(*args)

    monkeypatch.setattr(validation, "validate_log", spy)
    await write_stored_log(writer, "big", notes(validation.THREAD_THRESHOLD + 1))
    await write_stored_log(writer, "small", notes(3))
    observation = await coordinator.inspect("big")
    await coordinator.inspect("small")
    assert len(observation.events) == validation.THREAD_THRESHOLD + 1
    assert threads[0] != threading.get_ident()
    assert threads[1] == threading.get_ident()


async def test_refusals_name_the_raw_log(store: SessionStore, timer: ManualTimer) -> None:
    """Format refusals end with the raw-log suffix and carry the location when locate knows a path."""
    storage = MemoryStorage()
    writer = MemoryStoredLogWriter(storage)
    records = notes(2)
    foreign = {"type": "acme/x", "seq": 1, "time": 5, "data": {}}
    await write_stored_log(writer, "s1", [records[0], foreign])
    async with PersistenceCoordinator(LocatedMemory(storage), store, timer=timer) as coordinator:
        with pytest.raises(SessionFormatUnsupportedError) as caught:
            await coordinator.inspect("s1")
    assert caught.value.location == "/logs/s1.jsonl"
    assert str(caught.value).endswith(" (raw log: /logs/s1.jsonl)")


async def test_oversized_integer_is_format_unsupported(
    coordinator: PersistenceCoordinator, writer: MemoryStoredLogWriter
) -> None:
    """An integer outside signed 64 bits is refused as format-unsupported, never read as a float."""
    records = notes(3)
    records[1]["data"]["huge"] = 2**64
    await write_stored_log(writer, "s1", records)
    with pytest.raises(SessionFormatUnsupportedError) as caught:
        await coordinator.inspect("s1")
    assert caught.value.seq == 1


async def test_tolerated_64_bit_integer_is_preserved(
    coordinator: PersistenceCoordinator, writer: MemoryStoredLogWriter
) -> None:
    """An integer beyond the safe range but inside signed 64 bits in data is read and preserved."""
    records = notes(2)
    records[1]["data"]["wide"] = 2**62
    await write_stored_log(writer, "s1", records)
    observation = await coordinator.inspect("s1")
    data: Any = observation.events[1].data
    assert data["wide"] == 2**62


async def test_identity_and_header_messages(coordinator: PersistenceCoordinator, writer: MemoryStoredLogWriter) -> None:
    """An identity mismatch and a bad header shape are corruption with the pinned wording."""
    await write_stored_log(writer, "a", notes(1), header=stored_header("b"))
    with pytest.raises(SessionCorruptionError) as mismatch:
        await coordinator.inspect("a")
    assert str(mismatch.value) == 'stored session identity mismatch: requested "a", header contains "b"'
    await write_stored_log(writer, "c", notes(1), createdAt="yesterday")
    with pytest.raises(SessionCorruptionError) as shape:
        await coordinator.inspect("c")
    assert str(shape.value).startswith('stored session "c" failed validation: ')


async def test_refusal_wins_over_a_later_shape_defect(
    coordinator: PersistenceCoordinator, writer: MemoryStoredLogWriter
) -> None:
    """An unknown type after a broken record is still format-unsupported: refusals run first."""
    records = notes(4)
    records[1]["data"] = "not an object"
    records[1]["type"] = "turn/start"
    records[3] = {"type": "acme/x", "seq": 3, "time": 1, "data": {}}
    await write_stored_log(writer, "s1", records)
    with pytest.raises(SessionFormatUnsupportedError) as caught:
        await coordinator.inspect("s1")
    assert (caught.value.event_type, caught.value.seq) == ("acme/x", 3)


async def test_listing_reports_damaged_headers_once(
    coordinator: PersistenceCoordinator, writer: MemoryStoredLogWriter, caplog: pytest.LogCaptureFixture
) -> None:
    """Invalid headers land in `damaged` with their code, the rest is listed, and each is logged once."""
    caplog.set_level(logging.WARNING)
    await write_stored_log(writer, "good", notes(1))
    await write_stored_log(writer, "shape", notes(1), createdAt=-4)
    await write_stored_log(writer, "newer", notes(1), version=3)
    await write_stored_log(writer, "alias", notes(1), header=stored_header("other"))
    for _ in range(2):
        listing = await coordinator.list()
        assert [row.header.id for row in listing] == ["good"]
        assert len(listing) == 1
        codes = {item.location: item.code for item in listing.damaged}
        assert codes == {"shape": "SESSION_CORRUPT", "newer": "SESSION_FORMAT_UNSUPPORTED", "alias": "SESSION_CORRUPT"}
    assert len([r for r in caplog.records if "is damaged" in r.getMessage()]) == 3


async def test_typed_read_uses_the_typed_hook(
    coordinator: PersistenceCoordinator, writer: MemoryStoredLogWriter, backend: FaultyBackend
) -> None:
    """With TYPED_READS a typed read calls load_typed, an untyped read calls load."""
    await write_stored_log(writer, "s1", build_records(lambda s: append_closed_turn(s, 1)))
    typed = await coordinator.read_events("s1", types=["turn/end"])
    assert [event.type for event in typed.events] == ["turn/end"]
    assert typed.next_seq == 6
    assert (backend.calls["load_typed"], backend.calls["load"]) == (1, 0)
    tail = await coordinator.read_events("s1", from_seq=4)
    assert [event.seq for event in tail.events] == [4, 5]
    assert (backend.calls["load_typed"], backend.calls["load"]) == (1, 1)


async def test_read_events_is_never_cached(
    coordinator: PersistenceCoordinator, writer: MemoryStoredLogWriter, backend: FaultyBackend
) -> None:
    """Every read_events call reads storage, also for an id that is live or cached."""
    await write_stored_log(writer, "s1", notes(2))
    await coordinator.inspect("s1")
    await coordinator.read_events("s1")
    await coordinator.read_events("s1")
    assert backend.calls["load"] == 3


@pytest.mark.parametrize(("kwargs", "text"), [({"from_seq": -1}, "from_seq"), ({"types": "turn/end"}, "types")])
async def test_read_events_validates_arguments(
    coordinator: PersistenceCoordinator, kwargs: dict[str, Any], text: str
) -> None:
    """A negative from_seq or a bare string as types raises CONFIG_INVALID naming the argument."""
    with pytest.raises(ConfigError, match=text):
        await coordinator.read_events("s1", **kwargs)


async def test_abort_while_waiting_releases_only_that_waiter(
    coordinator: PersistenceCoordinator, writer: MemoryStoredLogWriter, backend: FaultyBackend
) -> None:
    """Aborting one waiter's signal raises OPERATION_CANCELLED for it; the shared load serves the other."""
    await write_stored_log(writer, "s1", notes(2))
    backend.hold_calls("load")
    controller = AbortController()
    aborted = asyncio.ensure_future(coordinator.inspect("s1", signal=controller.signal))
    patient = asyncio.ensure_future(coordinator.inspect("s1"))
    await backend.wait_calls("load", 1)
    controller.abort("enough")
    with pytest.raises(OperationCancelledError) as caught:
        await aborted
    assert caught.value.reason == "enough"
    backend.release_calls("load")
    assert len((await patient).events) == 2
    assert backend.calls["load"] == 1


async def test_read_settling_after_abort_raises(
    coordinator: PersistenceCoordinator, writer: MemoryStoredLogWriter, backend: FaultyBackend
) -> None:
    """A read_events that completes after its signal aborted raises instead of returning."""
    await write_stored_log(writer, "s1", notes(2))
    backend.hold_calls("load")
    controller = AbortController()
    reading = asyncio.ensure_future(coordinator.read_events("s1", signal=controller.signal))
    await backend.wait_calls("load", 1)
    controller.abort("late")
    backend.release_calls("load")
    with pytest.raises(OperationCancelledError):
        await reading


async def test_revision_of_unknown_id_is_none(coordinator: PersistenceCoordinator) -> None:
    """revision() of an id with nothing stored is None."""
    assert await coordinator.revision("nothing") is None


async def test_inspect_waits_for_retirement(
    coordinator: PersistenceCoordinator, store: SessionStore, backend: FaultyBackend
) -> None:
    """inspect right after dispose waits for the retirement and sees every event."""
    session = store.create("s1")
    append_closed_turn(session, 1)
    backend.hold_calls("append_batch")
    store.dispose(session)
    reading = asyncio.ensure_future(coordinator.inspect("s1"))
    await backend.wait_calls("append_batch", 1)
    backend.release_calls("append_batch")
    observation = await reading
    assert len(observation.events) == 6


async def test_retired_message_shape_is_format_unsupported(
    coordinator: PersistenceCoordinator, writer: MemoryStoredLogWriter
) -> None:
    """A pre-identity user message (no id) is retired vocabulary: format-unsupported, never corrupt."""
    records = notes(3)
    legacy = {"role": "user", "content": [{"type": "text", "text": "hi"}], "source": {"kind": "user"}}
    records[2] = {"type": "user/message", "seq": 2, "time": 9, "data": legacy, "surfaceOp": "append"}
    await write_stored_log(writer, "s1", records)
    with pytest.raises(SessionFormatUnsupportedError) as caught:
        await coordinator.read_events("s1")
    assert (caught.value.event_type, caught.value.seq) == ("user/message", 2)


async def test_oversized_envelope_integer_is_format_unsupported(
    coordinator: PersistenceCoordinator, writer: MemoryStoredLogWriter
) -> None:
    """An envelope time beyond signed 64 bits is format-unsupported even though its shape is invalid too."""
    records = notes(2)
    records[1]["time"] = -(2**70)
    await write_stored_log(writer, "s1", records)
    with pytest.raises(SessionFormatUnsupportedError):
        await coordinator.inspect("s1")


async def test_read_events_waits_for_retirement_of_the_id(
    coordinator: PersistenceCoordinator, store: SessionStore, backend: FaultyBackend
) -> None:
    """read_events right after a disposal waits for the retirement write, so it never serves a stale log."""
    session = store.create("s1")
    append_note(session, 0)
    await store.flush(session)
    append_note(session, 1)
    append_note(session, 2)
    backend.hold_calls("append_batch")
    store.dispose(session)
    await backend.wait_calls("append_batch", 2)
    reading = asyncio.ensure_future(coordinator.read_events("s1"))
    await asyncio.sleep(0)
    assert not reading.done()
    backend.release_calls("append_batch")
    sliced = await reading
    assert sliced.next_seq == 3
