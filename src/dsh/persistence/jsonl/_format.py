"""The JSONL session-log codec: path layout, record encoding and the header record.

Layer: persistence (private to `dsh.persistence.jsonl`, which re-exports the layout and encoding
functions fixture writers and tools need). Pure: nothing here opens a file; every function works on
the bytes or values it is handed, so the same rules serve the backend's worker threads, the listing
and the tests. Boundaries of zstd frames come from `zstandard` itself (a fresh `decompressobj` per
frame reports where its frame ends and verifies the content checksum), never from a hand-written
byte scanner. The scan of the event region (records, verdicts, the torn-tail rule) is `_scan`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final, Literal, NamedTuple

import orjson
import zstandard

from dsh.persistence.errors import SessionCorruptionError, SessionFormatUnsupportedError, raw_log_suffix
from dsh.persistence.jsonl._packed import ROW_TYPES
from dsh.session.header import SESSION_FORMAT_VERSION
from dsh.session.ids import encode_segment

__all__ = [
    "NO_CWD_DIR",
    "PACKED_ROW_TYPES",
    "Compression",
    "HeadLine",
    "LogContext",
    "artifact_name",
    "check_identity",
    "check_version",
    "decode_header",
    "decode_segment",
    "encode_batch",
    "encode_header",
    "project_key",
    "relative_path",
    "split_head",
]

Compression = Literal["zstd", "none"]

NO_CWD_DIR: Final = "_no-cwd"
"""The project directory of sessions whose header has no cwd (a literal, never escaped)."""

PACKED_ROW_TYPES: Final = ROW_TYPES
"""Upstream packed chunk rows; a complete line of one of these types is expanded (`_packed`)."""

_SAFE: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
_SEPARATORS: Final = frozenset("/\\:")
_MAX_SLUG: Final = 251
_NEWLINE: Final = b"\n"


# --------------------------------------------------------------------------------------------------
# Layout (docs/storage-format.md#jsonl-layout)


def artifact_name(compression: Compression) -> str:
    """The transcript file name inside a session directory."""
    return "session.jsonl.zstd" if compression == "zstd" else "session.jsonl"


def _utf16_units(value: str) -> Iterable[int]:
    for ch in value:
        cp = ord(ch)
        if cp >= 0x10000:
            cp -= 0x10000
            yield 0xD800 | (cp >> 10)
            yield 0xDC00 | (cp & 0x3FF)
        else:
            yield cp


def project_key(cwd: str | None) -> str:
    """The project directory name of a cwd (lossy by design; the header is authoritative).

    The segment walk over UTF-16 code units, except that `/`, `\\` and `:` become `-` with a run of
    them collapsed to one; leading `-` are stripped, an empty slug becomes `root`, the slug keeps its
    first 251 characters and is wrapped as `--<slug>--`. No cwd maps to the literal `_no-cwd`.
    """
    if cwd is None:
        return NO_CWD_DIR
    out: list[str] = []
    in_separator_run = False
    for unit in _utf16_units(cwd):
        ch = chr(unit)
        if ch in _SEPARATORS:
            if not in_separator_run:
                out.append("-")
            in_separator_run = True
            continue
        in_separator_run = False
        out.append(ch if ch in _SAFE else f"~{unit:04X}")
    slug = "".join(out).lstrip("-") or "root"
    return f"--{slug[:_MAX_SLUG]}--"


def decode_segment(segment: str) -> str | None:
    """The id a session folder name encodes (the inverse of `encode_segment`), or None if it is not
    an encoded segment. Used to name an entry whose header cannot be read; the header stays the
    authority for every readable log."""
    units: list[int] = []
    index = 0
    while index < len(segment):
        ch = segment[index]
        if ch == "~":
            digits = segment[index + 1 : index + 5]
            if len(digits) != 4 or any(c not in "0123456789ABCDEF" for c in digits):
                return None
            units.append(int(digits, 16))
            index += 5
        elif ch in _SAFE:
            units.append(ord(ch))
            index += 1
        else:
            return None
    if not units:
        return None
    raw = b"".join(unit.to_bytes(2, "little") for unit in units)
    return raw.decode("utf-16-le", "surrogatepass")


def relative_path(session_id: str, cwd: str | None, compression: Compression) -> str:
    """`<project key>/<encoded id>/<artifact>` relative to the root (raises ValueError on an empty id)."""
    return f"{project_key(cwd)}/{encode_segment(session_id)}/{artifact_name(compression)}"


# --------------------------------------------------------------------------------------------------
# Encoding (docs/storage-format.md#zstd-frames)


def encode_header(header: Mapping[str, Any]) -> bytes:
    """The header line: compact JSON in the record's own key order, ending in a newline."""
    return orjson.dumps(header) + _NEWLINE


def encode_batch(records: Iterable[Mapping[str, Any]]) -> bytes:
    """One line per record, compact JSON, key order kept; empty input gives empty bytes."""
    lines = [orjson.dumps(record) for record in records]
    if not lines:
        return b""
    lines.append(b"")
    return _NEWLINE.join(lines)


# --------------------------------------------------------------------------------------------------
# Errors with context


