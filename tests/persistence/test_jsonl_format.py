"""The pure JSONL codec: layout, header encoding, zstd framing and the scanner's torn/corruption rules.

No file system here: these tests call the private codec modules `dsh.persistence.jsonl._format` and
`_scan` directly (docs/storage-format.md#jsonl-layout, docs/storage-format.md#torn-tails-and-repair).
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import zstandard

from dsh.persistence.errors import SessionCorruptionError, SessionFormatUnsupportedError
from dsh.persistence.jsonl._format import (
    LogContext,
    check_identity,
    check_version,
    decode_header,
    encode_batch,
    encode_header,
    project_key,
    relative_path,
    split_head,
)
from dsh.persistence.jsonl._scan import scan_events
from dsh.session.header import HeaderInit
from tests.persistence.helpers import closed_records, open_step_records

CTX = LogContext("s1", "/store/x/session.jsonl")


def _frame(text: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=3, write_checksum=True).compress(text)


def _raw(records: list[dict[str, Any]], extra: bytes = b"") -> tuple[bytes, int]:
    head = b'{"type":"session","version":0,"id":"s1","createdAt":1,"delegationDepth":0}\n'
    return head + encode_batch(records) + extra, len(head)


def _turn_end(seq: int) -> bytes:
    return orjson.dumps({"type": "turn/end", "seq": seq, "time": 1, "data": {"turn": 9, "reason": {"kind": "x"}}})


def test_id_and_cwd_are_escaped_into_the_relative_path() -> None:
    """id `a/b c~` with cwd `/srv/x y` lives at `--srv-x~0020y--/a~002Fb~0020c~007E/session.jsonl.zstd`."""
    assert relative_path("a/b c~", "/srv/x y", "zstd") == "--srv-x~0020y--/a~002Fb~0020c~007E/session.jsonl.zstd"
    assert relative_path("a/b c~", "/srv/x y", "none") == "--srv-x~0020y--/a~002Fb~0020c~007E/session.jsonl"


def test_traversal_ids_and_missing_cwd_are_escaped() -> None:
    """`..` encodes as `~002E~002E`, `.` as `~002E`, and no cwd uses the literal `_no-cwd`."""
    assert relative_path("..", None, "zstd") == "_no-cwd/~002E~002E/session.jsonl.zstd"
    assert relative_path(".", None, "none") == "_no-cwd/~002E/session.jsonl"
    with pytest.raises(ValueError, match="empty path segment"):
        relative_path("", None, "zstd")


def test_project_key_collapses_separator_runs_and_escapes() -> None:
    """`/`, `\\`, `:` runs become one `-`, leading dashes go, an empty slug is `root`, astral chars take two escapes."""
    assert project_key("/a//b\\:c") == "--a-b-c--"
    assert project_key("/") == "--root--"
    assert project_key("/a-b/c") == project_key("/a/b-c") == "--a-b-c--"
    assert project_key("/x/\U0001f600") == "--x-~D83D~DE00--"
    assert project_key("/tmp/~") == "--tmp-~007E--"


def test_project_key_keeps_251_characters() -> None:
    """A long cwd keeps the first 251 slug characters, so the directory name is at most 255 bytes."""
    key = project_key("/" + "a" * 400)
    assert key == "--" + "a" * 251 + "--"
    assert len(key.encode()) == 255


def test_header_line_keeps_upstream_key_order() -> None:
    """The header line is compact JSON in upstream key order with `delegationDepth` always present."""
    header = HeaderInit(cwd="/w", parent_session="p", origin="subagent", agent_preset="coder").build(
        "s1", created_at=5, is_seeded=True
    )
    line = encode_header(header.to_stored(3))
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1
    keys = list(orjson.loads(line))
    assert keys == ["type", "version", "id", "createdAt", "cwd", "parentSession", "seedLength", "origin",
                    "delegationDepth", "agentPreset"]  # fmt: skip
    plain = encode_header(HeaderInit().build("s2", created_at=5, is_seeded=False).to_stored(0))
    assert orjson.loads(plain) == {"type": "session", "version": 0, "id": "s2", "createdAt": 5, "delegationDepth": 0}


def test_encode_batch_is_one_compact_line_per_record() -> None:
    """Every record is one compact line ending in a newline; an empty batch is empty bytes."""
    records = closed_records(1)
    text = encode_batch(records)
    assert text.count(b"\n") == len(records)
    assert b": " not in text
    assert [orjson.loads(line) for line in text.splitlines()] == records
    assert encode_batch([]) == b""


def test_split_head_raw_needs_a_newline() -> None:
    """A raw head without a newline is incomplete (None); with one, the event region starts after it."""
    assert split_head(b'{"type":"session"', "none", CTX) is None
    head = split_head(b'{"a":1}\n{"b":2}\n', "none", CTX)
    assert head is not None
    assert (head.line, head.end) == (b'{"a":1}', 8)


def test_split_head_zstd_frame_one_is_exactly_one_line() -> None:
    """Zstd frame 1 must be complete (else None) and decode to exactly one line (else corruption)."""
    header = _frame(b'{"a":1}\n')
    assert split_head(header[:-3], "zstd", CTX) is None
    head = split_head(header + _frame(b"x\n"), "zstd", CTX)
    assert head is not None
    assert (head.line, head.end) == (b'{"a":1}', len(header))
    with pytest.raises(SessionCorruptionError, match="exactly one header line"):
        split_head(_frame(b'{"a":1}\n{"b":2}\n'), "zstd", CTX)
    with pytest.raises(SessionCorruptionError, match="exactly one header line"):
        split_head(_frame(b'{"a":1}'), "zstd", CTX)
    with pytest.raises(SessionCorruptionError, match="frame at byte 0"):
        split_head(b"not a zstd frame at all", "zstd", CTX)


def test_decode_header_refuses_non_headers() -> None:
    """The first record must be JSON and a `session` record, else corruption."""
    with pytest.raises(SessionCorruptionError, match="not valid JSON"):
        decode_header(b"{nope", CTX)
    with pytest.raises(SessionCorruptionError, match="not a session header"):
        decode_header(b'{"type":"turn/start"}', CTX)
    assert decode_header(b'{"type":"session","id":"x"}', CTX) == {"type": "session", "id": "x"}


@pytest.mark.parametrize(("version", "direction"), [(1, "newer"), (-1, "older"), (2.5, "newer")])
def test_version_refusal_carries_the_facts(version: object, direction: str) -> None:
    """A numeric version other than 0 is format-unsupported with found version, direction and path."""
    with pytest.raises(SessionFormatUnsupportedError) as caught:
        check_version({"type": "session", "version": version, "id": "s1"}, CTX)
    error = caught.value
    assert (error.code, error.found_version, error.direction) == ("SESSION_FORMAT_UNSUPPORTED", version, direction)
    assert (error.session_id, error.location) == ("s1", CTX.location)
    check_version({"version": 0}, CTX)
    check_version({"version": "0"}, CTX)  # not numeric: left to the header shape check


def test_header_must_name_the_requested_id_and_this_path() -> None:
    """Header id must equal the requested id, and id + cwd must name this very path."""
    record = {"type": "session", "version": 0, "id": "s1", "cwd": "/w"}
    check_identity(record, "s1", "--w--/s1/session.jsonl.zstd", "zstd", CTX)
    with pytest.raises(SessionCorruptionError, match='requested id "s2"'):
        check_identity(record, "s2", "--w--/s1/session.jsonl.zstd", "zstd", CTX)
    with pytest.raises(SessionCorruptionError, match="identify"):
        check_identity(record, "s1", "--elsewhere--/s1/session.jsonl.zstd", "zstd", CTX)
    with pytest.raises(SessionCorruptionError, match="cannot name"):
        check_identity({"type": "session", "id": 7}, None, "_no-cwd/7/session.jsonl.zstd", "zstd", CTX)


# ---------------------------------------------------------------- raw scanner


def test_raw_clean_log_has_no_torn_tail() -> None:
    """A clean raw log yields every record and no marker."""
    records = closed_records(2)
    data, start = _raw(records)
    scan = scan_events(data, start, "none", CTX)
    assert scan.records == records
    assert (scan.torn, scan.oversized_int_at) == (None, None)


def test_raw_final_fragment_is_torn() -> None:
    """A final fragment without a newline is a torn tail; the marker cuts right after the last line."""
    records = open_step_records()
    data, start = _raw(records, b'{"type":"assistant/chunk","seq":')
    scan = scan_events(data, start, "none", CTX)
    assert scan.records == records
    assert scan.torn is not None
    assert scan.torn.truncate_to == len(data) - len(b'{"type":"assistant/chunk","seq":')
    assert scan.torn.recovered_events == ()


def test_raw_garbage_before_log_only_events_is_torn() -> None:
    """Garbage followed only by log-only events is a torn tail starting at the garbage line."""
    records = open_step_records(calls=())
    keep = records[:-2]
    data, start = _raw(keep)
    cut = len(data)
    data += b"\x00garbage\n" + encode_batch(records[-2:])
    scan = scan_events(data, start, "none", CTX)
    assert scan.records == keep
    assert scan.torn is not None
    assert scan.torn.truncate_to == cut
    assert (scan.torn.removed_bytes, scan.torn.removed_records) == (len(data) - cut, 2)


def test_raw_garbage_before_a_message_of_an_open_turn_is_a_torn_tail_counting_it() -> None:
    """Garbage then a message but no `turn/end` is a torn tail whose complete records are counted for the copy."""
    records = open_step_records()
    assert records[-1]["type"] == "assistant/message"
    data, start = _raw(records[:-1], b"{garbled\n" + encode_batch(records[-1:]))
    scan = scan_events(data, start, "none", CTX)
    assert scan.torn is not None
    assert scan.torn.removed_records == 1


def test_a_bare_fragment_holds_no_complete_record() -> None:
    """A final fragment without a newline is a torn tail that removes bytes but no complete record."""
    records = closed_records(1)
    data, start = _raw(records, b'{"type":"turn/start","se')
    scan = scan_events(data, start, "none", CTX)
    assert scan.torn is not None
    assert (scan.torn.removed_bytes, scan.torn.removed_records) == (len(b'{"type":"turn/start","se'), 0)


def test_raw_garbage_before_turn_end_is_corrupt() -> None:
    """Garbage followed by a `turn/end` line is corruption naming the garbage line."""
    records = open_step_records()
    data, start = _raw(records, b"garbage\n" + _turn_end(len(records) + 1) + b"\n")
    with pytest.raises(SessionCorruptionError, match=f"unparsable committed event at line {len(records) + 2}"):
        scan_events(data, start, "none", CTX)


def test_raw_seq_gap_rules() -> None:
    """A seq gap on a `turn/end` line is corruption at once; on any other line it starts a torn tail."""
    records = open_step_records()
    data, start = _raw(records, _turn_end(len(records) + 3) + b"\n")
    with pytest.raises(SessionCorruptionError, match="seq gap in committed region"):
        scan_events(data, start, "none", CTX)
    message = dict(records[-1], seq=len(records) + 5)
    data, start = _raw([*records, message])
    scan = scan_events(data, start, "none", CTX)
    assert scan.records == records
    assert scan.torn is not None
    chunk = dict(records[-2], seq=len(records) + 5)
    assert chunk["type"] == "assistant/chunk"
    data, start = _raw([*records, chunk])
    scan = scan_events(data, start, "none", CTX)
    assert scan.records == records
    assert scan.torn is not None
    assert scan.torn.removed_records == 1


def test_raw_unparsable_and_non_object_lines() -> None:
    """Lone-surrogate escapes and non-object JSON lines count as unparsable records."""
    records = closed_records(1)
    for bad in (b'{"type":"x","seq":6,"time":1,"data":"\\ud800"}', b"[1,2]", b"42", b""):
        data, start = _raw(records, bad + b"\n")
        scan = scan_events(data, start, "none", CTX)
        assert scan.records == records
        assert scan.torn is not None


def test_a_malformed_packed_row_is_a_defect_of_its_line() -> None:
    """A row-tagged line in the wrong shape is a torn tail when nothing follows and corruption before a `turn/end`."""
    records = closed_records(1)
    for bad in (
        b'{"type":"text-chunks","seq0":6,"time":1,"deltas":["a","b","c"]}',
        b'{"type":"text-chunks","seq":6,"time":1,"data":{}}',
    ):
        data, start = _raw(records, bad + b"\n")
        scan = scan_events(data, start, "none", CTX)
        assert scan.records == records
        assert scan.torn is not None
        assert scan.torn.truncate_to == len(data) - len(bad) - 1
        data, start = _raw(records, bad + b"\n" + _turn_end(6) + b"\n")
        with pytest.raises(SessionCorruptionError, match=f"malformed text-chunks row at line {len(records) + 2}"):
            scan_events(data, start, "none", CTX)


def test_oversized_integer_is_located() -> None:
    """An integer outside signed 64 bits marks its record index; long digit runs in strings do not."""
    records = closed_records(1)
    big = {"type": "session/title", "seq": len(records), "time": 1, "data": {"n": 0}}
    line = orjson.dumps(big).replace(b'"n":0', b'"n":' + str(2**64).encode())
    data, start = _raw(records, line + b"\n")
    assert scan_events(data, start, "none", CTX).oversized_int_at == len(records)
    text = dict(big, data={"text": "1" * 40, "n": 2**63 - 1})
    data, start = _raw([*records, text])
    assert scan_events(data, start, "none", CTX).oversized_int_at is None


# ---------------------------------------------------------------- zstd scanner


def _zstd(batches: list[bytes]) -> tuple[bytes, int]:
    head = _frame(b'{"type":"session","version":0,"id":"s1","createdAt":1,"delegationDepth":0}\n')
    return head + b"".join(_frame(batch) for batch in batches), len(head)


def test_zstd_multi_frame_log_scans_frame_by_frame() -> None:
    """Several complete frames decode into one contiguous record list, and a standard decoder reads the file."""
    records = closed_records(3)
    data, start = _zstd([encode_batch(records[:4]), encode_batch(records[4:9]), encode_batch(records[9:])])
    scan = scan_events(data, start, "zstd", CTX)
    assert (scan.records, scan.torn) == (records, None)
    whole = zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True).read()
    assert whole.splitlines()[1:] == encode_batch(records).splitlines()


def test_complete_frame_ending_mid_record_is_corrupt() -> None:
    """A complete frame whose text ends mid-record is corruption, even with no later `turn/end`."""
    records = open_step_records()
    data, start = _zstd([encode_batch(records), b'{"type":"assistant/chunk"'])
    with pytest.raises(SessionCorruptionError, match="torn JSONL record"):
        scan_events(data, start, "zstd", CTX)


def test_garbage_inside_a_complete_frame_is_corrupt() -> None:
    """An unparsable line inside a complete frame is corruption even when nothing follows it."""
    records = open_step_records()
    data, start = _zstd([encode_batch(records), b"garbage\n"])
    with pytest.raises(SessionCorruptionError, match="unparsable committed event"):
        scan_events(data, start, "zstd", CTX)


def test_flipped_byte_in_a_complete_frame_is_corrupt() -> None:
    """A flipped content byte fails the frame's checksum: corruption naming the frame offset."""
    records = open_step_records()
    data, start = _zstd([encode_batch(records[:3]), encode_batch(records[3:])])
    damaged = bytearray(data)
    damaged[start + 20] ^= 0x20
    with pytest.raises(SessionCorruptionError, match=f"frame at byte {start} failed validation"):
        scan_events(bytes(damaged), start, "zstd", CTX)


