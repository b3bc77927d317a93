"""Blocking file primitives of the JSONL backend: stable reads, revisions and durable writes.

Layer: persistence (private to `dsh.persistence.jsonl`; called from the backend's worker threads
only, nothing here may run on the event loop). Durability (docs/storage-format.md#durability): data
is `fsync`ed, and a directory is `fsync`ed after an entry in it was created, linked or unlinked. New
logs appear atomically through a private temp file that is linked into place (`os.link` fails
instead of overwriting, so two concurrent materializations cannot both win); appends remember the
previous size and truncate back to it on any failure, so a batch is all-or-nothing and a retry never
sees a gap or a duplicate. The two steps of a durable write, `write_and_sync` and `truncate_durably`,
are passed in by the backend, which keeps them as its private primitives so a test can fail either
one (`dsh.testing.io_faults`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import stat
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import IO, Any, Final

from dsh.persistence.base import Revision
from dsh.persistence.errors import (
    AppendConflictError,
    PersistenceIOError,
    SessionCorruptionError,
    StoreMisconfiguredError,
)
from dsh.persistence.jsonl._format import Compression, HeadLine, LogContext, split_head

__all__ = [
    "FILE_MODE",
    "FILE_READS",
    "LOG_NAMES",
    "TAIL_BYTES",
    "FileReads",
    "Opener",
    "Truncate",
    "Write",
    "raw_open",
    "append_durably",
    "check_contiguous",
    "check_flat",
    "ensure_dir",
    "log_compression",
    "log_in",
    "two_logs_error",
    "path_exists",
    "fd_revision",
    "flat_legacy_error",
    "fsync_dir",
    "is_file",
    "keep_torn_copy",
    "link_new_file",
    "make_dirs",
    "not_regular",
    "project_dirs",
    "project_entries",
    "read_head",
    "read_revision_at",
    "read_stable",
    "regular_stat",
    "remove_stale",
    "revision_of",
    "truncate_durably",
    "write_and_sync",
]

_log = logging.getLogger("dsh.persistence")

Opener = Callable[[str, str], IO[bytes]]
"""Opens a file for reading like the built-in `open(path, "rb")` (tests count bytes through it)."""


def raw_open(path: str, mode: str) -> IO[bytes]:
    """The default opener: unbuffered binary reads (every read and seek is one system call, and the
    small head and tail reads of a listing copy nothing through a buffer).

    Callers check the file type first (`regular_stat`); the open itself is non-blocking and checks
    again on the descriptor, so a FIFO swapped in between can never block a read.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise not_regular(path, _file_kind(st.st_mode))
        # O_NONBLOCK has no effect on a regular file's reads, so the flag can stay.
        return open(fd, mode, buffering=0, closefd=True)
    except BaseException:
        os.close(fd)
        raise


