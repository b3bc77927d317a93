"""`dsh --database-url postgresql://... sessions|agents|doctor` on the database two host processes filled.

Two hosts (`host_child.py` processes) write their families on one throw-away schema; host A quits
cleanly, host B is SIGKILLed holding its leases; then the children are damaged in storage as in
`test_two_hosts`. The three read-only commands then run as `python -m dsh` processes with a home
folder that does not exist. They show every session, the catalog rows with their diagnostics and
the doctor's findings, and a dump of every relation and row of the schema taken before and after
proves they wrote nothing (docs/cli.md#read-only-commands).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsh.persistence.postgres import SCHEMA_VERSION
from dsh.testing.postgres import ThrowawaySchemas
from tests.postgres.helpers import lease_row, until
from tests.postgres.hosts import (
    GUARD_S,
    cached_ids,
    damage_family,
    dump_schema,
    equals,
    expected_rows,
    family_ids,
    host_group,
    write_family,
)


async def _fill(url: str, schema: str, workdir: Path) -> tuple[str, str]:
    """The two-host scenario; returns the lease holders of A (quit) and B (killed)."""
    async with host_group(url, schema, workdir) as start:
        a = await start("a")
        b = await start("b", ttl_s=600.0, renew_s=10.0)  # its leases outlive the test once it is killed
        await write_family(a, "pa", 1_000)
        await write_family(b, "pb", 2_000)
        await a.ok("create", id="sa", created_at=3_000, turns=2)
        refused = await b.refused("resume", id="sa")
        assert refused["code"] == "SESSION_LEASE_HELD"
        await b.ok("create", id="sb", created_at=3_001, turns=1)
        # B's checkpoints land once its sessions go idle: let them land before B dies.
        everything = sorted([*family_ids("pa"), *family_ids("pb"), "sa", "sb"])
        await until(lambda: equals(cached_ids(url, schema), everything))
        await a.quit()
        await b.kill()
    # After the hosts: a host that closes checkpoints its live sessions in the cache, over the damage.
    await damage_family(url, schema, "pa")
    await damage_family(url, schema, "pb")
    return a.holder, b.holder


def _dsh(url: str, schema: str, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DSH_PG_SCHEMA": schema, "DSH_HOME": str(home), "NO_COLOR": "1"}
    env.pop("DSH_DATABASE_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "dsh", "--database-url", url, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=GUARD_S,
        check=False,
    )


@pytest.mark.slow
def test_sessions_agents_and_doctor_read_the_two_host_database_without_writing(
    pg_schemas: ThrowawaySchemas, tmp_path: Path
) -> None:
    """The read-only commands show both hosts' sessions, catalogs and damage, and leave every row as it was."""
    url, schema = pg_schemas.url, pg_schemas.new()
    holder_a, holder_b = asyncio.run(_fill(url, schema, tmp_path))
    assert asyncio.run(lease_row(url, schema, "sa")) is None  # A released its leases when it closed
    assert asyncio.run(lease_row(url, schema, "sb")) == (holder_b, 1)  # B died holding its own
    before = asyncio.run(dump_schema(url, schema))
    home = tmp_path / "absent"

    top = _dsh(url, schema, home, "sessions", "--json")
    assert top.returncode == 0, top.stderr
    assert [(item["id"], item["children"]) for item in json.loads(top.stdout)["items"]] == [
        ("sb", 0),
        ("sa", 0),
        ("pb", 4),
        ("pa", 4),
    ]
    every = _dsh(url, schema, home, "sessions", "--json", "--all")
    assert every.returncode == 0, every.stderr
    newest_first = ["sb", "sa", *reversed(family_ids("pb")), *reversed(family_ids("pa"))]  # ids in creation order
    assert [item["id"] for item in json.loads(every.stdout)["items"]] == newest_first

    for parent in ("pa", "pb"):
        agents = _dsh(url, schema, home, "agents", parent, "--json")
        assert agents.returncode == 0, agents.stderr
        assert json.loads(agents.stdout) == expected_rows(parent)
        assert agents.stderr == ""

    doctor = _dsh(url, schema, home, "doctor", "--json")
    assert doctor.returncode == 7, doctor.stderr  # it ran and found the damage
    report = json.loads(doctor.stdout)
    assert report["sessions"] == 14
    checks = {check["name"]: check for check in report["checks"]}
    assert checks["store"]["status"] == "ok"
    assert checks["postgres"]["status"] == "ok"
    assert f'schema "{schema}" version {SCHEMA_VERSION}' in checks["postgres"]["detail"]
    assert checks["leases"]["status"] == "ok"
    assert checks["leases"]["detail"].startswith("7 held, 0 expired: pb by ")
    assert holder_b in checks["leases"]["detail"]
    assert holder_a not in checks["leases"]["detail"]
    assert [(problem["kind"], problem["sessionId"]) for problem in report["problems"]] == [
        ("subagent-without-identity", "pa-c3"),
        ("unreadable", "pa-c4"),
        ("subagent-without-identity", "pb-c3"),
        ("unreadable", "pb-c4"),
    ]

    assert asyncio.run(dump_schema(url, schema)) == before
    assert not home.exists()
