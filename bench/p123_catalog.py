"""P1-P3 — the child catalog: listing time against transcript length for each rung of the ladder.

* P1, live (rung 1): N live children; warm listing (registry cells built). 0 log reads; target
  time(10,000-event logs) / time(100-event logs) <= 1.3.
* P2, cold cache hit (rung 2): N unseeded cold children with a projection-cache row. 0 log reads;
  same length-independence target.
* P3, cold miss (rung 3): N seeded cold children, one observation each; target >= 3x faster than
  the pre-seed baseline, implemented here only: per child two full reads plus a deep copy of each,
  then a hand-written descriptor scan.
Writes `bench/results/p123_catalog.json` and a PNG plot. Run: `python -m bench.p123_catalog`.
"""

from __future__ import annotations

import asyncio
import copy
import gc
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import RESULTS, print_table, verdict, write_json

CHILDREN = 20
LENGTHS = (100, 1_000, 10_000)
REPEAT = 5
PARENT = "parent"


def _descriptor(label: str) -> dict[str, Any]:
    return {"version": 2, "mode": "continuable", "provider": "spawn", "label": label}


def _child_records(length: int, *, seed: int = 0) -> list[dict[str, Any]]:
    """A child log of `length` events: `seed` inherited events, the descriptor at seq == cut, turns."""
    records: list[dict[str, Any]] = []

    def add(kind: str, data: Any, **extra: Any) -> None:
        records.append(
            {"type": kind, "seq": len(records), "time": 1_789_000_000_000 + len(records), "data": data, **extra}
        )

    turn = 0
    while len(records) < seed:
        turn += 1
        add("turn/start", {"turn": turn})
        while len(records) < seed - 1:
            add("assistant/chunk", {"turn": turn, "step": 1, "chunk": {"type": "text-delta", "text": "inherited"}})
        add("turn/end", {"turn": turn, "reason": {"kind": "completed"}})
    add("subagent/descriptor", _descriptor("worker"))
    add("session/end-seed", {})
    while len(records) < length:
        turn += 1
        add("turn/start", {"turn": turn})
        add(
            "user/message",
            {"id": f"u{turn}", "role": "user", "content": [{"type": "text", "text": "go"}], "source": {"kind": "user"}},
            surfaceOp="append",
        )
        for _ in range(min(16, length - len(records) - 1)):
            add("assistant/chunk", {"turn": turn, "step": 1, "chunk": {"type": "text-delta", "text": "working on it"}})
        add("turn/end", {"turn": turn, "reason": {"kind": "completed"}})
    return records[:length] if records[length - 1]["type"] == "turn/end" else records


def _header(child: str, *, seed: int) -> dict[str, Any]:
    header: dict[str, Any] = {
        "type": "session",
        "version": 0,
        "id": child,
        "createdAt": 1_789_000_000_000,
        "parentSession": PARENT,
    }
    if seed:
        header["seedLength"] = seed
    header |= {"origin": "subagent", "delegationDepth": 1}
    return header


