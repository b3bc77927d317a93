"""Backends side by side: append + durable flush and the child listing on JSONL, SQLite and PostgreSQL.

One run measures the three storage backends on the same workloads, interleaved in rotated rounds,
so every ratio compares figures taken a moment apart:

* **append**: a live session per backend, turns of 20 events (`bench.append_peers.turn_events`)
  appended with `Session.append` and made durable with `SessionStore.flush` at each turn end, as
  `bench.p6_append` runs dsh. Each round opens every backend fresh (a new folder; for PostgreSQL a
  new session in the run's schema) and runs turn n of every backend, in a rotated order, before
  turn n + 1 of any; a backend's round figure is its median turn time.
* **listing**: `list_children` of a parent with 20 continuable children (100 events each) right
  after a read-only `Runtime.open`, as `dsh agents` runs it. *Cached*: the children's
  projection-cache rows (written by the runtime that wrote them) answer, zero log reads; *cold*: the
  runtime opens without the cache and reads every child's log. Each round lists every (backend,
  kind) pair in a rotated order, three restarts each, keeping the fastest first listing.

Ratios are per round, `PostgreSQL / JSONL` and `SQLite / JSONL` of the times (above 1: slower than
JSONL), and reported as INFO rows with their spread; there is no target. Durability is the
backends' own: JSONL `fsync`s each batch, SQLite commits with `synchronous=FULL`, PostgreSQL
commits with the server's `synchronous_commit` and `fsync` (both reported). PostgreSQL runs against
`DSH_BENCH_POSTGRES_URL` (else `DSH_TEST_POSTGRES_URL`, else `postgresql://postgres@127.0.0.1:5432/test`)
in a throw-away schema dropped at the end; without a reachable server it is skipped with the reason
printed and recorded. Run: `python -m bench backends` (`DSH_BENCH_QUICK=1` for a short run).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Final

from bench.append_peers import EVENTS_PER_TURN, turn_events
from bench.common import QUICK, info, median, print_table, rotated, spread, write_json

TURNS = 40 if QUICK else 300
ROUNDS = 2 if QUICK else 7
CHILDREN: Final = 20
CHILD_TURNS: Final = 5
"""Turns of 20 events per child of the listed family: 100 events, plus the descriptor and end-seed."""
RESTARTS = 2 if QUICK else 3
"""Read-only opens per listing variant per round; the fastest first listing is kept."""

JSONL, SQLITE, POSTGRES = "jsonl", "sqlite", "postgresql"
KINDS: Final = ("cached", "cold")
LISTINGS: Final = ("first", "warm")
PARENT: Final = "family-parent"
DEFAULT_URL: Final = "postgresql://postgres@127.0.0.1:5432/test"


# ---------------------------------------------------------------- the PostgreSQL server


def postgres_url() -> str:
    """The server the benchmark uses (see the module docstring)."""
    for name in ("DSH_BENCH_POSTGRES_URL", "DSH_TEST_POSTGRES_URL"):
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return DEFAULT_URL


def probe(url: str) -> tuple[str | None, dict[str, str]]:
    """`(None, settings)` when the server answers, else `(why not, {})`; settings are its durability ones."""
    try:
        from dsh.persistence.postgres import load_driver, mask_url

        driver = load_driver()
    except Exception as error:  # the `postgres` extra is not installed
        return f"PostgreSQL not measured: the driver cannot load ({error})", {}
    try:
        with driver.psycopg.connect(url, connect_timeout=3) as conn:
            settings = {}
            for name in ("server_version", "synchronous_commit", "fsync"):
                row = conn.execute(f"SHOW {name}").fetchone()
                settings[name] = "" if row is None else str(row[0])
    except driver.psycopg.Error as error:
        first = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
        return f"PostgreSQL not measured: the server at {mask_url(url)} is unreachable: {first}", {}
    return None, settings


def drop_schema(url: str, schema: str) -> None:
    """Drop the run's schema and everything in it."""
    from dsh.persistence.postgres import load_driver, quoted

    with load_driver().psycopg.connect(url, autocommit=True, connect_timeout=3) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {quoted(schema)} CASCADE")


class Stores:
    """Where each backend keeps its sessions in this run: a folder each, one PostgreSQL schema."""

    def __init__(self, root: Path, systems: tuple[str, ...], url: str, schema: str) -> None:
        self.root = root
        self.systems = systems
        self.url = url
        self.schema = schema

    def config(self, system: str, home: Path) -> Any:
        """The `Config` of a runtime on `system`'s store under `home`."""
        from dsh.config import Config, PostgresConfig

        if system == JSONL:
            return Config(home=home)
        if system == SQLITE:
            return Config(home=home, database_url="sqlite://")
        return Config(home=home, database_url=self.url, postgres=PostgresConfig(schema_name=self.schema))

    def backend(self, system: str, home: Path) -> Any:
        """A writing backend of `system` (what `Runtime.open` builds from `config`)."""
        from dsh.runtime import backend_for

        return backend_for(self.config(system, home))