@pytest.mark.parametrize("cut", ["magic", "checksum", "middle"])
def test_torn_final_frame_keeps_complete_records(cut: str) -> None:
    """A torn final frame keeps the complete frames and the complete records it decodes."""
    records = open_step_records()
    first, last = records[:6], records[6:]
    data, start = _zstd([encode_batch(first)])
    torn_start = len(data)
    tail = _frame(encode_batch(last) + b'{"type":"tool/call"')
    size = {"magic": 2, "checksum": len(tail) - 2, "middle": len(tail) // 2}[cut]
    data += tail[:size]
    scan = scan_events(data, start, "zstd", CTX)
    assert scan.torn is not None
    assert scan.torn.truncate_to == torn_start
    recovered = list(scan.torn.recovered_events)
    assert scan.records == first + recovered
    if cut == "checksum":
        assert recovered == last
    if cut == "magic":
        assert recovered == []


def test_torn_frame_with_garbage_before_turn_end_is_corrupt() -> None:
    """Inside a torn final frame the line rule still applies: garbage before a complete `turn/end` is corrupt."""
    records = open_step_records()
    data, start = _zstd([encode_batch(records)])
    tail = _frame(b"garbage\n" + _turn_end(len(records) + 1) + b"\n")
    with pytest.raises(SessionCorruptionError, match="unparsable committed event"):
        scan_events(data + tail[:-2], start, "zstd", CTX)


def test_zstd_garbage_bytes_after_frames() -> None:
    """Fewer than four trailing bytes are a torn frame; four or more non-zstd bytes are corruption."""
    records = closed_records(1)
    data, start = _zstd([encode_batch(records)])
    scan = scan_events(data + b"\x28\xb5", start, "zstd", CTX)
    assert scan.torn is not None
    assert scan.torn.truncate_to == len(data)
    with pytest.raises(SessionCorruptionError, match=f"frame at byte {len(data)}"):
        scan_events(data + b"garbage!", start, "zstd", CTX)


def test_raw_large_log_scans_in_slices() -> None:
    """A raw log larger than one scan slice keeps every record, finds a late oversized integer and its torn tail."""
    records = [
        {"type": "session/title", "seq": seq, "time": 1, "data": {"title": "x" * 5000, "n": seq}} for seq in range(300)
    ]
    body = bytearray(encode_batch(records))
    marker = b'"n":250}'
    body[body.index(marker) : body.index(marker) + len(marker)] = b'"n":' + str(2**66).encode() + b"}"
    data, start = _raw([], bytes(body) + b'{"type":')
    assert len(data) > 4 * (1 << 18)
    scan = scan_events(data, start, "none", CTX)
    assert [record["seq"] for record in scan.records] == list(range(300))
    assert scan.oversized_int_at == 250
    assert scan.torn is not None
    assert scan.torn.truncate_to == len(data) - len(b'{"type":')
