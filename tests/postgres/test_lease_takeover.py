"""A lease whose holder is a dead process of this machine is taken over at once; any other waits.

A lease holder names its machine (boot id and pid namespace) and its process (pid and start
time) (docs/storage-format.md#postgresql-leases-and-fencing). Hosts here are real OS processes
(`tests/postgres/hosts.py`) on one throw-away schema; a host either is this machine (as `dsh`
itself is) or plays a machine of its own. A writer of this machine killed with SIGKILL leaves a
lease that is still valid for half a minute, yet the next writer of this machine takes it over at
once, with a WARNING naming the dead holder; a live writer of this machine, a writer of another
machine and a holder without identity facts keep their lease until it expires. A pid that now
belongs to another process (another start time) is no proof of life. Expiry is read from the
database clock or forced with SQL, never waited for with sleeps.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from dsh.persistence.errors import LeaseHeldError
from dsh.session.session import Session
from dsh.testing.postgres import ThrowawaySchemas
from dsh.testing.stored_logs import append_closed_turn
from tests.postgres.helpers import Host, expire_lease, lease_row, open_host, sql
from tests.postgres.hosts import event_rows, host_group

pytestmark = pytest.mark.slow  # host processes and a database: `make test` only

_TAKEOVER = re.compile(
    r'took over the lease of session "s" at once \(generation 2\): its holder (.+) was process (\d+)'
)


async def _valid_for(url: str, schema: str, seconds: int) -> bool:
    """Whether the lease of `s` is valid for at least `seconds` more by the database clock."""
    [(valid,)] = await sql(
        url,
        "SELECT expires_at > now() + make_interval(secs => %s) FROM {s}.session_leases WHERE session_id = 's'",
        [seconds],
        schema=schema,
    )
    return bool(valid)


async def test_a_killed_writer_of_this_host_is_taken_over_at_once_and_logged(
    pg_schemas: ThrowawaySchemas, tmp_path: Path
) -> None:
    """SIGKILL of A mid-turn; B on the same machine resumes while A's lease is still valid, at generation 2, logged."""
    url, schema = pg_schemas.url, pg_schemas.new()
    async with host_group(url, schema, tmp_path) as start:
        a = await start("a", machine=None)
        b = await start("b", machine=None)
        created = await a.ok("create", id="s", created_at=1_000, turns=1, open_step=True)
        before = await event_rows(url, schema, "s")
        await a.kill()
        assert await lease_row(url, schema, "s") == (a.holder, 1)
        assert await _valid_for(url, schema, 20)  # far from expiry: only the dead holder explains a takeover
        resumed = await b.ok("resume", id="s")
        assert resumed["types"][-3:] == ["step/end", "turn/end", "session/end-seed"]
        assert await lease_row(url, schema, "s") == (b.holder, 2)
        await b.ok("append", id="s", title="from b", count=1)
        after = await event_rows(url, schema, "s")
        assert after[: len(before)] == before
        assert len(before) == created["events"]
        logged = _TAKEOVER.search(b.stderr.read_text())
        assert logged is not None, b.stderr.read_text()
        assert logged.group(1) == a.holder
        assert int(logged.group(2)) == a.pid
        await b.quit()


async def test_a_live_writer_of_this_host_keeps_its_lease(pg_schemas: ThrowawaySchemas, tmp_path: Path) -> None:
    """While A (same machine) runs, B is refused with SESSION_LEASE_HELD naming A as a live process of this host."""
    url, schema = pg_schemas.url, pg_schemas.new()
    async with host_group(url, schema, tmp_path) as start:
        a = await start("a", machine=None)
        b = await start("b", machine=None)
        await a.ok("create", id="s", created_at=1_000, turns=1)
        refused = await b.refused("resume", id="s")
        assert refused["code"] == "SESSION_LEASE_HELD"
        assert f"is being written by a live process of this host ({a.holder})" in refused["message"]
        assert await lease_row(url, schema, "s") == (a.holder, 1)
        await a.ok("append", id="s", title="still a", count=1)
        await a.quit()
        await b.quit()


