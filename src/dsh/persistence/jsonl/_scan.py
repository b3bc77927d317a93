"""The scan of a JSONL log's event region: records, fast verdicts and the torn-tail rule.

Layer: persistence (private to `dsh.persistence.jsonl`; nothing outside the package imports it). Pure:
it works on the bytes of a whole log. The scan implements the torn-tail rule
(docs/storage-format.md#torn-tails-and-repair): the log is valid up to its first defect, and the
defect plus everything after it is a removable torn tail only if no later record carries a
`turn/end` (the TypeScript harness's rule; a torn tail holding complete records is copied beside the
log before a repair removes it, so no byte is lost). A packed chunk row written by the TypeScript
harness (`_packed`) is expanded into the events it stands for as it is scanned; a malformed row is a
defect of its line like any other.

Hot path (docs/architecture.md#read-path): a read is dominated by parsing, so every line is parsed
exactly once, with one C-level `map` of `orjson.loads` per slice (a zstd frame, or 256 KiB of a raw
log), and the parsed records are what the scan keeps and hands over: plain dicts, owned by the
reader, which the read path later wraps in lazily frozen views. The fast validation verdicts
(`dsh.session.fastcheck`) are taken from that parse, one byte per record. A line the fast loop does
not accept (a packed row, a defect) goes through the careful path alone, and the fast loop resumes
after it while the log is still clean. Two things `orjson` reads differently from the read rules
are caught per slice before anything is kept: an integer beyond 64 bits (the slice takes the careful
path, which finds it; such a log is format-unsupported) and a number that parses to `-0.0` (the
record is rewritten with `0.0`, as `dsh.json.adopt` reads it).
"""

from __future__ import annotations

import json
import re
from typing import Any, Final, NamedTuple

import orjson
import zstandard

from dsh.json import adopt, thaw
from dsh.persistence.base import TornMarker, first_oversized_int
from dsh.persistence.jsonl._format import Compression, LogContext
from dsh.persistence.jsonl._packed import ROW_TYPES, MalformedRowError, expand_row
from dsh.session.fastcheck import FAST_UNSURE, fast_check
from dsh.session.stored import RecordList

__all__ = ["LogScan", "may_hold_negative_zero", "scan_events"]

_NEWLINE: Final = b"\n"
_UNSURE: Final = bytes([FAST_UNSURE])

# A run of 19 digits is the only way to spell an integer outside signed 64 bits. Mapping every digit
# to "0" and searching for nineteen of them is an order of magnitude faster than a regex over the
# whole plaintext, so `first_oversized_int` only runs on slices that can hold such an integer.
_DIGITS_TO_ZERO: Final = bytes.maketrans(b"123456789", b"000000000")
_LONG_DIGIT_RUN: Final = b"0" * 19

# A JSON number that parses to -0.0 is negative and either starts `-0` without a nonzero first
# decimal (`-0`, `-0.00`, `-0e5`, and `-0.000...01` with hundreds of zeros, which underflows) or has a
# negative exponent that may underflow (`-1e-400`, `-0.5e-400`). `-0` followed by a digit is no JSON
# number, so dates such as `2024-01-05` do not match. The search may say yes for text inside a
# string; it never says no for such a number.
_NEGATIVE_ZERO: Final = re.compile(rb"-(?:0(?![0-9]|\.[1-9])|[0-9]+(?:\.[0-9]+)?[eE]-)")

# The first frame size guess when decoding; later guesses follow the previous frame's size so the
# bytes handed back in `unused_data` (a copy) stay about one frame long.
_FIRST_FRAME_GUESS: Final = 4096
_RAW_SLICE: Final = 1 << 18
_MAX_FRAME_STEP: Final = 1 << 22


def may_hold_negative_zero(text: bytes) -> bool:
    """Whether JSON `text` may spell a number that parses to `-0.0` (never a false "no")."""
    return _NEGATIVE_ZERO.search(text) is not None


def _may_hold_oversized_int(text: bytes) -> bool:
    """Whether `text` holds a run of 19 digits (never a false "no" for an integer beyond 64 bits)."""
    return text.translate(_DIGITS_TO_ZERO).find(_LONG_DIGIT_RUN) >= 0


def _positive_zeros(record: dict[str, Any]) -> dict[str, Any]:
    """`record` with every `-0.0` read as `0.0`, the read rules' reading (rare: a slice that may hold one)."""
    plain: dict[str, Any] = thaw(adopt(record))
    return plain


def _commits(kind: object) -> bool:
    """Whether a complete record proves that its writer went on committing past a defect: a `turn/end`.

    This is the TypeScript harness's rule, kept so both read a damaged log the same way. Anything
    else after a defect (messages included) is part of the torn tail; the repair copies such a tail
    beside the log before it cuts it (docs/storage-format.md#torn-tails-and-repair)."""
    return kind == "turn/end"


def _plain_at(record: Any, expected: int) -> bool:
    """Whether the fast loop takes a parsed line as the record at `expected` (seq and type only)."""
    try:
        kind = record["type"]
        return bool(record["seq"] == expected and kind not in ROW_TYPES)
    except (TypeError, KeyError):
        # Not an object, no seq (a packed row has `seq0`), an unhashable type: the careful path decides.
        return False


