"""The JSONL parent index file's format: entries, folder stamps, the searched view, encoding and folding.

Layer: persistence (private to `dsh.persistence.jsonl`; pure functions and immutable views, no I/O).
`dsh.persistence.jsonl._index` describes the file (docs/storage-format.md#parent-index) and owns
its reads and writes; this module is what a version of the file *is*: `IndexView` searches one
version without parsing the entries it is not asked about, `encode_base`/`encode_update` write a
base and an update line, `decode` reads a file, and `fold` writes a new base from an old one plus
its updates (and a writer's changes) while copying the lines of untouched folders as bytes.
"""

from __future__ import annotations

import os
import re
import threading
import zlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final, Literal, NamedTuple

import orjson

from dsh.session.header import SessionHeader

__all__ = [
    "INDEX_VERSION",
    "INODE",
    "KIND",
    "NAME",
    "PARENT",
    "SESSION_ID",
    "Entry",
    "IndexView",
    "Kind",
    "Stamp",
    "decode",
    "encode_base",
    "encode_update",
    "entry_name",
    "extend",
    "indexable",
    "listed_entry",
    "other_entry",
]

INDEX_VERSION: Final = 1
_MAGIC: Final = b"dsh-parent-index"
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


class _ParsedBase:
    """The entries of one base, parsed on first use and shared by every view of that base."""

    __slots__ = ("_entries", "_mutex")

    def __init__(self) -> None:
        self._entries: dict[str, dict[str, Entry]] | None = None
        self._mutex = threading.Lock()

    def entries(self, data: bytes, bounds: tuple[int, ...]) -> dict[str, dict[str, Entry]]:
        """Folder -> name -> entry of every base line (never changed once built).

        Raises:
            ValueError: A malformed line.
        """
        with self._mutex:
            if self._entries is not None:
                return self._entries
            out: dict[str, dict[str, Entry]] = {}
            for line in _lines(data, bounds[1], bounds[5]):
                parsed = _base_entry(line)
                if parsed is None:
                    raise ValueError("malformed index line")
                folder, entry = parsed
                out.setdefault(folder, {})[entry[NAME]] = entry
            self._entries = out
            return out


