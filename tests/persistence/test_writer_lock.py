"""One writer per session across processes: refusal naming the holder, takeover after SIGKILL.

Process A streams into session `shared`; process B (another `SessionStore` + coordinator over the
same store) tries to resume it and is refused with `SESSION_LEASE_HELD` naming A. After A is
SIGKILLed the kernel drops A's lock, so B's `prepare` succeeds, repairs A's open turn and appends;
while B holds the session a third process is refused naming B. The final log holds A's events, then
B's, contiguous and never interleaved. The lock is a kernel file lock, so a dead holder never
blocks the session (docs/storage-format.md#writer-locks).
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import pytest

from dsh.persistence.coordinator import PersistenceCoordinator
from dsh.session import SessionStore
from tests.persistence.helpers import CHILD, CHILD_BACKENDS, GUARD_S, Reports, event_sha256, open_backend, store_path

SESSION = "shared"


async def _start(kind: str, path: str, seed: int, mode: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        str(CHILD),
        kind,
        path,
        SESSION,
        str(seed),
        mode,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def _read_until(process: asyncio.subprocess.Process, reports: Reports, stop: bytes, count: int = 1) -> bytes:
    """Read report lines until `count` lines start with `stop`; return the last of them."""
    assert process.stdout is not None
    assert process.stderr is not None
    seen = 0
    while True:
        line = await asyncio.wait_for(process.stdout.readline(), GUARD_S)
        if not line:
            stderr = await process.stderr.read()
            pytest.fail(f"child ended before {stop!r}: {stderr.decode()[-3000:]}")
        reports.parse(line)
        if line.startswith(stop):
            seen += 1
            if seen >= count:
                return line


async def _refused_holder(kind: str, path: str) -> str:
    """Run a child that must be refused; return the holder it was told about."""
    process = await _start(kind, path, 99, "bounded")
    line = await _read_until(process, Reports(), b"HELD ")
    assert process.stdout is not None
    assert process.stderr is not None
    await asyncio.wait_for(process.stdout.read(), GUARD_S)
    stderr = await asyncio.wait_for(process.stderr.read(), GUARD_S)
    assert await asyncio.wait_for(process.wait(), GUARD_S) == 3, stderr.decode()[-3000:]
    return line.decode().split(" ", 1)[1].strip()


@pytest.mark.slow
@pytest.mark.parametrize("kind", CHILD_BACKENDS)
async def test_second_writer_is_refused_and_takes_over_after_sigkill(tmp_path: Path, kind: str) -> None:
    """A second process gets `SESSION_LEASE_HELD` naming the holder; after SIGKILL it takes over cleanly."""
    directory = tmp_path / "store"
    directory.mkdir(mode=0o700)
    path = store_path(directory, kind)
    first = await _start(kind, path, 1, "stream")
    first_reports = Reports()
    try:
        await _read_until(first, first_reports, b"F ", count=2)
        holder = await _refused_holder(kind, path)
        assert holder.startswith(f"{first.pid}@")
        before_kill = first_reports.flushed
    finally:
        if first.returncode is None:
            first.send_signal(signal.SIGKILL)
        assert first.stdout is not None
        assert first.stderr is not None
        rest = await asyncio.wait_for(first.stdout.read(), GUARD_S)
        await asyncio.wait_for(first.stderr.read(), GUARD_S)
        await asyncio.wait_for(first.wait(), GUARD_S)
    for line in rest.split(b"\n")[:-1]:  # a line cut by the kill has no newline: ignored
        first_reports.parse(line)
    assert before_kill > 0
    assert first.returncode == -signal.SIGKILL  # A died holding the lock, it did not release it

    second = await _start(kind, path, 2, "bounded")
    second_reports = Reports()
    try:
        ready = await _read_until(second, second_reports, b"READY ")
        resumed_at = int(ready.split()[1])
        await _read_until(second, second_reports, b"DONE")
        holder = await _refused_holder(kind, path)
        assert holder.startswith(f"{second.pid}@")
    finally:
        assert second.stdin is not None
        assert second.stderr is not None
        second.stdin.write(b"go\n")
        await second.stdin.drain()
        code = await asyncio.wait_for(second.wait(), GUARD_S)
        stderr = await asyncio.wait_for(second.stderr.read(), GUARD_S)
    assert code == 0, stderr.decode()[-3000:]

    store = SessionStore()
    async with PersistenceCoordinator(open_backend(kind, path), store) as coordinator:
        observation = await coordinator.inspect(SESSION)
        await store.aclose()
    events = list(observation.events)
    assert observation.synthetic_tail == 0
    assert [event.seq for event in events] == list(range(len(events)))
    assert len(events) == max(second_reports.events) + 1
    # B restored exactly what A left (plus the repair), then appended after it: no interleaving.
    for event in events:
        assert second_reports.events[event.seq] == event_sha256(event)
    # A's events are the longest prefix A reported. A later stored event can equal one A appended but
    # never flushed (a repair closer of the same turn, step and millisecond): that is B's, not A's.
    a_stored = 0
    while a_stored < len(events) and first_reports.events.get(a_stored) == event_sha256(events[a_stored]):
        a_stored += 1
    assert a_stored >= first_reports.flushed >= before_kill  # every event A saw acknowledged survived
    assert resumed_at >= a_stored
    assert events[resumed_at - 1].type == "session/end-seed"
    assert all(event.type != "session/end-seed" for event in events[resumed_at:])
    assert [event.type for event in events[resumed_at:]].count("turn/end") == 2
