"""One writer per session across hosts: leases, takeover after expiry, fencing of a late writer.

Each test plays two hosts on one throw-away schema: two stores, two backends (two pools, two holder
names) and two coordinators. Expiry is forced with SQL or a short TTL; waits poll the database or a
task's state, with a guard that only catches hangs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import datetime

import pytest
import pytest_asyncio

from dsh.json import freeze
from dsh.persistence.errors import LeaseHeldError, LeaseLostError, SessionNotFoundError
from dsh.session.events import make_event
from dsh.testing.postgres import ThrowawaySchemas, held_appends
from dsh.testing.stored_logs import BASE_TIME_MS, append_closed_turn, append_note, append_open_step
from tests.postgres.helpers import Host, expire_lease, lease_row, open_host, sql, stored_seqs, until


@pytest_asyncio.fixture
async def hosts(pg_schemas: ThrowawaySchemas) -> AsyncIterator[list[Host]]:
    """A list the test fills with hosts (via `open_host`); all closed at teardown."""
    opened: list[Host] = []
    try:
        yield opened
    finally:
        for host in reversed(opened):
            await host.close()


async def _two_hosts(schemas: ThrowawaySchemas, hosts: list[Host], **a_options: object) -> tuple[Host, Host, str]:
    schema = schemas.new()
    a = await open_host(schemas.url, schema, "a", **a_options)
    hosts.append(a)
    b = await open_host(schemas.url, schema, "b")
    hosts.append(b)
    return a, b, schema


async def test_second_writer_is_refused_naming_holder_and_expiry(
    pg_schemas: ThrowawaySchemas, hosts: list[Host]
) -> None:
    """While host A writes session s, host B's prepare gets SESSION_LEASE_HELD naming A and the expiry."""
    a, b, _ = await _two_hosts(pg_schemas, hosts)
    session = a.store.create("s")
    append_closed_turn(session, 1)
    await a.store.flush(session)
    with pytest.raises(LeaseHeldError) as caught:
        await b.coordinator.prepare("s")
    assert caught.value.code == "SESSION_LEASE_HELD"
    assert caught.value.holder == a.backend.holder
    assert isinstance(caught.value.expires_at, datetime)
    assert a.backend.holder in caught.value.message


async def test_expired_lease_is_taken_over_repaired_and_the_old_writer_fenced(
    pg_schemas: ThrowawaySchemas, hosts: list[Host]
) -> None:
    """After A's lease expires, B prepares s at generation 2 and repairs its open turn; A's next flush is refused."""
    a, b, schema = await _two_hosts(pg_schemas, hosts)
    url = pg_schemas.url
    session = a.store.create("s")
    append_open_step(session, 1)
    await a.store.flush(session)
    assert await lease_row(url, schema, "s") == (a.backend.holder, 1)
    await expire_lease(url, schema, "s")
    prepared = await b.coordinator.prepare("s")
    assert await lease_row(url, schema, "s") == (b.backend.holder, 2)
    repaired = prepared.observation.events
    assert [event.type for event in repaired[-2:]] == ["step/end", "turn/end"]
    stored_before = await stored_seqs(url, schema, "s")
    append_note(session, 1)
    with pytest.raises(LeaseLostError) as caught:
        await a.store.flush(session)
    assert caught.value.code == "SESSION_LEASE_LOST"
    assert await stored_seqs(url, schema, "s") == stored_before
    with pytest.raises(LeaseLostError):
        await a.store.flush(session)
    await prepared.close()


