"""Commit notices, the listener, request rows and the store feed on a real PostgreSQL schema.

See docs/server.md#replicas and docs/storage-format.md#postgresql-notifications-and-requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
import pytest_asyncio

from dsh.persistence.errors import AppendConflictError
from dsh.persistence.postgres import SCHEMA_VERSION, channel_name
from dsh.server.feed import StoreFeed, decode_position, encode_position
from dsh.testing.postgres import ThrowawaySchemas
from dsh.testing.stored_logs import append_closed_turn
from tests.postgres.helpers import Host, open_host, sql, until
from tests.server.stream_helpers import hub_runtime


@pytest_asyncio.fixture
async def hosts(pg_schemas: ThrowawaySchemas) -> AsyncIterator[list[Host]]:
    """Hosts the test opens (via `open_host`), closed at teardown."""
    opened: list[Host] = []
    try:
        yield opened
    finally:
        for host in reversed(opened):
            await host.close()


async def test_a_committed_append_notifies_its_session_and_last_seq_and_a_refused_one_nothing(
    pg_schemas: ThrowawaySchemas, hosts: list[Host]
) -> None:
    """Each committed batch sends one `{"k":"e","s","q"}` notice on the schema's channel; a refused batch none."""
    schema = pg_schemas.new()
    a = await open_host(pg_schemas.url, schema, "a")
    hosts.append(a)
    heard: list[dict[str, object]] = []
    gaps: list[int] = []
    listener = await a.backend.listen(lambda payload: heard.append(orjson.loads(payload)), lambda: gaps.append(1))
    try:
        session = a.store.create("s")
        append_closed_turn(session, 1)
        await a.store.flush(session)
        stored = await sql(pg_schemas.url, "SELECT max(seq) FROM {s}.events", schema=schema)
        await until(lambda: len(heard) == 1)
        assert heard == [{"k": "e", "s": "s", "q": stored[0][0]}]
        events = list(session.events)
        with pytest.raises(AppendConflictError):
            await a.backend.append_batch(
                session.header.to_stored(0), events[:1], materialized=True, fence=a.backend._leases.held["s"]
            )
        append_closed_turn(session, 2)
        await a.store.flush(session)
        await until(lambda: len(heard) == 2)
        assert heard[1] == {"k": "e", "s": "s", "q": len(session.events) - 1}
        assert gaps == []
        assert a.backend.channel == channel_name(schema) == f"dsh_{schema}"
    finally:
        await listener.aclose()


async def test_a_terminated_listener_listens_again_and_reports_the_gap(
    pg_schemas: ThrowawaySchemas, hosts: list[Host]
) -> None:
    """`pg_terminate_backend` of the listening connection: it is reopened, `on_gap` runs, later notices arrive."""
    schema = pg_schemas.new()
    a = await open_host(pg_schemas.url, schema, "a")
    hosts.append(a)
    heard: list[str] = []
    gaps: list[int] = []
    listener = await a.backend.listen(heard.append, lambda: gaps.append(1))
    try:
        pid = listener.backend_pid
        assert pid is not None
        assert await sql(pg_schemas.url, "SELECT pg_terminate_backend(%s)", [pid]) == [(True,)]
        await until(lambda: gaps == [1] and listener.connected)
        assert listener.backend_pid != pid
        assert listener.breaks == 1
        await a.backend.notify('{"k":"x"}')
        await until(lambda: heard == ['{"k":"x"}'])
        assert await a.backend.notify("x" * 8000) is False  # over the notice limit: nothing is sent
    finally:
        await listener.aclose()
    assert not listener.connected


