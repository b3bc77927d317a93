"""Catalog under load: a parent's listing while 50 agents stream, as a ratio to the same listing at rest.

One runtime on the default stack (JSONL+zstd logs, SQLite projection cache). The parent has 50
stored children: 25 unseeded ones the projection cache answers (rung 2, no log read) and 25 seeded
ones that need one observation each (rung 3). Next to it, 50 top-level agents run scripted turns on
a paced model that waits 1/30 s before each text chunk, so each agent streams about 30 chunks per
second and the event loop is busy (chunks, appends, flushes, cache work) but not saturated. The
achieved chunk rate is reported to show it.

Each round measures `list_children(parent)` a few times with the 50 agents idle and then a few times
with all of them streaming (the order alternates between rounds, so warm-up and drift spread
evenly). The ratio of a round is median(loaded) / median(idle); the result is the median ratio over
the rounds, against the target <= 1.5. Run: `python -m bench.catalog_load`.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from bench.common import QUICK, print_table, spread, target, write_json

AGENTS = 50
CHILDREN_CACHED = 25
CHILDREN_OBSERVED = 25
CHUNKS_PER_SECOND = 30.0
CHUNKS_PER_TURN = 60  # two seconds of streaming per turn
CHUNK_CHARS = 16
ROUNDS = 2 if QUICK else 7
LISTINGS = 3 if QUICK else 9  # per state and round
RAMP_S = 0.5  # after the agents start (or stop), before the listings of that state
TARGET = 1.5
PARENT = "bench-parent"


class PacedModel:
    """A model client that waits `1 / chunks_per_second` before each text chunk of the inner stream."""

    provider = "scripted"

    def __init__(self, inner: Any, chunks_per_second: float) -> None:
        self.inner = inner
        self.delay = 1.0 / chunks_per_second
        self.chunks = 0

    @property
    def model(self) -> str:
        """The inner client's model name."""
        return str(self.inner.model)

    async def stream(self, request: Any, *, signal: Any) -> AsyncIterator[Any]:
        """The inner stream, paced."""
        from dsh.agent.model import TextDelta

        async for chunk in self.inner.stream(request, signal=signal):
            if isinstance(chunk, TextDelta):
                await asyncio.sleep(self.delay)
                self.chunks += 1
            yield chunk

    async def aclose(self) -> None:
        """Nothing to release."""


def _model() -> PacedModel:
    from dsh.agent.models import ScriptedModelClient

    answer = "streamed chunk. " * CHUNKS_PER_TURN
    script = {
        "version": 1,
        "model": "bench-paced",
        "agents": {"main": {"on": [{"text": answer[: CHUNKS_PER_TURN * CHUNK_CHARS], "chunkSize": CHUNK_CHARS}]}},
    }
    return PacedModel(ScriptedModelClient.from_dict(script), CHUNKS_PER_SECOND)


async def _build_children(rt: Any) -> None:
    """The parent with one turn, 25 unseeded children (cache rows) and 25 seeded ones (one read each)."""
    from dsh.session.header import HeaderInit
    from dsh.subagent.descriptor import snapshot_descriptor

    store = rt.sessions
    parent = store.create(PARENT)
    parent.append("turn/start", {"turn": 1})
    parent.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
    await store.flush(parent)
    prefix: list[Any] = list(parent.events)
    for index in range(CHILDREN_CACHED + CHILDREN_OBSERVED):
        seeded = index >= CHILDREN_CACHED
        inherited = prefix if seeded else []
        descriptor = snapshot_descriptor("continuable", provider="fork" if seeded else "spawn", label=f"child {index}")
        record = {"type": "subagent/descriptor", "seq": len(inherited), "time": store.clock(), "data": descriptor}
        child = store.create(
            f"bench-child-{index:03d}",
            header=HeaderInit(parent_session=PARENT, origin="subagent", delegation_depth=1),
            seed=[*inherited, record],
            inherited_event_count=len(inherited),
        )
        for turn in range(2, 12):
            child.append("turn/start", {"turn": turn})
            child.append("turn/end", {"turn": turn, "reason": {"kind": "completed"}})
        await store.flush(child)
        store.dispose(child)  # the cache writes its checkpoint here


class _Load:
    """50 agents that run turn after turn while `running` is set, and wait between turns otherwise."""

    def __init__(self, agents: list[Any]) -> None:
        self.agents = agents
        self.running = asyncio.Event()
        self.stopped = False
        self.tasks = [asyncio.ensure_future(self._drive(agent)) for agent in agents]

    async def _drive(self, agent: Any) -> None:
        while True:
            await self.running.wait()
            if self.stopped:
                return
            await agent.turn_result(await agent.send("stream"))

    async def pause(self) -> None:
        """Stop starting turns, wait until every agent is idle, then let write-behind work drain."""
        self.running.clear()
        await asyncio.gather(*(agent.wait_idle() for agent in self.agents))
        await asyncio.sleep(RAMP_S)

    async def close(self) -> None:
        self.stopped = True
        self.running.set()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def _listing(rt: Any) -> float:
    start = time.perf_counter()
    rows = await rt.subagents.list_children(PARENT)
    elapsed = time.perf_counter() - start
    assert len(rows) == CHILDREN_CACHED + CHILDREN_OBSERVED, len(rows)
    return elapsed


