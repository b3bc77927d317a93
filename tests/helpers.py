"""Helpers shared by every test folder (imported explicitly, never through conftest)."""

from __future__ import annotations

import os

__all__ = ["FULL_RUN", "examples"]

FULL_RUN = bool(os.environ.get("CI")) or os.environ.get("DSH_FULL_TESTS") == "1"
"""True on CI (or with `DSH_FULL_TESTS=1`): property tests run their full example counts."""


def examples(full: int) -> int:
    """The hypothesis example count for a property test: `full` on CI, a tenth (at least 5) locally.

    The fast inner loop (`make check`) explores a small sample; `make test` on CI explores the full
    count, so a property that only fails rarely is still caught before it lands.
    """
    return full if FULL_RUN else max(5, full // 10)