async def test_fenced_late_append_is_refused_and_writes_nothing(
    pg_schemas: ThrowawaySchemas, hosts: list[Host]
) -> None:
    """A raw append under an old generation raises SESSION_LEASE_LOST; rows and revision are unchanged."""
    a, b, schema = await _two_hosts(pg_schemas, hosts)
    url = pg_schemas.url
    session = a.store.create("s")
    append_closed_turn(session, 1)
    await a.store.flush(session)
    old_fence = await a.backend.acquire("s")  # the same holder renews: generation 2
    assert old_fence is not None
    assert old_fence.generation == 2
    await expire_lease(url, schema, "s")
    new_fence = await b.backend.acquire("s")
    assert new_fence is not None
    assert new_fence.generation == 3
    revision = await a.backend.read_revision("s")
    data = freeze({"title": "late", "messageSeqs": [], "source": {"kind": "user"}})
    events = [make_event("session/title", 6, BASE_TIME_MS, data)]
    with pytest.raises(LeaseLostError):
        await a.backend.append_batch(session.header.to_stored(0), events, materialized=True, fence=old_fence)
    assert await stored_seqs(url, schema, "s") == list(range(6))
    assert await a.backend.read_revision("s") == revision


@pytest.mark.slow
async def test_heartbeat_keeps_an_idle_lease_alive_past_three_ttls(
    pg_schemas: ThrowawaySchemas, hosts: list[Host]
) -> None:
    """With heartbeats running, A stays the writer after three lease lifetimes of idleness."""
    a, b, schema = await _two_hosts(pg_schemas, hosts, lease_ttl_s=0.4, lease_renew_s=0.1)
    url = pg_schemas.url
    session = a.store.create("s")
    append_closed_turn(session, 1)
    await a.store.flush(session)
    [(start,)] = await sql(url, "SELECT now()")

    async def three_ttls_passed() -> bool:
        [(passed,)] = await sql(url, "SELECT now() > %s + interval '1.2 seconds'", [start])
        return bool(passed)

    await until(three_ttls_passed)
    with pytest.raises(LeaseHeldError):
        await b.coordinator.prepare("s")
    assert await lease_row(url, schema, "s") == (a.backend.holder, 1)


async def test_disposed_session_releases_its_lease_at_once(pg_schemas: ThrowawaySchemas, hosts: list[Host]) -> None:
    """After A disposes s its lease row is gone, and B prepares s immediately at generation 1."""
    a, b, schema = await _two_hosts(pg_schemas, hosts)
    session = a.store.create("s")
    append_closed_turn(session, 1)
    await a.store.flush(session)
    a.store.dispose(session)
    await a.coordinator.drain("s")
    await until(lambda: not a.backend.holds_lease("s"))
    assert await lease_row(pg_schemas.url, schema, "s") is None
    async with await b.coordinator.prepare("s") as prepared:
        assert prepared.observation.events[-1].type == "turn/end"
        assert await lease_row(pg_schemas.url, schema, "s") == (b.backend.holder, 1)


async def test_takeover_waits_for_the_holders_append_then_gets_the_next_generation(
    pg_schemas: ThrowawaySchemas, hosts: list[Host]
) -> None:
    """A takeover started while A's append holds the lease row waits for it, then takes generation 2."""
    a, b, schema = await _two_hosts(pg_schemas, hosts, lease_ttl_s=0.3, lease_renew_s=None)
    url = pg_schemas.url
    session = a.store.create("s")
    append_closed_turn(session, 1)
    await a.store.flush(session)
    inside, finish = asyncio.Event(), asyncio.Event()

    async def hold(session_id: str) -> None:
        inside.set()
        await finish.wait()

    async def holder_transaction_outlived_its_lease() -> bool:
        rows = await sql(
            url,
            "SELECT clock_timestamp() > xact_start + interval '0.3 seconds' FROM pg_stat_activity "
            "WHERE application_name = %s AND state = 'idle in transaction'",
            [f"dsh {a.backend.holder}"[:63]],
        )
        return bool(rows and rows[0][0])

    async def takeover_waits_on_the_row_lock() -> bool:
        rows = await sql(
            url,
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'",
            [f"dsh {b.backend.holder}"[:63]],
        )
        return int(rows[0][0]) == 1

    with held_appends(a.backend, hold):
        append_note(session, 1)
        holder_flush = asyncio.ensure_future(a.store.flush(session))
        await asyncio.wait_for(inside.wait(), 30)
        # The append extends the lease from its transaction's start; once that moment plus the TTL
        # has passed, the lease the append will leave behind is already expired for any later takeover.
        await until(holder_transaction_outlived_its_lease)
        takeover = asyncio.ensure_future(b.backend.acquire("s"))
        await until(takeover_waits_on_the_row_lock)
        assert not takeover.done()
    finish.set()
    await holder_flush  # the holder's append was ordered before the takeover: it is stored
    fence = await takeover
    assert fence is not None
    assert fence.generation == 2
    assert await stored_seqs(url, schema, "s") == list(range(7))
    append_note(session, 2)
    with pytest.raises(LeaseLostError):
        await a.store.flush(session)
    assert await stored_seqs(url, schema, "s") == list(range(7))


