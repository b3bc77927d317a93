"""Damage both ways: a damaged log reads the same on both sides, and a repair by either side reads the same
on the other.

Whichever side wrote the log (pydsh or the harness, zstd or plain), each damage of
`tests/interop/damage.py` is applied to it, or the writer simply stopped mid-step (`open-step`: a
tool call recorded, another one only asked for); then both sides must agree on whether it is
listed, on its events or on the kind of refusal (docs/storage-format.md#torn-tails-and-repair),
the synthesized closers' wording aside (`closer-wording` in the allow-list). Then one side repairs
it (the harness's `load`, pydsh's `prepare`: the torn tail cut, closers appended) or refuses to;
the other side must read exactly what the repairer now reads, and find nothing left to repair.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from dsh.config import Config
from dsh.persistence.errors import SessionPersistenceError
from dsh.runtime import Runtime
from dsh.testing.stored_logs import StepClock
from tests.helpers import tree_snapshot
from tests.interop.compare import Log, harness_kind, pydsh_kind
from tests.interop.damage import DAMAGES, applies, damage
from tests.interop.differences import erase_closer_wording
from tests.interop.harness import HarnessProcess, HarnessRefused
from tests.interop.streams import assistant_calls, harness_turn, user_message

pytestmark = [pytest.mark.interop, pytest.mark.slow]

SESSION = "d1"
BATCHES = [*harness_turn(1, "One.", "Uno."), *harness_turn(2, "Two.", "Dos.")]
"""Four durable batches: turn 1, then turn 2's prompt, then its answer and end (a tear opens turn 2)."""

OPEN_STEP = [
    *harness_turn(1, "One.", "Uno."),
    [{"type": "turn/start", "data": {"turn": 2}}, {"type": "step/start", "data": {"turn": 2, "step": 1}}],
    [user_message("u2", "List and read."), assistant_calls(2, 1, "a2", ["call-ls", "call-cat"])],
    [{"type": "tool/call", "data": {"turn": 2, "step": 1, "callId": "call-ls", "name": "ls", "arguments": "{}"}}],
]
"""A writer that stopped mid-step: `call-ls` recorded without a result, `call-cat` never started."""

CASES = [
    pytest.param(writer, compression, name, id=f"{writer}-{compression}-{name}")
    for writer in ("pydsh", "harness")
    for compression in ("zstd", "none")
    for name in (*DAMAGES, "open-step")
    if name == "open-step" or applies(name, compression)
]


async def _pydsh_write(home: Path, compression: str, batches: list[list[dict[str, Any]]]) -> None:
    config = Config(home=home, persistence={"compression": compression})
    async with Runtime.open(config, clock=StepClock()) as rt:
        session = rt.sessions.create(SESSION)
        for batch in batches:
            for event in batch:
                session.append(event["type"], event["data"])
            await rt.sessions.flush(session)


def _damaged(harness: HarnessProcess, home: Path, writer: str, compression: str, name: str) -> Path:
    """Write the session with `writer`, apply the damage, return the log's path."""
    batches = OPEN_STEP if name == "open-step" else BATCHES
    if writer == "pydsh":
        asyncio.run(_pydsh_write(home, compression, batches))
    else:
        sessions = [{"id": SESSION, "meta": {}, "batches": batches}]
        harness.call("write", root=home / "sessions", compression=compression, sessions=sessions)
    log = next((home / "sessions").rglob("session.jsonl*"))
    if name != "open-step":
        log.write_bytes(damage(name, log.read_bytes(), compression))
    return log


def _worded_alike(read: tuple[bool, Log]) -> tuple[bool, Log]:
    """A read with the synthesized closers' words blanked (the allowed `closer-wording` difference)."""
    listed, log = read
    if log.events is None:
        return read
    return listed, Log(events=tuple(erase_closer_wording(log.events)))


