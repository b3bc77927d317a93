"""Helpers shared by every test folder (imported explicitly, never through conftest)."""

from __future__ import annotations

import hashlib
import importlib
import os
import stat
from pathlib import Path

import dsh

__all__ = ["FULL_RUN", "examples", "exported_classes", "public_module_of", "public_modules", "tree_snapshot"]

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


def public_modules() -> list[str]:
    """Every public module of the package: `dsh` and each module whose dotted path has no `_` part."""
    root = Path(dsh.__file__).parent
    names = ["dsh"]
    for path in sorted(root.rglob("*.py")):
        parts = ("dsh", *path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if len(parts) > 1 and not any(part.startswith("_") for part in parts):
            names.append(".".join(parts))
    return names


def exported_classes() -> dict[type, list[str]]:
    """Every class of the package a public module lists in `__all__`, with the public modules that list it."""
    found: dict[type, list[str]] = {}
    for name in public_modules():
        module = importlib.import_module(name)
        for attribute in getattr(module, "__all__", ()):
            value = getattr(module, attribute)
            if isinstance(value, type) and (value.__module__ + ".").startswith("dsh."):
                found.setdefault(value, []).append(name)
    return found


def public_module_of(cls: type, exporters: list[str]) -> str:
    """The module a public class belongs to: the shortest path that exports it (docs/architecture.md#public-names).

    Between exporters of the same depth the defining module wins (`dsh.subagent.authority` over
    `dsh.subagent.runtime`, which re-exports it), else the first by name.
    """
    depth = min(name.count(".") for name in exporters)
    shortest = sorted(name for name in exporters if name.count(".") == depth)
    return cls.__module__ if cls.__module__ in shortest else shortest[0]
