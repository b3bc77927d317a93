"""Damage a listing reports instead of skipping: a log without a header, an unreadable project folder.

Layer: persistence (private to `dsh.persistence.jsonl`; blocking, called from the listing's worker
thread).

dsh publishes a log whole (written beside it, then linked into place), so a log of 0 bytes or one
whose first record is incomplete is not a session being created: it is damage, reported as
`SESSION_CORRUPT` (`headless_log`).

A project folder the listing cannot list (mode 000, say) hides every session it holds.
Each of them is a stored session nobody can read, so each counts in the listing's `damaged` list
(docs/storage-format.md#damage-stays-visible): `dsh agents` counts them on stderr and `dsh doctor`
prints one line for each, instead of one line for the folder.

How many there are, without listing the folder:

* the parent index names them, with their ids, when it describes the folder as it is now (its
  stamp has the folder's device and modification time; a `chmod` changes neither);
* otherwise the folder's link count tells: a folder has 2 links plus one per subfolder on ext4,
  xfs and tmpfs. A file system that does not count subfolders (btrfs reports 1) gives one entry
  for the folder.
"""

from __future__ import annotations

import os

from dsh.persistence.base import DamagedSession
from dsh.persistence.errors import SessionCorruptionError, SessionPersistenceError
from dsh.persistence.jsonl._format import LogContext, decode_segment
from dsh.persistence.jsonl._index import IndexFiles
from dsh.persistence.jsonl._index_format import KIND, SESSION_ID

__all__ = ["headless_log", "project_damage"]


def headless_log(ctx: LogContext, size: int) -> SessionCorruptionError:
    """The listing's verdict on a log of `size` bytes without a complete first record."""
    if size == 0:
        return ctx.corrupt("corrupt session log: the log is empty (0 bytes), so it has no header record")
    return ctx.corrupt(
        f"corrupt session log: its first record (the header) is incomplete: the log ends after {size} bytes"
    )


def project_damage(index: IndexFiles, artifact: str, name: str, path: str, error: OSError) -> list[DamagedSession]:
    """The damaged entries of project folder `name` at `path`, which could not be listed (`error`).

    Args:
        index: The store's parent index (only read).
        artifact: The store's log file name (an index built for the other encoding is not used).
        name: The project folder's name.
        path: Its path.
        error: Why listing it failed.
    """
    reason = error.strerror or str(error)
    try:
        st: os.stat_result | None = os.lstat(path)
    except OSError:
        st = None
    named = _indexed_sessions(index, artifact, name, st) if st is not None else []
    if named:
        message = f'cannot read project folder "{path}", which holds this session folder: {reason}'
        return [
            DamagedSession(os.path.join(path, entry), "PERSISTENCE_IO", message, session_id)
            for entry, session_id in named
        ]
    count = st.st_nlink - 2 if st is not None and st.st_nlink > 2 else 1
    held = f", which holds {count} session folders" if count > 1 else ""
    message = f'cannot read project folder "{path}"{held}: {reason}'
    return [DamagedSession(path, "PERSISTENCE_IO", message, None) for _ in range(count)]


def _indexed_sessions(index: IndexFiles, artifact: str, name: str, st: os.stat_result) -> list[tuple[str, str | None]]:
    """`(entry name, session id)` of every session folder the index knows in the folder, when the
    index describes the folder as it is now; else nothing."""
    try:
        view = index.load()
    except (OSError, SessionPersistenceError):
        return []
    if view is None or view.artifact != artifact:
        return []
    stamp = view.stamps.get(name)
    if stamp is None or not stamp.same_folder(st):
        return []
    found: list[tuple[str, str | None]] = []
    for entry_name, entry in sorted(view.folder_entries(name).items()):
        if entry[KIND] == "L":
            found.append((entry_name, str(entry[SESSION_ID])))
        elif entry[KIND] in ("D", "R"):
            found.append((entry_name, decode_segment(entry_name)))
    return found
