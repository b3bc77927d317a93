"""Listing the JSONL store: reading session folders, the walk over the parent index, and index upkeep.

Layer: persistence (private to `dsh.persistence.jsonl`; blocking, called from the backend's worker
threads only). `FolderReader` reads one entry of a project folder exactly as the listing always
did (docs/storage-format.md#listing-without-reading-logs): every entry is isolated, and a header is
parsed and validated once. `StoreListing` is the listing itself:

* without a parent filter it scans every project folder (every header is read);
* with one it uses, for each project folder, the folder's parent index when it is fresh
  (docs/storage-format.md#parent-index) and reads only the headers of the matching sessions plus
  the entries every listing re-reads (damaged ones and those still being created); a folder
  without a fresh index is scanned;
* a writing store also keeps the index: a scan of a folder whose index is not fresh writes a new
  one, every session it creates is appended to its folder's index without reading the folder
  (`create_folder`, then `note_materialized`), `open` refreshes every folder, and `close` rewrites
  the indexes it left "racily clean" once the clock has moved on and reads again the folders it
  added sessions to.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal, NamedTuple

from dsh.persistence.base import DamagedSession, ParentFilter, Revision
from dsh.persistence.errors import (
    PersistenceIOError,
    SessionCorruptionError,
    SessionFormatUnsupportedError,
    SessionPersistenceError,
)
from dsh.persistence.headers import read_stored_header
from dsh.persistence.jsonl._damage import headless_log, project_damage
from dsh.persistence.jsonl._files import (
    FILE_READS,
    LOG_NAMES,
    Opener,
    flat_legacy_error,
    log_compression,
    log_in,
    project_entries,
    read_head,
)
from dsh.persistence.jsonl._format import (
    LogContext,
    check_identity,
    check_version,
    decode_header,
    decode_segment,
)
from dsh.persistence.jsonl._index import (
    INODE,
    KIND,
    Entry,
    IndexFiles,
    IndexView,
    Kind,
    Stamp,
    Writer,
    entry_name,
    indexable,
    listed_entry,
    other_entry,
)
from dsh.session.header import SessionHeader, StoredHeaderError

__all__ = ["INDEX_ARTIFACTS", "FolderReader", "Listed", "StoreListing", "unreadable"]

_log = logging.getLogger("dsh.persistence")

INDEX_ARTIFACTS: Final = " ".join(LOG_NAMES)
"""What the parent index says it was built for: a reader that takes each session's log in either
encoding. An index built for one log file name (by an earlier dsh) is not used, and is rebuilt."""

_STAMP_TRIES: Final = 3
"""How many write timestamps a creation takes, at most, to get one later than the folder's time."""
_SETTLE_TRIES: Final = 25
_SETTLE_PAUSE_S: Final = 0.001
"""At close, a racily clean index is rewritten once the filesystem clock has moved past the folder's
time: up to 25 tries 1 ms apart (a coarser clock leaves it to the next writing open)."""


# Private and built on a hot path, never handed out: a NamedTuple is the cheapest record to build
# (docs/architecture.md#import-cost).
class Listed(NamedTuple):
    """One listable session: its stored header record (and the validated header), revision and log path."""

    record: dict[str, Any]
    revision: Revision
    path: str
    header: SessionHeader


Outcome = Listed | DamagedSession | None
"""What reading one folder entry gave: a listed session, a damaged entry, or nothing to list."""


def unreadable(path: str, what: str, error: OSError, session_id: str | None) -> DamagedSession:
    """A listing entry the OS refused to read (permissions, I/O): reported, never fatal."""
    reason = error.strerror or str(error)
    return DamagedSession(path, "PERSISTENCE_IO", f'cannot read {what} "{path}": {reason}', session_id)


def _kind(outcome: Outcome) -> Kind:
    if isinstance(outcome, Listed):
        return "L"
    return "D" if isinstance(outcome, DamagedSession) else "R"