async def _measure(home: Path) -> dict[str, Any]:
    from dsh.config import Config
    from dsh.runtime import Runtime

    model = _model()
    async with Runtime.open(Config(home=home), model=model) as rt:
        await _build_children(rt)
        agents = [await rt.create_agent(cwd=str(home)) for _ in range(AGENTS)]
        load = _Load(agents)
        rungs: dict[int, int] = {}
        await rt.subagents.list_children(PARENT, report=lambda report: rungs.update(_count(report.rungs)))
        idle_ms: list[float] = []
        loaded_ms: list[float] = []
        ratios: list[float] = []
        rates: list[float] = []
        try:
            # One warm-up of each state, outside the rounds.
            load.running.set()
            await asyncio.sleep(RAMP_S)
            await _listing(rt)
            await load.pause()
            await _listing(rt)
            for round_ in range(ROUNDS):
                per_state: dict[str, list[float]] = {}
                for state in ("idle", "loaded") if round_ % 2 == 0 else ("loaded", "idle"):
                    if state == "loaded":
                        load.running.set()
                        await asyncio.sleep(RAMP_S)
                        chunks, started = model.chunks, time.perf_counter()
                        per_state[state] = [await _listing(rt) for _ in range(LISTINGS)]
                        await asyncio.sleep(0.5)
                        rates.append((model.chunks - chunks) / (time.perf_counter() - started) / AGENTS)
                        await load.pause()
                    else:
                        per_state[state] = [await _listing(rt) for _ in range(LISTINGS)]
                idle, loaded = statistics.median(per_state["idle"]), statistics.median(per_state["loaded"])
                idle_ms.append(idle * 1e3)
                loaded_ms.append(loaded * 1e3)
                ratios.append(loaded / idle)
        finally:
            await load.close()
    return {"idle_ms": idle_ms, "loaded_ms": loaded_ms, "ratios": ratios, "rates": rates, "rungs": rungs}


def _count(rungs: Any) -> dict[int, int]:
    out: dict[int, int] = {}
    for rung in rungs.values():
        out[rung] = out.get(rung, 0) + 1
    return out


def main() -> None:
    """Run the rounds, print the table and write `bench/results/catalog_load.json`."""
    with tempfile.TemporaryDirectory(prefix="dsh-bench-load-") as home:
        result = asyncio.run(_measure(Path(home)))
    ratio = statistics.median(result["ratios"])
    rate = statistics.median(result["rates"])
    rows = [
        [round_ + 1, idle, loaded, ratio_]
        for round_, (idle, loaded, ratio_) in enumerate(
            zip(result["idle_ms"], result["loaded_ms"], result["ratios"], strict=True)
        )
    ]
    print_table(
        f"list_children of a parent with {CHILDREN_CACHED + CHILDREN_OBSERVED} cold children, {AGENTS} agents idle "
        f"vs streaming (~{CHUNKS_PER_SECOND:g} chunks/s each; median of {LISTINGS} listings per state)",
        ["round", "idle ms", "loaded ms", "ratio"],
        rows,
    )
    row = target(
        "load",
        f"list_children of {CHILDREN_CACHED + CHILDREN_OBSERVED} cold children while {AGENTS} agents stream / "
        "the same listing at rest",
        ratio,
        TARGET,
        higher_is_better=False,
        spread_=spread(result["ratios"]),
    )
    outcome = row["verdict"]
    print(f"\nmedian ratio loaded/idle: {ratio:.3g} (target <= {TARGET}): {outcome}")
    print(f"achieved stream rate while loaded: {rate:.3g} chunks/s per agent (paced at {CHUNKS_PER_SECOND:g})")
    write_json(
        "catalog_load",
        {
            "agents": AGENTS,
            "children": {"cached": CHILDREN_CACHED, "observed": CHILDREN_OBSERVED},
            "rungs": {str(rung): count for rung, count in sorted(result["rungs"].items())},
            "chunks_per_second_target": CHUNKS_PER_SECOND,
            "chunks_per_second_achieved": rate,
            "rounds": ROUNDS,
            "listings_per_state": LISTINGS,
            "idle_ms": result["idle_ms"],
            "loaded_ms": result["loaded_ms"],
            "ratios": result["ratios"],
            "median_ratio": ratio,
            "target": TARGET,
            "verdict": outcome,
            "targets": [row],
        },
    )


if __name__ == "__main__":
    main()
