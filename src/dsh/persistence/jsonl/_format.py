"""The JSONL session-log codec: path layout, record encoding, zstd framing and the read rules.

Layer: persistence (private to `dsh.persistence.jsonl`, which re-exports the layout and encoding
functions fixture writers and tools need). Pure: nothing here opens a file; every function works on
the bytes or values it is handed, so the same rules serve the backend's worker threads, the listing
and the tests. Boundaries of zstd frames come from `zstandard` itself (a fresh `decompressobj` per
frame reports where its frame ends and verifies the content checksum), never from a hand-written
byte scanner. The line scanner implements the torn-tail rule
(docs/storage-format.md#torn-tails-and-repair): the log is valid up to its first defect, and the
defect plus everything after it is a removable torn tail only if no later record carries a
`turn/end` (the TypeScript harness's rule; a torn tail holding complete records is copied beside the
log before a repair removes it, so no byte is lost). A packed chunk row written by the TypeScript
harness (`_packed`) is expanded into the events it stands for as it is scanned; a malformed row is
a defect of its line like any other.

Hot path: a read is dominated by `orjson.loads` per line, so the scanner parses each line once, in a
C-level `map` per slice and takes the fast validation verdicts (`dsh.session.fastcheck`) from that
parse. It always keeps the line; with the C helpers (`dsh._speedups`) it also keeps the parsed dict,
which the read path later hands out as the event itself, so nothing is parsed twice
(docs/architecture.md#read-path). A line the fast loop does not accept (a packed row, a defect) goes
through the careful path alone, and the fast loop resumes after it while the log is still clean.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping
from itertools import repeat
from typing import Any, Final, Literal, NamedTuple

import orjson
import zstandard

from dsh._accel import speedups
from dsh.persistence.base import TornMarker, first_oversized_int
from dsh.persistence.errors import SessionCorruptionError, SessionFormatUnsupportedError, raw_log_suffix
from dsh.persistence.jsonl._packed import ROW_TYPES, MalformedRowError, expand_row
from dsh.session.events import KNOWN_EVENT_TYPES
from dsh.session.fastcheck import FAST_UNSURE, fast_check
from dsh.session.header import SESSION_FORMAT_VERSION
from dsh.session.ids import encode_segment
from dsh.session.stored import LineRecords, collector_paused

__all__ = [
    "NO_CWD_DIR",
    "PACKED_ROW_TYPES",
    "Compression",
    "HeadLine",
    "LogContext",
    "LogScan",
    "artifact_name",
    "check_identity",
    "check_version",
    "decode_header",
    "decode_segment",
    "encode_batch",
    "encode_header",
    "project_key",
    "relative_path",
    "scan_events",
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

# A run of 19 digits is the only way to spell an integer outside signed 64 bits. Mapping every digit
# to "0" and searching for nineteen of them is an order of magnitude faster than a regex over the
# whole plaintext, so `first_oversized_int` only runs on frames that can hold such an integer.
_DIGITS_TO_ZERO: Final = bytes.maketrans(b"123456789", b"000000000")
_LONG_DIGIT_RUN: Final = b"0" * 19

# With the C helpers, one pass over a slice finds both a long digit run and a number that may parse to
# -0.0 (lines of a slice that may hold one keep no parsed dict: the read path checks them line by line).
_HAZARDS: Final = speedups.text_hazards if speedups is not None else None
_CHECK_RECORDS: Final[Callable[[list[Any], int, bool], tuple[bytes, list[Any]]] | None] = (
    speedups.check_records if speedups is not None else None
)
# One object holding every key the C check looks up: parsed at the start of each scan, it gives the
# check the parser's own key objects, so its lookups end at a pointer comparison (speed only).
_KEY_SAMPLE: Final = orjson.dumps(dict.fromkeys(speedups.KEYS, 0)) if speedups is not None else b"{}"
_LONG_DIGITS: Final = speedups.HAZARD_LONG_DIGITS if speedups is not None else 0
_NEGATIVE_ZERO: Final = speedups.HAZARD_NEGATIVE_ZERO if speedups is not None else 0

_UNSURE: Final = bytes([FAST_UNSURE])
_TYPE: Final = operator.itemgetter("type")
_CANONICAL_TYPES: Final = {kind: kind for kind in KNOWN_EVENT_TYPES}

# The first frame size guess when decoding; later guesses follow the previous frame's size so the
# bytes handed back in `unused_data` (a copy) stay about one frame long.
_FIRST_FRAME_GUESS: Final = 4096
_RAW_SLICE: Final = 1 << 18
_MAX_FRAME_STEP: Final = 1 << 22


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


# Not dataclasses: records on the start-up path are cheap to define (docs/architecture.md#import-cost).
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


# --------------------------------------------------------------------------------------------------
# The line scanner: one pass over the records of a log


def _commits(kind: object) -> bool:
    """Whether a complete record proves that its writer went on committing past a defect: a `turn/end`.

    This is the TypeScript harness's rule, kept so both read a damaged log the same way. Anything
    else after a defect (messages included) is part of the torn tail; the repair copies such a tail
    beside the log before it cuts it (docs/storage-format.md#torn-tails-and-repair)."""
    return kind == "turn/end"


class _LineScanner:
    """Accepts contiguous records line by line and remembers the first defect.

    `events` holds the accepted records (valid prefix), a packed row contributing every event it
    stands for. `issue` is the first defect's message; once it is set no line is accepted any
    more, and a later complete line holding a `turn/end` raises it, because the damage then lies
    in the committed region. `dropped` counts the complete, parseable records from
    the defect on (what a repair would remove). Line numbers count physical lines (the header is
    line 1), so a packed row is one line however many events it holds.
    """

    __slots__ = (
        "committed",
        "ctx",
        "dropped",
        "issue",
        "line_no",
        "lines",
        "oversized_at",
        "parsed",
        "types",
        "verdicts",
    )

    def __init__(self, ctx: LogContext) -> None:
        self.ctx = ctx
        # Accepted records are kept with their type and fast-check verdict (LineRecords), each as its
        # line or, with the C helpers, as its parse (the line is then None): a record of a slice in
        # which no -0.0 can hide is kept parsed, so it is never parsed again. Every kept line is one
        # complete JSON object on its own; an expanded packed row contributes one synthesized line
        # per event it stands for. Without the helpers the dicts are dropped at once, which keeps a
        # lazy read close to the bare parse and its memory near the size of the log.
        self.lines: list[bytes | None] = []
        self.types: list[str] = []
        self.verdicts = bytearray()
        self.parsed: list[dict[str, Any] | None] | None = [] if speedups is not None else None
        if speedups is not None:
            speedups.learn_keys(orjson.loads(_KEY_SAMPLE))
        self.issue: str | None = None
        self.dropped = 0
        self.line_no = 1  # the header is line 1
        self.committed = 0  # bytes of accepted lines, relative to the first byte fed
        self.oversized_at: int | None = None

    def feed(self, text: bytes) -> bytes:
        """Scan the complete lines of `text`; return the trailing fragment after the last newline."""
        lines = text.split(_NEWLINE)
        fragment = lines.pop()
        if _HAZARDS is not None:
            hazards = _HAZARDS(text)
            suspicious = self.oversized_at is None and hazards & _LONG_DIGITS != 0
            keep = hazards & _NEGATIVE_ZERO == 0
        else:
            suspicious = self.oversized_at is None and text.translate(_DIGITS_TO_ZERO).find(_LONG_DIGIT_RUN) >= 0
            keep = False
        start = 0
        if self.issue is None and not suspicious:
            while True:
                stop = self._fast(lines, start, keep=keep)
                accepted = stop - start
                self.line_no += accepted
                if start == 0 and stop == len(lines):
                    # The common case: every line of the slice was a plain contiguous record.
                    self.committed += len(text) - len(fragment)
                    return fragment
                self.committed += sum(map(len, lines[start:stop])) + accepted
                if stop == len(lines):
                    return fragment
                self.line_no += 1
                start = stop + 1
                if not self._careful(lines[stop], suspicious=False):
                    break
        for line in lines[start:]:
            self.line_no += 1
            self._careful(line, suspicious=suspicious)
        return fragment

    def _careful(self, line: bytes, *, suspicious: bool) -> bool:
        """One line through `_slow`, advancing the committed offset and locating an oversized integer.

        Returns whether the log is still clean (no defect recorded).
        """
        accepted = self._slow(line)
        if not accepted:
            return self.issue is None
        self.committed += len(line) + 1
        if suspicious and self.oversized_at is None and first_oversized_int((line,)) == 0:
            self.oversized_at = len(self.lines) - accepted
        return True

    def _fast(self, lines: list[bytes], start: int, *, keep: bool) -> int:
        """Accept `lines[start:]` while they are plain contiguous records; return the index of the
        first line it did not accept (`len(lines)` when it accepted them all).

        The per-line work runs in C-level loops: one parse per line, the fast checks, the types.
        `keep` (only when the helpers are built and no line of the slice may spell -0.0): keep the
        parsed dicts, and hand each record the check is certain of out as its event at once, while
        it is in the cache (`dsh._speedups.check_records`); so a kept parse with a nonzero verdict
        is always an event already. A slice holding a line that is not JSON is walked line by line
        instead, so the stop lands on that line.
        """
        chunk = lines[start:] if start else lines
        expected = len(self.lines)
        try:
            parsed = list(map(orjson.loads, chunk))
        except orjson.JSONDecodeError:
            return start + self._fast_lines(chunk, expected)
        kinds: list[Any] | None = None
        if _CHECK_RECORDS is not None:
            verdicts, kinds = _CHECK_RECORDS(parsed, expected, keep)
        else:
            verdicts = bytes(map(fast_check, parsed, range(expected, expected + len(parsed))))
        accepted = verdicts.find(_UNSURE)
        if accepted < 0:
            accepted = len(parsed)
        else:
            # A record the fast check is unsure about may still be a plain record (an unknown type,
            # a surface replace ...): the scanner only asks for seq contiguity and a non-packed
            # type, and validation judges the rest.
            while accepted < len(parsed) and _plain_at(parsed[accepted], expected + accepted):
                accepted += 1
            parsed = parsed[:accepted]
            chunk = chunk[:accepted]
            verdicts = verdicts[:accepted]
        if keep:
            # The parses are kept in place of the lines, which go with the slice (their memory is
            # reused by the next slice's parse).
            self.lines += repeat(None, accepted)
        else:
            self.lines += chunk
        if kinds is None:
            kinds = list(map(_TYPE, parsed))
            # Share one string object per known type instead of keeping one per record.
            self.types += map(_CANONICAL_TYPES.get, kinds, kinds)
        else:
            self.types += kinds if accepted == len(kinds) else kinds[:accepted]
        self.verdicts += verdicts
        if self.parsed is not None:
            self.parsed += parsed if keep else repeat(None, accepted)
        return start + accepted

    def _fast_lines(self, lines: list[bytes], expected: int) -> int:
        """`_fast` for a slice holding a line that is not JSON, one line at a time; returns the count."""
        for offset, line in enumerate(lines):
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                return offset
            if not _plain_at(record, expected + offset):
                return offset
            self.lines.append(line)
            self.types.append(record["type"])
            self.verdicts.append(fast_check(record, expected + offset))
            if self.parsed is not None:
                self.parsed.append(None)
        return len(lines)

    @property
    def events(self) -> LineRecords:
        """The accepted records (the valid prefix), as lines."""
        return LineRecords(self.lines, self.types, self.verdicts, self.parsed)

    def _slow(self, line: bytes) -> int:
        """Classify one line after a defect, on a suspicious slice, or where the fast loop stopped.

        Returns how many records it accepted: 0 (a defect, or a line after one), 1 (an event), or
        the member count of a packed row.
        """
        try:
            record: Any = orjson.loads(line)
        except orjson.JSONDecodeError:
            record = None
        commits = False
        members: list[dict[str, Any]] | None = None
        malformed: str | None = None
        if isinstance(record, dict):
            kind = record.get("type")
            if type(kind) is str and kind in PACKED_ROW_TYPES:
                try:
                    members = expand_row(record)
                except MalformedRowError as error:
                    malformed = f"corrupt session log: malformed {kind} row at line {self.line_no} ({error})"
            else:
                commits = _commits(kind)
        if self.issue is not None:
            if commits:
                raise self.ctx.corrupt(self.issue)
            self.dropped += isinstance(record, dict)
            return 0
        if malformed is not None:
            # A packed row holds only log-only chunks, so like an unparsable line it is a torn tail
            # unless a later record proves the writer went on committing.
            self.issue = malformed
            self.dropped += 1
            return 0
        if not isinstance(record, dict):
            self.issue = f"corrupt session log: unparsable committed event at line {self.line_no}"
            return 0
        expected = len(self.lines)
        seq = record.get("seq0") if members is not None else record.get("seq")
        if type(seq) is not int or seq != expected:
            message = (
                f"corrupt session log: seq gap in committed region at line {self.line_no} "
                f"(expected {expected}, got {orjson.dumps(seq).decode()})"
            )
            if commits:
                raise self.ctx.corrupt(message)
            self.issue = message
            self.dropped += 1
            return 0
        if members is None:
            self.lines.append(line)
            self.types.append(record.get("type"))  # type: ignore[arg-type]
            self.verdicts.append(fast_check(record, expected))
            if self.parsed is not None:
                self.parsed.append(None)
            return 1
        for member in members:
            self.lines.append(orjson.dumps(member))
            self.types.append("assistant/chunk")
            self.verdicts.append(fast_check(member, expected))
            expected += 1
        if self.parsed is not None:
            self.parsed += repeat(None, len(members))
        return len(members)


def _plain_at(record: Any, expected: int) -> bool:
    """Whether the fast loop takes a parsed line as the record at `expected` (seq and type only)."""
    try:
        kind = record["type"]
        return bool(record["seq"] == expected and kind not in PACKED_ROW_TYPES)
    except (TypeError, KeyError):
        # Not an object, no seq (a packed row has `seq0`), an unhashable type: the careful path decides.
        return False


# --------------------------------------------------------------------------------------------------
# Whole-log scans: the line scanner plus the torn-tail verdict


class LogScan(NamedTuple):
    """The event region of a log: the valid prefix, the torn marker, the first oversized integer."""

    events: LineRecords
    torn: TornMarker | None
    oversized_int_at: int | None


def scan_events(data: bytes, start: int, compression: Compression, ctx: LogContext) -> LogScan:
    """Scan the event region of a whole log (`data[start:]`, after the header record).

    Raises:
        SessionCorruptionError: A defect in the committed region (or inside a complete zstd frame).
    """
    # Scans keep one line (and perhaps one parsed dict) per record; pausing the collector keeps it from
    # rescanning them, and what the scan keeps goes straight to the oldest generation.
    with collector_paused(keep=True):
        if compression == "none":
            return _scan_raw(data, start, ctx)
        return _scan_zstd(data, start, ctx)


def _scan_raw(data: bytes, start: int, ctx: LogContext) -> LogScan:
    scanner = _LineScanner(ctx)
    # Feed slices that end on a line boundary, like zstd frames: a slice that may hold an oversized
    # integer takes the slow per-line path alone, and no split list spans the whole file.
    position = start
    fragment = b""
    while position < len(data):
        cut = data.find(_NEWLINE, position + _RAW_SLICE)
        end = len(data) if cut < 0 else cut + 1
        fragment = scanner.feed(data[position:end])
        position = end
    torn = None
    if fragment or scanner.issue is not None:
        # Raw mode: a final fragment without a newline, or a defect with no later `turn/end`, is a
        # torn tail; the complete records before it stay.
        cut = start + scanner.committed
        torn = TornMarker(truncate_to=cut, removed_bytes=len(data) - cut, removed_records=scanner.dropped)
    return LogScan(scanner.events, torn, scanner.oversized_at)


def _scan_zstd(data: bytes, start: int, ctx: LogContext) -> LogScan:
    scanner = _LineScanner(ctx)
    view = memoryview(data)
    size = len(data)
    context = zstandard.ZstdDecompressor()
    guess = _FIRST_FRAME_GUESS
    position = start
    while position < size:
        decoder = context.decompressobj()
        parts: list[bytes] = []
        end = position
        step = guess
        try:
            while not decoder.eof:
                piece = view[end : end + step]
                if not piece:
                    break
                parts.append(decoder.decompress(piece))
                end += len(piece)
                step = min(step * 2, _MAX_FRAME_STEP)
        except zstandard.ZstdError as error:
            raise ctx.corrupt(f"corrupt Zstandard session log: frame at byte {position} failed validation") from error
        text = b"".join(parts)
        if not decoder.eof:
            # The input ran out before this frame ended: a torn final frame, torn from its first
            # byte. Its complete records are kept and rewritten by the repair; the fragment goes.
            before = len(scanner.lines)
            scanner.feed(text)
            recovered = tuple(scanner.events[before:])
            torn = TornMarker(position, recovered, removed_bytes=size - position, removed_records=scanner.dropped)
            return LogScan(scanner.events, torn, scanner.oversized_at)
        end -= len(decoder.unused_data)
        fragment = scanner.feed(text)
        # A checksummed complete frame cannot be a crash artefact: any defect inside it is corruption.
        if fragment:
            raise ctx.corrupt(
                f"corrupt Zstandard session log: complete frame at byte {position} contains a torn JSONL record"
            )
        if scanner.issue is not None:
            raise ctx.corrupt(f"{scanner.issue} (inside the complete Zstandard frame at byte {position})")
        guess = end - position + 256
        position = end
    return LogScan(scanner.events, None, scanner.oversized_at)