async def _pydsh_read(home: Path) -> tuple[bool, Log]:
    """Whether pydsh lists the session, and its log (events or refusal)."""
    async with Runtime.open(Config(home=home), read_only=True) as rt:
        listing = await rt.persistence.list()
        listed = any(row.header.id == SESSION for row in listing.rows)
        try:
            return listed, Log.of((await rt.persistence.inspect(SESSION)).events)
        except SessionPersistenceError as error:
            return listed, Log(refused=pydsh_kind(error))


def _harness_read(harness: HarnessProcess, home: Path, compression: str) -> tuple[bool, Log]:
    where = {"root": home / "sessions", "compression": compression}
    listed = any(header["id"] == SESSION for header in harness.call("list", **where))
    try:
        return listed, Log(events=tuple(harness.call("inspect", session=SESSION, **where)["events"]))
    except HarnessRefused as error:
        return listed, Log(refused=harness_kind(error))


async def _pydsh_repair(home: Path) -> str | None:
    """pydsh's repair (`prepare`), then let go; the refusal kind when it refuses."""
    async with Runtime.open(Config(home=home)) as rt:
        try:
            prepared = await rt.persistence.prepare(SESSION)
        except SessionPersistenceError as error:
            return pydsh_kind(error)
        await prepared.close()
    return None


def _harness_repair(harness: HarnessProcess, home: Path, compression: str) -> str | None:
    try:
        harness.call("load", root=home / "sessions", compression=compression, session=SESSION)
    except HarnessRefused as error:
        return harness_kind(error)
    return None


@pytest.mark.parametrize(("writer", "compression", "name"), CASES)
def test_a_damaged_log_reads_the_same_on_both_sides(
    harness: HarnessProcess, tmp_path: Path, writer: str, compression: str, name: str
) -> None:
    """Listed or not, its events or the kind of refusal: both sides agree on every damage."""
    home = tmp_path / "home"
    _damaged(harness, home, writer, compression, name)
    before = tree_snapshot(home / "sessions")
    ours = asyncio.run(_pydsh_read(home))
    theirs = _harness_read(harness, home, compression)
    assert _worded_alike(ours) == _worded_alike(theirs)
    assert tree_snapshot(home / "sessions") == before  # reading repairs nothing
    if name in ("torn-last-frame", "open-step"):
        assert ours[1].events is not None
        assert ours[1].events[-1]["type"] == "turn/end"  # the open turn is closed in memory


@pytest.mark.parametrize("repairer", ["pydsh", "harness"])
@pytest.mark.parametrize(("writer", "compression", "name"), CASES)
def test_a_repair_by_one_side_reads_the_same_on_the_other(
    harness: HarnessProcess, tmp_path: Path, writer: str, compression: str, name: str, repairer: str
) -> None:
    """After one side repaired (or refused to), the other reads exactly what the repairer reads, and a
    repair by the other side finds nothing left to do."""
    home = tmp_path / "home"
    log = _damaged(harness, home, writer, compression, name)
    damaged = log.read_bytes()
    ours_first = asyncio.run(_pydsh_repair(home)) if repairer == "pydsh" else None
    theirs_first = _harness_repair(harness, home, compression) if repairer == "harness" else None
    refused = ours_first or theirs_first
    if refused is not None:
        assert refused == "corrupt"
        assert log.read_bytes() == damaged  # a refused repair leaves the bytes as they were
    ours = asyncio.run(_pydsh_read(home))
    theirs = _harness_read(harness, home, compression)
    assert ours == theirs
    settled = tree_snapshot(home / "sessions")
    if refused is None:
        again = _harness_repair(harness, home, compression) if repairer == "pydsh" else asyncio.run(_pydsh_repair(home))
        assert again is None
        assert tree_snapshot(home / "sessions") == settled
    else:
        other = _harness_repair(harness, home, compression) if repairer == "pydsh" else asyncio.run(_pydsh_repair(home))
        assert other == refused
        assert log.read_bytes() == damaged
