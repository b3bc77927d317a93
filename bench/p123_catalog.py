"""P1-P3 — the child catalog on real homes: does a listing cost scale with the family or with the home?

Every measurement runs on a JSONL or a SQLite home built once for the run (`bench.catalog_homes`):
one measured family (a parent, 20 children, 8 grandchildren) beside 0, 1,000, 3,000 or 10,000 other
stored sessions spread over 50 project folders. The family is `live` (made live by the measurement,
rung 1), `cached` (unseeded cold children with projection-cache rows, rung 2) or `cold` (seeded cold
children, one observation each, rung 3). The memory backend is not used: it has no stored headers to
read and hid exactly the cost this benchmark is about.

A restart is a fresh `Runtime.open` on the home (read-only, as `dsh agents` opens it; a writing open
for `live`, which then resumes the family), then the FIRST `list_children` (or `list_descendants`) of
the family's parent, then three warm ones. One measurement is two restarts and keeps the fastest
first listing, the fastest warm listing and the fastest open: the estimates least disturbed by
whatever else the machine runs. First and warm listings are reported separately; the open itself is
reported apart and is in no ratio. Every
listing's reads are counted at and below the backend (`bench.catalog_counting`): the backend's hook
calls, the header rows and log loads it returned, and every file the process opened or folder it
scanned under the home. Rows, rungs and observation counts are checked on every call.

Variants (system x family kind x transcript length x stored sessions x listing) run in rounds; the
order is rotated each round and reversed every other round, and every ratio is computed inside one
round, then summarised as median and spread over the rounds. Targets:

* home size (the acceptance of the enumeration by parent): time on the 10,000-session home / time on
  the family-only home <= 1.3, for live, cached and cold children, `list_children` and
  `list_descendants`, first and warm listings;
* P1 live / P2 cache hit: 0 log reads; warm time with 10,000-event transcripts / 100-event ones <= 1.3
  (on the family-only home and on the 10,000-session home);
* P3 cold miss: exactly one observation per cold child per listing; the first listing after a restart
  >= 3x faster than the pre-seed baseline (per child two full reads, each deep-copied, then a
  descriptor scan), measured the same way on the family-only home with 100- and 1,000-event logs.

Writes `bench/results/p123_catalog.json` and `p123_catalog.png` (listing time against stored sessions).
Run: `python -m bench p123_catalog` (`DSH_BENCH_QUICK=1` for a short run).
"""

from __future__ import annotations

import asyncio
import copy
import gc
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.catalog_counting import CountingBackend, FileCounter
from bench.catalog_homes import (
    FAMILY,
    KINDS,
    SYSTEMS,
    Homes,
    HomeSpec,
    backend_for,
    config_for,
    publish_family,
    stored_sessions,
)
from bench.common import QUICK, RESULTS, count_target, info, later, print_table, rotated, spread, target, write_json

ROUNDS = 2 if QUICK else 5
RESTARTS = 2
WARM = 3
SIZES = (0, 300, 1_000) if QUICK else (0, 1_000, 3_000, 10_000)
SHORT = 100
LONG = 1_000 if QUICK else 10_000
COLD_LONG = 300 if QUICK else 1_000
LISTINGS = ("children", "descendants")
PHASES = ("first", "warm")
HOME_TARGET = 1.3
LENGTH_TARGET = 1.3
P3_TARGET = 3.0
RUNG = {"live": 1, "cached": 2, "cold": 3}
ROWS = {"children": len(FAMILY.children), "descendants": FAMILY.descendants}
BIG = SIZES[-1]


class BenchmarkError(RuntimeError):
    """The benchmark measured something other than what it claims (wrong rows, rungs or reads)."""


def variants() -> list[HomeSpec]:
    """Every home measured: each kind at 100 events over every size, long transcripts on the end sizes."""
    out: list[HomeSpec] = []
    for system in SYSTEMS:
        out.extend(HomeSpec(system, kind, SHORT, stored) for kind in KINDS for stored in SIZES)
        out.extend(HomeSpec(system, kind, LONG, stored) for kind in ("live", "cached") for stored in (0, BIG))
        out.append(HomeSpec(system, "cold", COLD_LONG, 0))
    return out


def _baseline_specs() -> list[HomeSpec]:
    return [HomeSpec(system, "cold", length, 0) for system in SYSTEMS for length in (SHORT, COLD_LONG)]


# ---------------------------------------------------------------- one measurement