class FolderReader:
    """Reads the entries of project folders; one outcome per entry, each entry isolated.

    A session folder's log is `session.jsonl.zstd` or `session.jsonl`, whichever it holds: the
    encoding is taken from the file name, per log (docs/storage-format.md#jsonl-layout).

    Args:
        opener: Opens a log for reading (the backend's opener).
    """

    artifact: Final = INDEX_ARTIFACTS

    def __init__(self, opener: Opener) -> None:
        self.opener = opener

    def entry(self, project: str, project_name: str, entry: os.DirEntry[str]) -> tuple[Kind, Outcome]:
        """One entry found by a scan of `project`: its index kind and its outcome.

        Raises:
            StoreMisconfiguredError: A flat legacy log.
        """
        if entry.is_file(follow_symlinks=False):
            if entry.name.endswith((".jsonl", ".jsonl.zstd")):
                raise flat_legacy_error(entry.path)
            return "I", None
        if entry.is_symlink():
            # Followed like the lookup follows it: a session folder reached through a symbolic
            # link lists exactly as it reads (and is re-read by every listing: its target can change).
            return "R", self.named(project, project_name, entry.name)
        try:
            is_folder = entry.is_dir(follow_symlinks=False)
        except OSError:
            is_folder = False
        if not is_folder:
            return "I", None
        outcome = self.folder(entry.path, project_name, entry.name)
        return _kind(outcome), outcome

    def named(self, project: str, project_name: str, name: str) -> Outcome:
        """An entry the parent index names (or a symbolic link a scan found), read as a scan reads it.

        A symbolic link that cannot be followed (a loop, a dangling link) is an unreadable session
        folder (docs/storage-format.md#damage-stays-visible); a link to a non-folder is ignored.
        """
        path = os.path.join(project, name)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            if not os.path.islink(path):
                return None  # vanished since the folder was listed
            message = f'cannot read session folder "{path}": it is a dangling symbolic link'
            return DamagedSession(path, "PERSISTENCE_IO", message, decode_segment(name))
        except OSError as error:
            return unreadable(path, "session folder", error, decode_segment(name))
        return self.folder(path, project_name, name) if stat.S_ISDIR(st.st_mode) else None

    def folder(self, path: str, project_name: str, name: str) -> Outcome:
        """One session folder: its listed header, a damaged entry, or None (no log file in it, or it vanished)."""
        folder_id = decode_segment(name)
        try:
            names = os.listdir(path)
        except FileNotFoundError:
            return None
        except OSError as error:
            return unreadable(path, "session folder", error, folder_id)
        try:
            log = log_in(path, names, folder_id)
        except SessionCorruptionError as error:
            return DamagedSession(path, error.code, error.message, folder_id)
        if log is None:
            return None
        try:
            return self.header(log, f"{project_name}/{name}/{os.path.basename(log)}")
        except (SessionCorruptionError, SessionFormatUnsupportedError, PersistenceIOError) as error:
            return DamagedSession(log, error.code, error.message, folder_id)
        except OSError as error:
            # One unreadable log must not hide every other session: it is reported as damaged instead.
            return unreadable(log, "session log", error, folder_id)

    def header(self, path: str, relative: str) -> Listed | None:
        """The header of the log at `path` (`relative` to the root), validated once; None when it vanished.

        Raises:
            SessionCorruptionError: An empty log, an incomplete first record, a complete first
                record that is not a valid header, or one that breaks the identity rule.
            SessionFormatUnsupportedError: A header version other than 0.
            PersistenceIOError: The log kept changing, or is not a regular file.
        """
        compression = log_compression(path)
        result = read_head(self.opener, path, compression)
        if result is None:
            return None
        head, st, revision = result
        ctx = LogContext(None, path)
        if head is None:
            raise headless_log(ctx, st.st_size)
        record = decode_header(head.line, ctx)
        check_version(record, ctx)
        try:
            header, _ = read_stored_header(record)
        except StoredHeaderError as error:
            raise ctx.corrupt(f"corrupt session log: invalid session header: {error}") from error
        check_identity(record, None, relative, compression, ctx)
        return Listed(record, revision, path, header)


_Refresh = Literal["clean", "stale", "wait"]


