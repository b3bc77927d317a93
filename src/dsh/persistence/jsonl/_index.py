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
finds one folder's entries, or one id's copies, by searching the base the same way; only a rewrite
parses everything. `<root>.index/.lock` serialises writers (`flock`); its modification time, set
by the writer holding it, is the write's timestamp. `<root>.index/.tmp-<12 hex>` are the temp
files of atomic rewrites. Read-only backends never create, write or lock anything here.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import secrets
import stat
import threading
import time
import zlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final, Literal, NamedTuple

import orjson

from dsh.persistence.jsonl._files import FILE_MODE, FILE_READS
from dsh.session.header import SessionHeader

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
INDEX_VERSION: Final = 1
_MAGIC: Final = b"dsh-parent-index"
_DIR_MODE: Final = 0o700
_LOCK_NAME: Final = ".lock"
_TEMP_PREFIX: Final = ".tmp-"
_STALE_TEMP_NS: Final = 600 * 1_000_000_000
"""A temp file older than this (ten minutes) belongs to no write in progress and is swept."""
_MAX_UPDATES: Final = 64
"""Updates appended before the next write rewrites the file as one base (readers parse updates)."""
_MAX_UPDATE_ENTRIES: Final = 256
"""Entries the updates may carry in all before the next write rewrites the file as one base: a
reader parses every update entry, so they must stay few for its cost to follow the family."""
_SECTIONS: Final = (b"F", b"L", b"D", b"R", b"I", b"X")

Kind = Literal["L", "D", "R", "I"]
"""What one folder entry was when the index was written.

* `L` listed: a session folder (a real directory, not a symbolic link) whose log has a valid
  header; the entry carries its id, parent, origin and createdAt.
* `D` damaged: an entry the listing reports as damaged (unreadable or invalid header, a log that
  is not a regular file, an unreadable session folder ...); re-read by every filtered listing.
* `R` recheck: an entry whose state can change without its project folder changing (a session
  folder without a complete first record yet, a symbolic link); re-read by every filtered listing.
* `I` ignored: a plain file or other non-folder entry the listing skips.
"""

Entry = tuple[Any, ...]
"""One entry of a project folder: `(kind, name, inode)`, and for kind `L`
`("L", name, inode, session id, parentSession, origin, createdAt)`."""

KIND: Final = 0
NAME: Final = 1
INODE: Final = 2
SESSION_ID: Final = 3
PARENT: Final = 4


def indexable(folder: str) -> bool:
    """Whether a project folder can be indexed (a plain name; `.`-names are left to scans)."""
    return entry_name(folder) is not None and not folder.startswith(".")


def entry_name(name: object) -> str | None:
    """`name` when it can name an entry of a folder (a plain, non-empty file name), else None."""
    if type(name) is not str or not name or name in (".", "..") or "/" in name or "\x00" in name:
        return None
    return name


def listed_entry(name: str, inode: int, header: SessionHeader) -> Entry:
    """The `L` entry of a session folder whose log holds the validated logical `header`."""
    return ("L", name, inode, header.id, header.parent_session, header.origin, header.created_at)


def other_entry(name: str, inode: int, kind: Kind) -> Entry:
    """A `D`, `R` or `I` entry."""
    return (kind, name, inode)


# Private and built on a hot path, never handed out: a NamedTuple is the cheapest record to build
# (docs/architecture.md#import-cost).
class Stamp(NamedTuple):
    """The state of one project folder the index describes.

    Attributes:
        dev: The folder's device.
        mtime_ns: The folder's `st_mtime_ns` when its entries were looked at (read before).
        written_ns: The write's own timestamp, a time the filesystem gave before the folder was
            looked at (docs/storage-format.md#parent-index).
    """

    dev: int
    mtime_ns: int
    written_ns: int

    def fresh(self, st: os.stat_result) -> bool:
        """Whether the folder whose current `lstat` is `st` is still the folder this stamp describes.

        Fresh means: same device, the folder's modification time is exactly the recorded one, and
        the recorded time is strictly older than the write's timestamp. An entry added to or
        removed from the folder after the write's timestamp sets the folder's modification time to
        a time that is not older than the timestamp; the last condition (git's "racily clean"
        rule) refuses a folder modified in the same clock tick as the write, when a later change
        in that tick could leave the folder's time unchanged.
        """
        return st.st_dev == self.dev and st.st_mtime_ns == self.mtime_ns and self.mtime_ns < self.written_ns

    def racy(self) -> bool:
        """The folder's recorded time is not strictly older than the write (readers scan it)."""
        return self.mtime_ns >= self.written_ns

    def same_folder(self, st: os.stat_result) -> bool:
        """The folder still has the recorded device and time (fresh, or racily clean)."""
        return st.st_dev == self.dev and st.st_mtime_ns == self.mtime_ns


