"""The JSONL parent index: the header facts of every session folder, in one searchable journal.

Layer: persistence (private to `dsh.persistence.jsonl`; blocking, called from the backend's worker
threads only). Derived data owned by `JsonlBackend` (docs/storage-format.md#parent-index): the
index lets a listing filtered by parent read the headers of the matching sessions only, instead of
every header in the store. It is never an authority. A reader uses the index for a project folder
only when it is fresh for that folder (`Stamp.fresh`), reads and validates every header the index
points it to exactly as a scan would, and scans the folder otherwise; a missing, unreadable or
damaged index file is the same as no index. So a stale or damaged index costs time, never a row.

`<root>.index/entries` is a text file: a *base* (written whole, sorted, checksummed) followed by
*updates* (one line appended per change). Fields are separated by tabs; strings are JSON-encoded,
so they hold no tab or newline:

    dsh-parent-index  1  "session.jsonl.zstd"  <crc32 of the base body>  [<section offsets>]
    F  folder  dev  mtime_ns  written_ns                  one per indexed project folder
    L  parent  folder  name  inode  id  origin  createdAt  a listed session; lines sorted, so the
                                                           children of a parent are found by
                                                           binary search
    D|R|I  folder  name  inode                            damaged, recheck, ignored entries
    X  id                                                 an id listed in more than one folder
    U  crc32  {"folder", "dev", "mtime", "written", "replace", "entries", "removed", "dups"}

A reader therefore never parses the entries it does not need: it checks the checksums (a damaged
base or update makes the whole file unusable), reads the folder stamps and the (few) updates, and
binary-searches the parents it is asked about, so its cost follows the family it lists. A writer
finds one folder's entries, one entry, or one id's copies, by searching the base the same way; a
rewrite (`IndexView.fold`) copies the lines of every folder nothing changed as bytes. A session
this store creates is added by appending its entry (`add`), so a creation costs the same whatever
its folder or the store holds (docs/storage-format.md#parent-index). `<root>.index/.lock`
serialises writers (`flock`); its modification time, set by the writer holding it, is the write's
timestamp. `<root>.index/.tmp-<12 hex>` are the temp files of atomic rewrites. Read-only backends
never create, write or lock anything here. The file's format (entries, stamps, the searched view,
encoding) is `_index_format`.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import stat
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Final

import orjson

from dsh.persistence.jsonl._files import FILE_MODE, FILE_READS
from dsh.persistence.jsonl._index_format import (
    INDEX_VERSION,
    INODE,
    KIND,
    NAME,
    SESSION_ID,
    Entry,
    IndexView,
    Kind,
    Stamp,
    decode,
    encode_base,
    encode_update,
    entry_name,
    extend,
    indexable,
    listed_entry,
    other_entry,
)

__all__ = [
    "INDEX_FILE",
    "INDEX_VERSION",
    "INODE",
    "KIND",
    "NAME",
    "Entry",
    "IndexFiles",
    "IndexView",
    "Kind",
    "Stamp",
    "Writer",
    "entry_name",
    "indexable",
    "listed_entry",
    "other_entry",
]

_log = logging.getLogger("dsh.persistence")

INDEX_FILE: Final = "entries"
_DIR_MODE: Final = 0o700
_LOCK_NAME: Final = ".lock"
_TEMP_PREFIX: Final = ".tmp-"
_STALE_TEMP_NS: Final = 600 * 1_000_000_000
"""A temp file older than this (ten minutes) belongs to no write in progress and is swept."""
_MAX_UPDATES: Final = 128
"""Updates appended before the next write folds them into one base (readers parse updates; a
session's creation appends two)."""
_MAX_UPDATE_ENTRIES: Final = 256
"""Entries the updates may carry in all before the next write folds them into one base: a
reader parses every update entry, so they must stay few for its cost to follow the family."""
_INDEX_ERRORS: Final = (OSError, ValueError, TypeError, KeyError, IndexError, orjson.JSONDecodeError)


# --------------------------------------------------------------------------------------------------
# The file


class Writer:
    """The writers' lock, held: its descriptor doubles as the source of write timestamps."""

    __slots__ = ("device", "fd")

    def __init__(self, fd: int) -> None:
        self.fd: Final = fd
        self.device: Final = os.fstat(fd).st_dev

    def stamp(self) -> int:
        """A timestamp from the filesystem's clock, now: the lock file's time, set to now and read back.

        Only lock holders set it, so the time read back is the one this call set.
        """
        os.utime(self.fd)
        return os.fstat(self.fd).st_mtime_ns


class IndexFiles:
    """The index file of one store: cached reads, appends, atomic rewrites and the lock (thread-safe).

    Args:
        directory: `<root>.index`.
        writable: False for a read-only backend: nothing is ever created, written or locked.
    """

    def __init__(self, directory: str, *, writable: bool) -> None:
        self.directory = directory
        self.path = os.path.join(directory, INDEX_FILE)
        self.writable = writable
        self._mutex = threading.Lock()
        # (file identity, inode, the view) of the version read last.
        self._cached: tuple[tuple[int, int, int, int], IndexView | None] | None = None

    # ---------------------------------------------------------------- reads

    def load(self) -> IndexView | None:
        """The index as stored now, or None. One `stat` when unchanged; when only updates were
        appended since the last read, only those are read."""
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        key = _identity(st)
        with self._mutex:
            cached = self._cached
        if cached is not None and cached[0] == key:
            return cached[1]
        view = None
        if cached is not None and cached[1] is not None and cached[0][0] == st.st_ino and not cached[1].torn:
            view = self._read_appended(cached[1], st)
        if view is None:
            view = self._read(st)
        with self._mutex:
            self._cached = (key, view)
        return view

    def _open(self) -> int | None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                return fd
        except OSError:
            pass
        os.close(fd)
        return None

    def _read(self, st: os.stat_result) -> IndexView | None:
        FILE_READS.add("index")
        fd = self._open()
        if fd is None:
            return None
        try:
            chunks: list[bytes] = []
            while chunk := os.read(fd, max(st.st_size, 65536)):
                chunks.append(chunk)
        except OSError:
            return None
        finally:
            os.close(fd)
        return decode(b"".join(chunks))

    def _read_appended(self, view: IndexView, st: os.stat_result) -> IndexView | None:
        """`view` plus the update lines appended to the same file since it was read, or None."""
        size = view.size
        if st.st_size <= size:
            return None
        fd = self._open()
        if fd is None:
            return None
        try:
            appended = os.pread(fd, st.st_size - size, size)
        except OSError:
            return None
        finally:
            os.close(fd)
        try:
            return extend(view, appended)
        except (orjson.JSONDecodeError, ValueError, TypeError, KeyError, IndexError):
            return None

    # ---------------------------------------------------------------- writes (writable stores only)

    @contextlib.contextmanager
    def lock(self) -> Iterator[Writer | None]:
        """Hold the writers' lock; yields None (and holds nothing) in a read-only store or on failure."""
        if not self.writable:
            yield None
            return
        fd = -1
        try:
            os.makedirs(self.directory, mode=_DIR_MODE, exist_ok=True)
            fd = os.open(os.path.join(self.directory, _LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
            fcntl.flock(fd, fcntl.LOCK_EX)
            writer = Writer(fd)
        except OSError as error:
            _log.debug("jsonl index: cannot take the lock in %s: %s", self.directory, error)
            if fd >= 0:
                os.close(fd)
            yield None
            return
        try:
            yield writer
        finally:
            os.close(fd)  # closing drops the flock

    def store(
        self,
        view: IndexView | None,
        artifact: str,
        folder: str,
        stamp: Stamp,
        entries: Mapping[str, Entry],
        *,
        keep: Iterable[str] | None = None,
    ) -> IndexView | None:
        """Record `entries` as the whole content of `folder` in state `stamp` (the lock held).

        `view` is the file's current content (loaded under the lock). The change is appended as
        one update line while the file has few updates carrying few entries; otherwise, or when
        `keep` (the folders to keep, besides `folder`) is given, the file is rewritten atomically
        (temp file, fsync, rename) with the updates folded into its base. An append is not
        fsynced: losing or tearing it leaves the file describing the folder as it was before,
        which is not fresh. Returns what the file now holds (built from what was written, without
        reading it back), or None when it could not be written.
        """
        current = view if view is not None and view.artifact == artifact else None
        try:
            if current is None:
                return self._rewritten(encode_base(artifact, {folder: stamp}, {folder: dict(entries)}))
            if keep is None and _appendable(current):
                old = current.folder_entries(folder)
                changed = [entry for name, entry in entries.items() if old.get(name) != entry]
                removed = [name for name in old if name not in entries]
                if current.update_entries + len(changed) + len(removed) <= _MAX_UPDATE_ENTRIES:
                    dups = _dups_after(current, folder, old, entries)
                    return self._appended(current, encode_update(folder, stamp, changed, removed, dups, replace=False))
            kept = None if keep is None else {*keep, folder}
            stamps = {**current.stamps, folder: stamp}
            return self._rewritten(current.fold(stamps, {folder: dict(entries)}, replaced=(folder,), keep=kept))
        except _INDEX_ERRORS as error:
            _log.debug("jsonl index: cannot write the index of %s: %s", folder, error)
            return None

    def add(
        self,
        view: IndexView,
        folder: str,
        stamp: Stamp,
        entries: Sequence[Entry],
        *,
        dups: Iterable[str] | None = None,
    ) -> IndexView | None:
        """Record that `folder`, now in state `stamp`, holds `entries` besides what `view` says it holds.

        The lock is held and `view` is the file's current content. An entry replaces the one of
        the same name. This is how a store records the sessions it creates: one appended update
        line, written without reading the folder or parsing its other entries. `dups`, when the
        caller knows them, are the duplicate ids after the change; otherwise each entry's old
        version and each id's other copies are looked up (a search of the whole base), so a
        creation passes them to cost the same whatever the index holds. Once the updates are many
        the file is folded into a new base instead (as `store` does). Returns what the file now
        holds, or None when it could not be written.
        """
        try:
            changed = {entry[NAME]: entry for entry in entries}
            if _appendable(view) and view.update_entries + len(changed) <= _MAX_UPDATE_ENTRIES:
                if dups is None:
                    old: dict[str, Entry] = {}
                    for name in changed:
                        existing = view.entry(folder, name)
                        if existing is not None:
                            old[name] = existing
                    dups = _dups_after(view, folder, old, changed)
                line = encode_update(folder, stamp, changed.values(), (), dups, replace=False)
                return self._appended(view, line)
            return self._rewritten(view.fold({**view.stamps, folder: stamp}, {folder: dict(changed)}))
        except _INDEX_ERRORS as error:
            _log.debug("jsonl index: cannot add to the index of %s: %s", folder, error)
            return None

    def _appended(self, view: IndexView, line: bytes) -> IndexView:
        """Append one update line to the file `view` describes; the view of the file after it."""
        self._append(line)
        return self._remember(extend(view, line))

    def _rewritten(self, data: bytes) -> IndexView:
        """Replace the file by `data` (a whole base); the view of the file after it."""
        self._rewrite(data)
        decoded = decode(data)
        if decoded is None:
            raise ValueError("the index just written does not decode")
        return self._remember(decoded)

    def _remember(self, written: IndexView) -> IndexView:
        st = os.stat(self.path)
        with self._mutex:
            self._cached = (_identity(st), written)
        return written

    def _append(self, data: bytes) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)

    def _rewrite(self, data: bytes) -> None:
        os.makedirs(self.directory, mode=_DIR_MODE, exist_ok=True)
        temp = os.path.join(self.directory, f"{_TEMP_PREFIX}{secrets.token_hex(6)}")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
        try:
            try:
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(temp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise

    def sweep(self) -> None:
        """Remove abandoned temp files (a writing open, the lock held)."""
        try:
            names = os.listdir(self.directory)
        except OSError:
            return
        now = time.time_ns()
        for name in names:
            if name.startswith(_TEMP_PREFIX):
                path = os.path.join(self.directory, name)
                with contextlib.suppress(OSError):
                    if now - os.lstat(path).st_mtime_ns > _STALE_TEMP_NS:
                        os.unlink(path)


def _appendable(view: IndexView) -> bool:
    """Whether the next change may be one more update line (not too many yet, none torn)."""
    return view.updates < _MAX_UPDATES and not view.torn


def _dups_after(view: IndexView, folder: str, old: Mapping[str, Entry], new: Mapping[str, Entry]) -> set[str]:
    """The ids listed in several folders once `folder` holds `new` instead of `old`.

    Only the ids that entered or left the folder can change: each is looked up in the other
    folders (a search, no full parse).
    """
    before = {entry[SESSION_ID] for entry in old.values() if entry[KIND] == "L"}
    after = {entry[SESSION_ID] for entry in new.values() if entry[KIND] == "L"}
    dups = set(view.dups)
    for session_id in before ^ after:
        elsewhere = [copy for copy in view.listed_copies(session_id) if copy[0] != folder]
        if len(elsewhere) + (session_id in after) > 1:
            dups.add(session_id)
        else:
            dups.discard(session_id)
    return dups


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
