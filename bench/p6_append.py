"""P6 — append throughput through `Runtime`, as users call it, beside the bare store and the peers.

Workload (`bench.append_peers`): turns of 20 events with one durable commit per turn. dsh appends each
event with `Session.append` and calls `flush` at the turn end, two ways on each backend (JSONL+zstd,
the default, and SQLite; more backends are one entry in `DSH_BACKENDS`):

* **through `Runtime`**: `Runtime.open(Config(home=...))` as every user opens it — the session store,
  persistence, the projection registry with the subagent units, the projection cache and its write
  policy, the query service — and `rt.sessions.flush` at each turn end;
* **bare store**: a `SessionStore` + `PersistenceCoordinator` on the same backend and nothing else.

The peers: openai-agents `SQLiteSession.add_items` of the turn's 20 items, and LangGraph
`SqliteSaver.put` of one checkpoint per turn, as an agent keeps its state (the checkpoint carries the
conversation) and in its favourable use (only the turn's messages) — each in its **default
configuration** (opened as its documentation opens it; the journal mode and `synchronous` level that
gives are read from its connection and reported) and at **equal durability** (`journal_mode=WAL`,
`synchronous=FULL`, checked, like dsh's SQLite backend; the JSONL backend `fsync`s every batch). The
benchmark proves equal durability by counting the durable-sync syscalls of each system in a child
process under strace (`bench.fsyncs`): every system must make at least one per turn.

Targets: through `Runtime` on the default backend, >= 1.0x openai-agents and >= 2x LangGraph as an
agent keeps state, each peer in its default configuration (LangGraph turn-only reported; the
equal-durability ratios reported beside); and on each backend, turns through `Runtime` >= 0.9x the
bare store's.

The bound: no design that keeps I/O off the event loop commits a turn faster than one write + `fsync`
through one thread hop, measured alongside (`floor: ...`); `peer turn time / floor` is the best
ratio any such design could reach against that peer.

Interleaving: the disk is shared and its speed drifts, so each round opens every variant in a fresh
directory and then runs them turn by turn — turn n of every variant, in a rotated order, before turn
n + 1 of any — and each variant's round figure is its median turn time. The agent-state peers run
right after the others in the same round, each by itself (`ALONE`: their writes would slow everyone's
`fsync`s). Ratios are per round; the summary gives their median and spread. Run: `python -m bench
p6_append`; `python -m bench.p6_append --one <variant> <turns>` runs one variant alone (the
fsync-count child).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import fsyncs
from bench.append_peers import (
    EVENTS_PER_TURN,
    Floor,
    FloorHop,
    Hop,
    LangGraphSaver,
    OpenAIAgents,
    Variant,
    turn_events,
)
from bench.common import QUICK, count_target, info, median, print_table, rotated, spread, target, write_json

TURNS = 50 if QUICK else 500
ROUNDS = 2 if QUICK else 7
COUNT_TURNS = 20 if QUICK else 100
"""Turns per variant in the fsync-count child processes."""

OURS = "dsh jsonl+zstd, Runtime"
OURS_SQLITE = "dsh sqlite, Runtime"
BARE = "dsh jsonl+zstd, bare store"
BARE_SQLITE = "dsh sqlite, bare store"
OPENAI = "openai-agents SQLiteSession, default"
OPENAI_FULL = "openai-agents SQLiteSession, synchronous=FULL"
LANGGRAPH_STATE = "langgraph SqliteSaver agent state, default"
LANGGRAPH_STATE_FULL = "langgraph SqliteSaver agent state, synchronous=FULL"
LANGGRAPH_TURN = "langgraph SqliteSaver turn only, default"
LANGGRAPH_TURN_FULL = "langgraph SqliteSaver turn only, synchronous=FULL"
FLOOR_HOP = "floor: write+fsync, one thread hop"
FLOOR = "floor part: write+fsync"
HOP = "floor part: one thread hop"
PEERS = (OPENAI, LANGGRAPH_STATE, LANGGRAPH_TURN)
PEERS_FULL = (OPENAI_FULL, LANGGRAPH_STATE_FULL, LANGGRAPH_TURN_FULL)
THROUGH_RUNTIME = {OURS: BARE, OURS_SQLITE: BARE_SQLITE}
"""Each `Runtime` variant and the bare store on the same backend."""

_turn_events = turn_events
"""The workload's turns under the name other benchmarks import them by (`bench.append_peers` holds them)."""


