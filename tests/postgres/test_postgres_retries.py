"""Lost connections lose no acknowledged event: retries on a new connection, under the same fence.

Connections are killed for real with `pg_terminate_backend` (between appends, and inside an append
transaction held open by `held_appends`), and a connection lost after `COMMIT` but before its
acknowledgement is injected with `lost_acknowledgements` (both from `dsh.testing.postgres`). Every
flush that returned must be stored exactly once, with contiguous seqs; the retry of a committed batch
must neither duplicate it nor fail on the `(session_id, seq)` key.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from dsh.persistence.errors import PersistenceIOError
from dsh.session.session import Session
from dsh.testing.conformance_harness import encoded
from dsh.testing.postgres import ThrowawaySchemas, held_appends, lost_acknowledgements
from dsh.testing.stored_logs import append_closed_turn, append_note
from tests.postgres.helpers import Host, open_host, sql, stored_seqs, terminate


@pytest_asyncio.fixture
async def host(pg_schemas: ThrowawaySchemas) -> AsyncIterator[Host]:
    """One host on a fresh schema (pool of up to 4 connections), closed at teardown."""
    opened = await open_host(pg_schemas.url, pg_schemas.new(), "h", pool_min_size=2, pool_max_size=4)
    try:
        yield opened
    finally:
        await opened.close()


def _schema(host: Host) -> str:
    return host.backend.schema


async def _revisions(host: Host, session_id: str) -> list[tuple[str, int]]:
    return await sql(
        host.backend.location,
        "SELECT incarnation, revision FROM {s}.sessions WHERE id = %s",
        [session_id],
        schema=_schema(host),
    )


async def test_first_batch_acknowledgement_lost_after_commit_is_recognised(
    pg_schemas: ThrowawaySchemas, host: Host
) -> None:
    """A materializing batch committed before its connection dropped is acknowledged by the retry, once."""
    session = host.store.create("s")
    append_closed_turn(session, 1)
    with lost_acknowledgements(host.backend) as dropped:
        await host.store.flush(session)
    assert dropped.lost == 1
    assert await stored_seqs(pg_schemas.url, _schema(host), "s") == list(range(6))
    [(_, revision)] = await _revisions(host, "s")
    assert revision == 1
    append_closed_turn(session, 2)
    await host.store.flush(session)
    assert await stored_seqs(pg_schemas.url, _schema(host), "s") == list(range(12))


async def test_later_batch_acknowledgement_lost_after_commit_is_recognised(
    pg_schemas: ThrowawaySchemas, host: Host
) -> None:
    """An append committed before its connection dropped is found stored by the retry: no duplicate, no key error."""
    session = host.store.create("s")
    append_closed_turn(session, 1)
    await host.store.flush(session)
    append_closed_turn(session, 2)
    with lost_acknowledgements(host.backend) as dropped:
        await host.store.flush(session)
    assert dropped.lost == 1
    assert await stored_seqs(pg_schemas.url, _schema(host), "s") == list(range(12))
    [(_, revision)] = await _revisions(host, "s")
    assert revision == 2
    stored = await host.coordinator.read_events("s")
    assert encoded(stored.events) == encoded(session.events)


@pytest.mark.slow
async def test_connections_killed_between_appends_are_replaced(pg_schemas: ThrowawaySchemas, host: Host) -> None:
    """Terminating every pooled connection before each flush costs retries, never an event."""
    session = host.store.create("s")
    for turn in range(1, 9):
        append_closed_turn(session, turn)
        await terminate(pg_schemas.url, host.backend.holder)
        await host.store.flush(session)
    assert await stored_seqs(pg_schemas.url, _schema(host), "s") == list(range(48))
    stored = await host.coordinator.read_events("s")
    assert encoded(stored.events) == encoded(session.events)


async def test_connection_killed_inside_an_append_transaction_is_retried(
    pg_schemas: ThrowawaySchemas, host: Host
) -> None:
    """A connection terminated while its append transaction holds the lease row rolls back; the retry stores it once."""
    session = host.store.create("s")
    append_closed_turn(session, 1)
    await host.store.flush(session)
    kills: list[int] = []

    async def kill_my_connection(session_id: str) -> None:
        if not kills:
            kills.append(await terminate(pg_schemas.url, host.backend.holder, state="idle in transaction"))

    append_closed_turn(session, 2)
    with held_appends(host.backend, kill_my_connection):
        await host.store.flush(session)
    assert kills == [1]
    assert await stored_seqs(pg_schemas.url, _schema(host), "s") == list(range(12))


@pytest.mark.slow
async def test_mixed_connection_losses_lose_no_acknowledged_event(pg_schemas: ThrowawaySchemas, host: Host) -> None:
    """Kills between appends, inside transactions and after COMMIT, over many flushes: every acknowledged event once."""
    sessions = [host.store.create(f"s{index}") for index in range(3)]
    acknowledged: dict[str, int] = {}
    round_number = 0
    killed: set[tuple[int, str]] = set()

    async def kill_inside(session_id: str) -> None:
        # Once per append (its retry must get through), in every fourth round.
        if round_number % 4 == 1 and (round_number, session_id) not in killed:
            killed.add((round_number, session_id))
            await terminate(pg_schemas.url, host.backend.holder, state="idle in transaction")

    lost = 0
    with held_appends(host.backend, kill_inside):
        for round_number in range(12):
            for index, session in enumerate(sessions):
                append_note(session, round_number * 10 + index)
                append_note(session, round_number * 10 + index + 1)
            if round_number % 4 == 0:
                await terminate(pg_schemas.url, host.backend.holder)
            with lost_acknowledgements(host.backend, 2 if round_number % 4 == 2 else 0) as dropped:
                for session in sessions:
                    await host.store.flush(session)
                    acknowledged[session.id] = len(session.events)
            lost += dropped.lost
    assert lost == 6
    for session in sessions:
        seqs = await stored_seqs(pg_schemas.url, _schema(host), session.id)
        assert seqs == list(range(acknowledged[session.id]))
        stored = await host.coordinator.read_events(session.id)
        assert encoded(stored.events) == encoded(session.events)


async def test_a_statement_timeout_is_not_retried(pg_schemas: ThrowawaySchemas) -> None:
    """A statement cancelled by the server's timeout fails at once with one PERSISTENCE_IO line."""
    opened = await open_host(pg_schemas.url, pg_schemas.new(), "t", statement_timeout_ms=50)
    try:
        attempts: list[int] = []

        async def slow(conn: object) -> None:
            attempts.append(1)
            await conn.execute("SELECT pg_sleep(1)")  # type: ignore[attr-defined]

        with pytest.raises(PersistenceIOError) as caught:
            await opened.backend.run(slow, "sleep")
        assert attempts == [1]
        assert "statement timeout" in caught.value.message
        assert "\n" not in caught.value.message
    finally:
        await opened.close()