class StoreListing:
    """The listing of one JSONL root and the upkeep of its parent index (thread-safe).

    Args:
        root: The store root.
        reader: Reads folder entries.
        index: The root's index file (read-only stores never write it).
    """

    def __init__(self, root: str, reader: FolderReader, index: IndexFiles) -> None:
        self.root = root
        self.reader = reader
        self.index = index
        self._mutex = threading.Lock()
        self._racy: set[str] = set()
        self._added: set[str] = set()
        self._access: dict[str, tuple[tuple[int, int, int, int], bool]] = {}

    # ---------------------------------------------------------------- listing

    def headers(self, parents: ParentFilter | None) -> tuple[list[Listed], list[DamagedSession]]:
        """Every listable session (with `parents`, those whose validated header names one of them).

        The damaged entries are always the whole store's. Rows are sorted by `(createdAt, id)`.

        Raises:
            StoreMisconfiguredError: The root is unusable, or holds a flat legacy log where the walk looks.
        """
        read: list[Listed] = []
        damaged: list[DamagedSession] = []
        folders = project_entries(self.root)
        view = self._view(folders) if parents is not None else None
        fresh: set[str] = set()
        scanned: list[Listed] = []
        for folder in folders:
            if view is not None and self._fresh(view, folder.name, folder.path):
                fresh.add(folder.name)
            else:
                start = len(read)
                self._scan(folder.name, folder.path, read, damaged)
                scanned.extend(read[start:])
        picked: set[tuple[str, str]] = set()
        if view is not None and parents is not None and fresh:
            wanted = [pair for parent in parents for pair in view.children(parent)]
            picked = {(folder, name) for folder, name in (*wanted, *view.recheck()) if folder in fresh}
            unsafe = {folder_name for folder_name, name in picked if entry_name(name) is None}
            for folder_name in sorted(unsafe):
                # An index someone edited names what cannot be an entry: read that folder instead.
                fresh.discard(folder_name)
                start = len(read)
                self._scan(folder_name, os.path.join(self.root, folder_name), read, damaged)
                scanned.extend(read[start:])
            picked = {pair for pair in picked if pair[0] in fresh}
            for folder_name, name in sorted(picked):
                path = os.path.join(self.root, folder_name)
                _collect(self.reader.named(path, folder_name, name), read, damaged)
        duplicates = self._duplicates_of(read, scanned, view, fresh, picked)
        for session_id, paths in duplicates.items():
            message = f'duplicate session id "{session_id}" in several project directories: {", ".join(paths)}'
            damaged.extend(DamagedSession(path, "SESSION_CORRUPT", message, session_id) for path in paths)
        rows = [
            listed
            for listed in read
            if listed.header.id not in duplicates and (parents is None or listed.header.parent_session in parents)
        ]
        rows.sort(key=lambda listed: (listed.header.created_at, listed.header.id))
        return rows, damaged

    def _view(self, folders: list[os.DirEntry[str]]) -> IndexView | None:
        """The index for a filtered listing; a writing store first rewrites racily clean folders."""
        view = self.index.load()
        if view is None or view.artifact != self.reader.artifact:
            return None
        if self.index.writable:
            racy = [folder for folder in folders if self._racy_now(view, folder.name, folder.path)]
            for folder in racy:
                self._refresh_racy(folder.name, folder.path)
            if racy:
                view = self.index.load()
        return view

    def open_plan(self) -> list[tuple[str, list[str] | None]]:
        """What `open` looks at: each project folder's path, with the names of its entries that can
        have changed without the folder changing (the index's `D` and `R` entries) when the index
        is fresh for the folder, or None (every entry).

        Raises:
            StoreMisconfiguredError: The root is not a readable directory.
        """
        folders = project_entries(self.root)
        view = self.index.load()
        if view is None or view.artifact != self.reader.artifact:
            return [(folder.path, None) for folder in folders]
        pending: dict[str, list[str]] = {}
        for folder_name, name in view.recheck():
            pending.setdefault(folder_name, []).append(name)
        plan: list[tuple[str, list[str] | None]] = []
        for folder in folders:
            if self._fresh(view, folder.name, folder.path):
                names = [name for name in pending.get(folder.name, ()) if entry_name(name) is not None]
                plan.append((folder.path, names))
            else:
                plan.append((folder.path, None))
        return plan

    def _racy_now(self, view: IndexView, name: str, path: str) -> bool:
        stamp = view.stamps.get(name)
        if stamp is None or not stamp.racy():
            return False
        try:
            return stamp.same_folder(os.lstat(path))
        except OSError:
            return False

    def _fresh(self, view: IndexView, name: str, path: str) -> bool:
        """Whether a reader may use the index for this folder: indexable, fresh, and readable."""
        stamp = view.stamps.get(name)
        if stamp is None or not indexable(name):
            return False
        try:
            st = os.lstat(path)
        except OSError:
            return False
        if not stamp.fresh(st):
            return False
        # An unreadable folder is reported as one damaged folder by the scan, never entry by entry.
        return self._readable(path, st)

    def _readable(self, path: str, st: os.stat_result) -> bool:
        """`access(R_OK | X_OK)` of a folder, asked again only when its owner or mode changed."""
        key = (st.st_ino, st.st_mode, st.st_uid, st.st_gid)
        known = self._access.get(path)  # one dict read is atomic; writers below hold the mutex
        if known is not None and known[0] == key:
            return known[1]
        readable = os.access(path, os.R_OK | os.X_OK)
        with self._mutex:
            self._access[path] = (key, readable)
        return readable

    def _scan(self, name: str, path: str, read: list[Listed], damaged: list[DamagedSession]) -> None:
        """Read every entry of one project folder; a writing store also rewrites the folder's index."""
        if not (self.index.writable and indexable(name)):
            self._read_folder(name, path, read, damaged)
            return
        with self.index.lock() as writer:
            view = self.index.load() if writer is not None else None
            if writer is None or (view is not None and self._fresh(view, name, path)):
                self._read_folder(name, path, read, damaged)
                return
            written_ns = writer.stamp()
            scanned = self._read_folder(name, path, read, damaged)
            if scanned is not None and scanned[0].st_dev == writer.device:
                pre, entries = scanned
                stamp = Stamp(pre.st_dev, pre.st_mtime_ns, written_ns)
                self._stored(name, stamp, self.index.store(view, self.reader.artifact, name, stamp, entries))

    def _read_folder(
        self, name: str, path: str, read: list[Listed], damaged: list[DamagedSession]
    ) -> tuple[os.stat_result, dict[str, Entry]] | None:
        """Read every entry of one project folder: its `lstat` taken before, and its index entries."""
        FILE_READS.add("folder")
        try:
            pre = os.lstat(path)
            entries = list(os.scandir(path))
        except FileNotFoundError:
            return None
        except OSError as error:
            damaged.extend(project_damage(self.index, self.reader.artifact, name, path, error))
            return None
        built: dict[str, Entry] = {}
        for entry in entries:
            kind, outcome = self.reader.entry(path, name, entry)
            _collect(outcome, read, damaged)
            built[entry.name] = _entry_of(entry, kind, outcome)
        return pre, built

    def _duplicates_of(
        self,
        read: list[Listed],
        scanned: list[Listed],
        view: IndexView | None,
        fresh: set[str],
        picked: set[tuple[str, str]],
    ) -> dict[str, list[str]]:
        """Ids listed in several project folders -> every copy's path (sorted).

        Copies come from the headers read now and, for entries of fresh folders that were not read,
        from the index. Ids the index holds in several folders are listed in it (its writers keep
        that list), so the index is parsed whole only when that list is not empty or a folder had
        to be scanned (a scanned id may have a copy the index knows).
        """
        copies: dict[str, list[str]] = {}
        for listed in read:
            copies.setdefault(listed.header.id, []).append(listed.path)
        if view is None or not fresh:
            return {session_id: sorted(paths) for session_id, paths in copies.items() if len(paths) > 1}
        lookup = set(view.dups) | {listed.header.id for listed in scanned}
        if lookup:
            indexed = view.copies()
            for session_id in lookup:
                for folder, name in indexed.get(session_id, ()):
                    if folder in fresh and (folder, name) not in picked:
                        copies.setdefault(session_id, []).append(_log_path(os.path.join(self.root, folder, name)))
        return {session_id: sorted(paths) for session_id, paths in copies.items() if len(paths) > 1}

    # ---------------------------------------------------------------- index upkeep

    def _stored(self, name: str, stamp: Stamp, view: IndexView | None) -> None:
        """Note whether a written folder state is racily clean (`close` rewrites those it can)."""
        if view is None:
            return
        with self._mutex:
            if stamp.racy():
                self._racy.add(name)
            else:
                self._racy.discard(name)

    def _relist(self, project: str, project_name: str, known: Mapping[str, Entry]) -> dict[str, Entry]:
        """The folder's entries now: `known` entries whose name and inode are unchanged are kept, the
        rest is read again."""
        out: dict[str, Entry] = {}
        FILE_READS.add("folder")
        for entry in os.scandir(project):
            inode = entry.inode()
            old = known.get(entry.name)
            if old is not None and old[INODE] == inode and old[KIND] in ("L", "I"):
                out[entry.name] = old
                continue
            kind, outcome = self.reader.entry(project, project_name, entry)
            out[entry.name] = _entry_of(entry, kind, outcome)
        return out

    def create_folder(self, project: str, name: str, make: Callable[[], list[str]]) -> list[str]:
        """Run `make()`, which creates session folder `name` in `project`, and record the new folder
        in the parent index without reading the project folder (docs/storage-format.md#creations-and-the-index).

        `make` returns the folders it created (outermost first, nothing fsynced); its result is
        returned and its errors propagate. A writing store holds the index lock around it, so no
        other dsh writer changes the index or creates a session in between: when the index
        described the project folder just before (its stamp has the folder's time then) and the
        folder changed by exactly this one new subfolder (its time moved and, where the link count
        counts subfolders, the count grew by one), the new folder is appended to the index as an
        entry still being created (`R`) with the folder's new stamp. Otherwise the project folder is
        read again, as every index write did before. `note_materialized` then records the log's
        header. Index failures are logged at debug level and never fail the creation.
        """
        project_name = os.path.basename(project)
        if not (self.index.writable and indexable(project_name)):
            return make()
        with self.index.lock() as writer:
            if writer is None:
                return make()
            view = self.index.load()
            pre = _lstat(project)
            created = make()
            if os.path.join(project, name) in created:
                try:
                    self._created(writer, view, project, name, pre)
                except (OSError, SessionPersistenceError) as error:
                    _log.debug("jsonl index: not updated for %s: %s", project, error)
            return created

    def _created(
        self, writer: Writer, view: IndexView | None, project: str, name: str, pre: os.stat_result | None
    ) -> None:
        project_name = os.path.basename(project)
        post = os.lstat(project)
        if post.st_dev != writer.device:
            return
        if view is not None and view.artifact != self.reader.artifact:
            view = None
        old = None if view is None else view.stamps.get(project_name)
        if view is None or old is None or pre is None or not old.same_folder(pre) or not _only_one_added(pre, post):
            self._update(writer, project, project_name, pre)
            return
        own = other_entry(name, os.lstat(os.path.join(project, name)).st_ino, "R")
        written = _stamp_after(writer, post.st_mtime_ns)
        if old.racy():
            # The index was not proven fresh for the folder before: neither is it after. The stamp
            # is made racily clean (written at the folder's time), whatever the clocks did, so
            # readers, and `close` once the clock has moved on, read the folder again.
            written = min(written, post.st_mtime_ns)
        stamp = Stamp(post.st_dev, post.st_mtime_ns, written)
        # A folder that was not there: no entry is replaced, and an `R` entry lists no id.
        stored = self.index.add(view, project_name, stamp, [own], dups=view.dups)
        self._stored(project_name, stamp, stored)
        if stored is not None:
            with self._mutex:
                self._added.add(project_name)

    def note_materialized(self, project: str, name: str, record: Mapping[str, Any], inode: int) -> None:
        """Record the header of the session this writer just materialized in folder `name` of `project`.

        `create_folder` recorded the folder as still being created (`R`); now that its log is
        complete and durable, that entry becomes the listed entry (`L`) of the header just
        written, in one appended update. The folder's stamp does not change: the log was linked
        inside the session folder, which leaves the project folder as it was. When the index does
        not hold that `R` entry any more (the folder was re-read meanwhile, or is not indexed),
        nothing is written: a re-read found the folder as it is. Never raises.
        """
        project_name = os.path.basename(project)
        if not (self.index.writable and indexable(project_name)):
            return
        try:
            header, _ = read_stored_header(record)
        except StoredHeaderError:
            return  # not listable: the entry stays one every listing re-reads
        try:
            with self.index.lock() as writer:
                view = self.index.load() if writer is not None else None
                if view is None or view.artifact != self.reader.artifact:
                    return
                stamp = view.stamps.get(project_name)
                known = view.entry(project_name, name)
                if stamp is None or known is None or known[KIND] != "R" or known[INODE] != inode:
                    return
                own = listed_entry(name, inode, header)
                # The id is new to the store: materializing found no log of it in any project folder
                # (an `L` copy elsewhere lives at `<project>/<its folder name>/`, where it looked), so
                # the entry adds no duplicate the whole-store listing would report.
                stored = self.index.add(view, project_name, stamp, [own], dups=view.dups)
                self._stored(project_name, stamp, stored)
        except (OSError, SessionPersistenceError) as error:
            _log.debug("jsonl index: not updated for %s: %s", project, error)

    def _update(self, writer: Writer, project: str, project_name: str, pre: os.stat_result | None) -> None:
        """Record the project folder as it is now, reading it: entries known by name and inode from
        a stamp that still describes the folder as it was at `pre` are kept, the rest is read."""
        written_ns = writer.stamp()
        post = os.lstat(project)
        if post.st_dev != writer.device:
            return
        view = self.index.load()
        if view is not None and view.artifact != self.reader.artifact:
            view = None
        old = None if view is None else view.stamps.get(project_name)
        usable = (pre is None and old is None) or (old is not None and pre is not None and old.same_folder(pre))
        known = view.folder_entries(project_name) if usable and view is not None else {}
        entries = self._relist(project, project_name, known)
        stamp = Stamp(post.st_dev, post.st_mtime_ns, written_ns)
        self._stored(project_name, stamp, self.index.store(view, self.reader.artifact, project_name, stamp, entries))

    def _refresh_racy(self, name: str, path: str, *, verify: bool = False) -> _Refresh:
        """Rewrite a racily clean folder's index once the filesystem clock has moved past its time
        (with `verify`, a fresh one too: the folder is read again in any case).

        The folder still has its recorded time; entries added, removed or replaced within that
        clock tick are found by name and inode and read, the rest is kept.
        """
        with self.index.lock() as writer:
            if writer is None:
                return "stale"
            view = self.index.load()
            old = None if view is None or view.artifact != self.reader.artifact else view.stamps.get(name)
            try:
                st = os.lstat(path)
            except OSError:
                return "stale"
            if view is None or old is None or not old.same_folder(st):
                return "stale"
            if not (old.racy() or verify):
                return "clean"
            written_ns = writer.stamp()
            if writer.device != st.st_dev or written_ns <= st.st_mtime_ns:
                return "wait"
            entries = self._relist(path, name, view.folder_entries(name))
            if os.lstat(path).st_mtime_ns != st.st_mtime_ns:
                return "stale"
            stamp = Stamp(st.st_dev, st.st_mtime_ns, written_ns)
            stored = self.index.store(view, self.reader.artifact, name, stamp, entries)
            self._stored(name, stamp, stored)
            return "clean" if stored is not None else "stale"

    def refresh(self) -> None:
        """A writing open: make the index fresh for every project folder, and forget removed folders.

        Raises:
            StoreMisconfiguredError: As `headers`.
        """
        if not self.index.writable:
            return
        folders = project_entries(self.root)
        names = {folder.name for folder in folders if indexable(folder.name)}
        with self.index.lock() as writer:
            if writer is None:
                return
            self.index.sweep()
            view = self.index.load()
            if view is not None and view.artifact == self.reader.artifact and set(view.stamps) - names:
                # Drop the folders that are gone (one rewrite keeping every present folder).
                kept = next(iter(names & set(view.stamps)), None)
                if kept is not None:
                    stamp = view.stamps[kept]
                    self.index.store(view, self.reader.artifact, kept, stamp, view.folder_entries(kept), keep=names)
        for folder in folders:
            if folder.name not in names:
                continue
            view = self.index.load()
            if (
                view is not None
                and view.artifact == self.reader.artifact
                and self._fresh(view, folder.name, folder.path)
            ):
                continue
            try:
                state = self._settle_one(folder.name, folder.path, tries=1)
                if state == "stale":
                    self._scan(folder.name, folder.path, [], [])
                elif state == "wait":
                    with self._mutex:
                        self._racy.add(folder.name)
            except OSError as error:
                _log.debug("jsonl index: cannot refresh %s: %s", folder.path, error)

    def settle(self) -> None:
        """At close: rewrite the racily clean folder states this store wrote, once the clock allows,
        and read again the folders it recorded sessions in without reading them (`create_folder`):
        what a process that does not take the index lock changed there during a creation is then
        in the index (docs/storage-format.md#parent-index)."""
        with self._mutex:
            racy, self._racy = self._racy, set()
            added, self._added = self._added, set()
        for name in sorted(racy | added):
            try:
                self._settle_one(name, os.path.join(self.root, name), tries=_SETTLE_TRIES, verify=name in added)
            except (OSError, SessionPersistenceError) as error:
                _log.debug("jsonl index: cannot settle %s: %s", name, error)

    def _settle_one(self, name: str, path: str, *, tries: int, verify: bool = False) -> _Refresh:
        state: _Refresh = "wait"
        for attempt in range(tries):
            if attempt:
                time.sleep(_SETTLE_PAUSE_S)
            state = self._refresh_racy(name, path, verify=verify)
            if state != "wait":
                break
        return state


