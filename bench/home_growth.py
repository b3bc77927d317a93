"""A growing home: does creating a session cost the folder it lands in, or a live listing the home?

Both measurements run through `Runtime` as users open it, on JSONL+zstd (the default) and SQLite homes
written by the fixture writers of `bench.catalog_homes` (exactly what the backends write) and then
opened once for writing, as every home a user runs dsh on has been.

* **Create + first flush.** One project folder holds 100 or 10,000 sessions. A writing `Runtime`
  creates sessions in that folder: `rt.sessions.create`, one event, `rt.sessions.flush`, each timed
  from `create` to the flush's return (the first write materializes the log). Targets, per round:
  10,000-session folder / 100-session folder <= 1.2 for each system, and on the 10,000-session folder
  JSONL / SQLite <= 1.0.
* **Live listing.** A parent with 20 cold children (stored, unseeded, no cache rows: one observation
  each) and 10 live children that the measurement creates in a fresh writing `Runtime` (flushed, as a
  running agent's session is), in the family's project folder; beside the family either nothing (the
  family-only home) or 10,000 other sessions in that same project folder (one repository used for
  months, the common case, and the one where a JSONL folder is largest). Then the first
  `list_children` of the parent after that open, and the fastest of three warm ones. Each round uses
  a family of its own, so every listing sees 20 cold and 10 live children. Target: 10,000-session
  home / family-only home <= 1.3 for each system, first and warm.

Interleaving: the disk's speed drifts and an `fsync` can cost ten times its median, so homes are
measured side by side, never one after the other. Each round opens a runtime on every home of a
measurement at once; creations alternate between the homes (one creation in each, in a rotated
order, then the next), and each home's round figure is its median creation. For the listings, each
round makes two restarts (every home opened anew, its live children created, then every home's
first listing, then the warm ones, homes in a rotated order) and keeps each home's fastest first
and fastest warm listing, the estimates least disturbed by whatever else the machine runs. Every
ratio is computed inside one round, then summarised as median and spread over the rounds. Run:
`python -m bench home_growth` (`DSH_BENCH_QUICK=1` for a short run, with 2,000-session homes).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.catalog_homes import (
    BASE_TIME,
    FAMILY_CWD,
    SETTLE_S,
    SYSTEMS,
    _header,
    _one_turn,
    _Session,
    _write_jsonl,
    _write_sqlite,
    child_batches,
)
from bench.common import QUICK, print_table, rotated, spread, target, write_json

BIG = 2_000 if QUICK else 10_000
SMALL = 100
ROUNDS = 2 if QUICK else 7
CREATIONS = 10 if QUICK else 20
"""Sessions each round creates in the crowded folder, per home."""
RESTARTS = 2
"""Fresh opens per home and round for the listings (the fastest is kept)."""
COLD_CHILDREN = 20
LIVE_CHILDREN = 10
WARM = 3
CROWDED_CWD = "/home/bench/crowded"


@dataclass(frozen=True, slots=True)
class Home:
    """One benchmark home: its system, what it measures (`folder` or `listing`) and its other sessions."""

    system: str
    kind: str
    stored: int

    @property
    def name(self) -> str:
        """A folder name for the home."""
        return f"{self.system}-{self.kind}-{self.stored}"


def _config(home: Home, path: Path) -> Any:
    from dsh.config import Config

    return Config(home=path, database_url="sqlite://" if home.system == "sqlite" else None)


def _crowded(count: int) -> Iterator[_Session]:
    """`count` top-level sessions of one turn each, all in one project folder."""
    body = [_one_turn(0, 1)]
    for index in range(count):
        session_id = f"bg-{index:05d}"
        yield _Session(session_id, _header(session_id, BASE_TIME + index, CROWDED_CWD), body, "crowded")


def _parent(family: int) -> str:
    return f"family-{family}"


def _families(stored: int) -> Iterator[_Session]:
    """`stored` other sessions in the family's project folder, then one family per round: a parent
    and its cold children, in the same folder."""
    body = [_one_turn(0, 1)]
    for index in range(stored):
        session_id = f"bg-{index:05d}"
        yield _Session(session_id, _header(session_id, BASE_TIME + index, FAMILY_CWD), body, "background")
    children = child_batches(22, seed=0)
    middle = BASE_TIME + stored * 1000
    for family in range(ROUNDS * RESTARTS):
        parent = _parent(family)
        yield _Session(parent, _header(parent, middle + family * 100, FAMILY_CWD), body, "background")
        for index in range(COLD_CHILDREN):
            child = f"{parent}-cold-{index:02d}"
            header = _header(child, middle + family * 100 + 1 + index, FAMILY_CWD, parent=parent, depth=1)
            yield _Session(child, header, children, "child")


async def _build(root: Path, home: Home) -> Path:
    """Write the home, wait a moment (a home is written well before it is opened), open it for writing once."""
    from dsh.runtime import Runtime

    path = root / home.name
    path.mkdir(parents=True)
    sessions = _crowded(home.stored) if home.kind == "folder" else _families(home.stored)
    if home.system == "jsonl":
        await asyncio.to_thread(_write_jsonl, path / "sessions", sessions)
    else:
        await asyncio.to_thread(_write_sqlite, path / "sessions.sqlite3", sessions)
    await asyncio.sleep(SETTLE_S)
    async with Runtime.open(_config(home, path)):
        pass
    return path


async def _creations(homes: list[Home], paths: dict[Home, Path], round_: int) -> dict[str, float]:
    """Each home's median seconds of one create + first flush in its crowded folder, the homes open
    side by side and the creations alternating between them."""
    from dsh.runtime import Runtime
    from dsh.session.header import HeaderInit

    times: dict[str, list[float]] = {home.name: [] for home in homes}
    async with contextlib.AsyncExitStack() as stack:
        runtimes = {home: await stack.enter_async_context(Runtime.open(_config(home, paths[home]))) for home in homes}
        for index in range(CREATIONS):
            for home in rotated(homes, (index + round_) % len(homes), len(homes)):
                rt = runtimes[home]
                started = time.perf_counter()
                session = rt.sessions.create(f"new-{round_}-{index:02d}", header=HeaderInit(cwd=CROWDED_CWD))
                session.append("turn/start", {"turn": 1})
                await rt.sessions.flush(session)
                times[home.name].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in times.items()}


async def _listings(homes: list[Home], paths: dict[Home, Path], family: int) -> dict[str, tuple[float, float]]:
    """Each home's (first, fastest warm) `list_children` seconds after a fresh open in which 10 live
    children of the family's parent were created; the homes open side by side."""
    from dsh.runtime import Runtime
    from dsh.session.header import HeaderInit
    from dsh.subagent.descriptor import snapshot_descriptor

    parent = _parent(family)
    order = rotated(homes, family % len(homes), len(homes))
    rows: dict[Home, Any] = {}
    first: dict[str, float] = {}
    warm: dict[str, list[float]] = {home.name: [] for home in homes}
    async with contextlib.AsyncExitStack() as stack:
        runtimes = {home: await stack.enter_async_context(Runtime.open(_config(home, paths[home]))) for home in order}
        for index in range(LIVE_CHILDREN):
            for home in order:
                header = HeaderInit(cwd=FAMILY_CWD, parent_session=parent, origin="subagent", delegation_depth=1)
                session = runtimes[home].sessions.create(f"{parent}-live-{index:02d}", header=header)
                descriptor = snapshot_descriptor("continuable", provider="spawn", label="live")
                session.append("subagent/descriptor", descriptor)
                await runtimes[home].sessions.flush(session)
        for home in order:
            started = time.perf_counter()
            rows[home] = await runtimes[home].subagents.list_children(parent)
            first[home.name] = time.perf_counter() - started
        for attempt in range(WARM):
            for home in rotated(order, attempt, WARM):
                started = time.perf_counter()
                again = await runtimes[home].subagents.list_children(parent)
                warm[home.name].append(time.perf_counter() - started)
                assert again == rows[home]
    for home, listed in rows.items():
        assert len(listed) == COLD_CHILDREN + LIVE_CHILDREN, f"{home.name}: {len(listed)} rows"
    return {name: (first[name], min(warm[name])) for name in first}