def _jsonl(root: Path) -> Any:
    from dsh.persistence.jsonl import JsonlBackend

    return JsonlBackend(root / "sessions")


def _sqlite(root: Path) -> Any:
    from dsh.persistence.sqlite import SqliteBackend

    return SqliteBackend(root / "sessions.sqlite3")


DSH_BACKENDS: dict[str, Callable[[Path], Any]] = {BARE: _jsonl, BARE_SQLITE: _sqlite}
"""dsh bare-store variants: name -> backend factory (given a fresh directory). Add a backend here to measure it."""


class Dsh(Variant):
    """A live dsh session on a bare store: `Session.append` of each event, `SessionStore.flush` at the turn end."""

    def __init__(self, backend: Callable[[Path], Any]) -> None:
        self.backend = backend

    async def open(self, root: Path, turns: int) -> None:
        from dsh.persistence.coordinator import PersistenceCoordinator
        from dsh.session.store import SessionStore

        self.store = SessionStore()
        self.coordinator = PersistenceCoordinator(self.backend(root), self.store)
        await self.coordinator.open()
        self.session = self.store.create(header=None)
        self.events = {turn: turn_events(turn) for turn in range(1, turns + 1)}

    async def turn(self, turn: int) -> None:
        append = self.session.append
        for kind, data in self.events[turn]:
            append(kind, data)
        await self.store.flush(self.session)

    async def close(self) -> None:
        await self.store.aclose()
        await self.coordinator.close()


class DshRuntime(Variant):
    """A live session of a `Runtime` opened as users open it: `Runtime.open(Config(home=...))`, every
    service of the default composition included; `Session.append` of each event, `rt.sessions.flush`
    at the turn end."""

    def __init__(self, *, sqlite: bool) -> None:
        self.sqlite = sqlite

    async def open(self, root: Path, turns: int) -> None:
        from dsh.config import Config
        from dsh.runtime import Runtime

        home = root / "home"
        url = f"sqlite:///{home / 'sessions.sqlite3'}" if self.sqlite else None
        self.runtime = Runtime.open(Config(home=home, database_url=url))
        await self.runtime.start()
        self.session = self.runtime.sessions.create(header=None)
        self.events = {turn: turn_events(turn) for turn in range(1, turns + 1)}

    async def turn(self, turn: int) -> None:
        append = self.session.append
        for kind, data in self.events[turn]:
            append(kind, data)
        await self.runtime.sessions.flush(self.session)

    async def close(self) -> None:
        await self.runtime.aclose()


VARIANTS: dict[str, Callable[[], Variant]] = {
    OURS: lambda: DshRuntime(sqlite=False),
    OURS_SQLITE: lambda: DshRuntime(sqlite=True),
    **{name: (lambda factory=factory: Dsh(factory)) for name, factory in DSH_BACKENDS.items()},
    OPENAI: lambda: OpenAIAgents(full_sync=False),
    OPENAI_FULL: lambda: OpenAIAgents(full_sync=True),
    LANGGRAPH_STATE: lambda: LangGraphSaver(agent_state=True, full_sync=False),
    LANGGRAPH_STATE_FULL: lambda: LangGraphSaver(agent_state=True, full_sync=True),
    LANGGRAPH_TURN: lambda: LangGraphSaver(agent_state=False, full_sync=False),
    LANGGRAPH_TURN_FULL: lambda: LangGraphSaver(agent_state=False, full_sync=True),
    FLOOR_HOP: FloorHop,
    FLOOR: Floor,
    HOP: Hop,
}


ALONE = frozenset({LANGGRAPH_STATE, LANGGRAPH_STATE_FULL})
"""Variants run after the interleaved ones, each by itself, instead of among them: the agent-state peer
writes hundreds of megabytes per round, and on ext4 an `fsync` commits the journal with every file's
dirty data, so among the others it would slow everyone's commits by its own writes."""

