"""Whether the read path's optional C helpers (`dsh._speedups`) are in use.

Layer: base. `dsh._speedups` is compiled when the package is installed (hatch_build.py) and may be
missing: no compiler, an unsupported interpreter. Every helper has a pure-Python twin that gives the
same results; only the read path's speed differs (docs/architecture.md#read-path). Setting the
environment variable `DSH_PURE_PYTHON=1` before `dsh` is imported turns the helpers off.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import ModuleType

__all__ = ["speedups"]


def _load() -> ModuleType | None:
    if os.environ.get("DSH_PURE_PYTHON", "").strip() not in ("", "0"):
        return None
    try:
        import dsh._speedups as compiled
    except ImportError:
        return None
    return compiled


speedups: ModuleType | None = _load()
"""The C helpers, or None when the pure-Python twins run."""
