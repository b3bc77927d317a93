"""`dsh --database-url postgresql://... sessions|agents|doctor` read a PostgreSQL store and change nothing.

The store is filled through a writing `Runtime`; the commands then run through the CLI with a home
folder that does not exist. A snapshot of every row of the schema (and its list of relations) taken
before and after proves the reads wrote nothing: no lease row, no cache row, no table.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dsh.cli.main import app
from dsh.config import Config
from dsh.doctor import run_doctor
from dsh.persistence.postgres import SCHEMA_VERSION
from dsh.runtime import Runtime
from dsh.session.header import HeaderInit
from dsh.subagent.descriptor import snapshot_descriptor
from dsh.testing.postgres import ThrowawaySchemas
from tests.postgres.helpers import sql

runner = CliRunner()


async def _populate(config: Config) -> None:
    async with Runtime.open(config) as rt:
        parent = rt.sessions.create("P")
        parent.append("turn/start", {"turn": 1})
        parent.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        descriptor = snapshot_descriptor("continuable", provider="spawn", label="Collect sources")
        child = rt.sessions.create(
            "C1",
            header=HeaderInit(parent_session="P", origin="subagent", delegation_depth=1),
            seed=[{"type": "subagent/descriptor", "seq": 0, "time": 1, "data": descriptor}],
        )
        child.append("turn/start", {"turn": 1})
        child.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        for session in (parent, child):
            await rt.sessions.flush(session)


async def _snapshot(url: str, schema: str) -> dict[str, Any]:
    relations = await sql(
        url,
        "SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s ORDER BY 1",
        [schema],
    )
    out: dict[str, Any] = {"relations": relations}
    for table in ("store", "sessions", "events", "session_leases", "projection_cache"):
        out[table] = await sql(url, f"SELECT * FROM {{s}}.{table} ORDER BY 1", schema=schema)
    return out


@pytest.fixture
def filled(pg_schemas: ThrowawaySchemas, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """A schema holding a parent P and its subagent C1; `DSH_PG_SCHEMA` names it. Returns `(url, schema)`."""
    url, schema = pg_schemas.url, pg_schemas.new()
    monkeypatch.setenv("DSH_PG_SCHEMA", schema)
    asyncio.run(_populate(Config(home=tmp_path / "writer-home", database_url=url)))
    return url, schema


def _invoke(tmp_path: Path, url: str, *args: str) -> Any:
    return runner.invoke(app, ["--home", str(tmp_path / "absent"), "--database-url", url, *args])


def test_sessions_agents_and_doctor_read_postgres_without_writing(filled: tuple[str, str], tmp_path: Path) -> None:
    """The three read-only commands list P and C1, pass the doctor, and leave every row and table as it was."""
    url, schema = filled
    before = asyncio.run(_snapshot(url, schema))
    listed = _invoke(tmp_path, url, "sessions", "--json")
    assert listed.exit_code == 0, listed.output
    page = json.loads(listed.stdout)
    assert [(item["id"], item["children"]) for item in page["items"]] == [("P", 1)]
    agents = _invoke(tmp_path, url, "agents", "P", "--json")
    assert agents.exit_code == 0, agents.output
    assert [row["label"] for row in json.loads(agents.stdout)] == ["Collect sources"]
    doctor = _invoke(tmp_path, url, "doctor", "--json")
    assert doctor.exit_code == 0, doctor.output
    report = json.loads(doctor.stdout)
    checks = {check["name"]: check for check in report["checks"]}
    assert report["sessions"] == 2
    assert checks["postgres"]["status"] == "ok"
    assert f'schema "{schema}" version {SCHEMA_VERSION}' in checks["postgres"]["detail"]
    assert checks["leases"]["detail"] == "0 held, 0 expired"
    assert asyncio.run(_snapshot(url, schema)) == before
    assert not (tmp_path / "absent").exists()


def test_doctor_lists_held_and_expired_leases(filled: tuple[str, str], tmp_path: Path) -> None:
    """A live lease and an expired one are both listed; the expired one makes the check a warning."""
    url, schema = filled
    asyncio.run(
        sql(
            url,
            "INSERT INTO {s}.session_leases VALUES ('P', 'hostA', 3, now() + interval '1 hour'), "
            "('C1', 'hostB', 1, now() - interval '1 minute')",
            schema=schema,
        )
    )
    config = Config(home=tmp_path / "absent", database_url=url)
    report = asyncio.run(run_doctor(config))
    leases = next(check for check in report.checks if check.name == "leases")
    assert leases.status == "warn"
    assert leases.detail.startswith("1 held, 1 expired: P by hostA (generation 3, expires ")
    assert "C1 by hostB (generation 1, expired " in leases.detail
    assert report.status == "warn"


def test_an_unreachable_database_fails_the_doctor_in_one_line(tmp_path: Path) -> None:
    """`dsh doctor` on a server that does not answer reports one failed store check, password masked, exit 7."""
    result = _invoke(tmp_path, "postgresql://u:secret@127.0.0.1:1/db", "doctor", "--json")
    assert result.exit_code == 7, result.output
    checks = {check["name"]: check for check in json.loads(result.stdout)["checks"]}
    assert checks["store"]["status"] == "fail"
    assert checks["store"]["detail"].startswith("PERSISTENCE_IO: postgresql: cannot connect to postgresql://u:***@")
    assert "secret" not in result.stdout