async def _listing(rt: Any, listing: str, report: Any) -> list[Any]:
    if listing == "children":
        return await rt.subagents.list_children(FAMILY.parent, report=report)
    return await rt.subagents.list_descendants(FAMILY.parent, report=report)


async def _timed_listing(
    rt: Any, backend: CountingBackend, files: FileCounter, home: Path, spec: HomeSpec, listing: str
) -> dict[str, Any]:
    """One listing: its time, what the backend and the file system saw, checked rows and rungs."""
    reports: list[Any] = []
    backend.reset()
    files.start(home)
    started = time.perf_counter()
    try:
        rows = await _listing(rt, listing, reports.append)
    finally:
        elapsed = time.perf_counter() - started
        seen = files.stop()
    expected = ROWS[listing]
    entries = [getattr(row, "entry", row) for row in rows]  # a descendant row wraps its entry
    if len(rows) != expected or any(entry.kind != "child" for entry in entries):
        raise BenchmarkError(f"{spec.name} {listing}: {len(rows)} rows, expected {expected} child rows")
    rungs = set(reports[0].rungs.values()) if reports else set()
    if rungs != {RUNG[spec.kind]}:
        raise BenchmarkError(f"{spec.name} {listing}: rungs {sorted(rungs)}, expected {RUNG[spec.kind]}")
    return {
        "s": elapsed,
        "observations": reports[0].observations,
        "loads": backend.loads,
        "header_rows": backend.header_rows,
        "hooks": dict(backend.calls),
        **seen.as_dict(),
    }


async def _restart(homes: Homes, files: FileCounter, spec: HomeSpec, listing: str) -> dict[str, Any]:
    """One restart: a fresh runtime on the home, its first listing, then `WARM` warm ones."""
    from dsh.runtime import Runtime

    home = await homes.get(spec)
    read_only = spec.kind != "live"
    backend = CountingBackend(backend_for(spec, home, read_only=read_only))
    gc.collect()
    started = time.perf_counter()
    async with Runtime.open(config_for(spec, home), backend=backend, read_only=read_only) as rt:
        opened = time.perf_counter() - started
        if spec.kind == "live":
            await publish_family(rt)
            for session in rt.sessions.list():
                await rt.sessions.flush(session)  # no write-behind work left to overlap the listing
        calls = [await _timed_listing(rt, backend, files, home, spec, listing) for _ in range(1 + WARM)]
    return {"open_s": opened, "calls": calls}


async def measure(homes: Homes, files: FileCounter, spec: HomeSpec, listing: str) -> dict[str, Any]:
    """`RESTARTS` restarts on the home; the fastest first listing, warm listing and open of them.

    The fastest of a few tries is the estimate least disturbed by whatever else the machine runs;
    every call is kept (`calls`, each restart's first call first) for the counts.
    """
    restarts = [await _restart(homes, files, spec, listing) for _ in range(RESTARTS)]
    return {
        "open_s": min(restart["open_s"] for restart in restarts),
        "first_s": min(restart["calls"][0]["s"] for restart in restarts),
        "warm_s": min(call["s"] for restart in restarts for call in restart["calls"][1:]),
        "calls": [call for restart in restarts for call in restart["calls"]],
    }


async def _pre_seed_baseline(services: Any) -> list[tuple[str, str | None]]:
    """What listing did before seeds existed: per child, two full reads, each deep-copied, then a scan."""
    from dsh.json import thaw

    out: list[tuple[str, str | None]] = []
    listing = await services.persistence.list()
    for info_ in listing.rows:
        header = info_.header
        if header.origin != "subagent" or header.parent_session != FAMILY.parent:
            continue
        events = await services.persistence.read_events(header.id)
        copied = copy.deepcopy([thaw(event) for event in events.events])
        again = await services.persistence.read_events(header.id)
        copied_again = copy.deepcopy([thaw(event) for event in again.events])
        label = None
        for record in copied_again if copied else ():
            if record["type"] == "subagent/descriptor":
                label = record["data"].get("label")
        out.append((header.id, label))
    return out


