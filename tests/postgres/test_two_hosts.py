"""Two OS processes acting as two hosts on one PostgreSQL schema (docs/storage-format.md#postgresql-leases-and-fencing).

Each host is a process of its own (`host_child.py`, driven over pipes by `tests.postgres.hosts`)
with its own runtime, pool and lease holder name, on one throw-away schema. The tests prove that
each host lists the other's sessions and catalog from storage (a child whose stored descriptor is
damaged is a `corrupt` row, one whose log cannot be read an `unavailable` row), that two hosts
never interleave events in one session, that a SIGKILLed holder's lease is taken over once it
expires, and that a holder frozen with SIGSTOP past its lease and then resumed is fenced:
its next append fails with `SESSION_LEASE_LOST` and writes nothing. Rows are checked with SQL on a
connection of the test's own; lease expiry is read from the database clock, never from sleeps.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from dsh.testing.postgres import ThrowawaySchemas
from tests.postgres.helpers import lease_row, sql, stored_seqs, until
from tests.postgres.hosts import (
    cached_ids,
    damage_family,
    equals,
    event_rows,
    expected_rows,
    family_ids,
    host_group,
    lease_expired,
    titles,
    write_family,
)

pytestmark = pytest.mark.slow  # each test runs two host processes: `make test` only

SHORT_LEASE = {"ttl_s": 1.5, "renew_s": 0.3}
"""Lease settings of a host the test lets expire: short enough to wait for, renewed well within it."""


async def test_each_host_lists_the_other_hosts_sessions_and_catalog_with_diagnostics(
    pg_schemas: ThrowawaySchemas, tmp_path: Path
) -> None:
    """Hosts A and B each list every session and the other's catalog from storage, damaged children as diagnostics."""
    url, schema = pg_schemas.url, pg_schemas.new()
    async with host_group(url, schema, tmp_path) as start:
        a = await start("a")
        b = await start("b")
        await write_family(a, "pa", 1_000)
        await write_family(b, "pb", 2_000)
        everything = family_ids("pa") + family_ids("pb")
        # Each writer checkpoints its sessions in the shared cache once they go idle (a second after their turns).
        await until(lambda: equals(cached_ids(url, schema), sorted(everything)))
        await damage_family(url, schema, "pa")
        await damage_family(url, schema, "pb")
        for host in (a, b):
            listed = await host.ok("sessions")
            assert listed["ids"] == everything
            assert listed["damaged"] == []
        from_b = await b.ok("children", parent="pa")
        assert from_b["rows"] == expected_rows("pa")
        assert from_b["unlisted"] == 0
        from_a = await a.ok("children", parent="pb")
        assert from_a["rows"] == expected_rows("pb")
        assert from_a["unlisted"] == 0
        # A listing writes nothing back (docs/catalog.md): the children read cold stay uncached.
        read_cold = {f"{parent}-{child}" for parent in ("pa", "pb") for child in ("c2", "c3", "c4")}
        assert await cached_ids(url, schema) == sorted(set(everything) - read_cold)
        # The damage is in storage only: the writing host still serves its own child from memory.
        own = await a.ok("children", parent="pa")
        assert [(row["id"], row.get("label")) for row in own["rows"][2:]] == [("pa-c3", "gamma"), ("pa-c4", "delta")]
        await a.quit()
        await b.quit()
    assert await sql(url, "SELECT count(*) FROM {s}.session_leases", schema=schema) == [(0,)]


async def test_second_host_is_refused_the_session_and_events_never_interleave(
    pg_schemas: ThrowawaySchemas, tmp_path: Path
) -> None:
    """While A writes s, B's resume gets SESSION_LEASE_HELD naming A; s holds only A's events, contiguous."""
    url, schema = pg_schemas.url, pg_schemas.new()
    async with host_group(url, schema, tmp_path) as start:
        a = await start("a")
        b = await start("b")
        created = await a.ok("create", id="s", created_at=1_000, turns=1)
        refused = await b.refused("resume", id="s")
        assert refused["code"] == "SESSION_LEASE_HELD"
        assert a.holder in refused["message"]
        await a.ok("append", id="s", title="from a", count=3)
        again = await b.refused("resume", id="s")
        assert again["code"] == "SESSION_LEASE_HELD"
        await a.ok("append", id="s", title="from a, later", count=2)
        assert await stored_seqs(url, schema, "s") == list(range(created["events"] + 5))
        assert await titles(url, schema, "s") == ["from a"] * 3 + ["from a, later"] * 2
        assert await lease_row(url, schema, "s") == (a.holder, 1)
        await a.quit()
        await b.quit()


