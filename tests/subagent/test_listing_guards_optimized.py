"""The listing guards hold under `python -O`, which strips every `assert`.

A guard written as an `assert` vanishes under `-O`: a `cold_read_concurrency` of 0 then started no
worker and every healthy cold child came back as a `corrupt` row. The guards are explicit checks
(docs/catalog.md#enumeration), so an optimised interpreter refuses a bad concurrency with
`CONFIG_INVALID`, refuses a registry without the `subagent` unit with
`SUBAGENT_CONTROL_UNITS_UNAVAILABLE`, and lists healthy cold children as ordinary rows. The checks run
in a real `python -O` child over a real JSONL home.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

_GUARD_S = 120
_ROOT = Path(__file__).resolve().parents[2]

_CHILD = """
import asyncio, json, sys
from pathlib import Path
from dsh.config import Config
from dsh.errors import DshError
from dsh.projection.registry import ProjectionRegistry
from dsh.runtime import Runtime
from dsh.services import Services
from dsh.session.header import HeaderInit
from dsh.subagent.descriptor import snapshot_descriptor
from dsh.subagent.listing import list_children, list_descendants
from tests.subagent.helpers import write_family_home


async def refused(call) -> str:
    try:
        await call
    except DshError as error:
        return f"{type(error).__name__} {error.code}"
    return "no error"


async def main(home: Path) -> dict[str, object]:
    await write_family_home(home, ["C0", "C1", "C2"])
    out: dict[str, object] = {"optimize": sys.flags.optimize}
    async with Runtime.open(Config(home=home), read_only=True) as rt:
        services = rt.services
        for name, listing in (("children", list_children), ("descendants", list_descendants)):
            out[name] = [row.to_json() for row in await listing(services, "P", cold_read_concurrency=1)]
            for value in (0, -1):
                out[f"{name} {value}"] = await refused(listing(services, "P", cold_read_concurrency=value))
            bare = ProjectionRegistry(services.sessions)
            try:
                unitless = Services(
                    sessions=services.sessions,
                    persistence=services.persistence,
                    projections=bare,
                    query=services.query,
                )
                out[f"{name} without the unit"] = await refused(listing(unitless, "P"))
            finally:
                bare.close()
    return out


print(json.dumps(asyncio.run(main(Path(sys.argv[1])))))
"""


def _run_optimised(home: Path) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-O", "-c", _CHILD, str(home)],
        capture_output=True,
        text=True,
        timeout=_GUARD_S,
        check=False,
        stdin=subprocess.DEVNULL,
        cwd=_ROOT,  # the child imports the shared test helpers from `tests`
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert isinstance(report, dict)
    return report


@pytest.mark.slow
def test_the_listing_guards_and_healthy_rows_survive_python_dash_o(tmp_path: Path) -> None:
    """Under `python -O` a concurrency of 0 or -1 and a unit-less registry are refused; healthy children list."""
    report = _run_optimised(tmp_path / "home")
    assert report["optimize"] == 1
    expected_rows = [
        {"kind": "child", "id": f"C{index}", "mode": "continuable", "label": f"C{index}", "activity": "inactive"}
        for index in range(3)
    ]
    children = report["children"]
    assert isinstance(children, list)
    assert [{key: row[key] for key in expected_rows[0]} for row in children] == expected_rows
    descendants = report["descendants"]
    assert isinstance(descendants, list)
    assert [row["id"] for row in descendants] == ["C0", "C1", "C2"]
    assert all(row["kind"] == "child" for row in descendants)
    for name in ("children", "descendants"):
        assert report[f"{name} 0"] == "ConfigError CONFIG_INVALID"
        assert report[f"{name} -1"] == "ConfigError CONFIG_INVALID"
        assert report[f"{name} without the unit"] == "SubagentError SUBAGENT_CONTROL_UNITS_UNAVAILABLE"