async def measure_baseline(homes: Homes, spec: HomeSpec) -> dict[str, Any]:
    """The pre-seed baseline after a restart (read-only open), timed like the first listing (fastest of two)."""
    from dsh.runtime import Runtime

    home = await homes.get(spec)
    times = []
    for _ in range(RESTARTS):
        gc.collect()
        backend = backend_for(spec, home, read_only=True)
        async with Runtime.open(config_for(spec, home), backend=backend, read_only=True) as rt:
            started = time.perf_counter()
            rows = await _pre_seed_baseline(rt.services)
            times.append(time.perf_counter() - started)
        if len(rows) != len(FAMILY.children) or any(label != "worker" for _, label in rows):
            raise BenchmarkError(f"{spec.name}: the baseline found {len(rows)} children")
    return {"first_s": min(times)}


# ---------------------------------------------------------------- rounds


def _tasks() -> list[tuple[HomeSpec, str]]:
    """Every (home, listing) pair in the base order: systems alternate, sizes of one variant adjacent."""
    tasks = [(spec, listing) for spec in variants() for listing in LISTINGS]
    tasks += [(spec, "baseline") for spec in _baseline_specs()]
    order = {kind: index for index, kind in enumerate(KINDS)}
    return sorted(
        tasks,
        key=lambda task: (order[task[0].kind], task[1], task[0].length, task[0].stored, task[0].system),
    )


async def run_rounds(root: Path) -> tuple[list[dict[tuple[HomeSpec, str], dict[str, Any]]], Homes]:
    """Build the homes (on first use) and run every round; returns per-round samples."""
    homes = Homes(root)
    files = FileCounter.installed()
    tasks = _tasks()
    print(f"building {len(variants())} homes (once) and measuring {len(tasks)} variants x {ROUNDS} rounds")
    for spec in sorted({spec for spec, _ in tasks}, key=lambda spec: (spec.stored, spec.system, spec.kind)):
        await homes.get(spec)
    rounds: list[dict[tuple[HomeSpec, str], dict[str, Any]]] = []
    for round_ in range(ROUNDS):
        started = time.perf_counter()
        samples: dict[tuple[HomeSpec, str], dict[str, Any]] = {}
        for spec, listing in rotated(tasks, round_, ROUNDS):
            if listing == "baseline":
                samples[(spec, listing)] = await measure_baseline(homes, spec)
            else:
                samples[(spec, listing)] = await measure(homes, files, spec, listing)
        rounds.append(samples)
        print(f"  round {round_ + 1}/{ROUNDS}: {time.perf_counter() - started:.1f} s")
    return rounds, homes


# ---------------------------------------------------------------- ratios and targets


def _per_round(
    rounds: Sequence[dict[tuple[HomeSpec, str], dict[str, Any]]],
    numerator: tuple[HomeSpec, str],
    denominator: tuple[HomeSpec, str],
    phase: str,
    denominator_phase: str | None = None,
) -> dict[str, Any]:
    key = f"{phase}_s"
    other = f"{denominator_phase or phase}_s"
    return spread([samples[numerator][key] / samples[denominator][other] for samples in rounds])