class IndexView:
    """One version of the index file, as a reader sees it (never changed; cached per file version).

    The base stays bytes and is searched; the updates (a bounded number of short lines) are
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
        self._base = _ParsedBase()
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
        view._base = self._base  # the same base: parsed at most once for every view of it
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
        """Every entry of every folder (the base is parsed once; writers' and scanning readers' need).

        The entries of a folder no update touched are the parsed base's own mapping, shared: read
        them, never change them.
        """
        with self._mutex:
            cached = self._full
        if cached is not None:
            return cached
        base = self._base.entries(self.data, self.bounds)
        out: dict[str, dict[str, Entry]] = {}
        for folder in (*self.stamps, *base, *self._overlay):
            if folder in out:
                continue
            entries = {} if folder in self._replaced else base.get(folder, {})
            overlay = self._overlay.get(folder)
            if overlay:
                entries = dict(entries)
                for name, maybe in overlay.items():
                    if maybe is None:
                        entries.pop(name, None)
                    else:
                        entries[name] = maybe
            out[folder] = entries
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

    def entry(self, folder: str, name: str) -> Entry | None:
        """The entry `name` of `folder`, or None: the updates first, then a search of the base."""
        overlay = self._overlay.get(folder)
        if overlay is not None and name in overlay:
            return overlay[name]
        if folder in self._replaced:
            return None
        with self._mutex:
            full = self._full
        if full is not None:
            return full.get(folder, {}).get(name)
        needle = b"\t" + orjson.dumps(folder) + b"\t" + orjson.dumps(name) + b"\t"
        for line in _lines_holding(self.data, self.bounds[1], self.bounds[5], needle):
            parsed = _base_entry(line)
            if parsed is not None and parsed[0] == folder and parsed[1][NAME] == name:
                return parsed[1]
        return None

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

    def fold(
        self,
        stamps: Mapping[str, Stamp],
        changes: Mapping[str, Mapping[str, Entry | None]],
        *,
        replaced: Iterable[str] = (),
        keep: Iterable[str] | None = None,
    ) -> bytes:
        """A new whole index file: this view's base with its updates and then `changes` folded in.

        `changes` maps a folder to the entries that changed, by name (None: the entry went away); a
        folder in `replaced` first loses every entry it had. `stamps` are the folders' stamps after the
        change, and `keep` (when given) the folders to keep. Every line of the base is copied as bytes
        or dropped, never decoded (the names the changes touch are compared in their JSON spelling),
        so a rewrite costs a split of each line and a sort, not a parse of the whole file. The
        duplicate ids are counted again from every listed line.
        """
        gone = set(self._replaced) | set(replaced)
        overlay: dict[str, dict[str, Entry | None]] = {folder: dict(names) for folder, names in self._overlay.items()}
        for folder in replaced:
            overlay[folder] = {}
        for folder, names in changes.items():
            overlay.setdefault(folder, {}).update(names)
        kept = None if keep is None else set(keep)
        # Folder and entry names as their lines spell them (this module writes every line with
        # `orjson.dumps`), so the lines of untouched entries are compared as bytes, never decoded.
        dropped = {orjson.dumps(folder) for folder in gone}
        changed_names = {
            orjson.dumps(folder): {orjson.dumps(name) for name in names}
            for folder, names in overlay.items()
            if folder not in gone
        }
        kept_keys = None if kept is None else {orjson.dumps(folder) for folder in kept}
        sections: dict[bytes, list[bytes]] = {kind: [] for kind in _SECTIONS}
        ids: dict[bytes, int] = {}
        data, bounds = self.data, self.bounds
        for index, kind in enumerate(_SECTIONS[1:5], start=1):
            start, end = bounds[index], bounds[index + 1]
            if start == end:
                continue
            out = sections[kind]
            listed = kind == b"L"
            for line in data[start : end - 1].split(b"\n"):
                fields = line.split(b"\t")
                folder_key, name_key = (fields[2], fields[3]) if listed else (fields[1], fields[2])
                if kept_keys is not None and folder_key not in kept_keys:
                    continue
                if folder_key in dropped:
                    continue
                spelled = changed_names.get(folder_key)
                if spelled is not None and name_key in spelled:
                    continue
                out.append(line)
                if listed:
                    ids[fields[5]] = ids.get(fields[5], 0) + 1
        for folder, names in overlay.items():
            if kept is not None and folder not in kept:
                continue
            key = orjson.dumps(folder)
            for entry in names.values():
                if entry is None:
                    continue
                line = _entry_line(key, entry)
                sections[line[:1]].append(line)
                if entry[KIND] == "L":
                    session_key = orjson.dumps(entry[SESSION_ID])
                    ids[session_key] = ids.get(session_key, 0) + 1
        sections[b"F"] = [
            _stamp_line(orjson.dumps(folder), stamp)
            for folder, stamp in stamps.items()
            if kept is None or folder in kept
        ]
        sections[b"X"] = [b"X\t" + key for key, count in ids.items() if count > 1]
        return _assemble(self.artifact, sections)

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
    ids: dict[bytes, int] = {}
    for folder, stamp in stamps.items():
        key = orjson.dumps(folder)
        sections[b"F"].append(_stamp_line(key, stamp))
        for entry in entries.get(folder, {}).values():
            line = _entry_line(key, entry)
            if entry[KIND] == "L":
                session_key = orjson.dumps(entry[SESSION_ID])
                ids[session_key] = ids.get(session_key, 0) + 1
            sections[line[:1]].append(line)
    sections[b"X"] = [b"X\t" + key for key, count in ids.items() if count > 1]
    return _assemble(artifact, sections)


def _stamp_line(key: bytes, stamp: Stamp) -> bytes:
    return b"F\t%b\t%d\t%d\t%d" % (key, stamp.dev, stamp.mtime_ns, stamp.written_ns)


def _entry_line(key: bytes, entry: Entry) -> bytes:
    """The base line of one entry of the folder whose JSON-encoded name is `key`."""
    if entry[KIND] == "L":
        _, name, inode, session_id, parent, origin, created_at = entry
        return b"L\t%b\t%b\t%b\t%d\t%b\t%b\t%d" % (
            orjson.dumps(parent),
            key,
            orjson.dumps(name),
            inode,
            orjson.dumps(session_id),
            orjson.dumps(origin),
            created_at,
        )
    return b"%b\t%b\t%b\t%d" % (entry[KIND].encode(), key, orjson.dumps(entry[NAME]), entry[INODE])


def _assemble(artifact: str, sections: Mapping[bytes, list[bytes]]) -> bytes:
    """The file: the first line (magic, version, artifact, checksum, offsets), then each section sorted."""
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
        return extend(IndexView(artifact, data, bounds, stamps, dups), data[bounds[-1] :])
    except (orjson.JSONDecodeError, ValueError, TypeError, KeyError, IndexError):
        return None


def extend(view: IndexView, appended: bytes) -> IndexView:
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