class IndexView:
    """One version of the index file, as a reader sees it (never changed; cached per file version).

    The base stays bytes and is searched; the updates (at most `_MAX_UPDATES` short lines) are
    parsed and overlay it. Search results are cached per view.

    Args:
        artifact: The log file name the index was built for.
        data: The file's bytes (the base is `data[bounds[0]:bounds[-1]]`).
        bounds: The absolute start of each base section (`_SECTIONS` order) and the base's end.
        stamps: The folder stamps of the base.
        dups: The duplicate ids of the base.
    """

    def __init__(
        self,
        artifact: str,
        data: bytes,
        bounds: tuple[int, ...],
        stamps: Mapping[str, Stamp],
        dups: Iterable[str],
    ) -> None:
        self.artifact = artifact
        self.data = data
        self.bounds = bounds
        self.stamps: dict[str, Stamp] = dict(stamps)
        self.dups: set[str] = set(dups)
        self.updates = 0
        self.update_entries = 0
        """Entries (changed or removed) the parsed updates carry in all."""
        self.size = bounds[-1]
        """How many bytes of the file this view has read (the base and every complete update)."""
        self.torn = False
        self._replaced: set[str] = set()
        self._overlay: dict[str, dict[str, Entry | None]] = {}
        self._by_parent: dict[object, list[tuple[str, str]]] = {}
        self._overlay_parents: dict[object, list[tuple[str, str]]] | None = None
        self._recheck: list[tuple[str, str]] | None = None
        self._full: dict[str, dict[str, Entry]] | None = None
        self._mutex = threading.Lock()

    def updated(self, update: Mapping[str, Any]) -> IndexView:
        """This view plus one appended update line (parsed JSON), without reading anything.

        Raises:
            ValueError, TypeError, KeyError, IndexError: The update is malformed.
        """
        view = IndexView(self.artifact, self.data, self.bounds, self.stamps, self.dups)
        view.updates = self.updates + 1
        view.size = self.size
        view._replaced = set(self._replaced)
        view._overlay = {folder: dict(entries) for folder, entries in self._overlay.items()}
        folder = _text(update["folder"])
        view.stamps[folder] = Stamp(_int(update["dev"]), _int(update["mtime"]), _int(update["written"]))
        overlay = view._overlay.setdefault(folder, {})
        replace = update["replace"] is True
        if replace:
            view._replaced.add(folder)
            overlay.clear()
        removed = [_text(name) for name in update["removed"]]
        entries = [_entry(raw) for raw in update["entries"]]
        view.update_entries = self.update_entries + len(removed) + len(entries)
        for name in removed:
            overlay[name] = None
        for entry in entries:
            overlay[entry[NAME]] = entry
        view.dups = {_text(session_id) for session_id in update["dups"]}
        if self._full is not None:
            full = dict(self._full)
            kept = {} if replace else dict(full.get(folder, {}))
            for name in removed:
                kept.pop(name, None)
            kept.update((entry[NAME], entry) for entry in entries)
            full[folder] = kept
            view._full = full
        return view

    def _from_base(self, folder: str, name: str) -> bool:
        """Whether the base's entry of `folder/name` still counts (no update replaced it)."""
        return folder not in self._replaced and name not in self._overlay.get(folder, {})

    def children(self, parent: str | None) -> list[tuple[str, str]]:
        """`(folder, name)` of every listed entry whose parent is `parent` (a binary search)."""
        with self._mutex:
            cached = self._by_parent.get(parent)
        if cached is not None:
            return cached
        found: list[tuple[str, str]] = []
        key = b"L\t" + orjson.dumps(parent) + b"\t"
        start, end = self.bounds[1], self.bounds[2]
        position = _first_at_least(self.data, start, end, key)
        while position < end and self.data.startswith(key, position):
            stop = self.data.find(b"\n", position, end)
            folder, name = _fields(self.data[position + len(key) : stop], 6)[:2]
            folder_name, entry = _text(orjson.loads(folder)), _text(orjson.loads(name))
            if self._from_base(folder_name, entry):
                found.append((folder_name, entry))
            position = stop + 1
        found.extend(self._updated_children().get(parent, ()))
        with self._mutex:
            self._by_parent[parent] = found
        return found

    def _updated_children(self) -> dict[object, list[tuple[str, str]]]:
        """The listed entries of the updates by parent, built once per view: a walk asks for many
        parents, and the updates may carry a few hundred entries."""
        with self._mutex:
            built = self._overlay_parents
        if built is not None:
            return built
        by_parent: dict[object, list[tuple[str, str]]] = {}
        for folder_name, overlay in self._overlay.items():
            for name, maybe in overlay.items():
                if maybe is not None and maybe[KIND] == "L":
                    by_parent.setdefault(maybe[PARENT], []).append((folder_name, name))
        with self._mutex:
            self._overlay_parents = by_parent
        return by_parent

    def recheck(self) -> list[tuple[str, str]]:
        """`(folder, name)` of every `D` and `R` entry (every filtered listing re-reads them)."""
        with self._mutex:
            cached = self._recheck
        if cached is not None:
            return cached
        found: list[tuple[str, str]] = []
        for line in _lines(self.data, self.bounds[2], self.bounds[4]):
            folder, name = (_text(orjson.loads(value)) for value in _fields(line[2:], 3)[:2])
            if self._from_base(folder, name):
                found.append((folder, name))
        for folder, overlay in self._overlay.items():
            found.extend(
                (folder, name) for name, maybe in overlay.items() if maybe is not None and maybe[KIND] in ("D", "R")
            )
        with self._mutex:
            self._recheck = found
        return found

    def full(self) -> dict[str, dict[str, Entry]]:
        """Every entry of every folder (parses the whole file: writers, and readers that scanned)."""
        with self._mutex:
            cached = self._full
        if cached is not None:
            return cached
        out: dict[str, dict[str, Entry]] = {folder: {} for folder in self.stamps}
        for line in _lines(self.data, self.bounds[1], self.bounds[5]):
            parsed = _base_entry(line)
            if parsed is None:
                raise ValueError("malformed index line")
            folder_name, entry = parsed
            if self._from_base(folder_name, entry[NAME]):
                out.setdefault(folder_name, {})[entry[NAME]] = entry
        for overlaid, overlay in self._overlay.items():
            entries = out.setdefault(overlaid, {})
            for entry_key, maybe in overlay.items():
                if maybe is None:
                    entries.pop(entry_key, None)
                else:
                    entries[entry_key] = maybe
        with self._mutex:
            self._full = out
        return out

    def folder_entries(self, folder: str) -> dict[str, Entry]:
        """Every entry of one folder, found by searching the base for the folder's name (a writer's
        update needs one folder, not the whole file)."""
        with self._mutex:
            full = self._full
        if full is not None:
            return dict(full.get(folder, {}))
        out: dict[str, Entry] = {}
        if folder not in self._replaced:
            key = orjson.dumps(folder)
            for line in _lines_holding(self.data, self.bounds[1], self.bounds[5], b"\t" + key + b"\t"):
                entry = _base_entry(line)
                if entry is not None and entry[0] == folder:
                    out[entry[1][NAME]] = entry[1]
        for name, maybe in self._overlay.get(folder, {}).items():
            if maybe is None:
                out.pop(name, None)
            else:
                out[name] = maybe
        return out

    def listed_copies(self, session_id: str) -> list[tuple[str, str]]:
        """`(folder, name)` of every listed entry of `session_id` (a search of the base, then the updates)."""
        found: list[tuple[str, str]] = []
        key = orjson.dumps(session_id)
        for line in _lines_holding(self.data, self.bounds[1], self.bounds[2], b"\t" + key + b"\t"):
            entry = _base_entry(line)
            if entry is not None and entry[1][SESSION_ID] == session_id and self._from_base(entry[0], entry[1][NAME]):
                found.append((entry[0], entry[1][NAME]))
        for folder, overlay in self._overlay.items():
            found.extend(
                (folder, name)
                for name, maybe in overlay.items()
                if maybe is not None and maybe[KIND] == "L" and maybe[SESSION_ID] == session_id
            )
        return found

    def set_full(self, full: dict[str, dict[str, Entry]]) -> None:
        """Record every entry when the caller already has them (a writer that just wrote the base)."""
        with self._mutex:
            self._full = full

    def copies(self) -> dict[str, list[tuple[str, str]]]:
        """Listed session id -> `(folder, name)` of each listed copy (from `full`)."""
        out: dict[str, list[tuple[str, str]]] = {}
        for folder, entries in self.full().items():
            for name, entry in entries.items():
                if entry[KIND] == "L":
                    out.setdefault(entry[SESSION_ID], []).append((folder, name))
        return out


