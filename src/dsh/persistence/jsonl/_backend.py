"""The JSONL storage backend (the default): one append-only file per session, zstd frames or plain lines.

Layer: persistence (private to `dsh.persistence.jsonl`). `JsonlBackend` implements the
`StorageBackend` hooks over a directory tree (docs/storage-format.md#jsonl-layout):
`<root>/<project key>/<encoded id>/session.jsonl.zstd` (or `session.jsonl`). The pure codec
(layout, encoding, framing, the scanner and its torn/corruption rules) lives in `_format`, the
blocking file primitives in `_files`; this module owns the backend: stable reads, durable
materialization (temp file + `fsync` + `os.link`), appends with rollback, repairs, the listing
walk, the writer locks and the detectors. Every blocking call (file I/O, zstd, scanning) runs in a worker
thread through `asyncio.to_thread`; the backend keeps no state that a restart would need, only an
`id -> path` cache and the next seq after its own writes, both verified on use.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

import zstandard

from dsh.errors import ConfigError
from dsh.json import FrozenDict, adopt
from dsh.persistence._faults import IOFaultSlot
from dsh.persistence._locks import WriterLocks, writer_active
from dsh.persistence.base import Capability, DamagedSession, Fence, Revision, StoredLog, TornMarker
from dsh.persistence.errors import (
    AppendConflictError,
    PersistenceClosedError,
    PersistenceIOError,
    SessionAlreadyExistsError,
    SessionCorruptionError,
    SessionFormatUnsupportedError,
    SessionNotFoundError,
    SessionPersistenceError,
    StoreMisconfiguredError,
)
from dsh.persistence.headers import read_stored_header
from dsh.persistence.jsonl._files import (
    TAIL_BYTES,
    Opener,
    append_durably,
    check_contiguous,
    check_flat,
    ensure_dir,
    fd_revision,
    flat_legacy_error,
    keep_torn_copy,
    link_new_file,
    path_exists,
    project_dirs,
    raw_open,
    read_head,
    read_revision_at,
    read_stable,
    regular_stat,
    remove_stale,
    revision_of,
    wrong_encoding_error,
)
from dsh.persistence.jsonl._format import (
    Compression,
    LogContext,
    artifact_name,
    check_identity,
    check_version,
    decode_header,
    decode_segment,
    encode_batch,
    encode_header,
    relative_path,
    scan_events,
    split_head,
)
from dsh.session.header import StoredHeaderError
from dsh.session.ids import encode_segment

__all__ = ["JsonlBackend"]


T = TypeVar("T")
V = TypeVar("V")

_TEMP_NAME: Final = re.compile(r"^session\.jsonl(?:\.zstd)?\.[0-9a-f]{12}\.tmp$")
_CAPABILITIES: Final = frozenset({Capability.ARTIFACT_PATHS})
_CACHE_LIMIT: Final = 4096


@dataclass(frozen=True, slots=True)
class _Tail:
    """What this instance knows about a log it read or wrote, valid while `revision` is current.

    Attributes:
        revision: The log's revision when this was recorded.
        next_seq: The seq the next batch must start at (after removing a torn tail, if any).
        torn_at: Where the torn tail starts, or None for a clean log.
    """

    revision: Revision
    next_seq: int
    torn_at: int | None


def _unreadable(path: str, what: str, error: OSError, session_id: str | None) -> DamagedSession:
    """A listing entry the OS refused to read (permissions, I/O): reported, never fatal."""
    reason = error.strerror or str(error)
    return DamagedSession(path, "PERSISTENCE_IO", f'cannot read {what} "{path}": {reason}', session_id)


def _bounded_put(cache: OrderedDict[str, V], key: str, value: V) -> None:
    """Insert as most recent and evict the oldest entries above `_CACHE_LIMIT` (caller holds the mutex)."""
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > _CACHE_LIMIT:
        cache.popitem(last=False)


class JsonlBackend:
    """JSONL session logs under one root directory; declares `ARTIFACT_PATHS` only.

    Without `TYPED_READS` it has no `load_typed`: a log is one file read whole, so the coordinator
    answers a typed `read_events` with a full `load` and filters it. It offers the
    `dsh.testing.IOFaultSeam` (`arm_io_fault`).

    Args:
        root: The store directory (default in the runtime: `$DSH_HOME/sessions`); made absolute once.
        compression: `"zstd"` (default: one checksummed frame per durable batch) or `"none"` (plain
            `.jsonl`). One root holds one encoding; the other encoding's artifacts are refused.
        zstd_level: The zstd compression level (1..22).
        opener: Replaces `open(path, "rb")` for every read, e.g. to count the bytes read.
        read_only: Never write: `open` sweeps no temp files, and every write, repair and writer
            lock is refused with `STORE_MISCONFIGURED` (docs/storage-format.md#read-only-opens).

    Raises:
        ConfigError: An invalid argument (`CONFIG_INVALID`).
    """

    name = "jsonl"

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        compression: Compression = "zstd",
        zstd_level: int = 3,
        opener: Opener | None = None,
        read_only: bool = False,
    ) -> None:
        if not isinstance(root, str | os.PathLike) or not os.fspath(root):
            raise ConfigError("root must be a non-empty path")
        if compression not in ("zstd", "none"):
            raise ConfigError(f'compression must be "zstd" or "none", got {compression!r}')
        if type(zstd_level) is not int or not 1 <= zstd_level <= 22:
            raise ConfigError("zstd_level must be an integer between 1 and 22")
        if opener is not None and not callable(opener):
            raise ConfigError("opener must be callable")
        if type(read_only) is not bool:
            raise ConfigError("read_only must be a bool")
        self.root = Path(os.path.abspath(os.path.expanduser(os.fspath(root))))
        self.compression: Compression = compression
        self.zstd_level = zstd_level
        self.capabilities: frozenset[Capability] = _CAPABILITIES
        self._root = str(self.root)
        self._opener: Opener = opener if opener is not None else raw_open
        self._artifact = artifact_name(compression)
        self._opposite = artifact_name("none" if compression == "zstd" else "zstd")
        self._locks = WriterLocks(Path(self._root + ".locks"))
        self._mutex = threading.Lock()
        # Both caches are bounded (least recently stored first out) and verified on every use.
        self._paths: OrderedDict[str, str] = OrderedDict()
        self._tails: OrderedDict[str, _Tail] = OrderedDict()
        self._local = threading.local()
        self._faults = IOFaultSlot()
        self._closed = False
        self.read_only = read_only

    def __repr__(self) -> str:
        return f"JsonlBackend(root={self._root!r}, compression={self.compression!r})"

    def _refuse_read_only(self, what: str) -> None:
        if self.read_only:
            raise StoreMisconfiguredError(
                f"cannot {what}: the session store {self._root} was opened read-only", location=self._root
            )

    # ---------------------------------------------------------------- plumbing

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking work in a worker thread, translating stray OS errors at this one boundary."""
        if self._closed:
            raise PersistenceClosedError("the jsonl backend is closed")
        try:
            return await asyncio.to_thread(fn, *args)
        except SessionPersistenceError:
            raise
        except OSError as error:
            raise PersistenceIOError(f"jsonl: {error}", location=error.filename) from error

    def _compressor(self) -> zstandard.ZstdCompressor:
        # A compressor is not thread-safe; each worker thread keeps its own.
        compressor: zstandard.ZstdCompressor | None = getattr(self._local, "compressor", None)
        if compressor is None:
            compressor = zstandard.ZstdCompressor(level=self.zstd_level, write_checksum=True)
            self._local.compressor = compressor
        return compressor

    def _frame(self, text: bytes) -> bytes:
        """Zstd: one independent, checksummed frame; raw: the text itself."""
        return self._compressor().compress(text) if self.compression == "zstd" else text

    def _relative(self, path: str) -> str:
        return os.path.relpath(path, self._root).replace(os.sep, "/")

    def _project_dirs(self) -> list[str]:
        return project_dirs(self._root)

    # ---------------------------------------------------------------- lifecycle

    async def open(self) -> None:
        """Check the root, refuse misconfigured stores and sweep stale temp files."""
        await self._run(self._open_sync)

    def _open_sync(self) -> None:
        # `project_dirs` refuses a root that is a file or unreadable; a missing root is fine. An
        # unreadable project or session folder is skipped here: the listing reports it as damaged.
        for project in self._project_dirs():
            try:
                entries = list(os.scandir(project))
            except OSError:
                continue
            for entry in entries:
                if entry.is_file(follow_symlinks=False):
                    if entry.name.endswith((".jsonl", ".jsonl.zstd")):
                        raise flat_legacy_error(entry.path)
                    continue
                if entry.is_dir(follow_symlinks=False):
                    self._sweep_session_dir(entry.path, entry.name)

    def _sweep_session_dir(self, directory: str, segment: str) -> None:
        try:
            names = os.listdir(directory)
        except OSError:
            return
        if self._opposite in names:
            raise wrong_encoding_error(os.path.join(directory, self._opposite), self.compression)
        stale = [name for name in names if _TEMP_NAME.match(name)]
        if self.read_only:
            return
        if stale and not writer_active(os.path.join(self._root + ".locks", f"{segment}.lock")):
            # A temp file of a process holding the session's writer lock may be about to be linked.
            remove_stale(directory, stale)

    async def close(self) -> None:
        """Release every writer lock; later calls raise `PERSISTENCE_CLOSED`."""
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(self._locks.release_all)

    # ---------------------------------------------------------------- lookup

    def locate(self, header: Mapping[str, Any]) -> str | None:
        """The artifact path a header names (id + cwd), without I/O; None for an unusable header."""
        session_id = header.get("id")
        cwd = header.get("cwd")
        if type(session_id) is not str or not session_id or (cwd is not None and type(cwd) is not str):
            return None
        return os.path.join(self._root, relative_path(session_id, cwd, self.compression))

    def _find(self, session_id: str) -> str | None:
        """The artifact of `session_id`: the cached path if it still exists, else a probe of every project.

        Raises:
            StoreMisconfiguredError: The id's artifact uses the other encoding or the flat layout.
            SessionCorruptionError: The id exists in several project directories.
        """
        with self._mutex:
            cached = self._paths.get(session_id)
        if cached is not None and path_exists(cached):
            return cached
        try:
            segment = encode_segment(session_id)
        except ValueError:
            return None
        found: list[str] = []
        for project in self._project_dirs():
            directory = os.path.join(project, segment)
            candidate = os.path.join(directory, self._artifact)
            try:
                # Anything at the artifact path is stored, even when it cannot be read: a directory
                # or a FIFO there is refused by the read (never opened), not reported as "not found".
                if path_exists(candidate):
                    found.append(candidate)
                elif path_exists(os.path.join(directory, self._opposite)):
                    raise wrong_encoding_error(os.path.join(directory, self._opposite), self.compression)
                check_flat(project, segment)
            except PermissionError:
                # An unreadable project folder hides nothing else: the listing reports it as damaged.
                continue
        if len(found) > 1:
            raise SessionCorruptionError(
                f'duplicate session id "{session_id}" in several project directories: {", ".join(sorted(found))}',
                session_id=session_id,
                location=found[0],
            )
        with self._mutex:
            if found:
                _bounded_put(self._paths, session_id, found[0])
            else:
                self._paths.pop(session_id, None)
        return found[0] if found else None

    async def exists(self, session_id: str) -> bool:
        """Whether a transcript is stored for the id (in any project directory)."""
        return await self._run(self._find, session_id) is not None

    # ---------------------------------------------------------------- reads

    async def read_revision(self, session_id: str) -> Revision | None:
        """The current revision: one stat plus the last 4 KiB (None when nothing is stored)."""
        return await self._run(self._read_revision_sync, session_id)

    def _read_revision_sync(self, session_id: str) -> Revision | None:
        path = self._find(session_id)
        return None if path is None else read_revision_at(self._opener, path)

    async def load(self, session_id: str) -> StoredLog | None:
        """Read and scan the whole log (nothing is modified; a torn tail is only reported)."""
        return await self._run(self._load_sync, session_id)

    def _load_sync(self, session_id: str) -> StoredLog | None:
        path = self._find(session_id)
        if path is None:
            return None
        try:
            return self._load_path(session_id, path)[0]
        except FileNotFoundError:
            # Removed between lookup and read: nothing is stored any more.
            return None

    def _load_path(self, session_id: str, path: str) -> tuple[StoredLog, _Tail]:
        """Read and scan one artifact; also returns (and remembers) what the next write needs."""
        data, st = read_stable(self._opener, path)
        ctx = LogContext(session_id, path)
        head = split_head(data, self.compression, ctx)
        if head is None:
            kind = "Zstandard session log" if self.compression == "zstd" else "session log"
            raise ctx.corrupt(f"empty or header-less {kind}")
        record = decode_header(head.line, ctx)
        check_version(record, ctx)
        check_identity(record, session_id, self._relative(path), self.compression, ctx)
        scan = scan_events(data, head.end, self.compression, ctx)
        revision = revision_of(st, data[-TAIL_BYTES:])
        torn = scan.torn
        committed = len(scan.events) - (len(torn.recovered_events) if torn is not None else 0)
        tail = _Tail(revision, committed, torn.truncate_to if torn is not None else None)
        self._remember(path, tail)
        log = StoredLog(
            header=record,
            events=scan.events,
            revision=revision,
            torn=torn,
            oversized_int_at=scan.oversized_int_at,
            location=path,
        )
        return log, tail

    # ---------------------------------------------------------------- listing

    async def list_headers(
        self, *, parent_session: str | None
    ) -> tuple[list[tuple[FrozenDict, Revision]], list[DamagedSession]]:
        """Header records and revisions from the first frame/line of each log."""
        return await self._run(self._list_sync, parent_session)

    def _list_sync(self, parent_session: str | None) -> tuple[list[tuple[FrozenDict, Revision]], list[DamagedSession]]:
        """Walk `root/*/*/`; every entry is isolated (docs/storage-format.md#damage-stays-visible).

        One unreadable project folder, session folder or log never fails the walk: it is reported
        in `damaged` and the walk goes on. Only a misconfigured store (the other encoding, the
        flat legacy layout, an unreadable root) fails the whole listing.
        """
        found: dict[str, list[tuple[dict[str, Any], Revision, str]]] = {}
        damaged: list[DamagedSession] = []
        for project in self._project_dirs():
            try:
                entries = list(os.scandir(project))
            except FileNotFoundError:
                continue
            except OSError as error:
                damaged.append(_unreadable(project, "project folder", error, None))
                continue
            for entry in entries:
                listed = self._list_entry(entry, damaged)
                if listed is not None:
                    record, revision, path = listed
                    found.setdefault(record["id"], []).append((record, revision, path))
        rows: list[tuple[FrozenDict, Revision]] = []
        for session_id, entries_for_id in found.items():
            if len(entries_for_id) > 1:
                paths = sorted(path for _, _, path in entries_for_id)
                message = f'duplicate session id "{session_id}" in several project directories: {", ".join(paths)}'
                damaged.extend(DamagedSession(path, "SESSION_CORRUPT", message, session_id) for path in paths)
                continue
            record, revision, path = entries_for_id[0]
            with self._mutex:
                _bounded_put(self._paths, session_id, path)
            if parent_session is not None and record.get("parentSession") != parent_session:
                continue
            rows.append((adopt(record), revision))  # type: ignore[arg-type]  # adopt of a dict is a FrozenDict
        rows.sort(key=lambda row: (row[0]["createdAt"], row[0]["id"]))
        return rows, damaged

    def _list_entry(
        self, entry: os.DirEntry[str], damaged: list[DamagedSession]
    ) -> tuple[dict[str, Any], Revision, str] | None:
        """One entry of a project folder: a listed header, or None (skipped or reported in `damaged`)."""
        if entry.is_file(follow_symlinks=False):
            if entry.name.endswith((".jsonl", ".jsonl.zstd")):
                raise flat_legacy_error(entry.path)
            return None
        try:
            # Followed like the lookup follows it: a session folder reached through a symbolic
            # link lists exactly as it reads.
            is_folder = entry.is_dir()
        except OSError:
            is_folder = False
        if not is_folder:
            return None
        folder_id = decode_segment(entry.name)
        try:
            names = os.listdir(entry.path)
        except FileNotFoundError:
            return None
        except OSError as error:
            damaged.append(_unreadable(entry.path, "session folder", error, folder_id))
            return None
        if self._opposite in names:
            raise wrong_encoding_error(os.path.join(entry.path, self._opposite), self.compression)
        if self._artifact not in names:
            return None
        path = os.path.join(entry.path, self._artifact)
        try:
            row = self._list_one(path)
        except (SessionCorruptionError, SessionFormatUnsupportedError, PersistenceIOError) as error:
            damaged.append(DamagedSession(path, error.code, error.message, folder_id))
            return None
        except OSError as error:
            # One unreadable log must not hide every other session: it is reported as damaged instead.
            damaged.append(_unreadable(path, "session log", error, folder_id))
            return None
        if row is None:
            return None
        record, revision = row
        return record, revision, path

    def _list_one(self, path: str) -> tuple[dict[str, Any], Revision] | None:
        """One listing row, None to skip; a complete but invalid header raises (reported as damaged)."""
        result = read_head(self._opener, path, self.compression)
        if result is None:
            return None
        head, _, revision = result
        if head is None:
            return None
        ctx = LogContext(None, path)
        record = decode_header(head.line, ctx)
        check_version(record, ctx)
        try:
            read_stored_header(record)
        except StoredHeaderError as error:
            raise ctx.corrupt(f"corrupt session log: invalid session header: {error}") from error
        check_identity(record, None, self._relative(path), self.compression, ctx)
        return record, revision

    # ---------------------------------------------------------------- writes

    def arm_io_fault(self, kind: str, error: BaseException) -> None:
        """Test support (`dsh.testing.IOFaultSeam`): fail the next append or repair from the inside.

        `partial-write` writes half of the batch, `sync` writes all of it and fails at `fsync`,
        `rollback` writes half and makes the rollback fail too. The batch is rolled back before
        `error` is raised (except for `rollback`, which reports the failed rollback).
        """
        self._faults.arm(kind, error)

    def _remember(self, path: str, tail: _Tail) -> None:
        with self._mutex:
            _bounded_put(self._tails, path, tail)

    async def append_batch(
        self, header: FrozenDict, events: Sequence[Mapping[str, Any]], *, materialized: bool, fence: Fence | None
    ) -> Revision:
        """Durably append one batch (one zstd frame); materialize header + batch when not yet stored."""
        self._refuse_read_only(f'write session "{header.get("id")}"')
        if materialized:
            return await self._run(self._append_sync, header, events)
        return await self._run(self._materialize_sync, header, events)

    def _materialize_sync(self, header: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> Revision:
        session_id = str(header["id"])
        path = self.locate(header)
        if path is None:
            raise SessionCorruptionError(
                f'session "{session_id}": header cannot name an artifact', session_id=session_id
            )
        directory = os.path.dirname(path)
        if path_exists(os.path.join(directory, self._opposite)):
            raise wrong_encoding_error(os.path.join(directory, self._opposite), self.compression)
        existing = self._find(session_id)
        if existing is not None:
            raise SessionAlreadyExistsError(
                f'refusing to materialize "{session_id}": a log already exists on disk (load/resume it instead)',
                session_id=session_id,
                location=existing,
            )
        if events and events[0]["seq"] != 0:
            raise AppendConflictError(
                f'first batch of session "{session_id}" must start at seq 0, got {events[0]["seq"]}',
                session_id=session_id,
                location=path,
            )
        body = encode_batch(events)
        data = self._frame(encode_header(header)) + (self._frame(body) if body else b"")
        ensure_dir(directory)
        try:
            st = link_new_file(path, data, self._faults.take())
        except FileExistsError as error:
            raise SessionAlreadyExistsError(
                f'refusing to materialize "{session_id}": a log already exists on disk (load/resume it instead)',
                session_id=session_id,
                location=path,
            ) from error
        revision = revision_of(st, data[-TAIL_BYTES:])
        with self._mutex:
            _bounded_put(self._paths, session_id, path)
        self._remember(path, _Tail(revision, len(events), None))
        return revision

    def _open_log(self, session_id: str) -> tuple[str, int]:
        path = self._find(session_id)
        if path is None:
            raise SessionNotFoundError(f'session "{session_id}" not found', session_id=session_id)
        try:
            regular_stat(path)
            return path, os.open(path, os.O_RDWR | os.O_APPEND | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError as error:
            raise SessionNotFoundError(f'session "{session_id}" not found', session_id=session_id) from error

    def _current_tail(self, session_id: str, path: str, fd: int) -> tuple[_Tail, os.stat_result]:
        """The verified tail state: this instance's memory if the revision still matches, else a rescan."""
        revision, st = fd_revision(fd)
        with self._mutex:
            known = self._tails.get(path)
        if known is not None and known.revision == revision:
            return known, st
        _, rescanned = self._load_path(session_id, path)  # someone else wrote: rescan
        return rescanned, os.fstat(fd)

    def _append_sync(self, header: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> Revision:
        session_id = str(header["id"])
        path, fd = self._open_log(session_id)
        try:
            tail, st = self._current_tail(session_id, path, fd)
            if not events:
                return tail.revision
            if tail.torn_at is not None:
                raise SessionCorruptionError(
                    f'cannot append to "{path}": the log ends in a torn tail; prepare the session to repair it',
                    session_id=session_id,
                    location=path,
                )
            check_contiguous(session_id, path, events, tail.next_seq)
            return self._write_batch(session_id, path, fd, (st.st_size, tail.next_seq), events)
        finally:
            os.close(fd)

    def _write_batch(
        self, session_id: str, path: str, fd: int, at: tuple[int, int], records: Sequence[Mapping[str, Any]]
    ) -> Revision:
        """Append one encoded batch at `at = (size, next_seq)`, all or nothing, and remember the new tail."""
        size, next_seq = at
        append_durably(
            fd, self._frame(encode_batch(records)), size, path=path, session_id=session_id, fault=self._faults.take()
        )
        revision, _ = fd_revision(fd)
        self._remember(path, _Tail(revision, next_seq + len(records), None))
        return revision

    async def commit_repair(
        self, header: FrozenDict, torn: TornMarker | None, closers: Sequence[Mapping[str, Any]], *, fence: Fence | None
    ) -> Revision:
        """Truncate the torn tail (fsync), then append recovered records + closers as one batch.

        A torn tail holding complete records is first copied beside the log
        (`<artifact>.torn-<epoch ms>`, fsynced), so the truncation destroys no record.
        See docs/storage-format.md#torn-tails-and-repair.
        """
        self._refuse_read_only(f'repair session "{header.get("id")}"')
        return await self._run(self._repair_sync, header, torn, closers)

    def _repair_sync(
        self, header: Mapping[str, Any], torn: TornMarker | None, closers: Sequence[Mapping[str, Any]]
    ) -> Revision:
        session_id = str(header["id"])
        path, fd = self._open_log(session_id)
        try:
            tail, st = self._current_tail(session_id, path, fd)
            expected_torn = torn.truncate_to if torn is not None else None
            if tail.torn_at != expected_torn:
                raise AppendConflictError(
                    f'cannot repair session "{session_id}": the log changed since it was read',
                    session_id=session_id,
                    location=path,
                )
            batch = [*(torn.recovered_events if torn is not None else ()), *closers]
            check_contiguous(session_id, path, batch, tail.next_seq)
            size = st.st_size
            if torn is not None:
                if torn.removed_records:
                    # The removed bytes hold complete records: keep them beside the log first.
                    keep_torn_copy(path, fd, torn.truncate_to, size)
                # Step 1 of 2: drop the torn fragment durably. A crash before step 2 leaves a clean
                # log that still needs its closers; the next prepare repairs it again (idempotent).
                os.ftruncate(fd, torn.truncate_to)
                os.fsync(fd)
                size = torn.truncate_to
            if batch:
                return self._write_batch(session_id, path, fd, (size, tail.next_seq), batch)
            revision, _ = fd_revision(fd)
            self._remember(path, _Tail(revision, tail.next_seq, None))
            return revision
        finally:
            os.close(fd)

    # ---------------------------------------------------------------- writer lock

    async def acquire(self, session_id: str) -> Fence | None:
        """Take the session's exclusive `flock` (`SESSION_LEASE_HELD` naming the holder); no fence."""
        self._refuse_read_only(f'take the writer lock of session "{session_id}"')
        await self._run(self._locks.acquire, session_id)
        return None

    async def release(self, session_id: str) -> None:
        """Drop the session's writer lock (no-op when not held)."""
        await asyncio.to_thread(self._locks.release, session_id)