def _log_path(directory: str) -> str:
    """The log of a session folder the index lists: the file there, else the default name (it vanished)."""
    for name in LOG_NAMES:
        path = os.path.join(directory, name)
        if os.path.lexists(path):
            return path
    return os.path.join(directory, LOG_NAMES[0])


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _only_one_added(pre: os.stat_result, post: os.stat_result) -> bool:
    """Whether a project folder whose `lstat` was `pre` before one subfolder was created in it, and
    is `post` now, changed by that creation alone, as far as its inode tells.

    Its modification time must have moved. Where the link count counts subfolders (2 plus one per
    subfolder: ext4, XFS, tmpfs ...) it must have grown by exactly one, so another process's session
    folder created in the same moment shows; where it does not (btrfs keeps 1) only the time is
    checked (docs/storage-format.md#parent-index).
    """
    if post.st_mtime_ns == pre.st_mtime_ns:
        return False
    return pre.st_nlink < 2 or post.st_nlink == pre.st_nlink + 1


def _stamp_after(writer: Writer, mtime_ns: int) -> int:
    """A write timestamp, retried a few times (microseconds each) until it is later than `mtime_ns`.

    A stamp in the folder's own clock tick is racily clean and not trusted by readers; filesystems
    with fine-grained timestamps give a later one on the next try, coarse ones may not (then the
    racy stamp is written and settled later).
    """
    written = writer.stamp()
    for _ in range(_STAMP_TRIES - 1):
        if written > mtime_ns:
            break
        written = writer.stamp()
    return written


def _entry_of(entry: os.DirEntry[str], kind: Kind, outcome: Outcome) -> Entry:
    if kind == "L" and isinstance(outcome, Listed):
        return listed_entry(entry.name, entry.inode(), outcome.header)
    return other_entry(entry.name, entry.inode(), kind)


def _collect(outcome: Outcome, read: list[Listed], damaged: list[DamagedSession]) -> None:
    if isinstance(outcome, Listed):
        read.append(outcome)
    elif outcome is not None:
        damaged.append(outcome)