async def test_a_request_row_is_claimed_once_answered_and_adopted_by_the_next_holder(
    pg_schemas: ThrowawaySchemas, hosts: list[Host]
) -> None:
    """Two instances: one claim wins, answers wake the sender, pending rows can be withdrawn, orphans adopted once."""
    schema = pg_schemas.new()
    a = await open_host(pg_schemas.url, schema, "a")
    b = await open_host(pg_schemas.url, schema, "b")
    hosts.extend([a, b])
    heard: list[dict[str, object]] = []
    listener = await a.backend.listen(lambda payload: heard.append(orjson.loads(payload)), lambda: None)
    try:
        first = await a.backend.submit_request("s", "prompt", {"content": [{"type": "text", "text": "hi"}]})
        second = await a.backend.submit_request("s", "interrupt", {})
        claims = await asyncio.gather(b.backend.claim_next_request("s"), a.backend.claim_next_request("s"))
        assert sorted(row.id for row in claims if row is not None) == [first, second]
        claimed = next(row for row in claims if row is not None and row.id == first)
        assert claimed.state == "accepted"
        assert claimed.body == {"content": [{"type": "text", "text": "hi"}]}
        await b.backend.answer_request(first, {"messageId": "m1"}, done=False)
        await until(lambda: {"k": "a", "r": first} in heard)
        assert {"k": "r", "s": "s", "r": first} in heard
        row = await a.backend.get_request(first)
        assert row is not None
        assert (row.state, row.answer) == ("accepted", {"messageId": "m1"})
        assert await a.backend.withdraw_request(first) is False  # accepted: too late to withdraw
        third = await a.backend.submit_request("s", "prompt", {"content": []})
        assert await a.backend.withdraw_request(third) is True
        assert await b.backend.claim_request(third) is None
        # `first` is an orphan for anyone but its handler; only one adoption succeeds.
        handler, other = (a, b) if claimed.handler == a.backend.holder else (b, a)
        assert [found.id for found in await handler.backend.orphan_requests("s")] == [
            found.id for found in claims if found is not None and found.handler != handler.backend.holder
        ]
        orphans = [found for found in await other.backend.orphan_requests("s") if found.id == first]
        assert len(orphans) == 1
        assert await other.backend.adopt_request(orphans[0]) is True
        assert await handler.backend.adopt_request(orphans[0]) is False
        await other.backend.finish_request(first)
        assert first not in [found.id for found in await handler.backend.orphan_requests("s")]
        version = await sql(pg_schemas.url, "SELECT schema_version FROM {s}.store", schema=schema)
        assert version == [(SCHEMA_VERSION,)] == [(2,)]
    finally:
        await listener.aclose()


async def test_the_store_feed_serves_rows_in_seq_order_once_and_resumes_from_a_position(
    pg_schemas: ThrowawaySchemas, hosts: list[Host], tmp_path: Path
) -> None:
    """Frames carry store positions; repeated notices read nothing twice; a resumed stream gets the rest."""
    schema = pg_schemas.new()
    a = await open_host(pg_schemas.url, schema, "a")
    hosts.append(a)
    session = a.store.create("s")
    append_closed_turn(session, 1)
    await a.store.flush(session)
    first_tail = len(session.events) - 1
    async with hub_runtime(tmp_path) as (_, hub):
        hub.use_replicas(lambda event, data: None)
        feed = StoreFeed(a.backend.events_after, hub)
        live = await feed.subscribe(frozenset({"s", "t"}), None)
        assert live.position() == f"{first_tail}.-1"
        append_closed_turn(session, 2)
        await a.store.flush(session)
        for _ in range(3):  # duplicate notices read nothing twice
            feed.notice("s", len(session.events) - 1)
        await feed.settle()
        frames = [live._queue.popleft() for _ in range(live.queued)]
        assert frames[0].event == ""  # the opening position
        assert frames[0].id == f"{first_tail}.-1"
        seqs = [frame.data["seq"] for frame in frames[1:]]
        assert seqs == [event.seq for event in session.events if event.seq > first_tail]
        assert [frame.id for frame in frames[1:]] == [f"{seq}.-1" for seq in seqs]
        resumed = await feed.subscribe(frozenset({"s", "t"}), f"{first_tail}.-1")
        replayed = [resumed._queue.popleft() for _ in range(resumed.queued)]
        assert [frame.data.get("seq") for frame in replayed[:-1]] == seqs
        assert replayed[-1].id == live.position()
        stale = await feed.subscribe(frozenset({"s"}), "not-a-position")
        assert stale._queue[0].event == "reset"
        assert feed.followed() == ("s", "t")
        for subscription in (live, resumed, stale):
            subscription.close()
        assert feed.followed() == ()


def test_positions_round_trip_in_the_order_of_the_sorted_ids_and_refuse_anything_else() -> None:
    """`encode_position` lists last seqs by sorted id; `decode_position` accepts only that shape for the same filter."""
    order = ("a", "b", "c")
    assert encode_position(order, {"a": 3, "c": 10}) == "3.-1.10"
    assert decode_position("3.-1.10", order) == {"a": 3, "b": -1, "c": 10}
    for bad in ("3.-1", "3.x.1", "3.-2.1", "1.2.3.4", "", "3..1", "1e3.1.1"):
        assert decode_position(bad, order) is None