@pytest.mark.slow
async def test_concurrent_flushes_under_a_connection_killer_store_every_acknowledged_event_once(
    pg_schemas: ThrowawaySchemas, host: Host
) -> None:
    """Four sessions flushing at once while connections are terminated: every acknowledged event stored once."""
    sessions = [host.store.create(f"c{index}") for index in range(4)]
    acknowledged = dict.fromkeys((session.id for session in sessions), 0)
    flushed = asyncio.Event()
    done = False

    async def writer(session: Session) -> None:
        for index in range(15):
            append_note(session, index)
            append_note(session, index + 100)
            for _ in range(20):
                try:
                    await host.store.flush(session)
                    break
                except PersistenceIOError:
                    continue  # a flush that ran out of retries keeps its batch; the next one stores it
            else:
                pytest.fail(f"session {session.id} could not be flushed in 20 tries")
            acknowledged[session.id] = len(session.events)
            flushed.set()

    async def killer() -> int:
        kills = 0
        while not done and kills < 12:
            await flushed.wait()
            flushed.clear()
            kills += await terminate(pg_schemas.url, host.backend.holder)
        return kills

    killing = asyncio.ensure_future(killer())
    await asyncio.gather(*(writer(session) for session in sessions))
    done = True
    flushed.set()
    assert await killing > 0
    for session in sessions:
        assert await stored_seqs(pg_schemas.url, _schema(host), session.id) == list(range(acknowledged[session.id]))
        stored = await host.coordinator.read_events(session.id)
        assert encoded(stored.events) == encoded(session.events)