# ---------------------------------------------------------------- append


class Appender:
    """A live session on one backend: `turn(n)` appends turn n's events and flushes them durably."""

    def __init__(self, stores: Stores, system: str, home: Path) -> None:
        self.stores, self.system, self.home = stores, system, home

    async def open(self) -> None:
        from dsh.persistence.coordinator import PersistenceCoordinator
        from dsh.session.store import SessionStore

        self.store = SessionStore()
        self.coordinator = PersistenceCoordinator(self.stores.backend(self.system, self.home), self.store)
        await self.coordinator.open()
        self.session = self.store.create(header=None)
        self.events = {turn: turn_events(turn) for turn in range(1, TURNS + 1)}

    async def turn(self, turn: int) -> None:
        append = self.session.append
        for kind, data in self.events[turn]:
            append(kind, data)
        await self.store.flush(self.session)

    async def close(self) -> None:
        await self.store.aclose()
        await self.coordinator.close()


async def _append_round(stores: Stores, round_: int) -> dict[str, float]:
    """One append round: every backend opened fresh, turns interleaved in a rotated order; median seconds."""
    order = rotated(list(stores.systems), round_, ROUNDS)
    appenders: dict[str, Appender] = {}
    for system in order:
        home = stores.root / f"append-{round_}-{system}"
        home.mkdir(mode=0o700)
        appenders[system] = Appender(stores, system, home)
        await appenders[system].open()
    times: dict[str, list[float]] = {system: [] for system in order}
    try:
        for turn in range(1, TURNS + 1):
            for system, appender in appenders.items():
                start = time.perf_counter()
                await appender.turn(turn)
                times[system].append(time.perf_counter() - start)
    finally:
        for appender in appenders.values():
            await appender.close()
    return {system: statistics.median(values) for system, values in times.items()}


# ---------------------------------------------------------------- listing


async def build_family(stores: Stores, system: str, home: Path) -> None:
    """A parent and its 20 children written by a runtime on `system`; its cache rows are written on the way."""
    from dsh.runtime import Runtime
    from dsh.session.header import HeaderInit
    from dsh.subagent.descriptor import snapshot_descriptor

    async with Runtime.open(stores.config(system, home)) as rt:
        parent = rt.sessions.create(PARENT, header=HeaderInit(created_at=1_000))
        sessions = [parent]
        for index in range(CHILDREN):
            descriptor = snapshot_descriptor("continuable", provider="spawn", label=f"worker {index}")
            child = rt.sessions.create(
                f"family-child-{index:02d}",
                header=HeaderInit(
                    created_at=1_001 + index, parent_session=PARENT, origin="subagent", delegation_depth=1
                ),
                seed=[{"type": "subagent/descriptor", "seq": 0, "time": 1, "data": descriptor}],
            )
            for turn in range(1, CHILD_TURNS + 1):
                for kind, data in turn_events(turn):
                    child.append(kind, data)
            sessions.append(child)
        for session in sessions:
            await rt.sessions.flush(session)
        await rt.subagents.list_children(PARENT)  # registers the catalog's units, so closing checkpoints them


async def _listings(stores: Stores, system: str, kind: str, home: Path) -> tuple[float, float]:
    """Seconds of the first `list_children` after a read-only open, then of a second (warm) one.

    The open is not timed. The first listing pays what `dsh agents` pays after its open (for
    PostgreSQL, the pool's further connections too); the warm one shows the listing alone.
    """
    from dsh.runtime import Runtime

    timed: list[float] = []
    async with Runtime.open(stores.config(system, home), read_only=True, use_cache=kind == "cached") as rt:
        for _ in range(2):
            start = time.perf_counter()
            rows = await rt.subagents.list_children(PARENT)
            timed.append(time.perf_counter() - start)
            if len(rows) != CHILDREN or any(row.kind != "child" for row in rows):
                found = [row.to_json() for row in rows]
                raise AssertionError(f"{system} {kind}: expected {CHILDREN} child rows, got {found}")
    return timed[0], timed[1]


async def _listing_round(stores: Stores, homes: dict[str, Path], round_: int) -> dict[tuple[str, str, str], float]:
    """One listing round: every (backend, kind) in a rotated order; the fastest of `RESTARTS` first and warm ones."""
    variants = [(system, kind) for system in stores.systems for kind in KINDS]
    out: dict[tuple[str, str, str], float] = {}
    for system, kind in rotated(variants, round_, ROUNDS):
        measured = [await _listings(stores, system, kind, homes[system]) for _ in range(RESTARTS)]
        out[(system, kind, "first")] = min(first for first, _ in measured)
        out[(system, kind, "warm")] = min(warm for _, warm in measured)
    return out


# ---------------------------------------------------------------- the run