DURABILITY: dict[str, set[str]] = {}
"""The journal mode and `synchronous` level each peer's connection had, over the rounds."""


async def _run_turns(variants: dict[str, Variant], times: dict[str, list[float]]) -> None:
    """Turn 1 of every variant, then turn 2 of every variant, ...; each turn timed on its own."""
    for turn in range(1, TURNS + 1):
        for name, variant in variants.items():
            start = time.perf_counter()
            await variant.turn(turn)
            times[name].append(time.perf_counter() - start)


async def _round(round_: int, root: Path) -> dict[str, float]:
    """One round: every variant opened fresh and run turn by turn in a rotated order (the `ALONE`
    ones afterwards, each by itself); the median turn seconds of each."""
    order = rotated(list(VARIANTS), round_, ROUNDS)
    variants = {name: VARIANTS[name]() for name in order}
    times: dict[str, list[float]] = {name: [] for name in order}
    for index, variant in enumerate(variants.values()):
        workdir = root / f"r{round_}-{index}"
        workdir.mkdir()
        await variant.open(workdir, TURNS)
    try:
        await _run_turns({name: v for name, v in variants.items() if name not in ALONE}, times)
        for name in sorted(ALONE):
            os.sync()
            await _run_turns({name: variants[name]}, times)
    finally:
        for variant in variants.values():
            await variant.close()
    for name, variant in variants.items():
        if isinstance(variant, OpenAIAgents | LangGraphSaver):
            DURABILITY.setdefault(name, set()).add(variant.durability)
    return {name: statistics.median(values) for name, values in times.items()}


def _rounds() -> dict[str, list[float]]:
    """Median turn seconds per variant per round."""
    seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
    tmp = Path(tempfile.mkdtemp(prefix="dsh-p6-"))
    try:
        for round_ in range(ROUNDS):
            os.sync()  # start every round with nothing left to write back
            for name, value in asyncio.run(_round(round_, tmp)).items():
                seconds[name].append(value)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return seconds