# --------------------------------------------------------------------------------------------------
# Encoding and decoding


def encode_base(artifact: str, stamps: Mapping[str, Stamp], entries: Mapping[str, Mapping[str, Entry]]) -> bytes:
    """A whole index file: the first line, then the sorted sections of the base."""
    sections: dict[bytes, list[bytes]] = {kind: [] for kind in _SECTIONS}
    ids: dict[str, int] = {}
    for folder, stamp in stamps.items():
        key = orjson.dumps(folder)
        sections[b"F"].append(b"F\t%b\t%d\t%d\t%d" % (key, stamp.dev, stamp.mtime_ns, stamp.written_ns))
        for entry in entries.get(folder, {}).values():
            if entry[KIND] == "L":
                _, name, inode, session_id, parent, origin, created_at = entry
                line = b"L\t%b\t%b\t%b\t%d\t%b\t%b\t%d" % (
                    orjson.dumps(parent),
                    key,
                    orjson.dumps(name),
                    inode,
                    orjson.dumps(session_id),
                    orjson.dumps(origin),
                    created_at,
                )
                ids[session_id] = ids.get(session_id, 0) + 1
            else:
                line = b"%b\t%b\t%b\t%d" % (entry[KIND].encode(), key, orjson.dumps(entry[NAME]), entry[INODE])
            sections[line[:1]].append(line)
    sections[b"X"] = [b"X\t" + orjson.dumps(session_id) for session_id, count in ids.items() if count > 1]
    body: list[bytes] = []
    offsets: list[int] = []
    size = 0
    for kind in _SECTIONS:
        offsets.append(size)
        for line in sorted(sections[kind]):
            body.append(line + b"\n")
            size += len(line) + 1
    offsets.append(size)
    data = b"".join(body)
    head = b"\t".join(
        (
            _MAGIC,
            str(INDEX_VERSION).encode(),
            orjson.dumps(artifact),
            b"%08x" % zlib.crc32(data),
            orjson.dumps(offsets),
        )
    )
    return head + b"\n" + data