def analyse(rounds: Sequence[dict[tuple[HomeSpec, str], dict[str, Any]]]) -> dict[str, Any]:
    """Every per-round ratio (median and spread), the count checks and the target rows."""
    targets: list[dict[str, Any]] = []
    home_ratios: dict[str, Any] = {}
    length_ratios: dict[str, Any] = {}
    p3: dict[str, Any] = {}
    first = rounds[0]
    specs = {spec for spec, _ in first}
    for system in SYSTEMS:
        for kind in KINDS:
            for length in sorted({spec.length for spec in specs if spec.kind == kind}):
                small, big = HomeSpec(system, kind, length, 0), HomeSpec(system, kind, length, BIG)
                if big not in specs:
                    continue
                for listing in LISTINGS:
                    for phase in PHASES:
                        ratio = _per_round(rounds, (big, listing), (small, listing), phase)
                        name = f"{system} {kind} {length}ev list_{listing} {phase}"
                        home_ratios[name] = ratio
                        targets.append(
                            target(
                                "home",
                                f"{system}, {kind} children ({length}-event logs), list_{listing}, {phase} "
                                f"listing: {BIG:,}-session home / family-only home",
                                ratio["median"],
                                HOME_TARGET,
                                higher_is_better=False,
                                spread_=ratio,
                            )
                        )
        for kind, id_ in (("live", "P1"), ("cached", "P2")):
            for stored in (0, BIG):
                for listing in LISTINGS:
                    short, long_ = HomeSpec(system, kind, SHORT, stored), HomeSpec(system, kind, LONG, stored)
                    ratio = _per_round(rounds, (long_, listing), (short, listing), "warm")
                    home = "family-only home" if stored == 0 else f"{stored:,}-session home"
                    length_ratios[f"{system} {kind} {home} list_{listing}"] = ratio
                    targets.append(
                        target(
                            id_,
                            f"{system}, {kind} children on the {home}, list_{listing}, warm: "
                            f"{LONG:,}-event / {SHORT}-event logs",
                            ratio["median"],
                            LENGTH_TARGET,
                            higher_is_better=False,
                            spread_=ratio,
                        )
                    )
        for length in (SHORT, COLD_LONG):
            spec = HomeSpec(system, "cold", length, 0)
            ratio = _per_round(rounds, (spec, "baseline"), (spec, "children"), "first")
            p3[f"{system} {length}ev"] = ratio
            targets.append(
                target(
                    "P3",
                    f"{system}, cold children ({length}-event logs), first list_children after a restart: "
                    "speed-up over the pre-seed baseline",
                    ratio["median"],
                    P3_TARGET,
                    higher_is_better=True,
                    spread_=ratio,
                )
            )
    for system in SYSTEMS:
        small, big = HomeSpec(system, "cold", SHORT, 0), HomeSpec(system, "cold", SHORT, BIG)
        ratio = spread([r[(big, "children")]["open_s"] / r[(small, "children")]["open_s"] for r in rounds])
        targets.append(
            info(
                "open",
                f"{system}: read-only Runtime.open (in no ratio above), {BIG:,}-session home / family-only home",
                ratio["median"],
                unit="x",
            )
        )
    targets += _count_targets(rounds)
    targets.append(later("P8", "peak memory of listing 100 cold children independent of transcript length"))
    return {"home_ratios": home_ratios, "length_ratios": length_ratios, "p3_speedup": p3, "targets": targets}


def _calls(rounds: Sequence[dict[tuple[HomeSpec, str], dict[str, Any]]], kind: str) -> list[tuple[str, dict]]:
    return [
        (listing, call)
        for samples in rounds
        for (spec, listing), sample in samples.items()
        if spec.kind == kind and listing != "baseline"
        for call in sample["calls"]
    ]


def _count_targets(rounds: Sequence[dict[tuple[HomeSpec, str], dict[str, Any]]]) -> list[dict[str, Any]]:
    out = []
    for kind, id_ in (("live", "P1"), ("cached", "P2")):
        calls = _calls(rounds, kind)
        worst = max(max(call["loads"], call["observations"]) for _, call in calls)
        out.append(
            count_target(
                id_,
                f"{kind} children: log reads per listing (backend loads and observations, worst of {len(calls)})",
                worst,
                "== 0",
                worst == 0,
            )
        )
    calls = _calls(rounds, "cold")
    wrong = sum(1 for listing, call in calls if call["observations"] != ROWS[listing] or call["loads"] > ROWS[listing])
    out.append(
        count_target(
            "P3",
            f"cold children: listings without exactly one observation per child (of {len(calls)})",
            wrong,
            "== 0",
            wrong == 0,
        )
    )
    for system in SYSTEMS:
        for stored in (0, BIG):
            sample = rounds[0][(HomeSpec(system, "cold", SHORT, stored), "children")]["calls"][0]
            out.append(
                info(
                    "reads",
                    f"{system}, first list_children of 20 cold children on a {stored_sessions_label(stored)}: "
                    "header rows / log files opened / folders scanned / log loads",
                    f"{sample['header_rows']} / {sample['log_opens']} / {sample['dir_scans']} / {sample['loads']}",
                )
            )
    return out


def stored_sessions_label(stored: int) -> str:
    """How a home is named in the tables."""
    return "family-only home" if stored == 0 else f"{stored:,}-session home"


# ---------------------------------------------------------------- report


