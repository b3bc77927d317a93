"""The benchmark harness on tiny inputs: the summary writer, the round order, and the catalog measurement."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from bench import summary
from bench.common import count_target, info, later, rotated, spread, target


def _write(results: Path, name: str, payload: dict[str, Any]) -> None:
    results.mkdir(parents=True, exist_ok=True)
    (results / f"{name}.json").write_text(json.dumps({"benchmark": name, **payload}), encoding="utf-8")


def test_summary_lists_every_target_with_its_verdict(tmp_path: Path) -> None:
    """The summary has one row per target, marks errors, missing and earlier results, and writes JSON too."""
    ratio = spread([1.1, 1.2, 1.5])
    _write(
        tmp_path,
        "fresh",
        {
            "finished_at": "2030-01-01T00:00:10+00:00",
            "targets": [
                target("P7", "long / short", ratio["median"], 1.3, higher_is_better=False, spread_=ratio),
                target("P6", "ours / peer", 1.5, 2.0, higher_is_better=True),
                count_target("P1", "log reads", 0, "== 0", ok=True),
                info("open", "open ratio", 9.5, unit="x"),
                later("P4", "typed reads"),
            ],
        },
    )
    _write(tmp_path, "stale", {"finished_at": "2020-01-01T00:00:00+00:00", "targets": [info("x", "old", 1.0)]})
    markdown, data = summary.write(
        ["fresh", "stale", "broken", "absent"],
        results=tmp_path,
        since="2030-01-01T00:00:00+00:00",
        errors={"broken": "RuntimeError: boom"},
        seconds={"fresh": 3.0, "broken": 1.0},
    )
    text = markdown.read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| benchmark")]
    assert len(rows) == 8
    assert "| fresh | P7 | long / short | 1.2x | 1.1-1.5 (3 rounds) | <= 1.3x | PASS |" in rows
    assert any("ours / peer" in row and "**MISS**" in row for row in rows)
    assert any(row.startswith("| stale (earlier run, 2020-01-01") for row in rows)
    assert any("RuntimeError: boom" in row and "**ERROR**" in row for row in rows)
    assert any(row.startswith("| absent |") and "NOT RUN" in row for row in rows)
    assert "Run time: 4 s" in text
    payload = json.loads(data.read_text(encoding="utf-8"))
    assert [entry["status"] for entry in payload["benchmarks"]] == ["this run", "earlier run", "error", "missing"]


def test_rotated_rounds_are_permutations_that_move_every_item() -> None:
    """Each round's order holds every item once, and no item keeps its position in every round."""
    items = list(range(7))
    orders = [rotated(items, round_, 5) for round_ in range(5)]
    assert all(sorted(order) == items for order in orders)
    assert all(len({order.index(item) for order in orders}) > 1 for item in items)


@pytest.mark.slow
def test_catalog_measurement_counts_reads_below_the_query_layer(tmp_path: Path) -> None:
    """On tiny homes, a restart's listings check rows and rungs and count backend reads and file opens."""
    from bench.catalog_counting import FileCounter
    from bench.catalog_homes import FAMILY, Homes, HomeSpec
    from bench.p123_catalog import RESTARTS, WARM, measure

    async def run() -> list[dict[str, Any]]:
        homes = Homes(tmp_path)
        files = FileCounter.installed()
        kinds = ("live", "cached", "cold")
        specs = [HomeSpec(system, kind, 40, 30) for system in ("jsonl", "sqlite") for kind in kinds]
        return [await measure(homes, files, spec, "descendants") for spec in specs]

    results = asyncio.run(run())
    for result in results:
        assert len(result["calls"]) == RESTARTS * (1 + WARM)
        assert all(call["header_rows"] > 0 for call in result["calls"])
    jsonl_live, jsonl_cached, jsonl_cold, sqlite_live, sqlite_cached, sqlite_cold = results
    for result in (jsonl_live, jsonl_cached, sqlite_live, sqlite_cached):
        assert all(call["loads"] == 0 and call["observations"] == 0 for call in result["calls"])
    for result in (jsonl_cold, sqlite_cold):
        assert all(call["observations"] == FAMILY.descendants for call in result["calls"])
    assert jsonl_cold["calls"][0]["loads"] == FAMILY.descendants
    assert jsonl_cold["calls"][0]["log_opens"] >= FAMILY.descendants
    assert sqlite_cold["calls"][0]["log_opens"] == 0