def encode_update(
    folder: str, stamp: Stamp, entries: Iterable[Entry], removed: Iterable[str], dups: Iterable[str], *, replace: bool
) -> bytes:
    """One appended update line: the folder's new stamp, its changed entries and the duplicate ids."""
    update = {
        "folder": folder,
        "dev": stamp.dev,
        "mtime": stamp.mtime_ns,
        "written": stamp.written_ns,
        "replace": replace,
        "entries": [list(entry) for entry in entries],
        "removed": list(removed),
        "dups": sorted(dups),
    }
    body = orjson.dumps(update)
    return b"U\t%08x\t%b\n" % (zlib.crc32(body), body)


def decode(data: bytes) -> IndexView | None:
    """Parse an index file; None when it is not one (damaged, foreign, another version).

    The base must match its checksum, so a damaged or edited base is never searched. Bytes after
    the last newline are a torn append and ignored: the file then describes the folder of that
    update as it was before, which is older than the folder and so not fresh.
    """
    first = data.find(b"\n")
    head = data[:first].split(b"\t") if first >= 0 else []
    if len(head) != 5 or head[0] != _MAGIC or head[1] != str(INDEX_VERSION).encode():
        return None
    try:
        artifact = _text(orjson.loads(head[2]))
        offsets = orjson.loads(head[4])
        if not isinstance(offsets, list) or len(offsets) != len(_SECTIONS) + 1:
            return None
        bounds = tuple(first + 1 + _int(offset) for offset in offsets)
        if list(bounds) != sorted(bounds) or bounds[-1] > len(data):
            return None
        if b"%08x" % zlib.crc32(data[bounds[0] : bounds[-1]]) != head[3]:
            return None
        stamps: dict[str, Stamp] = {}
        for line in _lines(data, bounds[0], bounds[1]):
            folder, dev, mtime_ns, written_ns = _fields(line[2:], 4)
            stamps[_text(orjson.loads(folder))] = Stamp(_int(dev), _int(mtime_ns), _int(written_ns))
        dups = [_text(orjson.loads(line[2:])) for line in _lines(data, bounds[5], bounds[6])]
        return _extend(IndexView(artifact, data, bounds, stamps, dups), data[bounds[-1] :])
    except (orjson.JSONDecodeError, ValueError, TypeError, KeyError, IndexError):
        return None


