"""Single-event append + flush latency against the write+fsync floor of the same file system.

What an agent waits for when it needs one event durable right now (a tool result before the next
model call): `Session.append` of one event, then `await store.flush(session)`, on a live JSONL+zstd
session that is already materialized. The floor is the least any durable append can cost here:
write one line of the same size to a file in the same directory and `fsync` it, on the calling
thread. Samples of the two alternate (the order flips every sample), so both see the same disk and
the same neighbours; each round reports p50 of both and their ratio, and the target is on the median
of the per-round ratios: dsh p50 within 3x of the floor p50.

Also reported (no targets): the same write+fsync through one `asyncio.to_thread` hop (what keeping
I/O off the event loop costs by itself), dsh on the SQLite backend, p99s, and — counted in a child
process under strace (`bench.fsyncs`) — how many durable syncs one append + flush makes (one: the
acknowledgement comes after the `fsync`, and nothing else is synced). Run: `python -m bench append_latency`.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson

from bench import fsyncs
from bench.append_peers import turn_events
from bench.common import QUICK, count_target, info, print_table, spread, target, write_json

ROUNDS = 2 if QUICK else 7
SAMPLES = 60 if QUICK else 400
"""Samples per variant per round."""
COUNT_FLUSHES = 50 if QUICK else 200
"""Append + flush pairs in the fsync-count child."""

EVENT = turn_events(7)[10]
"""One `assistant/chunk` event (type, data): a typical streamed event, about 150 bytes as a line."""

OURS = "dsh jsonl+zstd: append + flush"
FLOOR = "floor: write+fsync"
FLOOR_HOP = "write+fsync through one thread hop"
OURS_SQLITE = "dsh sqlite: append + flush"


def _line() -> bytes:
    kind, data = EVENT
    return orjson.dumps({"type": kind, "seq": 1000, "time": 1_800_000_000_000, "data": data}) + b"\n"


async def _open_session(backend: Any) -> tuple[Any, Any, Any]:
    from dsh.persistence.coordinator import PersistenceCoordinator
    from dsh.session.store import SessionStore

    store = SessionStore()
    coordinator = PersistenceCoordinator(backend, store)
    await coordinator.open()
    session = store.create(header=None)
    session.append("turn/start", {"turn": 7})
    await store.flush(session)  # materialize first: every sample is a plain append
    return store, coordinator, session


def _ours(store: Any, session: Any) -> Callable[[], Awaitable[None]]:
    kind, data = EVENT

    async def sample() -> None:
        session.append(kind, data)
        await store.flush(session)

    return sample


async def _measure(root: Path) -> dict[str, list[list[float]]]:
    """Per variant, per round, the sample latencies in seconds."""
    from dsh.persistence.jsonl import JsonlBackend
    from dsh.persistence.sqlite import SqliteBackend

    line = _line()
    fd = os.open(root / "floor.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def commit() -> None:
        os.write(fd, line)
        os.fsync(fd)

    async def floor() -> None:
        commit()

    async def floor_hop() -> None:
        await asyncio.to_thread(commit)

    jsonl = await _open_session(JsonlBackend(root / "sessions"))
    sqlite = await _open_session(SqliteBackend(root / "sessions.sqlite3"))
    variants: dict[str, Callable[[], Awaitable[None]]] = {
        OURS: _ours(jsonl[0], jsonl[2]),
        FLOOR: floor,
        FLOOR_HOP: floor_hop,
        OURS_SQLITE: _ours(sqlite[0], sqlite[2]),
    }
    samples: dict[str, list[list[float]]] = {name: [] for name in variants}
    names = list(variants)
    try:
        for _ in range(ROUNDS):
            rounds: dict[str, list[float]] = {name: [] for name in names}
            for index in range(SAMPLES):
                # Alternate the order every sample so no variant always follows the same neighbour.
                for name in names if index % 2 == 0 else reversed(names):
                    start = time.perf_counter()
                    await variants[name]()
                    rounds[name].append(time.perf_counter() - start)
            for name in names:
                samples[name].append(rounds[name])
    finally:
        os.close(fd)
        for store, coordinator, _ in (jsonl, sqlite):
            await store.aclose()
            await coordinator.close()
    return samples


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _child(flushes: int) -> None:
    """The fsync-count child: `flushes` append + flush pairs on a materialized JSONL session."""
    from dsh.persistence.jsonl import JsonlBackend

    async def run(root: Path) -> None:
        store, coordinator, session = await _open_session(JsonlBackend(root / "sessions"))
        sample = _ours(store, session)
        for _ in range(flushes):
            await sample()
        await store.aclose()
        await coordinator.close()

    tmp = Path(tempfile.mkdtemp(prefix="dsh-latency-one-"))
    try:
        asyncio.run(run(tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    """Measure the rounds, print p50/p99 per variant and the per-round ratios, write the targets."""
    tmp = Path(tempfile.mkdtemp(prefix="dsh-latency-"))
    try:
        samples = asyncio.run(_measure(tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    p50 = {name: [statistics.median(r) for r in rounds] for name, rounds in samples.items()}
    p99 = {name: [_p(r, 0.99) for r in rounds] for name, rounds in samples.items()}
    ratio = {name: spread([a / b for a, b in zip(p50[name], p50[FLOOR], strict=True)]) for name in samples}
    rows = [
        [name, statistics.median(p50[name]) * 1e6, statistics.median(p99[name]) * 1e6, ratio[name]["median"]]
        for name in samples
    ]
    print_table(
        f"one event append + durable flush, {ROUNDS} rounds x {SAMPLES} samples (medians of per-round values)",
        ["variant", "p50 us", "p99 us", "p50 / floor p50"],
        rows,
    )
    targets = [
        target(
            "P6",
            "one event append + flush p50 / write+fsync floor p50 (same directory, interleaved), dsh jsonl+zstd",
            ratio[OURS]["median"],
            3.0,
            higher_is_better=False,
            spread_=ratio[OURS],
        ),
        info("P6", "floor write+fsync p50", statistics.median(p50[FLOOR]) * 1e6, unit=" us"),
        info("P6", "write+fsync through one thread hop, p50 / floor p50", ratio[FLOOR_HOP]["median"], unit="x"),
        info("P6", "one event append + flush p50 / floor p50, dsh sqlite", ratio[OURS_SQLITE]["median"], unit="x"),
    ]
    counts: dict[str, int | None] = {}
    if fsyncs.available():
        baseline = fsyncs.count(["bench.append_latency", "--child", "0"])
        counted = fsyncs.count(["bench.append_latency", "--child", str(COUNT_FLUSHES)])
        per = None if baseline is None or counted is None else counted - baseline
        counts = {"baseline": baseline, "with_flushes": counted}
        targets.append(
            count_target(
                "P6",
                f"durable syncs for {COUNT_FLUSHES} append + flush pairs (one fsync before each acknowledgement)",
                -1 if per is None else per,
                f"== {COUNT_FLUSHES}",
                per == COUNT_FLUSHES,
            )
        )
    else:
        targets.append(info("P6", "durable syncs per append + flush (strace not available, not counted)", "-"))
    print()
    for row in targets:
        measured = row["measured"]
        shown = f"{measured:.2f}" if isinstance(measured, float) else str(measured)
        print(f"  {row['what']}: {shown} (target {row['target'] or '-'}) {row['verdict']}")
    write_json(
        "append_latency",
        {
            "rounds": ROUNDS,
            "samples": SAMPLES,
            "p50_us": {name: [v * 1e6 for v in values] for name, values in p50.items()},
            "p99_us": {name: [v * 1e6 for v in values] for name, values in p99.items()},
            "ratios": ratio,
            "fsyncs": counts,
            "targets": targets,
        },
    )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        _child(int(sys.argv[2]))
    else:
        main()
