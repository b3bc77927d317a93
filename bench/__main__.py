"""Run every benchmark (`python -m bench`) or one (`python -m bench p5_cold_read`)."""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = ["p5_cold_read", "p6_append", "p7_listing", "p123_catalog", "agent_loop", "catalog_load", "server_load"]


def main(argv: list[str]) -> int:
    """Run the named benchmarks (all by default)."""
    names = argv or BENCHMARKS
    for name in names:
        module = importlib.import_module(f"bench.{name}")
        module.main()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
