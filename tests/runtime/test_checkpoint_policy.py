"""Projection checkpoints follow the cache's policy, not the flushes, and a crash between two costs no row.

A child process (`checkpoint_child.py`) runs subagent children turn by turn through a real `Runtime`
on a JSONL home, each turn flushed, with the cache writing every 12 dirty events; it is killed with
SIGKILL after its last flush, so every child has durable events its last checkpoint does not cover
and two children have no checkpoint at all (docs/projections.md#cache-write-policy). A new runtime
then lists the children: each row equals the row folded from the log alone, a child with a
checkpoint costs no log read (cached identity) and one without costs exactly one (observed
identity), counted by the listing and at the backend's file layer.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import pytest

from dsh.config import Config
from dsh.persistence.jsonl import FILE_READS
from dsh.projection.cache_storage import SqliteCacheStorage
from dsh.runtime import Runtime
from dsh.session.header import SessionId
from dsh.subagent.listing import ListingReport

CHILD = Path(__file__).with_name("checkpoint_child.py")
GUARD_S = 60.0
"""Only guards against a hung child; every wait ends on a report long before."""


async def _run_and_kill(home: Path) -> dict[str, object]:
    """Run the child until it reports READY, SIGKILL it, and return its reports."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(CHILD), str(home), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    assert process.stdout is not None
    assert process.stderr is not None
    reports: dict[str, object] = {"seq": {}}
    try:
        while True:
            line = (await asyncio.wait_for(process.stdout.readline(), GUARD_S)).decode()
            if not line:
                stderr = await process.stderr.read()
                pytest.fail(f"child exited early: {stderr.decode()[-3000:]}")
            word, *rest = line.split()
            if word == "READY":
                break
            if word == "SEQ":
                reports["seq"][rest[0]] = int(rest[1])  # type: ignore[index]
            else:
                reports[word.lower()] = int(rest[0])
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGKILL)
        await asyncio.wait_for(process.wait(), GUARD_S)
    assert process.returncode == -signal.SIGKILL
    return reports


async def _checkpoints(home: Path) -> dict[str, int]:
    """Child id -> the seq its stored checkpoint (the `subagent` row) covers."""
    storage = await SqliteCacheStorage.open(home / "cache.sqlite3", read_only=True)
    try:
        out = {}
        for child in ("c0", "c1", "c2", "c3", "c4"):
            record = await storage.get(SessionId(child))
            if record is not None:
                out[child] = record.rows["subagent"]["seq"]
        return out
    finally:
        await storage.aclose()


@pytest.mark.slow
async def test_checkpoints_follow_the_policy_and_a_kill_between_two_leaves_the_listing_right(tmp_path: Path) -> None:
    """19 flushed turns give 4 checkpoints; after a SIGKILL the listing is right at one read per uncovered child."""
    home = tmp_path / "home"
    reports = await _run_and_kill(home)
    last: dict[str, int] = reports["seq"]  # type: ignore[assignment]

    assert reports["flushes"] == 19
    assert reports["puts"] == 4  # c2 once, c3 once, c4 twice: by the count, never per flush
    checkpoints = await _checkpoints(home)
    assert set(checkpoints) == {"c2", "c3", "c4"}
    assert all(checkpoints[child] < last[child] for child in checkpoints)  # killed between two checkpoints

    config = Config(home=home)
    async with Runtime.open(config, read_only=True, use_cache=False) as rt:
        reference = await rt.subagents.list_children("P")
    seen: list[ListingReport] = []
    async with Runtime.open(config, read_only=True) as rt:
        before = FILE_READS.snapshot().get("log", 0)
        rows = await rt.subagents.list_children("P", report=seen.append)
        log_reads = FILE_READS.snapshot().get("log", 0) - before

    assert [row.id for row in rows] == ["c0", "c1", "c2", "c3", "c4"]
    assert rows == reference
    (report,) = seen
    assert report.rungs == {"c0": 3, "c1": 3, "c2": 2, "c3": 2, "c4": 2}
    assert report.observations == 2
    assert log_reads == 2  # one read per child without a checkpoint, none for the others