def _timings(rounds: Sequence[dict[tuple[HomeSpec, str], dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Median over rounds of each variant's open, first and warm time, plus the first call's counts."""
    out: dict[str, dict[str, Any]] = {}
    for key in rounds[0]:
        spec, listing = key
        if listing == "baseline":
            out[f"{spec.name} baseline"] = {"first_s": spread([r[key]["first_s"] for r in rounds])["median"]}
            continue
        first_call = rounds[0][key]["calls"][0]
        out[f"{spec.name} {listing}"] = {
            "system": spec.system,
            "kind": spec.kind,
            "length": spec.length,
            "stored": spec.stored,
            "stored_total": stored_sessions(spec),
            "listing": listing,
            "open_s": spread([r[key]["open_s"] for r in rounds])["median"],
            "first_s": spread([r[key]["first_s"] for r in rounds])["median"],
            "warm_s": spread([r[key]["warm_s"] for r in rounds])["median"],
            "first_counts": {k: v for k, v in first_call.items() if k != "s"},
        }
    return out


def _print(timings: dict[str, dict[str, Any]], analysis: dict[str, Any]) -> None:
    rows = [
        [
            value["system"],
            value["kind"],
            value["length"],
            value["stored"],
            value["listing"],
            value["open_s"] * 1e3,
            value["first_s"] * 1e3,
            value["warm_s"] * 1e3,
            value["first_counts"]["header_rows"],
            value["first_counts"]["log_opens"],
            value["first_counts"]["loads"],
        ]
        for value in sorted(
            (value for value in timings.values() if "system" in value),
            key=lambda v: (v["system"], v["kind"], v["length"], v["listing"], v["stored"]),
        )
    ]
    print_table(
        f"Catalog listings after a restart (median of {ROUNDS} rounds; ms; counts of the first listing)",
        ["system", "kind", "events", "stored", "listing", "open", "first", "warm", "hdr rows", "log opens", "loads"],
        rows,
    )
    target_rows = [
        [
            row["id"],
            row["what"],
            row["measured"],
            f"{row['min']:.2f}-{row['max']:.2f}" if "min" in row else "",
            row["target"],
            row["verdict"],
        ]
        for row in analysis["targets"]
    ]
    print_table(
        "Targets (ratios: median over rounds, min-max)",
        ["id", "what", "measured", "spread", "target", "verdict"],
        target_rows,
    )


def _plot(timings: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 2, figsize=(11, 8), sharex=True)
    styles = {"jsonl": "-", "sqlite": "--"}
    markers = {"live": "o", "cached": "s", "cold": "^"}
    colors = {"live": "tab:blue", "cached": "tab:orange", "cold": "tab:green"}
    for row_index, listing in enumerate(LISTINGS):
        for column, phase in enumerate(PHASES):
            axis = axes[row_index][column]
            for system in SYSTEMS:
                for kind in KINDS:
                    points = sorted(
                        (value["stored"], value[f"{phase}_s"] * 1e3)
                        for value in timings.values()
                        if value.get("system") == system
                        and value.get("kind") == kind
                        and value.get("length") == SHORT
                        and value.get("listing") == listing
                    )
                    axis.plot(
                        [x for x, _ in points],
                        [y for _, y in points],
                        linestyle=styles[system],
                        marker=markers[kind],
                        color=colors[kind],
                        label=f"{system}, {kind}",
                    )
            axis.set_yscale("log")
            axis.set_title(f"list_{listing}, {phase} listing after a restart", fontsize=10)
            axis.grid(True, which="both", alpha=0.3)
            if row_index == 1:
                axis.set_xlabel("other sessions stored in the home")
            if column == 0:
                axis.set_ylabel(f"ms ({ROWS[listing]} rows, {SHORT}-event logs)")
    axes[0][0].legend(fontsize=8)
    figure.suptitle("Child catalog: listing time against the sessions stored beside the family")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    print(f"wrote {path}")


def main() -> None:
    """Build the homes, run the rounds, print the tables, write JSON and the plot."""
    started = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="dsh-bench-catalog-"))
    try:
        rounds, homes = asyncio.run(run_rounds(root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    timings = _timings(rounds)
    analysis = analyse(rounds)
    _print(timings, analysis)
    RESULTS.mkdir(parents=True, exist_ok=True)
    _plot(timings, RESULTS / "p123_catalog.png")
    raw: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for samples in rounds:
        for (spec, listing), sample in samples.items():
            raw[f"{spec.name} {listing}"].append(sample)
    write_json(
        "p123_catalog",
        {
            "rounds": ROUNDS,
            "restarts": RESTARTS,
            "warm_listings": WARM,
            "sizes": list(SIZES),
            "lengths": {"short": SHORT, "long": LONG, "cold_long": COLD_LONG},
            "family": {"children": len(FAMILY.children), "descendants": FAMILY.descendants},
            "seconds_total": time.perf_counter() - started,
            "home_build_seconds": homes.build_seconds,
            "timings": timings,
            **analysis,
            "samples": raw,
        },
    )


if __name__ == "__main__":
    main()