def _one(name: str, turns: int) -> None:
    """Run one variant alone in a fresh directory (the fsync-count child)."""

    async def run(root: Path) -> None:
        variant = VARIANTS[name]()
        await variant.open(root, turns)
        try:
            for turn in range(1, turns + 1):
                await variant.turn(turn)
        finally:
            await variant.close()

    tmp = Path(tempfile.mkdtemp(prefix="dsh-p6-one-"))
    try:
        asyncio.run(run(tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _ratios(seconds: dict[str, list[float]], fast: str, slow: str) -> list[float]:
    """Per-round rate ratios `fast / slow` (= slow's turn time / fast's turn time)."""
    return [s / f for f, s in zip(seconds[fast], seconds[slow], strict=True)]


def main() -> None:
    """Run the rounds, count the fsyncs, print turn times and ratios, write the targets."""
    seconds = _rounds()
    per_turn = {name: median(values) * 1e6 for name, values in seconds.items()}
    rows = [
        [name, per_turn[name], EVENTS_PER_TURN * 1e6 / per_turn[name], median(_ratios(seconds, OURS, name))]
        for name in VARIANTS
    ]
    print_table(
        f"P6 append + durable flush, {TURNS} turns x {EVENTS_PER_TURN} events, {ROUNDS} rounds, "
        "turns interleaved (medians)",
        ["variant", "us/turn", "events/s", "dsh jsonl Runtime / x"],
        rows,
    )
    for name in (*PEERS, *PEERS_FULL):
        print(f"  {name}: {', '.join(sorted(DURABILITY.get(name, {'?'})))}")
    ratio = {name: spread(_ratios(seconds, OURS, name)) for name in (*PEERS, *PEERS_FULL)}
    bare = {name: spread(_ratios(seconds, name, base)) for name, base in THROUGH_RUNTIME.items()}
    bound = {name: spread(_ratios(seconds, FLOOR_HOP, name)) for name in PEERS}
    what = f"append + durable flush, turns of {EVENTS_PER_TURN} events, through Runtime: dsh jsonl+zstd / "
    targets = [
        target("P6", what + OPENAI, ratio[OPENAI]["median"], 1.0, higher_is_better=True, spread_=ratio[OPENAI]),
        target(
            "P6",
            what + LANGGRAPH_STATE + " (checkpoint carries the conversation)",
            ratio[LANGGRAPH_STATE]["median"],
            2.0,
            higher_is_better=True,
            spread_=ratio[LANGGRAPH_STATE],
        ),
        info("P6", what + LANGGRAPH_TURN + " (its favourable use)", ratio[LANGGRAPH_TURN]["median"], unit="x"),
    ]
    targets += [info("P6", what + name + " (equal durability)", ratio[name]["median"], unit="x") for name in PEERS_FULL]
    targets += [
        target(
            "P6-runtime",
            f"turns through Runtime / turns on the bare store (SessionStore + PersistenceCoordinator), {backend}",
            bare[name]["median"],
            0.9,
            higher_is_better=True,
            spread_=bare[name],
        )
        for name, backend in ((OURS, "jsonl+zstd"), (OURS_SQLITE, "sqlite"))
    ]
    targets += [
        info("P6", f"the same through Runtime, dsh sqlite / {OPENAI}", median(_ratios(seconds, OURS_SQLITE, OPENAI))),
        info("P6", f"bare store, dsh jsonl+zstd / {OPENAI}", median(_ratios(seconds, BARE, OPENAI)), unit="x"),
    ]
    targets += [
        info(
            "P6",
            f"bound: {name} turn time / (write+fsync through one thread hop) — the best ratio reachable",
            bound[name]["median"],
            unit="x",
        )
        for name in PEERS
    ]
    targets.append(
        info(
            "P6",
            "dsh jsonl+zstd Runtime turn time / (write+fsync through one thread hop)",
            median(_ratios(seconds, FLOOR_HOP, OURS)),
            unit="x",
        )
    )
    targets += [
        info("P6", f"{name}: connection as configured", ", ".join(sorted(DURABILITY.get(name, {"?"}))))
        for name in (*PEERS, *PEERS_FULL)
    ]
    counted = _count_fsyncs()
    targets += counted["targets"]
    print()
    for row in targets:
        measured = row["measured"]
        shown = f"{measured:.2f}" if isinstance(measured, float) else str(measured)
        print(f"  {row['what']}: {shown} (target {row['target'] or '-'}) {row['verdict']}")
    write_json(
        "p6_append",
        {
            "turns": TURNS,
            "events_per_turn": EVENTS_PER_TURN,
            "rounds": ROUNDS,
            "median_turn_seconds": seconds,
            "us_per_turn": per_turn,
            "ratios": dict(ratio),
            "runtime_over_bare": bare,
            "bound": bound,
            "durability": {name: sorted(values) for name, values in DURABILITY.items()},
            "fsyncs": counted["counts"],
            "targets": targets,
        },
    )


def _count_fsyncs() -> dict[str, Any]:
    """Durable syncs per system for `COUNT_TURNS` turns, each in a child process under strace."""
    # Only systems that sync in this process: a database server's fsyncs happen in the server.
    systems = [OURS, OURS_SQLITE, BARE, BARE_SQLITE, *PEERS, *PEERS_FULL]
    if not fsyncs.available():
        row = info("P6", "equal durability: fsyncs per turn (strace not available, not counted)", "not counted")
        return {"counts": {}, "targets": [row]}
    counts: dict[str, int | None] = {
        name: fsyncs.count(["bench.p6_append", "--one", name, str(COUNT_TURNS)]) for name in systems
    }
    print_table(
        f"durable syncs (fsync, fdatasync, ...) for {COUNT_TURNS} turns, whole child process",
        ["system", "syncs", "per turn"],
        [[name, "-" if n is None else n, "-" if n is None else n / COUNT_TURNS] for name, n in counts.items()],
    )
    rows = [
        count_target(
            "P6",
            f"equal durability: {name} syncs for {COUNT_TURNS} turns (at least one per commit)",
            -1 if n is None else n,
            f">= {COUNT_TURNS}",
            n is not None and n >= COUNT_TURNS,
        )
        for name, n in counts.items()
    ]
    return {"counts": counts, "targets": rows}


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--one":
        _one(sys.argv[2], int(sys.argv[3]))
    else:
        main()