# Private and built on a hot path, never handed out: a NamedTuple is the cheapest record to build
# (docs/architecture.md#import-cost).
class LogContext(NamedTuple):
    """Who a decode is for, so errors carry the session id and the artifact path."""

    session_id: str | None
    location: str | None

    def corrupt(self, message: str) -> SessionCorruptionError:
        """A corruption error for this log."""
        return SessionCorruptionError(
            message + raw_log_suffix(self.location), session_id=self.session_id, location=self.location
        )


# --------------------------------------------------------------------------------------------------
# The header record


class HeadLine(NamedTuple):
    """The header line (without its newline) and the byte offset where the event region starts."""

    line: bytes
    end: int


def split_head(data: bytes, compression: Compression, ctx: LogContext) -> HeadLine | None:
    """Find the complete first record in the leading bytes of a log, or None if it is incomplete.

    Raw: the first newline ends the header record. Zstd: frame 1 must be complete and decode to
    exactly one line. None means "not enough bytes" (an empty or still-incomplete head); callers
    that hold the whole file turn it into `empty or header-less ... session log`.

    Raises:
        SessionCorruptionError: A decoder error in frame 1, or frame 1 is not exactly one line.
    """
    if compression == "none":
        end = data.find(_NEWLINE)
        if end < 0:
            return None
        return HeadLine(data[:end], end + 1)
    decoder = zstandard.ZstdDecompressor().decompressobj()
    try:
        text = decoder.decompress(data)
    except zstandard.ZstdError as error:
        raise ctx.corrupt("corrupt Zstandard session log: frame at byte 0 failed validation") from error
    if not decoder.eof:
        return None
    if not text.endswith(_NEWLINE) or text.count(_NEWLINE) != 1:
        raise ctx.corrupt("corrupt Zstandard session log: first frame is not exactly one header line")
    return HeadLine(text[:-1], len(data) - len(decoder.unused_data))


def decode_header(line: bytes, ctx: LogContext) -> dict[str, Any]:
    """Parse the header line into a record whose `type` is `"session"`.

    Raises:
        SessionCorruptionError: Not JSON, or not a session header record.
    """
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError as error:
        raise ctx.corrupt("corrupt session log: header line is not valid JSON") from error
    if not isinstance(record, dict) or record.get("type") != "session":
        raise ctx.corrupt("corrupt session log: first line is not a session header")
    return record


def check_version(record: Mapping[str, Any], ctx: LogContext) -> None:
    """Refuse a numeric version other than 0 as format-unsupported (checked before anything else).

    A missing or non-numeric version is left to the header shape check (corruption).

    Raises:
        SessionFormatUnsupportedError: With `found_version` and `direction`.
    """
    version: Any = record.get("version")
    if type(version) not in (int, float) or version == SESSION_FORMAT_VERSION:
        return
    who = ctx.session_id if ctx.session_id is not None else record.get("id")
    suffix = raw_log_suffix(ctx.location)
    if version > SESSION_FORMAT_VERSION:
        message = (
            f'session "{who}" was written with log format version {version}, newer than version '
            f"{SESSION_FORMAT_VERSION} which this build reads; upgrade dsh to open it{suffix}"
        )
        direction: Literal["newer", "older"] = "newer"
    else:
        message = (
            f'session "{who}" uses log format version {version}, older than version {SESSION_FORMAT_VERSION}; '
            f"this build has no upgrade path for it{suffix}"
        )
        direction = "older"
    raise SessionFormatUnsupportedError(
        message,
        session_id=ctx.session_id,
        location=ctx.location,
        found_version=version,
        direction=direction,
    )


def check_identity(
    record: Mapping[str, Any], requested_id: str | None, relative: str, compression: Compression, ctx: LogContext
) -> None:
    """The identity rule: header id = requested id, and id + cwd name this very path.

    Args:
        record: The decoded header record.
        requested_id: The id the caller asked for (None when listing).
        relative: The artifact path relative to the root (`<project>/<segment>/<file>`).
        compression: The backend's encoding (names the artifact file).
        ctx: Error context.

    Raises:
        SessionCorruptionError: Either rule fails.
    """
    header_id = record.get("id")
    shown = orjson.dumps(header_id).decode() if type(header_id) is not str else f'"{header_id}"'
    if requested_id is not None and header_id != requested_id:
        raise SessionCorruptionError(
            f'corrupt session log "{ctx.location}": requested id "{requested_id}" does not match header id {shown}',
            session_id=ctx.session_id,
            location=ctx.location,
        )
    cwd = record.get("cwd")
    if type(header_id) is not str or not header_id or (cwd is not None and type(cwd) is not str):
        raise SessionCorruptionError(
            f'corrupt session log "{ctx.location}": header id {shown} and cwd cannot name a session artifact',
            session_id=ctx.session_id,
            location=ctx.location,
        )
    expected = relative_path(header_id, cwd, compression)
    if expected != relative:
        raise SessionCorruptionError(
            f'corrupt session log "{ctx.location}": header id {shown} and cwd identify "{expected}"',
            session_id=ctx.session_id,
            location=ctx.location,
        )