class FileReads:
    """How many files the JSONL backend opened for reading, by purpose, in this process (thread-safe).

    Purposes: `head` (a listing read a header record and the revision), `log` (a whole log was
    read), `revision` (only the last 4 KiB), `index` (a parent index file was read and parsed),
    `folder` (a project folder's entries were listed: a scan, or the index reading a folder again).
    The counts are counted where the backend opens the files, below every cache and wrapper, so a
    test can prove what one command costs (for example that listing one parent's children opens
    O(children) header files, or that creating a session lists no folder,
    docs/storage-format.md#parent-index).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def add(self, purpose: str) -> None:
        """Count one opened file."""
        with self._lock:
            self._counts[purpose] += 1

    def snapshot(self) -> dict[str, int]:
        """The counts so far (subtract two snapshots to measure one call)."""
        with self._lock:
            return dict(self._counts)


FILE_READS: Final = FileReads()
"""The process-wide `FileReads` of every `JsonlBackend`."""

TAIL_BYTES: Final = 4096
FILE_MODE: Final = 0o600
_DIR_MODE: Final = 0o700
_HEAD_CHUNK: Final = 1024
"""First read of a listing; a header frame is ~200 bytes, and longer ones double the read."""
_STABLE_TRIES: Final = 8


def _stat_key(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def revision_of(st: os.stat_result, tail: bytes) -> Revision:
    """`jsonl:<dev>:<ino>:<size>:<mtime_ns>:<ctime_ns>:<hash of the last 4 KiB>` (docs/storage-format.md#revisions).

    The hash makes a repair that keeps the size (truncate, then append as many bytes) still
    change the token.
    """
    # A change detector, not a security check: CRC-32 of the tail is enough (with size, inode and
    # times beside it) and costs a tenth of a cryptographic hash on every listing row.
    digest = f"{zlib.crc32(tail[-TAIL_BYTES:]):08x}"
    return Revision(f"jsonl:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{digest}")


def fd_revision(fd: int) -> tuple[Revision, os.stat_result]:
    """The revision of an open (readable) log descriptor."""
    st = os.fstat(fd)
    return revision_of(st, os.pread(fd, TAIL_BYTES, max(st.st_size - TAIL_BYTES, 0))), st


def fsync_dir(path: str) -> None:
    """Make a directory entry change (creation, link, unlink) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


Write = Callable[[int, bytes], None]
"""The write step of a durable write: all of the bytes to the descriptor, then durable (`write_and_sync`)."""

Truncate = Callable[[int, int], None]
"""The rollback step of a failed append: cut the file back to a size, durably (`truncate_durably`)."""


def write_and_sync(fd: int, data: bytes) -> None:
    """Write all of `data` and fsync."""
    _write_all(fd, data)
    os.fsync(fd)


def truncate_durably(fd: int, size: int) -> None:
    """Cut the file back to `size` bytes and fsync."""
    os.ftruncate(fd, size)
    os.fsync(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def path_exists(path: str) -> bool:
    """Whether anything (even a dangling symlink) is at `path`."""
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


def is_file(path: str) -> bool:
    """Whether `path` is a regular file."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False


_KINDS: Final = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _file_kind(mode: int) -> str:
    for test, kind in _KINDS:
        if test(mode):
            return kind
    return "not a regular file"


def not_regular(path: str, kind: str) -> PersistenceIOError:
    """The refusal of a session log that is not a regular file (nothing was opened)."""
    return PersistenceIOError(
        f'session log "{path}" is {kind}, not a regular file; dsh does not open it', location=path
    )


def regular_stat(path: str) -> os.stat_result:
    """The stat of the regular file at `path` (a symbolic link is followed), checked before any open.

    Nothing on a read path opens a FIFO, a device or a directory: a FIFO would block the reader
    forever (docs/storage-format.md#damage-stays-visible says what is reported instead).

    Raises:
        FileNotFoundError: Nothing is at `path`.
        PersistenceIOError: `path` is a dangling symbolic link or not a regular file.
    """
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise not_regular(path, "a dangling symbolic link") from None
        except OSError as error:
            raise not_regular(path, f"a symbolic link that cannot be followed ({error.strerror})") from error
    if not stat.S_ISREG(st.st_mode):
        raise not_regular(path, _file_kind(st.st_mode))
    return st


LOG_NAMES: Final = ("session.jsonl.zstd", "session.jsonl")
"""The log file names of a session folder, one per encoding (docs/storage-format.md#jsonl-layout)."""


def log_compression(path: str) -> Compression:
    """The encoding of the log at `path`, from its file name: `.zstd` is zstd frames, else plain lines."""
    return "zstd" if path.endswith(".zstd") else "none"


def two_logs_error(directory: str, session_id: str | None) -> SessionCorruptionError:
    """A session folder holding a log of each encoding: which one is the session cannot be told."""
    return SessionCorruptionError(
        f'session folder "{directory}" holds both session.jsonl.zstd and session.jsonl; '
        "keep the one that is the session and move the other away",
        session_id=session_id,
        location=directory,
    )


def log_in(directory: str, names: Collection[str], session_id: str | None) -> str | None:
    """The log among a session folder's entry `names` (either encoding), or None when there is none.

    Raises:
        SessionCorruptionError: The folder holds a log of each encoding (`two_logs_error`).
    """
    found = [name for name in LOG_NAMES if name in names]
    if len(found) > 1:
        raise two_logs_error(directory, session_id)
    return os.path.join(directory, found[0]) if found else None


def flat_legacy_error(path: str) -> StoreMisconfiguredError:
    """The detector refusal for a flat legacy `<project>/<id>.jsonl[.zstd]` artifact."""
    return StoreMisconfiguredError(
        f'session artifact "{path}" uses the flat legacy layout (<project>/<id>.jsonl); this build reads '
        "only <project>/<id>/session.jsonl[.zstd]; move it or use a separate root",
        location=path,
    )


def check_flat(project: str, segment: str) -> None:
    """Refuse a flat legacy artifact of the session directory name `segment` in `project`."""
    for suffix in (".jsonl", ".jsonl.zstd"):
        flat = os.path.join(project, segment + suffix)
        if path_exists(flat):
            raise flat_legacy_error(flat)


def remove_stale(directory: str, names: list[str]) -> None:
    """Remove temp files a crashed materialization left in `directory`, then make that durable."""
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, name))
            _log.info("jsonl: removed stale temp file %s", os.path.join(directory, name))
    fsync_dir(directory)


def project_entries(root: str) -> list[os.DirEntry[str]]:
    """The project directories under `root` as directory entries (none when it does not exist yet).

    Raises:
        StoreMisconfiguredError: The root is not a directory or is not readable.
    """
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return []
    except NotADirectoryError as error:
        raise StoreMisconfiguredError(f'session store root "{root}" is not a directory', location=root) from error
    except PermissionError as error:
        raise StoreMisconfiguredError(f'session store root "{root}" is not readable', location=root) from error
    return [entry for entry in entries if entry.is_dir(follow_symlinks=False)]


def project_dirs(root: str) -> list[str]:
    """The paths of the project directories under `root` (see `project_entries`)."""
    return [entry.path for entry in project_entries(root)]


def _changing(path: str) -> PersistenceIOError:
    return PersistenceIOError(f'session log "{path}" kept changing during read', location=path)


# --------------------------------------------------------------------------------------------------
# Reads: stable snapshots of a log file and the misconfiguration detector


def read_stable(opener: Opener, path: str) -> tuple[bytes, os.stat_result]:
    """The whole file, read between two agreeing stats (at most 8 tries).

    Raises:
        FileNotFoundError: The file vanished.
        PersistenceIOError: It kept changing, or it is not a regular file (`regular_stat`).
    """
    for _ in range(_STABLE_TRIES):
        before = regular_stat(path)
        FILE_READS.add("log")
        with opener(path, "rb") as handle:
            data = handle.read()
        after = os.stat(path)
        if _stat_key(before) == _stat_key(after) and len(data) == after.st_size:
            return data, after
    raise _changing(path)


def read_head(
    opener: Opener, path: str, compression: Compression
) -> tuple[HeadLine | None, os.stat_result, Revision] | None:
    """Frame 1 / line 1 plus the revision, reading only the head and the last 4 KiB (cost independent of size).

    Returns:
        None when the file vanished; otherwise `(head, stat, revision)` where a None head means
        the file is empty or its first record is incomplete.

    Raises:
        SessionCorruptionError: Frame 1 fails to decode or is not exactly one line.
        PersistenceIOError: The file kept changing, or it is not a regular file (`regular_stat`).
    """
    ctx = LogContext(None, path)
    for _ in range(_STABLE_TRIES):
        try:
            before = regular_stat(path)
            size = before.st_size
            head: HeadLine | None = None
            FILE_READS.add("head")
            with opener(path, "rb") as handle:
                data = b""
                step = _HEAD_CHUNK
                while len(data) < size:
                    chunk = handle.read(min(step, size - len(data)))
                    if not chunk:
                        break
                    data += chunk
                    head = split_head(data, compression, ctx)
                    if head is not None:
                        break
                    # A header is normally one small chunk; doubling keeps probing a long one linear.
                    step *= 2
                if size <= len(data):
                    tail = data[-TAIL_BYTES:]
                else:
                    handle.seek(max(size - TAIL_BYTES, 0))
                    tail = handle.read(TAIL_BYTES)
            after = os.stat(path)
        except FileNotFoundError:
            return None
        if _stat_key(before) == _stat_key(after):
            return head, after, revision_of(after, tail)
    raise _changing(path)


def read_revision_at(opener: Opener, path: str) -> Revision | None:
    """One stat plus the last 4 KiB (between two agreeing stats); None when the file vanished."""
    for _ in range(_STABLE_TRIES):
        try:
            before = regular_stat(path)
            FILE_READS.add("revision")
            with opener(path, "rb") as handle:
                handle.seek(max(before.st_size - TAIL_BYTES, 0))
                tail = handle.read(TAIL_BYTES)
            after = os.stat(path)
        except FileNotFoundError:
            return None
        if _stat_key(before) == _stat_key(after):
            return revision_of(after, tail)
    raise _changing(path)


# --------------------------------------------------------------------------------------------------
# Writes: atomic creation, durable appends and torn-tail truncation


def ensure_dir(directory: str) -> None:
    """Create `directory` and its missing parents with mode 0700, fsyncing each parent after a creation.

    Raises:
        StoreMisconfiguredError: Something that is not a directory is in the way.
    """
    for created in make_dirs(directory):
        fsync_dir(os.path.dirname(created))


def make_dirs(directory: str) -> list[str]:
    """Create `directory` and its missing parents with mode 0700; the folders created, outermost first.

    Nothing is fsynced: the caller makes each creation durable (`fsync_dir` of each created folder's
    parent) before it relies on it.

    Raises:
        StoreMisconfiguredError: Something that is not a directory is in the way.
    """
    if os.path.isdir(directory):
        return []
    parent = os.path.dirname(directory)
    created = make_dirs(parent) if parent != directory else []
    try:
        os.mkdir(directory, _DIR_MODE)
    except FileExistsError:
        if not os.path.isdir(directory):
            raise StoreMisconfiguredError(f'"{directory}" exists and is not a directory', location=directory) from None
        return created
    created.append(directory)
    return created


def link_new_file(path: str, data: bytes, write: Write) -> os.stat_result:
    """Publish a new file atomically: `<path>.<12 hex>.tmp` (O_EXCL, 0600), `write`, link, unlink, dir fsync.

    The temp file is removed on every failure; one left by a crash is swept at the next open.

    Raises:
        FileExistsError: `path` already exists (another writer won); nothing was changed.
    """
    directory = os.path.dirname(path)
    temp = f"{path}.{secrets.token_hex(6)}.tmp"
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
        try:
            write(fd, data)
        finally:
            os.close(fd)
        # link() never overwrites: of two concurrent materializations exactly one succeeds.
        os.link(temp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
    # The link and the unlink changed the inode's ctime, so the stat for the revision comes last.
    st = os.stat(path)
    fsync_dir(directory)
    return st


def keep_torn_copy(path: str, fd: int, start: int, end: int) -> str:
    """Copy the log's bytes `[start, end)` (a torn tail about to be removed) to `<path>.torn-<epoch ms>`.

    The copy is created exclusively (mode 0600, a later millisecond when the name is taken),
    fsynced, and its directory entry made durable before this returns, so a repair that truncates
    afterwards never destroys a record (docs/storage-format.md#torn-tails-and-repair).

    Returns:
        The path of the copy.
    """
    parts: list[bytes] = []
    offset = start
    while offset < end:
        chunk = os.pread(fd, end - offset, offset)
        if not chunk:
            break
        parts.append(chunk)
        offset += len(chunk)
    stamp = time.time_ns() // 1_000_000
    while True:
        target = f"{path}.torn-{stamp}"
        try:
            out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
        except FileExistsError:
            stamp += 1
            continue
        break
    try:
        try:
            _write_all(out, b"".join(parts))
            os.fsync(out)
        finally:
            os.close(out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(target)
        raise
    fsync_dir(os.path.dirname(path))
    _log.info("jsonl: kept the torn tail of %s (%d bytes) at %s", path, end - start, target)
    return target


def check_contiguous(session_id: str, path: str, records: Sequence[Mapping[str, Any]], next_seq: int) -> None:
    """Refuse (before writing anything) a batch that does not continue at `next_seq` without gaps.

    Raises:
        AppendConflictError: `APPEND_SEQ_MISMATCH` (a stale writer).
    """
    for offset, record in enumerate(records):
        if record["seq"] != next_seq + offset:
            raise AppendConflictError(
                f'batch for session "{session_id}" must continue at seq {next_seq + offset}, got seq {record["seq"]}',
                session_id=session_id,
                location=path,
            )


def append_durably(
    fd: int, data: bytes, size: int, *, path: str, session_id: str, write: Write, truncate: Truncate
) -> None:
    """`write` `data` at the end of the log (whose size is `size`), all or nothing.

    On any failure the file is cut back to `size` (`truncate`, durably) before the error propagates
    (an `OSError` as `PersistenceIOError`), so a retry neither duplicates nor skips a seq.

    Raises:
        PersistenceIOError: The write failed, or (`failed to roll back append to <path>`) the
            rollback failed too; then both errors are attached as an `ExceptionGroup` cause.
    """
    try:
        write(fd, data)
    except Exception as error:
        try:
            truncate(fd, size)
        except OSError as rollback_error:
            raise PersistenceIOError(
                f"failed to roll back append to {path}", session_id=session_id, location=path
            ) from ExceptionGroup("append and rollback both failed", [error, rollback_error])
        if isinstance(error, OSError):
            raise PersistenceIOError(
                f"failed to append to {path}: {error}", session_id=session_id, location=path
            ) from error
        raise


# Shown under the name users import (docs/architecture.md#public-names).
FileReads.__module__ = "dsh.persistence.jsonl"
