"""The summary of a benchmark run: every target of every benchmark in one table, with PASS/MISS.

Each benchmark writes `bench/results/<name>.json` with a `targets` list (see `bench.common`). This
module reads them and writes `summary.md` (a Markdown table for people) and `summary.json` (the same
rows for tools) next to them. A benchmark that did not run in this run keeps the rows of its last run,
marked with the time they were measured; one that failed shows `ERROR` with its message; one that
never ran shows `NOT RUN`. Run alone (`python -m bench.summary`) it summarises whatever results exist.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import RESULTS, machine

VERDICTS = ("PASS", "MISS", "ERROR", "NOT RUN", "INFO", "LATER")


def _load(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def collect(
    names: Sequence[str],
    *,
    results: Path = RESULTS,
    since: str | None = None,
    errors: Mapping[str, str] | None = None,
    seconds: Mapping[str, float] | None = None,
) -> list[dict[str, Any]]:
    """One entry per benchmark: where its rows come from and the rows themselves.

    Args:
        names: The benchmarks, in table order.
        results: The results folder.
        since: The run's start (ISO 8601, UTC); older results are marked as earlier runs.
        errors: Benchmarks of this run that raised, with their messages.
        seconds: How long each benchmark of this run took.
    """
    errors = errors or {}
    seconds = seconds or {}
    out: list[dict[str, Any]] = []
    for name in names:
        payload = _load(results / f"{name}.json")
        entry: dict[str, Any] = {"benchmark": name, "seconds": seconds.get(name)}
        if name in errors:
            entry |= {"status": "error", "targets": [_row("run", errors[name], "ERROR")]}
        elif payload is None:
            entry |= {"status": "missing", "targets": [_row("run", "no results yet", "NOT RUN")]}
        else:
            finished = payload.get("finished_at")
            earlier = since is not None and (finished is None or finished < since)
            targets = payload.get("targets")
            if not isinstance(targets, list):
                targets = [_row("run", "results without targets (written by an older benchmark)", "INFO")]
            entry |= {
                "status": "earlier run" if earlier else "this run",
                "finished_at": finished,
                "quick": bool(payload.get("quick")),
                "targets": targets,
            }
        out.append(entry)
    return out


def _row(id_: str, what: str, verdict: str) -> dict[str, Any]:
    return {"id": id_, "what": what, "measured": None, "target": "", "verdict": verdict}


def _measured(row: Mapping[str, Any]) -> str:
    value = row.get("measured")
    unit = row.get("unit", "")
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.3g}{unit}"
    return f"{value}{unit}" if isinstance(value, int) else str(value)


def _spread(row: Mapping[str, Any]) -> str:
    if "min" not in row:
        return ""
    return f"{row['min']:.3g}-{row['max']:.3g} ({row['rounds']} rounds)"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(entries: Sequence[Mapping[str, Any]], *, written_at: str) -> str:
    """The Markdown summary."""
    counts = Counter(row["verdict"] for entry in entries for row in entry["targets"])
    tally = ", ".join(f"{counts[verdict]} {verdict}" for verdict in VERDICTS if counts[verdict])
    about = machine()
    lines = [
        "# Benchmark summary",
        "",
        f"Written {written_at} on Python {about['python']}, {about['machine']}, {about['cpus']} CPUs. {tally}.",
        "Ratios are medians over rounds measured side by side (spread: lowest-highest round); counts are exact.",
        "",
        "| benchmark | id | what | measured | spread | target | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for entry in entries:
        name = entry["benchmark"]
        if entry.get("status") == "earlier run":
            name += f" (earlier run, {entry.get('finished_at')})"
        if entry.get("quick"):
            name += " (quick)"
        for row in entry["targets"]:
            cells = [
                name,
                str(row.get("id", "")),
                str(row.get("what", "")),
                _measured(row),
                _spread(row),
                str(row.get("target", "")),
                f"**{row['verdict']}**" if row["verdict"] in ("MISS", "ERROR") else str(row["verdict"]),
            ]
            lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    timed = [entry for entry in entries if entry.get("seconds") is not None]
    if timed:
        total = sum(entry["seconds"] for entry in timed)
        parts = ", ".join(f"{entry['benchmark']} {entry['seconds']:.0f} s" for entry in timed)
        lines += ["", f"Run time: {total:.0f} s ({parts})."]
    return "\n".join(lines) + "\n"


def write(
    names: Sequence[str],
    *,
    results: Path = RESULTS,
    since: str | None = None,
    errors: Mapping[str, str] | None = None,
    seconds: Mapping[str, float] | None = None,
) -> tuple[Path, Path]:
    """Write `summary.md` and `summary.json` under `results`; returns their paths."""
    entries = collect(names, results=results, since=since, errors=errors, seconds=seconds)
    written_at = datetime.now(UTC).isoformat(timespec="seconds")
    results.mkdir(parents=True, exist_ok=True)
    markdown = results / "summary.md"
    markdown.write_text(render(entries, written_at=written_at), encoding="utf-8")
    payload = {"written_at": written_at, "machine": machine(), "since": since, "benchmarks": entries}
    summary = results / "summary.json"
    summary.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return markdown, summary


def main(argv: Sequence[str] = ()) -> int:
    """Summarise the existing results of every benchmark."""
    from bench.__main__ import BENCHMARKS

    markdown, _ = write(list(argv) or BENCHMARKS)
    print(markdown.read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