async def test_renewal_reports_a_lease_taken_over(pg_schemas: ThrowawaySchemas, hosts: list[Host]) -> None:
    """A heartbeat after a takeover returns the lost id, and A's next flush fails without touching the rows."""
    a, b, schema = await _two_hosts(pg_schemas, hosts)
    session = a.store.create("s")
    append_closed_turn(session, 1)
    await a.store.flush(session)
    await expire_lease(pg_schemas.url, schema, "s")
    assert await b.backend.acquire("s") is not None
    assert await a.backend.renew_leases() == ["s"]
    assert not a.backend.holds_lease("s")
    append_note(session, 1)
    with pytest.raises(LeaseLostError):
        await a.store.flush(session)
    assert await stored_seqs(pg_schemas.url, schema, "s") == list(range(6))


async def test_appends_of_other_sessions_do_not_wait_for_a_held_lease_row(
    pg_schemas: ThrowawaySchemas, hosts: list[Host]
) -> None:
    """While one session's append transaction is held open, another session's append commits."""
    a, _, schema = await _two_hosts(pg_schemas, hosts)
    first, second = a.store.create("s1"), a.store.create("s2")
    for session in (first, second):
        append_closed_turn(session, 1)
        await a.store.flush(session)
    inside, finish = asyncio.Event(), asyncio.Event()

    async def hold(session_id: str) -> None:
        if session_id == "s1":
            inside.set()
            await finish.wait()

    with held_appends(a.backend, hold):
        append_note(first, 1)
        held = asyncio.ensure_future(a.store.flush(first))
        await asyncio.wait_for(inside.wait(), 30)
        append_note(second, 1)
        await asyncio.wait_for(a.store.flush(second), 30)
        assert await stored_seqs(pg_schemas.url, schema, "s2") == list(range(7))
        assert not held.done()
        finish.set()
        await held
    assert await stored_seqs(pg_schemas.url, schema, "s1") == list(range(7))


async def test_close_releases_every_lease(pg_schemas: ThrowawaySchemas, hosts: list[Host]) -> None:
    """Closing a host deletes every lease row it held."""
    a, _, schema = await _two_hosts(pg_schemas, hosts)
    for session_id in ("s1", "s2"):
        session = a.store.create(session_id)
        append_closed_turn(session, 1)
        await a.store.flush(session)
    assert len(await sql(pg_schemas.url, "SELECT 1 FROM {s}.session_leases", schema=schema)) == 2
    await a.close()
    assert await sql(pg_schemas.url, "SELECT 1 FROM {s}.session_leases", schema=schema) == []


async def test_a_session_disposed_before_its_lease_was_taken_releases_it(
    pg_schemas: ThrowawaySchemas, hosts: list[Host]
) -> None:
    """A session published and disposed at once leaves no lease behind: another host finds it not stored."""
    a, b, schema = await _two_hosts(pg_schemas, hosts)
    a.store.dispose(a.store.create("x"))
    await a.coordinator.drain("x")
    assert await lease_row(pg_schemas.url, schema, "x") is None
    with pytest.raises(SessionNotFoundError):
        await b.coordinator.prepare("x")
    a.store.create("y")
    await a.close()
    assert await lease_row(pg_schemas.url, schema, "y") is None