async def test_lease_of_a_sigkilled_host_is_taken_over_after_expiry(
    pg_schemas: ThrowawaySchemas, tmp_path: Path
) -> None:
    """After SIGKILL of A mid-turn, B is refused until A's lease expires, then resumes s at generation 2 and appends."""
    url, schema = pg_schemas.url, pg_schemas.new()
    async with host_group(url, schema, tmp_path) as start:
        a = await start("a", **SHORT_LEASE)
        b = await start("b", **SHORT_LEASE)
        created = await a.ok("create", id="s", created_at=1_000, turns=1, open_step=True)
        before = await event_rows(url, schema, "s")
        assert len(before) == created["events"]
        await a.kill()
        assert await lease_row(url, schema, "s") == (a.holder, 1)  # a dead host releases nothing
        [(valid_for_a_while,)] = await sql(
            url,
            "SELECT expires_at > now() + interval '0.5 seconds' FROM {s}.session_leases WHERE session_id = 's'",
            schema=schema,
        )
        if valid_for_a_while:
            refused = await b.refused("resume", id="s")
            assert refused["code"] == "SESSION_LEASE_HELD"
            assert a.holder in refused["message"]
        await until(lambda: lease_expired(url, schema, "s"))
        resumed = await b.ok("resume", id="s")
        # A's open turn, closed by the repair, then the resumed session's own marker.
        assert resumed["types"][-3:] == ["step/end", "turn/end", "session/end-seed"]
        assert await lease_row(url, schema, "s") == (b.holder, 2)
        await b.ok("append", id="s", title="from b", count=2)
        after = await event_rows(url, schema, "s")
        assert after[: len(before)] == before  # what A committed is kept as it was
        assert [row[1] for row in after] == list(range(len(after)))
        assert len(after) == len(resumed["types"]) + 2
        assert await titles(url, schema, "s") == ["from b", "from b"]
        await b.quit()


async def test_holder_resumed_after_sigstop_past_its_lease_is_fenced_and_writes_nothing(
    pg_schemas: ThrowawaySchemas, tmp_path: Path
) -> None:
    """A frozen past its lease, taken over by B, then resumed: A's appends fail SESSION_LEASE_LOST; no row of A's."""
    url, schema = pg_schemas.url, pg_schemas.new()
    async with host_group(url, schema, tmp_path) as start:
        a = await start("a", **SHORT_LEASE)
        b = await start("b", **SHORT_LEASE)
        await a.ok("create", id="s", created_at=1_000, turns=1)
        await a.ok("append", id="s", title="from a", count=1)
        a.send_signal(signal.SIGSTOP)
        try:
            await until(lambda: lease_expired(url, schema, "s"))
            await b.ok("resume", id="s")
            assert await lease_row(url, schema, "s") == (b.holder, 2)
            await b.ok("append", id="s", title="from b", count=2)
            taken_over = await event_rows(url, schema, "s")
        finally:
            a.send_signal(signal.SIGCONT)
        late = await a.refused("append", id="s", title="late from a", count=1)
        assert late["code"] == "SESSION_LEASE_LOST"
        assert await event_rows(url, schema, "s") == taken_over
        again = await a.refused("append", id="s", title="later from a", count=1)
        assert again["code"] == "SESSION_LEASE_LOST"
        await b.ok("append", id="s", title="from b, later", count=1)  # B is still the writer
        assert await titles(url, schema, "s") == ["from a", "from b", "from b", "from b, later"]
        assert await lease_row(url, schema, "s") == (b.holder, 2)
        await b.quit()
        await a.quit()
    assert await stored_seqs(url, schema, "s") == list(range(len(taken_over) + 1))