async def _write_store(root: Path, length: int, *, seed: int) -> None:
    from dsh.testing.jsonl_writer import JsonlLogWriter

    writer = JsonlLogWriter(root)
    records = _child_records(length, seed=seed)
    await writer.write(
        PARENT,
        {"type": "session", "version": 0, "id": PARENT, "createdAt": 1, "delegationDepth": 0},
        [
            {"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1}},
            {"type": "turn/end", "seq": 1, "time": 2, "data": {"turn": 1, "reason": {"kind": "completed"}}},
        ],
    )
    for index in range(CHILDREN):
        await writer.write(f"child-{index:03d}", _header(f"child-{index:03d}", seed=seed), records)


async def _stack(root: Path, cache_path: Path | None) -> Any:
    """A hand-built stack (00 §3) over a JSONL root, optionally with a SQLite projection cache."""
    from dsh.persistence.coordinator import PersistenceCoordinator
    from dsh.persistence.jsonl import JsonlBackend
    from dsh.projection.cache import ProjectionCache
    from dsh.projection.cache_storage import SqliteCacheStorage
    from dsh.projection.registry import ProjectionRegistry
    from dsh.query.service import SessionQuery
    from dsh.services import Services
    from dsh.session.store import SessionStore
    from dsh.subagent.runtime import SubagentRuntime
    from dsh.testing.counting import CountingPersistence

    store = SessionStore()
    persistence = PersistenceCoordinator(JsonlBackend(root), store)
    await persistence.open()
    counting = CountingPersistence(persistence)
    registry = ProjectionRegistry(store)
    services = Services(sessions=store, persistence=counting, projections=registry)
    runtime = SubagentRuntime(services)
    if cache_path is not None:
        storage = await SqliteCacheStorage.open(cache_path)
        services.projection_cache = await ProjectionCache.open(
            storage, registry=registry, sessions=store, persistence=persistence
        )
    services.query = SessionQuery(store, counting, projections=registry)

    async def close() -> None:
        await store.aclose()
        if services.projection_cache is not None:
            await services.projection_cache.aclose()
        runtime.release_units()
        registry.close()
        await persistence.close()

    return services, runtime, counting, close


async def _time_listing(runtime: Any, counting: Any) -> tuple[float, int, list[Any]]:
    counting.reset()
    start = time.perf_counter()
    rows = await runtime.list_children(PARENT)
    return time.perf_counter() - start, counting.total_reads, rows


async def p1_live(length: int) -> tuple[float, int]:
    """Warm listing of CHILDREN live children, each with `length` events (memory persistence)."""
    from dsh.persistence.coordinator import PersistenceCoordinator
    from dsh.persistence.memory import MemoryBackend
    from dsh.projection.registry import ProjectionRegistry
    from dsh.query.service import SessionQuery
    from dsh.services import Services
    from dsh.session.header import HeaderInit
    from dsh.session.store import SessionStore
    from dsh.subagent.runtime import SubagentRuntime
    from dsh.testing.counting import CountingPersistence

    store = SessionStore()
    async with PersistenceCoordinator(MemoryBackend(), store) as persistence:
        counting = CountingPersistence(persistence)
        registry = ProjectionRegistry(store)
        services = Services(sessions=store, persistence=counting, projections=registry)
        runtime = SubagentRuntime(services)
        services.query = SessionQuery(store, counting, projections=registry)
        store.create(PARENT)
        records = _child_records(length)
        for index in range(CHILDREN):
            seed = [records[0]]  # the continuable descriptor, staged in the creation seed
            child = store.create(
                f"child-{index:03d}",
                header=HeaderInit(parent_session=PARENT, origin="subagent", delegation_depth=1),
                seed=seed,
            )
            for record in records[2:]:
                child.append(record["type"], record["data"])
        await _time_listing(runtime, counting)  # warm: registry cells built
        best, reads = float("inf"), 0
        for _ in range(REPEAT):
            elapsed, reads, rows = await _time_listing(runtime, counting)
            assert len(rows) == CHILDREN
            assert all(row.kind == "child" for row in rows)
            best = min(best, elapsed)
        await store.aclose()
        runtime.release_units()
        registry.close()
    return best, reads


async def p2_cache_hit(root: Path, length: int) -> tuple[float, int]:
    """Cold listing where every unseeded child is served by its projection-cache row."""
    await _write_store(root, length, seed=0)
    cache_path = root.parent / f"{root.name}-cache.sqlite3"
    services, runtime, counting, close = await _stack(root, cache_path)
    for index in range(CHILDREN):  # fill the cache the way a cold read does (write-back)
        await services.projection_cache.cold_snapshot(f"child-{index:03d}")
    best, reads = float("inf"), 0
    for _ in range(REPEAT):
        elapsed, reads, rows = await _time_listing(runtime, counting)
        assert len(rows) == CHILDREN
        assert all(row.kind == "child" for row in rows)
        best = min(best, elapsed)
    await close()
    return best, reads


async def p3_cold_miss(root: Path, length: int) -> tuple[float, int, float]:
    """Cold listing of seeded children (one observation each) against the pre-seed baseline."""
    await _write_store(root, length, seed=max(1, length // 10))
    best, reads = float("inf"), 0
    for _ in range(REPEAT):
        # A fresh stack per run, so the coordinator's prepared-observation cache starts empty.
        services, runtime, counting, close = await _stack(root, None)
        elapsed, reads, rows = await _time_listing(runtime, counting)
        assert len(rows) == CHILDREN
        assert all(row.kind == "child" for row in rows)
        best = min(best, elapsed)
        await close()
    baseline = float("inf")
    for _ in range(REPEAT):
        services, runtime, counting, close = await _stack(root, None)
        start = time.perf_counter()
        await _pre_seed_baseline(services)
        baseline = min(baseline, time.perf_counter() - start)
        await close()
    return best, reads, baseline


async def _pre_seed_baseline(services: Any) -> list[tuple[str, str | None]]:
    """What listing did before seed 000: per child, two full reads, each deep-copied, then a scan."""
    from dsh.json import thaw

    out: list[tuple[str, str | None]] = []
    listing = await services.persistence.list()
    for info in listing.rows:
        header = info.header
        if header.origin != "subagent" or header.parent_session != PARENT:
            continue
        events = await services.persistence.read_events(header.id)  # "listEvents"
        copied = copy.deepcopy([thaw(event) for event in events.events])
        again = await services.persistence.read_events(header.id)  # "readEvent" of the descriptor
        copied_again = copy.deepcopy([thaw(event) for event in again.events])
        label = None
        for record in copied_again if copied else ():
            if record["type"] == "subagent/descriptor":
                label = record["data"].get("label")
        out.append((header.id, label))
    return out


def _plot(results: dict[str, dict[int, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    for name, series in results.items():
        xs = sorted(series)
        axis.plot(xs, [series[x] * 1000 for x in xs], marker="o", label=name)
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("events per child transcript")
    axis.set_ylabel(f"listing time for {CHILDREN} children (ms)")
    axis.set_title("Child catalog: listing time vs transcript length")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    print(f"wrote {path}")


def main() -> None:
    """Measure the three rungs and the baseline at each transcript length; print ratios; plot."""
    tmp = Path(tempfile.mkdtemp(prefix="dsh-p123-"))
    series: dict[str, dict[int, float]] = {
        "rung 1: live": {},
        "rung 2: cache hit": {},
        "rung 3: cold miss (1 read)": {},
        "pre-seed baseline (2 reads + copies)": {},
    }
    reads: dict[str, dict[int, int]] = {"p1": {}, "p2": {}, "p3": {}}
    try:
        for length in LENGTHS:
            gc.collect()
            series["rung 1: live"][length], reads["p1"][length] = asyncio.run(p1_live(length))
            series["rung 2: cache hit"][length], reads["p2"][length] = asyncio.run(
                p2_cache_hit(tmp / f"p2-{length}", length)
            )
            cold, reads["p3"][length], baseline = asyncio.run(p3_cold_miss(tmp / f"p3-{length}", length))
            series["rung 3: cold miss (1 read)"][length] = cold
            series["pre-seed baseline (2 reads + copies)"][length] = baseline
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows = [[name, *(series[name][n] * 1000 for n in LENGTHS)] for name in series]
    print_table(
        f"P1-P3 child catalog, {CHILDREN} children (ms per listing)", ["rung", *(f"{n:,} ev" for n in LENGTHS)], rows
    )
    p1 = series["rung 1: live"][LENGTHS[-1]] / series["rung 1: live"][LENGTHS[0]]
    p2 = series["rung 2: cache hit"][LENGTHS[-1]] / series["rung 2: cache hit"][LENGTHS[0]]
    p3 = {
        n: series["pre-seed baseline (2 reads + copies)"][n] / series["rung 3: cold miss (1 read)"][n] for n in LENGTHS
    }
    for label, ratio, key in (("P1 live", p1, "p1"), ("P2 cache hit", p2, "p2")):
        mark = verdict(ratio, 1.3, higher_is_better=False)
        print(f"  {label}: length ratio {ratio:.2f} (target <= 1.3) {mark}; log reads {reads[key]}")
    for n, ratio in p3.items():
        print(
            f"  P3 cold miss at {n:,} events: {ratio:.2f}x faster than the baseline (target >= 3) "
            f"{verdict(ratio, 3.0, higher_is_better=True)}; reads {reads['p3'][n]} for {CHILDREN} children"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    _plot(series, RESULTS / "p123_catalog.png")
    write_json(
        "p123_catalog",
        {
            "children": CHILDREN,
            "seconds": {name: {str(n): t for n, t in values.items()} for name, values in series.items()},
            "reads": {key: {str(n): r for n, r in values.items()} for key, values in reads.items()},
            "p1_length_ratio": p1,
            "p2_length_ratio": p2,
            "p3_speedup": {str(n): r for n, r in p3.items()},
            "targets": {"p1": 1.3, "p2": 1.3, "p3": 3.0},
        },
    )


if __name__ == "__main__":
    main()
