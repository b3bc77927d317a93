"""Helpers shared by every test folder (imported explicitly, never through conftest)."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

__all__ = ["FULL_RUN", "examples", "tree_snapshot"]

FULL_RUN = bool(os.environ.get("CI")) or os.environ.get("DSH_FULL_TESTS") == "1"
"""True on CI (or with `DSH_FULL_TESTS=1`): property tests run their full example counts."""


def examples(full: int) -> int:
    """The hypothesis example count for a property test: `full` on CI, a tenth (at least 5) locally.

    The fast inner loop (`make check`) explores a small sample; `make test` on CI explores the full
    count, so a property that only fails rarely is still caught before it lands.
    """
    return full if FULL_RUN else max(5, full // 10)


_SQLITE_SIDE_FILES = ("-wal", "-shm")


def tree_snapshot(*roots: str | os.PathLike[str]) -> dict[str, tuple[object, ...]]:
    """Every path under `roots` (roots included) with its kind, mode, size, mtime and content hash.

    Compare two snapshots to prove a read-only path created, removed or changed nothing: a new
    folder, a new empty file, a changed byte, a touched file mtime or a changed mode all show.
    SQLite's own `-wal` and `-shm` files are left out (a reader may create them; that is SQLite's
    crash recovery, not a change of committed data), and so are folder mtimes, which those files
    change; a folder's entries are compared one by one instead. Nothing is opened but regular files
    (never a FIFO), and a missing root is recorded as missing, so a created one shows.
    """
    out: dict[str, tuple[object, ...]] = {}
    pending = [Path(root) for root in roots]
    while pending:
        path = pending.pop()
        if path.name.endswith(_SQLITE_SIDE_FILES):
            continue
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            out[str(path)] = ("missing",)
            continue
        mode = stat.S_IMODE(info.st_mode)
        if stat.S_ISLNK(info.st_mode):
            out[str(path)] = ("symlink", os.readlink(path))
        elif stat.S_ISDIR(info.st_mode):
            out[str(path)] = ("dir", mode)
            try:
                pending.extend(path / name for name in os.listdir(path))
            except PermissionError:
                out[str(path)] += ("unlistable",)
        elif stat.S_ISREG(info.st_mode):
            try:
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
            except PermissionError:
                digest = "unreadable"
            out[str(path)] = ("file", mode, info.st_size, info.st_mtime_ns, digest)
        else:
            out[str(path)] = ("special", stat.S_IFMT(info.st_mode), mode, info.st_mtime_ns)
    return out
