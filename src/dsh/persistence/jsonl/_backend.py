"""The JSONL storage backend (the default): one append-only file per session, zstd frames or plain lines.

Layer: persistence (private to `dsh.persistence.jsonl`). `JsonlBackend` implements the
`StorageBackend` hooks over a directory tree (docs/storage-format.md#jsonl-layout):
`<root>/<project key>/<encoded id>/session.jsonl.zstd` or `session.jsonl`, each log read and
appended to in the encoding its file name says, new logs written in the configured one. The pure codec
(layout, encoding, framing, the scanner and its torn/corruption rules) lives in `_format`, the
blocking file primitives in `_files`; this module owns the backend: stable reads, durable
materialization (temp file + `fsync` + `os.link`), appends with rollback, repairs, the listing
walk, the writer locks and the detectors. Every blocking call (file I/O, zstd, scanning) runs in a worker
thread through `asyncio.to_thread`; the backend keeps no state that a restart would need, only an
`id -> path` cache and the next seq after its own writes, both verified on use.
"""

from __future__ import annotations

import asyncio
import errno
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, NamedTuple, TypeVar

import zstandard

from dsh.errors import ConfigError
from dsh.json import FrozenDict, adopt
from dsh.persistence._locks import WriterLocks, writer_active
from dsh.persistence._workers import WriterThreads
from dsh.persistence.base import (
    Capability,
    DamagedSession,
    Fence,
    HeaderRow,
    ParentFilter,
    Revision,
    StoredLog,
    TornMarker,
)
from dsh.persistence.errors import (
    AppendConflictError,
    PersistenceClosedError,
    PersistenceIOError,
    SessionAlreadyExistsError,
    SessionCorruptionError,
    SessionNotFoundError,
    SessionPersistenceError,
    StoreMisconfiguredError,
)
from dsh.persistence.jsonl._files import (
    FILE_READS,
    LOG_NAMES,
    TAIL_BYTES,
    Opener,
    append_durably,
    check_contiguous,
    check_flat,
    fd_revision,
    flat_legacy_error,
    fsync_dir,
    keep_torn_copy,
    link_new_file,
    log_compression,
    log_in,
    make_dirs,
    path_exists,
    project_dirs,
    raw_open,
    read_revision_at,
    read_stable,
    regular_stat,
    remove_stale,
    revision_of,
    truncate_durably,
    write_and_sync,
)
from dsh.persistence.jsonl._format import (
    Compression,
    LogContext,
    artifact_name,
    check_identity,
    check_version,
    decode_header,
    encode_batch,
    encode_header,
    relative_path,
    split_head,
)
from dsh.persistence.jsonl._index import IndexFiles
from dsh.persistence.jsonl._listing import FolderReader, StoreListing
from dsh.persistence.jsonl._open_logs import OpenLog, OpenLogs
from dsh.persistence.jsonl._scan import scan_events
from dsh.session.ids import MAX_SEGMENT_BYTES, encode_segment

__all__ = ["JsonlBackend"]


T = TypeVar("T")
V = TypeVar("V")

_TEMP_NAME: Final = re.compile(r"^session\.jsonl(?:\.zstd)?\.[0-9a-f]{12}\.tmp$")
_CAPABILITIES: Final = frozenset({Capability.ARTIFACT_PATHS, Capability.EAGER_APPENDS})
_WRITER_THREADS: Final = 4
"""Writer threads per backend: one session's appends always run on the same one (`WriterThreads`)."""
_CACHE_LIMIT: Final = 4096


# Private and built on a hot path, never handed out: a NamedTuple is the cheapest record to build
# (docs/architecture.md#import-cost).
class _Tail(NamedTuple):
    """What this instance knows about a log it read or wrote, valid while `revision` is current.

    Attributes:
        revision: The log's revision when this was recorded.
        next_seq: The seq the next batch must start at (after removing a torn tail, if any).
        torn_at: Where the torn tail starts, or None for a clean log.
    """

    revision: Revision
    next_seq: int
    torn_at: int | None


def _bounded_put(cache: OrderedDict[str, V], key: str, value: V) -> None:
    """Insert as most recent and evict the oldest entries above `_CACHE_LIMIT` (caller holds the mutex)."""
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > _CACHE_LIMIT:
        cache.popitem(last=False)


