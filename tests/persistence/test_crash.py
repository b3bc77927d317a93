"""Crash safety: SIGKILL a streaming writer at seeded-random points, then reopen and verify the log.

Each trial starts `crash_child.py` (a real `SessionStore` + `PersistenceCoordinator` over the backend),
lets it stream turns with periodic flushes, and kills it with SIGKILL after a seeded-random number
of completed flushes plus a seeded-random extra delay — the delay only moves the kill point; no test
step waits on it. Consecutive trials resume the same session (the child `prepare`s what the previous
kill left), so torn tails, repairs and end-seeds are all exercised. After every kill a fresh
coordinator proves: every event covered by a completed flush is present, every stored event is one
the child appended (byte-identical; nothing after the torn tail is invented), seqs are contiguous,
the log loads, an open turn is closed in memory by exactly the interrupted-turn closers, and
`prepare` then commits that repair durably (docs/architecture.md#crash-repair).
"""

from __future__ import annotations

import asyncio
import random
import signal
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from dsh.persistence.coordinator import PersistenceCoordinator
from dsh.session import SessionStore
from dsh.session.repair import interrupted_turn_closers
from tests.persistence.helpers import CHILD, CHILD_BACKENDS, GUARD_S, Reports, event_sha256, open_backend, store_path

TRIALS = 20
LANES = 2  # trials run in two independent stores at once; each lane is sequential


async def _run_and_kill(kind: str, path: str, session_id: str, seed: int, rng: random.Random) -> Reports:
    """Start a child, wait for some completed flushes, SIGKILL it, and collect every complete report."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(CHILD),
        kind,
        path,
        session_id,
        str(seed),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    assert process.stderr is not None
    reports = Reports()
    flushes_before_kill = rng.randint(1, 4)
    extra_delay_s = rng.uniform(0.0, 0.04)
    seen_flushes = 0
    try:
        while seen_flushes < flushes_before_kill:
            line = await asyncio.wait_for(process.stdout.readline(), GUARD_S)
            if not line:
                stderr = await process.stderr.read()
                pytest.fail(f"child exited early ({kind}, {session_id}): {stderr.decode()[-3000:]}")
            reports.parse(line)
            seen_flushes += line.startswith(b"F ")
        await asyncio.sleep(extra_delay_s)  # moves the kill point; nothing waits on it
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGKILL)
        rest = await asyncio.wait_for(process.stdout.read(), GUARD_S)
        stderr = await asyncio.wait_for(process.stderr.read(), GUARD_S)
        await asyncio.wait_for(process.wait(), GUARD_S)
    for line in rest.split(b"\n")[:-1]:  # a line cut by the kill has no newline: ignored
        reports.parse(line)
    assert process.returncode == -signal.SIGKILL, stderr.decode()[-3000:]
    return reports


def _open_turn(events: list[Any]) -> bool:
    for event in reversed(events):
        if event["type"] == "turn/end":
            return False
        if event["type"] == "turn/start":
            return True
    return False


async def _verify(kind: str, path: str, session_id: str, reports: Reports) -> None:
    """Reopen with fresh coordinators and check every crash-safety promise for one killed child."""
    store = SessionStore()
    async with PersistenceCoordinator(open_backend(kind, path), store) as coordinator:
        observation = await coordinator.inspect(session_id)
        events = list(observation.events)
        assert [event.seq for event in events] == list(range(len(events)))
        stored = events[: len(events) - observation.synthetic_tail]
        assert len(stored) >= reports.flushed, "an event covered by a completed flush is missing"
        for event in stored:
            assert reports.events.get(event.seq) == event_sha256(event), f"stored seq {event.seq} was never appended"
        expected_closers = interrupted_turn_closers(stored)
        assert (observation.synthetic_tail > 0) == _open_turn(stored)
        assert [orjson.dumps(e) for e in events[len(stored) :]] == [orjson.dumps(e) for e in expected_closers]
        if expected_closers:
            assert events[-1]["data"]["reason"] == {"kind": "interrupted"}
        async with await coordinator.prepare(session_id):
            pass
        await store.aclose()
    store = SessionStore()
    async with PersistenceCoordinator(open_backend(kind, path), store) as coordinator:
        repaired = await coordinator.inspect(session_id)
        assert repaired.synthetic_tail == 0
        assert [orjson.dumps(e) for e in repaired.events] == [orjson.dumps(e) for e in events]
        if expected_closers:
            assert repaired.revision != observation.revision
        await store.aclose()


async def _lane(kind: str, lane_dir: Path, lane: int, trials: int) -> int:
    rng = random.Random(f"crash:{kind}:{lane}")
    path = store_path(lane_dir, kind)
    verified = 0
    for trial in range(trials):
        session_id = f"lane{lane}-s{trial // 2}"  # the odd trial resumes what the even one left
        reports = await _run_and_kill(kind, path, session_id, rng.randrange(2**32), rng)
        await _verify(kind, path, session_id, reports)
        verified += 1
    return verified


@pytest.mark.slow
@pytest.mark.parametrize("kind", CHILD_BACKENDS)
async def test_sigkill_at_random_points_loses_no_flushed_event(tmp_path: Path, kind: str) -> None:
    """Twenty SIGKILLs mid-stream: flushed events survive, the log loads and repairs, nothing is invented."""
    lanes = []
    for lane in range(LANES):
        lane_dir = tmp_path / f"lane{lane}"
        lane_dir.mkdir(mode=0o700)  # the SQLite backend insists on a private directory
        lanes.append(_lane(kind, lane_dir, lane, TRIALS // LANES))
    verified = await asyncio.gather(*lanes)
    assert sum(verified) == TRIALS