def _extend(view: IndexView, appended: bytes) -> IndexView:
    """`view` plus the update lines of `appended` (the file's bytes from `view.size` on).

    A torn last line (no newline yet) is left out and marks the view `torn`.

    Raises:
        orjson.JSONDecodeError, ValueError, TypeError, KeyError, IndexError: A malformed update.
    """
    end = appended.rfind(b"\n") + 1
    for line in _lines(appended, 0, end):
        kind, checksum, body = _fields(line, 3)
        if kind != b"U" or b"%08x" % zlib.crc32(body) != checksum:
            raise ValueError("not an update line, or a damaged one")
        update = orjson.loads(body)
        if not isinstance(update, dict):
            raise ValueError("not an update")
        view = view.updated(update)
    view.size += end
    view.torn = end < len(appended)
    return view


def _base_entry(line: bytes) -> tuple[str, Entry] | None:
    """`(folder, entry)` of one `L`, `D`, `R` or `I` line of the base, or None for another line.

    Raises:
        orjson.JSONDecodeError, ValueError: A malformed line.
    """
    kind = line[:1]
    if kind == b"L":
        parent, folder, name, inode, session_id, origin, created_at = _fields(line[2:], 7)
        entry: Entry = (
            "L",
            _text(orjson.loads(name)),
            _int(inode),
            _text(orjson.loads(session_id)),
            _optional_text(orjson.loads(parent)),
            _optional_text(orjson.loads(origin)),
            _int(created_at),
        )
    elif kind in (b"D", b"R", b"I"):
        folder, name, inode = _fields(line[2:], 3)
        entry = (kind.decode(), _text(orjson.loads(name)), _int(inode))
    else:
        return None
    return _text(orjson.loads(folder)), entry


def _lines_holding(data: bytes, start: int, end: int, needle: bytes) -> Iterator[bytes]:
    """Every line of `data[start:end]` that contains `needle` (each line once)."""
    position = data.find(needle, start, end)
    while position >= 0:
        line_start = data.rfind(b"\n", start, position) + 1
        line_start = max(line_start, start)
        line_end = data.find(b"\n", position, end)
        line_end = end if line_end < 0 else line_end
        yield data[line_start:line_end]
        position = data.find(needle, line_end, end)