class JsonlBackend:
    """JSONL session logs under one root directory; declares `ARTIFACT_PATHS` and `EAGER_APPENDS`.

    Without `TYPED_READS` it has no `load_typed`: a log is one file read whole, so the coordinator
    answers a typed `read_events` with a full `load` and filters it. Every durable write goes through
    two private primitives, `_write_and_sync` (write + fsync) and `_truncate_durably` (the rollback of
    a failed append), which tests replace on one instance to fail a write from the inside
    (`dsh.testing.io_faults`).

    Args:
        root: The store directory (default in the runtime: `$DSH_HOME/sessions`); made absolute once.
        compression: The encoding of the logs this backend creates: `"zstd"` (default, one
            checksummed frame per durable batch, `session.jsonl.zstd`) or `"none"` (plain lines,
            `session.jsonl`). An existing log is read and appended to in its own encoding, taken
            from its file name, so one root may hold both.
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
        self._locks = WriterLocks(Path(self._root + ".locks"))
        self._listing = StoreListing(
            self._root,
            FolderReader(self._opener),
            IndexFiles(self._root + ".index", writable=not read_only),
        )
        self._mutex = threading.Lock()
        # Both caches are bounded (least recently stored first out) and verified on every use.
        self._paths: OrderedDict[str, str] = OrderedDict()
        self._tails: OrderedDict[str, _Tail] = OrderedDict()
        # Write descriptors of the logs this process writes, kept while their writer lock is held.
        self._open_logs = OpenLogs()
        self._writers = WriterThreads("dsh-jsonl-writer", _WRITER_THREADS)
        self._local = threading.local()
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

    def _frame(self, text: bytes, compression: Compression) -> bytes:
        """Zstd: one independent, checksummed frame; raw: the text itself."""
        return self._compressor().compress(text) if compression == "zstd" else text

    def _relative(self, path: str) -> str:
        """`path` relative to the root, `/`-separated (the artifact paths this backend builds are below it)."""
        prefix = self._root + os.sep
        relative = path[len(prefix) :] if path.startswith(prefix) else os.path.relpath(path, self._root)
        return relative.replace(os.sep, "/")

    def _project_dirs(self) -> list[str]:
        return project_dirs(self._root)

    # ---------------------------------------------------------------- lifecycle

    async def open(self) -> None:
        """Check the root, refuse misconfigured stores, sweep stale temp files; a writing open also
        brings the parent index up to date (docs/storage-format.md#parent-index)."""
        await self._run(self._open_sync)
        if not self.read_only:
            await self._run(self._listing.refresh)

    def _open_sync(self) -> None:
        # `project_entries` refuses a root that is a file or unreadable; a missing root is fine. An
        # unreadable project or session folder is skipped here: the listing reports it as damaged.
        # A project folder the parent index describes freshly has changed no entry since the index
        # looked at it, so only its entries still being created (or damaged) can hold a crash's temp
        # file or a new log: only those are looked at (docs/storage-format.md#parent-index).
        for project, pending in self._listing.open_plan():
            if pending is not None:
                for name in pending:
                    directory = os.path.join(project, name)
                    if os.path.isdir(directory) and not os.path.islink(directory):
                        self._sweep_session_dir(directory, name)
                continue
            FILE_READS.add("folder")
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
        if not self.read_only:
            # Indexes written within the folder's clock tick are rewritten once the clock moved on.
            await asyncio.to_thread(self._listing.settle)
        await asyncio.to_thread(self._close_sync)

    def _close_sync(self) -> None:
        self._writers.close()
        for log in self._open_logs.pop_all():
            self._remember(log.path, _Tail(log.revision, log.next_seq, None))
        self._locks.release_all()

    # ---------------------------------------------------------------- lookup

    def locate(self, header: Mapping[str, Any]) -> str | None:
        """The artifact path a header names (id + cwd), without I/O; None for an unusable header.

        The log this instance last found or wrote for the id when it is in the folder the header
        names (it may be of either encoding); otherwise the path a new log gets.
        """
        session_id = header.get("id")
        cwd = header.get("cwd")
        if type(session_id) is not str or not session_id or (cwd is not None and type(cwd) is not str):
            return None
        path = os.path.join(self._root, relative_path(session_id, cwd, self.compression))
        with self._mutex:
            known = self._paths.get(session_id)
        if known is not None and os.path.dirname(known) == os.path.dirname(path):
            return known
        return path

    def _find(self, session_id: str) -> str | None:
        """The artifact of `session_id`: the cached path if it still exists, else a probe of every project.

        Raises:
            StoreMisconfiguredError: The id's artifact uses the flat layout.
            SessionCorruptionError: The id exists in several project directories, or its session
                folder holds a log of each encoding.
        """
        with self._mutex:
            cached = self._paths.get(session_id)
        if cached is not None and path_exists(cached):
            return cached
        try:
            segment = encode_segment(session_id)
        except ValueError:
            return None
        if len(segment) > MAX_SEGMENT_BYTES:
            # No folder can carry this name, so nothing is stored under the id: "not found", never
            # the file system's "file name too long".
            return None
        found: list[str] = []
        for project in self._project_dirs():
            directory = os.path.join(project, segment)
            try:
                # Anything at a log's path is stored, even when it cannot be read: a directory or a
                # FIFO there is refused by the read (never opened), not reported as "not found".
                present = [name for name in LOG_NAMES if path_exists(os.path.join(directory, name))]
                candidate = log_in(directory, present, session_id)
                if candidate is not None:
                    found.append(candidate)
                check_flat(project, segment)
            except PermissionError:
                # An unreadable project folder hides nothing else: the listing reports it as damaged.
                continue
            except OSError as error:
                if error.errno == errno.ENAMETOOLONG:
                    continue  # a flat-file name this long cannot exist either
                # A session folder that is a symbolic link loop, say: stored, but it cannot be read.
                raise PersistenceIOError(
                    f'cannot read session folder "{directory}": {error.strerror or error}',
                    session_id=session_id,
                    location=directory,
                ) from error
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
        compression = log_compression(path)
        head = split_head(data, compression, ctx)
        if head is None:
            kind = "Zstandard session log" if compression == "zstd" else "session log"
            raise ctx.corrupt(f"empty or header-less {kind}")
        record = decode_header(head.line, ctx)
        check_version(record, ctx)
        check_identity(record, session_id, self._relative(path), compression, ctx)
        scan = scan_events(data, head.end, compression, ctx)
        revision = revision_of(st, data[-TAIL_BYTES:])
        torn = scan.torn
        committed = len(scan.records) - (len(torn.recovered_events) if torn is not None else 0)
        tail = _Tail(revision, committed, torn.truncate_to if torn is not None else None)
        self._remember(path, tail)
        log = StoredLog(
            header=record,
            events=scan.records,
            revision=revision,
            torn=torn,
            oversized_int_at=scan.oversized_int_at,
            location=path,
            verdicts=scan.verdicts,
            viewable=True,
        )
        return log, tail

    # ---------------------------------------------------------------- listing

    async def list_headers(
        self, *, parents: ParentFilter | None = None
    ) -> tuple[list[HeaderRow], list[DamagedSession]]:
        """Header records and revisions from the first frame/line of each log, each header validated once.

        Without `parents` every project folder is scanned. With it, a project folder whose parent
        index is fresh costs only the headers of the sessions it names under those parents plus
        the entries every listing re-reads; other folders are scanned
        (docs/storage-format.md#parent-index). One unreadable project folder, session folder or log
        never fails the walk (docs/storage-format.md#damage-stays-visible): it is reported in
        `damaged`, which always covers the whole store. Only a misconfigured store (the other
        encoding, the flat legacy layout, an unreadable root) fails the whole listing.
        """
        return await self._run(self._list_sync, parents)

    def _list_sync(self, parents: ParentFilter | None) -> tuple[list[HeaderRow], list[DamagedSession]]:
        if parents is not None:
            # A parent id no stored header can hold (a lone surrogate from a command line that was
            # not UTF-8) has no children; it is dropped here, so it never reaches the index search.
            parents = frozenset(parent for parent in parents if parent is None or _storable(parent))
        listed, damaged = self._listing.headers(parents)
        with self._mutex:
            for item in listed:
                _bounded_put(self._paths, item.header.id, item.path)
        # `adopt` of a dict is a FrozenDict; the header was validated once, while listing.
        rows = [
            HeaderRow(adopt(item.record), item.revision, item.header)  # type: ignore[arg-type]
            for item in listed
        ]
        return rows, damaged

    # ---------------------------------------------------------------- writes

    # The two steps of every durable write (`_files.append_durably`, `_files.link_new_file`), kept as
    # class attributes so that a test can replace them on one instance (`dsh.testing.io_faults`).
    _write_and_sync = staticmethod(write_and_sync)
    _truncate_durably = staticmethod(truncate_durably)

    def _remember(self, path: str, tail: _Tail) -> None:
        with self._mutex:
            _bounded_put(self._tails, path, tail)

    async def append_batch(
        self, header: FrozenDict, events: Sequence[Mapping[str, Any]], *, materialized: bool, fence: Fence | None
    ) -> Revision:
        """Durably append one batch (one zstd frame); materialize header + batch when not yet stored."""
        if self.read_only:
            self._refuse_read_only(f'write session "{header.get("id")}"')
        if materialized:
            return await self._run(self._append_sync, header, events)
        return await self._run(self._materialize_sync, header, events)

    def start_append(
        self,
        header: FrozenDict,
        events: Sequence[Mapping[str, Any]],
        *,
        fence: Fence | None,
        done: Callable[[BaseException | None], object],
    ) -> None:
        """`EagerAppends`: queue the batch on the session's writer thread now; `done(error)` runs on the loop.

        The same append as `append_batch(..., materialized=True)`, without a task or a future chain
        around it (docs/architecture.md#from-append-to-the-acknowledgement).

        Raises:
            PersistenceClosedError: The backend is closed.
            StoreMisconfiguredError: The backend was opened read-only.
        """
        if self._closed:
            raise PersistenceClosedError("the jsonl backend is closed")
        if self.read_only:
            self._refuse_read_only(f'write session "{header.get("id")}"')
        loop = asyncio.get_running_loop()
        self._writers.submit(str(header["id"]), self._append_translated, (header, events), loop, done)

    def _append_translated(self, header: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> Revision:
        """`_append_sync` with stray OS errors translated, as `_run` does for awaited calls."""
        try:
            return self._append_sync(header, events)
        except SessionPersistenceError:
            raise
        except OSError as error:
            raise PersistenceIOError(f"jsonl: {error}", location=error.filename) from error

    def _materialize_sync(self, header: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> Revision:
        session_id = str(header["id"])
        path = self.locate(header)
        if path is None:
            raise SessionCorruptionError(
                f'session "{session_id}": header cannot name an artifact', session_id=session_id
            )
        directory = os.path.dirname(path)
        # A new log is written in the configured encoding, whatever `locate` remembered.
        path = os.path.join(directory, artifact_name(self.compression))
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
        compression = self.compression
        data = self._frame(encode_header(header), compression) + (self._frame(body, compression) if body else b"")
        project = os.path.dirname(directory)
        name = os.path.basename(directory)
        # The session folder is created under the parent index's lock, which records it without
        # reading the project folder. The new folders are made durable after the log (before this
        # returns): the log's fsync then commits their creation too, and their own fsyncs find
        # nothing left to write on a journaling filesystem.
        created = self._listing.create_folder(project, name, lambda: make_dirs(directory))
        try:
            st = link_new_file(path, data, self._write_and_sync)
        except FileExistsError as error:
            raise SessionAlreadyExistsError(
                f'refusing to materialize "{session_id}": a log already exists on disk (load/resume it instead)',
                session_id=session_id,
                location=path,
            ) from error
        for folder_path in reversed(created):
            fsync_dir(os.path.dirname(folder_path))
        revision = revision_of(st, data[-TAIL_BYTES:])
        with self._mutex:
            _bounded_put(self._paths, session_id, path)
        self._remember(path, _Tail(revision, len(events), None))
        self._keep_open(session_id, path, st=st, next_seq=len(events), data=data, revision=revision)
        folder = _lstat(directory)
        if folder is not None:
            self._listing.note_materialized(project, name, header, folder.st_ino)
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
        log = self._open_logs.get(session_id)
        if log is not None:
            if log.unchanged():
                # The common case: the file is exactly as this process's last write left it.
                if not events:
                    return log.revision
                check_contiguous(session_id, log.path, events, log.next_seq)
                return self._write_open(session_id, log, events)
            self._drop_open(session_id)
        path, fd = self._open_log(session_id)
        kept = False
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
            revision = self._write_batch(session_id, path, fd, (st.st_size, tail.next_seq), events)
            kept = True
            return revision
        finally:
            if not kept:
                os.close(fd)

    def _write_batch(
        self, session_id: str, path: str, fd: int, at: tuple[int, int], records: Sequence[Mapping[str, Any]]
    ) -> Revision:
        """Append one encoded batch at `at = (size, next_seq)`, all or nothing; then keep `fd` open for
        the next batch (the caller must not close it once this returned)."""
        size, next_seq = at
        data = self._frame(encode_batch(records), log_compression(path))
        append_durably(
            fd,
            data,
            size,
            path=path,
            session_id=session_id,
            write=self._write_and_sync,
            truncate=self._truncate_durably,
        )
        st = os.fstat(fd)
        tail = os.pread(fd, TAIL_BYTES, max(st.st_size - TAIL_BYTES, 0))
        revision = revision_of(st, tail)
        self._open_logs.put(
            session_id, OpenLog(path, fd, st=st, next_seq=next_seq + len(records), tail=tail, revision=revision)
        )
        return revision

    def _write_open(self, session_id: str, log: OpenLog, records: Sequence[Mapping[str, Any]]) -> Revision:
        """Append one batch through a kept descriptor whose file was just verified unchanged."""
        data = self._frame(encode_batch(records), log_compression(log.path))
        try:
            append_durably(
                log.fd,
                data,
                log.size,
                path=log.path,
                session_id=session_id,
                write=self._write_and_sync,
                truncate=self._truncate_durably,
            )
        except BaseException:
            # Rolled back, but the file's times changed: the next append opens and checks afresh.
            self._drop_open(session_id)
            raise
        st = os.fstat(log.fd)
        revision = revision_of(st, (log.tail + data)[-TAIL_BYTES:])
        log.advance(st, len(records), data, revision)
        return revision

    def _keep_open(
        self, session_id: str, path: str, *, st: os.stat_result, next_seq: int, data: bytes, revision: Revision
    ) -> None:
        """Open a freshly materialized log for appending (best effort: a failure only costs speed)."""
        try:
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return
        self._open_logs.put(session_id, OpenLog(path, fd, st=st, next_seq=next_seq, tail=data, revision=revision))

    def _drop_open(self, session_id: str) -> None:
        """Close the id's kept descriptor, remembering its state for the next verified open."""
        log = self._open_logs.pop(session_id)
        if log is not None:
            self._remember(log.path, _Tail(log.revision, log.next_seq, None))

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
        self._drop_open(session_id)
        path, fd = self._open_log(session_id)
        kept = False
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
                revision = self._write_batch(session_id, path, fd, (size, tail.next_seq), batch)
                kept = True
                return revision
            revision, _ = fd_revision(fd)
            self._remember(path, _Tail(revision, tail.next_seq, None))
            return revision
        finally:
            if not kept:
                os.close(fd)

    # ---------------------------------------------------------------- writer lock

    async def acquire(self, session_id: str) -> Fence | None:
        """Take the session's exclusive `flock` (`SESSION_LEASE_HELD` naming the holder); no fence."""
        self._refuse_read_only(f'take the writer lock of session "{session_id}"')
        await self._run(self._locks.acquire, session_id)
        return None

    async def release(self, session_id: str) -> None:
        """Drop the session's writer lock (no-op when not held) and close its kept log descriptor."""
        await asyncio.to_thread(self._release_sync, session_id)

    def _release_sync(self, session_id: str) -> None:
        self._drop_open(session_id)
        self._locks.release(session_id)


def _storable(text: str) -> bool:
    """Whether `text` can appear in a stored header (it is valid UTF-8: no lone surrogate)."""
    if text.isascii():  # a flag of the string: no scan
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


# Shown under the name users import (docs/architecture.md#public-names).
JsonlBackend.__module__ = "dsh"
