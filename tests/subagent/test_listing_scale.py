"""`dsh agents` on a home of 10,000 stored sessions opens the family's header files, not the home's.

The home is built once per test session through the writers (the JSONL backend materializes every
session and keeps the parent index, docs/storage-format.md#parent-index), spread over 20 project
folders, with a parent `P` and 20 continuable children. The files are counted where the JSONL
backend opens them (`dsh.persistence.jsonl.FILE_READS`), below the catalog, the query service and
the coordinator, so no layer above can hide a read.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dsh.cli.main import app
from dsh.json import freeze
from dsh.persistence.coordinator import PersistenceCoordinator
from dsh.persistence.jsonl import FILE_READS, JsonlBackend, project_key
from dsh.session import HeaderInit, SessionStore
from dsh.session.events import make_event
from dsh.subagent.descriptor import snapshot_descriptor

pytestmark = pytest.mark.slow

SESSIONS = 10_000
FOLDERS = 20
CHILDREN = 20
SLACK = 2
"""Header files a listing may open beyond the children (none today; a margin for harmless change)."""

runner = CliRunner()


def _cwd(index: int) -> str:
    return f"/work/project{index:02d}"


async def _build(home: Path) -> None:
    root = home / "sessions"
    store = SessionStore()
    async with PersistenceCoordinator(JsonlBackend(root), store):
        parent = store.create("P", header=HeaderInit(cwd=_cwd(0), created_at=1))
        parent.append("turn/start", {"turn": 1})
        parent.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        await store.flush(parent)
        for index in range(CHILDREN):
            descriptor = snapshot_descriptor("continuable", provider="spawn", label=f"child {index}")
            child = store.create(
                f"C{index:02d}",
                header=HeaderInit(
                    cwd=_cwd(0), parent_session="P", origin="subagent", delegation_depth=1, created_at=10 + index
                ),
                seed=[{"type": "subagent/descriptor", "seq": 0, "time": 1, "data": descriptor}],
            )
            child.append("turn/start", {"turn": 1})
            child.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
            await store.flush(child)
        await store.aclose()
    # The rest through the backend's own writer path (what the coordinator calls to materialize).
    backend = JsonlBackend(root)
    await backend.open()
    events = [
        make_event("turn/start", 0, 1, freeze({"turn": 1})),
        make_event("turn/end", 1, 2, freeze({"turn": 1, "reason": {"kind": "completed"}})),
    ]
    try:
        for index in range(SESSIONS - CHILDREN - 1):
            session_id = f"S{index:05d}"
            header = {"type": "session", "version": 0, "id": session_id, "createdAt": 100 + index}
            header.update(cwd=_cwd(index % FOLDERS), delegationDepth=0)
            await backend.acquire(session_id)
            await backend.append_batch(freeze(header), events, materialized=False, fence=None)
            await backend.release(session_id)
    finally:
        await backend.close()


@pytest.fixture(scope="session")
def big_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The 10,000-session home (in memory-backed `/dev/shm` when there is one: it is built in seconds)."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        base = Path(tempfile.mkdtemp(prefix="dsh-big-home-", dir=shm))
    else:
        base = tmp_path_factory.mktemp("big-home")
    home = base / "home"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "fsync", lambda fd: None)  # durability is not what these tests measure
        asyncio.run(_build(home))
    yield home
    shutil.rmtree(base, ignore_errors=True)


def _agents(home: Path, *args: str) -> tuple[list[dict[str, object]], dict[str, int]]:
    before = FILE_READS.snapshot()
    result = runner.invoke(app, ["--home", str(home), "agents", "P", "--json", *args])
    after = FILE_READS.snapshot()
    assert result.exit_code == 0, result.output
    opened = {purpose: after.get(purpose, 0) - before.get(purpose, 0) for purpose in after}
    return json.loads(result.stdout), opened


def test_the_home_is_what_the_count_is_about(big_home: Path) -> None:
    """10,000 stored sessions in 20 project folders, the family in one of them, and a fresh parent index."""
    root = big_home / "sessions"
    folders = sorted(os.listdir(root))
    assert len(folders) == FOLDERS
    assert sum(len(os.listdir(root / folder)) for folder in folders) == SESSIONS
    assert (Path(f"{root}.index") / "entries").is_file()


def test_dsh_agents_opens_the_childrens_header_files_only(big_home: Path) -> None:
    """Twenty children listed: at most 20 + 2 header files opened in a 10,000-session home, one log per child."""
    rows, opened = _agents(big_home)
    assert len(rows) == CHILDREN
    assert opened.get("head", 0) <= CHILDREN + SLACK
    assert opened.get("log", 0) <= CHILDREN


def test_descendants_cost_the_family_too(big_home: Path) -> None:
    """`--descendants` walks level by level: still only the family's header files."""
    rows, opened = _agents(big_home, "--descendants")
    assert len(rows) == CHILDREN
    assert opened.get("head", 0) <= CHILDREN + SLACK


def test_a_changed_folder_costs_one_folder_scan_per_read_not_the_home(big_home: Path) -> None:
    """A touched project folder is scanned by each of the command's two reads by parent; no other folder is.

    `dsh agents` opens the home read-only, so it cannot record what it scanned: the children read
    and the `hasChildren` read each scan the changed folder (a writing process rewrites the folder's
    index at its first scan).
    """
    folder = big_home / "sessions" / project_key(_cwd(7))
    stat = os.stat(folder)
    os.utime(folder)
    try:
        rows, opened = _agents(big_home)
    finally:
        os.utime(folder, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    in_folder = len(os.listdir(folder))
    reads = 2
    assert len(rows) == CHILDREN
    assert CHILDREN + reads * in_folder <= opened.get("head", 0) <= CHILDREN + reads * in_folder + SLACK
    assert opened.get("head", 0) < SESSIONS // 5