def _first_at_least(data: bytes, lo: int, hi: int, key: bytes) -> int:
    """The start of the first line in `data[lo:hi]` (sorted lines) that is not below `key`, or `hi`."""
    while lo < hi:
        mid = (lo + hi) // 2
        start = max(lo, data.rfind(b"\n", lo, mid) + 1)
        stop = data.find(b"\n", start, hi)
        stop = hi if stop < 0 else stop
        if data[start:stop] < key:
            lo = stop + 1
        else:
            hi = start
    return lo


def _lines(data: bytes, start: int, end: int) -> Iterator[bytes]:
    """The lines of `data[start:end]` (which starts at a line and ends after a newline)."""
    position = start
    while position < end:
        stop = data.find(b"\n", position, end)
        if stop < 0:
            stop = end
        yield data[position:stop]
        position = stop + 1


def _fields(line: bytes, count: int) -> list[bytes]:
    parts = line.split(b"\t")
    if len(parts) != count:
        raise ValueError("malformed index line")
    return parts


def _text(value: object) -> str:
    if type(value) is not str:
        raise ValueError("not a string")
    return value


def _optional_text(value: object) -> str | None:
    return None if value is None else _text(value)


_INTEGER: Final = re.compile(rb"-?[0-9]+")


def _int(value: object) -> int:
    if isinstance(value, bytes):
        if not _INTEGER.fullmatch(value):
            raise ValueError("not an integer")
        return int(value)
    if type(value) is not int:
        raise ValueError("not an integer")
    return value


def _entry(raw: object) -> Entry:
    """An entry from an update line (checked: it came from a file)."""
    if not isinstance(raw, list) or not raw:
        raise ValueError("bad entry")
    kind = raw[0]
    if kind == "L" and len(raw) == 7:
        _, name, inode, session_id, parent, origin, created_at = raw
        return (
            "L",
            _text(name),
            _int(inode),
            _text(session_id),
            _optional_text(parent),
            _optional_text(origin),
            _int(created_at),
        )
    if kind in ("D", "R", "I") and len(raw) == 3:
        return (kind, _text(raw[1]), _int(raw[2]))
    raise ValueError("bad entry")


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
            return _extend(view, appended)
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
        one update line while the file has few updates carrying few entries; otherwise, or when `keep` (the folders
        to keep, besides `folder`) is given, the file is rewritten atomically (temp file, fsync,
        rename). An append is not fsynced: losing or tearing it leaves the file describing the
        folder as it was before, which is not fresh. Returns what the file now holds (built from
        what was written, without reading it back), or None when it could not be written.
        """
        try:
            current = view if view is not None and view.artifact == artifact else None
            appendable = current is not None and keep is None and current.updates < _MAX_UPDATES and not current.torn
            old = current.folder_entries(folder) if current is not None and appendable else {}
            changed = [entry for name, entry in entries.items() if old.get(name) != entry]
            removed = [name for name in old if name not in entries]
            if (
                current is not None
                and appendable
                and (current.update_entries + len(changed) + len(removed) <= _MAX_UPDATE_ENTRIES)
            ):
                dups = _dups_after(current, folder, old, entries)
                line = encode_update(folder, stamp, changed, removed, dups, replace=False)
                self._append(line)
                written = _extend(current, line)
            else:
                all_entries = {} if current is None else dict(current.full())
                all_entries[folder] = dict(entries)
                stamps = {} if current is None else dict(current.stamps)
                stamps[folder] = stamp
                if keep is not None:
                    kept = set(keep) | {folder}
                    all_entries = {name: value for name, value in all_entries.items() if name in kept}
                    stamps = {name: value for name, value in stamps.items() if name in kept}
                data = encode_base(artifact, stamps, all_entries)
                self._rewrite(data)
                decoded = decode(data)
                if decoded is None:
                    raise ValueError("the index just written does not decode")
                decoded.set_full(all_entries)
                written = decoded
            st = os.stat(self.path)
        except (OSError, ValueError, TypeError, KeyError, IndexError) as error:
            _log.debug("jsonl index: cannot write the index of %s: %s", folder, error)
            return None
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
