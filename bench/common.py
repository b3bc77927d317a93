"""Shared helpers for the benchmarks: timing, rotated rounds, result tables, targets, JSON output.

Every benchmark writes `bench/results/<name>.json` (or under `$DSH_BENCH_RESULTS`) with a `targets`
list: one row per requirement it checks (`target(...)`, PASS or MISS), per figure it only reports
(`info(...)`) or per requirement left for a later release (`later(...)`). `bench.summary` gathers
those rows into one table. `DSH_BENCH_QUICK=1` asks every benchmark for a short run (smaller sizes,
fewer rounds): a smoke run whose numbers are not meant to be compared.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

RESULTS = Path(os.environ.get("DSH_BENCH_RESULTS", Path(__file__).resolve().parent / "results"))
QUICK = os.environ.get("DSH_BENCH_QUICK", "") not in ("", "0")
"""A short smoke run: smaller sizes and fewer rounds everywhere."""


def best_of(fn: Callable[[], Any], repeat: int = 5) -> float:
    """Best wall time of `repeat` runs of `fn` (seconds); the minimum is the least noisy estimate."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


async def best_of_async(fn: Callable[[], Awaitable[Any]], repeat: int = 5) -> float:
    """Async variant of `best_of`."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        await fn()
        times.append(time.perf_counter() - start)
    return min(times)


def median(values: list[float]) -> float:
    """The median of `values`."""
    return statistics.median(values)


def rotated(items: Sequence[T], round_: int, rounds: int) -> list[T]:
    """The round's order: `items` rotated by an even share per round, reversed on odd rounds.

    Every item takes a different position in each round and the neighbours of a pair swap sides, so
    warm-up, drift and the cost of whatever ran just before spread evenly over the variants.
    """
    shift = (round_ * len(items)) // max(1, rounds)
    order = list(items[shift:]) + list(items[:shift])
    return order[::-1] if round_ % 2 else order


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Median, minimum and maximum of per-round values (the spread shows how much to trust the median)."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "rounds": len(values),
        "values": list(values),
    }


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    return {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()}


def print_table(title: str, header: list[str], rows: list[list[Any]]) -> None:
    """Print a fixed-width table."""
    cells = [header] + [[_fmt(value) for value in row] for row in rows]
    widths = [max(len(str(row[i])) for row in cells) for i in range(len(header))]
    print(f"\n{title}")
    for index, row in enumerate(cells):
        print("  " + "  ".join(str(value).rjust(width) for value, width in zip(row, widths, strict=True)))
        if index == 0:
            print("  " + "  ".join("-" * width for width in widths))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def write_json(name: str, payload: dict[str, Any]) -> Path:
    """Write `bench/results/<name>.json` and return its path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {
        "benchmark": name,
        "machine": machine(),
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "quick": QUICK,
        **payload,
    }
    path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path}")
    return path


def verdict(ratio: float, target: float, *, higher_is_better: bool) -> str:
    """`PASS`/`MISS` against a target ratio."""
    ok = ratio >= target if higher_is_better else ratio <= target
    return "PASS" if ok else "MISS"


def target(
    id_: str,
    what: str,
    measured: float,
    goal: float,
    *,
    higher_is_better: bool,
    spread_: dict[str, Any] | None = None,
    unit: str = "x",
) -> dict[str, Any]:
    """One requirement row: the measured value against `goal`, with its PASS/MISS verdict."""
    row: dict[str, Any] = {
        "id": id_,
        "what": what,
        "measured": measured,
        "target": f"{'>=' if higher_is_better else '<='} {goal:g}{unit}",
        "verdict": verdict(measured, goal, higher_is_better=higher_is_better),
        "unit": unit,
    }
    if spread_ is not None:
        row["min"], row["max"], row["rounds"] = spread_["min"], spread_["max"], spread_["rounds"]
    return row


def count_target(id_: str, what: str, measured: int, expected: str, ok: bool) -> dict[str, Any]:
    """One requirement on a count (deterministic, so no spread): PASS when `ok`."""
    return {"id": id_, "what": what, "measured": measured, "target": expected, "verdict": "PASS" if ok else "MISS"}


def info(id_: str, what: str, measured: float | str, *, unit: str = "") -> dict[str, Any]:
    """A reported figure without a target."""
    return {"id": id_, "what": what, "measured": measured, "target": "", "verdict": "INFO", "unit": unit}


def later(id_: str, what: str) -> dict[str, Any]:
    """A requirement left for a later release (reported, not measured)."""
    return {"id": id_, "what": what, "measured": None, "target": "", "verdict": "LATER"}