def _ratios(times: list[float], jsonl: list[float]) -> list[float]:
    """Per-round time ratios `times / jsonl`."""
    return [value / base for value, base in zip(times, jsonl, strict=True)]


def _ratio_rows(what: str, seconds: dict[str, list[float]], systems: tuple[str, ...]) -> list[dict[str, Any]]:
    """INFO rows of the per-round ratios `system / JSONL`, with their spread."""
    rows = []
    for system in systems:
        if system == JSONL:
            continue
        ratios = spread(_ratios(seconds[system], seconds[JSONL]))
        row = info("backends", f"{what}: {system} / jsonl time", ratios["median"], unit="x")
        row |= {"min": ratios["min"], "max": ratios["max"], "rounds": ratios["rounds"]}
        rows.append(row)
    return rows


def _key(system: str, kind: str, which: str) -> str:
    return f"{system} {kind} {which}"


async def _run(stores: Stores) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    append: dict[str, list[float]] = {system: [] for system in stores.systems}
    listing: dict[str, list[float]] = {
        _key(system, kind, which): [] for system in stores.systems for kind in KINDS for which in LISTINGS
    }
    homes = {}
    for system in stores.systems:
        homes[system] = stores.root / f"family-{system}"
        homes[system].mkdir(mode=0o700)
        await build_family(stores, system, homes[system])
        await _listings(stores, system, "cold", homes[system])  # warm imports and caches, outside the rounds
    for round_ in range(ROUNDS):
        for system, value in (await _append_round(stores, round_)).items():
            append[system].append(value)
        for (system, kind, which), value in (await _listing_round(stores, homes, round_)).items():
            listing[_key(system, kind, which)].append(value)
    return append, listing


def main() -> None:
    """Measure the three backends side by side, print the tables and ratios, write the INFO rows."""
    started = time.perf_counter()
    url = postgres_url()
    skipped, settings = probe(url)
    systems: tuple[str, ...] = (JSONL, SQLITE) if skipped else (JSONL, SQLITE, POSTGRES)
    if skipped:
        print(skipped)
    schema = f"dsh_bench_{uuid.uuid4().hex[:12]}"
    root = Path(tempfile.mkdtemp(prefix="dsh-backends-"))
    try:
        append, listing = asyncio.run(_run(Stores(root, systems, url, schema)))
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if not skipped:
            drop_schema(url, schema)
    rows = []
    for system in systems:
        turn = median(append[system])
        rows.append([system, turn * 1e6, EVENTS_PER_TURN / turn, median(_ratios(append[system], append[JSONL]))])
    print_table(
        f"append + durable flush, {TURNS} turns x {EVENTS_PER_TURN} events, {ROUNDS} rounds (medians)",
        ["backend", "us/turn", "events/s", "x / jsonl"],
        rows,
    )
    rows = []
    for kind in KINDS:
        for which in LISTINGS:
            base = listing[_key(JSONL, kind, which)]
            for system in systems:
                times = listing[_key(system, kind, which)]
                rows.append([system, kind, which, median(times) * 1e3, median(_ratios(times, base))])
    print_table(
        f"list_children of {CHILDREN} children after a read-only open (first, then warm), "
        f"best of {RESTARTS} opens, {ROUNDS} rounds (medians)",
        ["backend", "kind", "listing", "ms", "x / jsonl"],
        rows,
    )
    targets = _ratio_rows(f"append + durable flush, turns of {EVENTS_PER_TURN} events", append, systems)
    for kind in KINDS:
        for which in LISTINGS:
            by_system = {system: listing[_key(system, kind, which)] for system in systems}
            what = f"{which} list_children of {CHILDREN} {kind} children after a read-only open"
            targets += _ratio_rows(what, by_system, systems)
    if skipped:
        targets.append(info("backends", skipped, "skipped"))
    else:
        durability = ", ".join(f"{name}={value}" for name, value in settings.items())
        targets.append(info("backends", f"PostgreSQL server settings: {durability}", settings["synchronous_commit"]))
    seconds = time.perf_counter() - started
    targets.append(info("backends", "run time of this benchmark", round(seconds, 1), unit=" s"))
    print()
    for row in targets:
        measured = row["measured"]
        shown = f"{measured:.2f}" if isinstance(measured, float) else str(measured)
        print(f"  {row['what']}: {shown}{row.get('unit', '')}")
    write_json(
        "backends",
        {
            "systems": list(systems),
            "turns": TURNS,
            "events_per_turn": EVENTS_PER_TURN,
            "children": CHILDREN,
            "child_events": CHILD_TURNS * EVENTS_PER_TURN,
            "rounds": ROUNDS,
            "restarts": RESTARTS,
            "postgres": {"skipped": skipped, "settings": settings},
            "append_median_turn_seconds": append,
            "listing_first_seconds": listing,
            "seconds": seconds,
            "targets": targets,
        },
    )


if __name__ == "__main__":
    main()