def _ratios(values: dict[str, list[float]], num: str, den: str) -> dict[str, Any]:
    return spread([a / b for a, b in zip(values[num], values[den], strict=True)])


async def _run(root: Path) -> dict[str, Any]:
    folder_homes = [Home(system, "folder", stored) for system in SYSTEMS for stored in (SMALL, BIG)]
    listing_homes = [Home(system, "listing", stored) for system in SYSTEMS for stored in (0, BIG)]
    paths: dict[Home, Path] = {}
    built: dict[str, float] = {}
    for home in (*folder_homes, *listing_homes):
        started = time.perf_counter()
        paths[home] = await _build(root, home)
        built[home.name] = time.perf_counter() - started
        print(f"  built {home.name} in {built[home.name]:.1f} s", flush=True)
    create: dict[str, list[float]] = {home.name: [] for home in folder_homes}
    first: dict[str, list[float]] = {home.name: [] for home in listing_homes}
    warm: dict[str, list[float]] = {home.name: [] for home in listing_homes}
    for round_ in range(ROUNDS):
        for name, seconds in (await _creations(folder_homes, paths, round_)).items():
            create[name].append(seconds)
        restarts = [await _listings(listing_homes, paths, round_ * RESTARTS + restart) for restart in range(RESTARTS)]
        for home in listing_homes:
            first[home.name].append(min(restart[home.name][0] for restart in restarts))
            warm[home.name].append(min(restart[home.name][1] for restart in restarts))
    return {"create": create, "first": first, "warm": warm, "build_seconds": built}