async def test_a_killed_writer_of_another_host_waits_for_expiry(pg_schemas: ThrowawaySchemas, tmp_path: Path) -> None:
    """A on another machine is killed: B is refused ("another host") until the lease expires, then takes it."""
    url, schema = pg_schemas.url, pg_schemas.new()
    async with host_group(url, schema, tmp_path) as start:
        a = await start("a", machine="elsewhere")
        b = await start("b", machine=None)
        await a.ok("create", id="s", created_at=1_000, turns=1)
        await a.kill()
        assert await _valid_for(url, schema, 20)
        refused = await b.refused("resume", id="s")
        assert refused["code"] == "SESSION_LEASE_HELD"
        assert f"is being written by another host ({a.holder})" in refused["message"]
        await expire_lease(url, schema, "s")
        await b.ok("resume", id="s")
        assert await lease_row(url, schema, "s") == (b.holder, 2)
        assert _TAKEOVER.search(b.stderr.read_text()) is None
        await b.quit()


# ---------------------------------------------------------------- holders written with SQL


async def _held_by(pg_schemas: ThrowawaySchemas, hosts: list[Host]) -> tuple[Host, Host, Session, str]:
    """Hosts A and B in this process; A writes `s` and holds its lease. Returns `(a, b, session, schema)`."""
    schema = pg_schemas.new()
    a = await open_host(pg_schemas.url, schema, "a")
    hosts.append(a)
    b = await open_host(pg_schemas.url, schema, "b")
    hosts.append(b)
    session = a.store.create("s")
    append_closed_turn(session, 1)
    await a.store.flush(session)
    return a, b, session, schema


async def _set_holder(url: str, schema: str, holder: str) -> None:
    await sql(url, "UPDATE {s}.session_leases SET holder = %s WHERE session_id = 's'", [holder], schema=schema)


def _ended_pid() -> int:
    """The pid of a process that has ended and been reaped."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    return int(done.stdout)


@pytest_asyncio.fixture
async def hosts() -> AsyncIterator[list[Host]]:
    """Hosts a test opens (via `_held_by`); closed at teardown."""
    opened: list[Host] = []
    try:
        yield opened
    finally:
        for host in reversed(opened):
            await host.close()


async def test_a_reused_pid_is_no_proof_of_life(pg_schemas: ThrowawaySchemas, hosts: list[Host]) -> None:
    """A holder naming a running pid of this machine with another start time is dead: B takes over at once."""
    a, b, _, schema = await _held_by(pg_schemas, hosts)
    reused = re.sub(r" start=[0-9]+$", " start=1", a.backend.holder)
    assert reused != a.backend.holder  # the pid is this test's own, alive, but it started at another time
    await _set_holder(pg_schemas.url, schema, reused)
    prepared = await b.coordinator.prepare("s")
    assert await lease_row(pg_schemas.url, schema, "s") == (b.backend.holder, 2)
    await prepared.close()


async def test_a_gone_pid_of_this_machine_is_taken_over_and_of_another_machine_is_not(
    pg_schemas: ThrowawaySchemas, hosts: list[Host]
) -> None:
    """The same ended pid: under this machine's boot id B takes over at once; under another boot id, or without
    identity facts, B is refused until expiry."""
    a, b, _, schema = await _held_by(pg_schemas, hosts)
    url = pg_schemas.url
    ended = _ended_pid()
    this_machine = re.sub(r":[0-9]+ boot=", f":{ended} boot=", a.backend.holder)
    other_machine = re.sub(r" boot=[0-9a-f-]{36} ", " boot=00000000-0000-4000-8000-000000000000 ", this_machine)
    legacy = re.sub(r" boot=.*$", "", this_machine)
    for holder in (other_machine, legacy):
        await _set_holder(url, schema, holder)
        with pytest.raises(LeaseHeldError) as caught:
            await b.coordinator.prepare("s")
        assert caught.value.holder == holder
        assert "another host" in caught.value.message
        assert await lease_row(url, schema, "s") == (holder, 1)
    await _set_holder(url, schema, this_machine)
    prepared = await b.coordinator.prepare("s")
    assert await lease_row(url, schema, "s") == (b.backend.holder, 2)
    await prepared.close()
