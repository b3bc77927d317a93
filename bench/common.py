"""Shared helpers for the benchmarks: timing, result tables, JSON and PNG output."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

RESULTS = Path(os.environ.get("DSH_BENCH_RESULTS", Path(__file__).resolve().parent / "results"))


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
    payload = {"benchmark": name, "machine": machine(), **payload}
    path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path}")
    return path


def verdict(ratio: float, target: float, *, higher_is_better: bool) -> str:
    """`PASS`/`MISS` against a target ratio."""
    ok = ratio >= target if higher_is_better else ratio <= target
    return "PASS" if ok else "MISS"
