"""Run every benchmark (`python -m bench`) or some (`python -m bench p5_cold_read p7_listing`), then the summary.

Each benchmark prints its tables and writes its JSON (and plots) under `bench/results/`; a benchmark
that raises is reported and the others still run. At the end `bench.summary` writes
`bench/results/summary.md` and `summary.json`: every target of every benchmark with PASS/MISS
(benchmarks not run this time keep their last results, marked as such). The exit status is 1 when a
benchmark failed to run, 0 otherwise (a MISS is a result, not a failure). `DSH_BENCH_QUICK=1` makes
every benchmark short.
"""

from __future__ import annotations

import importlib
import sys
import time
import traceback
from datetime import UTC, datetime

BENCHMARKS = [
    "p5_cold_read",
    "p6_append",
    "home_growth",
    "append_latency",
    "p7_listing",
    "p123_catalog",
    "agent_loop",
    "compaction",
    "catalog_load",
    "server_load",
    "replica_load",
    "startup",
    "run_startup",
    "backends",
]


def main(argv: list[str]) -> int:
    """Run the named benchmarks (all by default) and write the summary."""
    from bench import summary

    names = argv or BENCHMARKS
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    since = datetime.now(UTC).isoformat(timespec="seconds")
    errors: dict[str, str] = {}
    seconds: dict[str, float] = {}
    for name in names:
        print(f"\n=== {name}", flush=True)
        started = time.perf_counter()
        try:
            importlib.import_module(f"bench.{name}").main()
        except Exception as error:
            traceback.print_exc()
            errors[name] = f"{type(error).__name__}: {error}"
        seconds[name] = time.perf_counter() - started
    markdown, _ = summary.write(BENCHMARKS, since=since, errors=errors, seconds=seconds)
    print(f"\n{markdown.read_text(encoding='utf-8')}")
    print(f"wrote {markdown}")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