class _LineScanner:
    """Accepts contiguous records line by line and remembers the first defect.

    `records` holds the accepted records (the valid prefix), a packed row contributing every event it
    stands for, and `verdicts` their fast-check verdicts. `issue` is the first defect's message; once
    it is set no line is accepted any more, and a later complete line holding a `turn/end` raises it,
    because the damage then lies in the committed region. `dropped` counts the complete, parseable
    records from the defect on (what a repair would remove). Line numbers count physical lines (the
    header is line 1), so a packed row is one line however many events it holds.
    """

    __slots__ = ("committed", "ctx", "dropped", "issue", "line_no", "oversized_at", "records", "verdicts")

    def __init__(self, ctx: LogContext) -> None:
        self.ctx = ctx
        self.records: list[dict[str, Any]] = []
        self.verdicts = bytearray()
        self.issue: str | None = None
        self.dropped = 0
        self.line_no = 1  # the header is line 1
        self.committed = 0  # bytes of accepted lines, relative to the first byte fed
        self.oversized_at: int | None = None

    def feed(self, text: bytes) -> bytes:
        """Scan the complete lines of `text`; return the trailing fragment after the last newline."""
        lines = text.split(_NEWLINE)
        fragment = lines.pop()
        suspicious = self.oversized_at is None and _may_hold_oversized_int(text)
        zeros = may_hold_negative_zero(text)
        start = 0
        if self.issue is None and not suspicious:
            while True:
                stop = self._fast(lines, start, zeros=zeros)
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
            self.oversized_at = len(self.records) - accepted
        return True

    def _fast(self, lines: list[bytes], start: int, *, zeros: bool) -> int:
        """Accept `lines[start:]` while they are plain contiguous records; return the index of the
        first line it did not accept (`len(lines)` when it accepted them all).

        The per-line work runs in C-level loops: one parse per line, then the fast checks. A slice
        holding a line that is not JSON is walked line by line instead, so the stop lands on that
        line. `zeros`: a line of the slice may spell `-0.0`, so each line is asked before its record
        is kept.
        """
        chunk = lines[start:] if start else lines
        expected = len(self.records)
        try:
            parsed = list(map(orjson.loads, chunk))
        except orjson.JSONDecodeError:
            return start + self._fast_lines(chunk, expected, zeros=zeros)
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
            del parsed[accepted:]
            verdicts = verdicts[:accepted]
        if zeros:
            for offset in range(accepted):
                if may_hold_negative_zero(chunk[offset]):
                    parsed[offset] = _positive_zeros(parsed[offset])
        self.records += parsed
        self.verdicts += verdicts
        return start + accepted

    def _fast_lines(self, lines: list[bytes], expected: int, *, zeros: bool) -> int:
        """`_fast` for a slice holding a line that is not JSON, one line at a time; returns the count."""
        for offset, line in enumerate(lines):
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                return offset
            if not _plain_at(record, expected + offset):
                return offset
            self._keep(record, line if zeros else None)
        return len(lines)

    def _keep(self, record: dict[str, Any], line: bytes | None) -> None:
        """Keep one accepted record (`line`: its text, when it may spell `-0.0`)."""
        if line is not None and may_hold_negative_zero(line):
            record = _positive_zeros(record)
        self.verdicts.append(fast_check(record, len(self.records)))
        self.records.append(record)

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
            if type(kind) is str and kind in ROW_TYPES:
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
        expected = len(self.records)
        seq = record.get("seq0") if members is not None else record.get("seq")
        if type(seq) is not int or seq != expected:
            message = (
                f"corrupt session log: seq gap in committed region at line {self.line_no} "
                f"(expected {expected}, got {_spelled(seq, line, 'seq0' if members is not None else 'seq')})"
            )
            if commits:
                raise self.ctx.corrupt(message)
            self.issue = message
            self.dropped += 1
            return 0
        if members is None:
            self._keep(record, line)
            return 1
        for member in members:
            self._keep(member, line)
        return len(members)


def _spelled(value: object, line: bytes, key: str) -> str:
    """`value` (the line's `key`) as the line spells it, for a message.

    `orjson` reads an integer beyond 64 bits as a float, so such a value is read again from the
    line with the standard library's parser, which keeps every integer exact.
    """
    if type(value) is float and first_oversized_int((line,)) == 0:
        try:
            exact = json.loads(line).get(key)
        except (ValueError, AttributeError):
            exact = None
        if type(exact) is int:
            return str(exact)
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return repr(value)


class LogScan(NamedTuple):
    """The event region of a log: the valid prefix with its verdicts, the torn marker, the first
    oversized integer."""

    records: RecordList
    verdicts: bytearray
    torn: TornMarker | None
    oversized_int_at: int | None


def scan_events(data: bytes, start: int, compression: Compression, ctx: LogContext) -> LogScan:
    """Scan the event region of a whole log (`data[start:]`, after the header record).

    Raises:
        SessionCorruptionError: A defect in the committed region (or inside a complete zstd frame).
    """
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
    return LogScan(RecordList(scanner.records), scanner.verdicts, torn, scanner.oversized_at)


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
            before = len(scanner.records)
            scanner.feed(text)
            # The repair gets its own top-level copies: freezing the read's records replaces their
            # `data` (and only that; nested values are copied when they are wrapped).
            recovered = tuple(dict(record) for record in scanner.records[before:])
            torn = TornMarker(position, recovered, removed_bytes=size - position, removed_records=scanner.dropped)
            return LogScan(RecordList(scanner.records), scanner.verdicts, torn, scanner.oversized_at)
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
    return LogScan(RecordList(scanner.records), scanner.verdicts, None, scanner.oversized_at)