def main() -> None:
    """Build the homes, run the rounds, print the times and ratios, write the targets."""
    root = Path(tempfile.mkdtemp(prefix="dsh-growth-"))
    try:
        measured = asyncio.run(_run(root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    create, first, warm = measured["create"], measured["first"], measured["warm"]
    print_table(
        f"create + first flush through Runtime, {CREATIONS} per home and round, {ROUNDS} rounds (median ms)",
        ["home", "ms"],
        [[name, statistics.median(values) * 1e3] for name, values in create.items()],
    )
    print_table(
        f"list_children, {COLD_CHILDREN} cold + {LIVE_CHILDREN} live children, {ROUNDS} rounds (median ms)",
        ["home", "first ms", "warm ms"],
        [[name, statistics.median(first[name]) * 1e3, statistics.median(warm[name]) * 1e3] for name in first],
    )
    targets = []
    ratios: dict[str, Any] = {}
    for system in SYSTEMS:
        key = f"{system}: {BIG:,}-session folder / {SMALL}-session folder"
        ratios[key] = _ratios(create, f"{system}-folder-{BIG}", f"{system}-folder-{SMALL}")
        targets.append(
            target(
                "create-growth",
                f"create + first flush through Runtime, {key}",
                ratios[key]["median"],
                1.2,
                higher_is_better=False,
                spread_=ratios[key],
            )
        )
    for stored in (BIG, SMALL):
        key = f"jsonl / sqlite, {stored:,}-session folder"
        ratios[key] = _ratios(create, f"jsonl-folder-{stored}", f"sqlite-folder-{stored}")
    key = f"jsonl / sqlite, {BIG:,}-session folder"
    targets.append(
        target(
            "create-growth",
            f"create + first flush through Runtime, {key}",
            ratios[key]["median"],
            1.0,
            higher_is_better=False,
            spread_=ratios[key],
        )
    )
    for system in SYSTEMS:
        for label, values in (("first", first), ("warm", warm)):
            key = f"{system}, {label} listing: {BIG:,}-session home / family-only home"
            ratios[key] = _ratios(values, f"{system}-listing-{BIG}", f"{system}-listing-0")
            targets.append(
                target(
                    "live-listing",
                    f"list_children with {LIVE_CHILDREN} live and {COLD_CHILDREN} cold children, {key}",
                    ratios[key]["median"],
                    1.3,
                    higher_is_better=False,
                    spread_=ratios[key],
                )
            )
    print()
    for row in targets:
        print(f"  {row['what']}: {row['measured']:.2f} (target {row['target']}) {row['verdict']}")
    write_json(
        "home_growth",
        {
            "rounds": ROUNDS,
            "stored": {"big": BIG, "small": SMALL},
            "creations_per_round": CREATIONS,
            "median_create_seconds": create,
            "first_listing_seconds": first,
            "warm_listing_seconds": warm,
            "build_seconds": measured["build_seconds"],
            "ratios": ratios,
            "targets": targets,
        },
    )


if __name__ == "__main__":
    main()
