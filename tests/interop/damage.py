"""Ways a log is damaged on disk, applied the same to a log whichever side wrote it.

Layer: tests (interop). Each damage takes the bytes of a complete log (a header frame or line and at
least two event batches) and returns the damaged bytes; the frame boundaries come from `zstandard`
(`frame_spans`), never from scanning. A zstd-only damage has no plain-text form (`applies`).

* `torn-last-frame`: the last batch was cut short by a crash (its frame lost its last bytes, or
  the last plain line its newline and a few characters);
* `flipped-checksum`: the last frame's content checksum has one byte flipped;
* `header-only`: only the header survived (a log truncated right after its first record);
* `empty-file`: a 0-byte log;
* `torn-header`: the first record itself is incomplete;
* `partial-line-frame`: one more complete, checksummed frame whose text ends inside a line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import zstandard

from dsh.testing.jsonl_writer import frame_spans

__all__ = ["DAMAGES", "applies", "damage"]


def _torn_last(data: bytes, zstd: bool) -> bytes:
    if zstd:
        start, end = frame_spans(data)[-1]
        return data[: start + (end - start) // 2]
    body = data.rstrip(b"\n")
    return body[: body.rfind(b"\n") + 1 + 12]


def _flipped_checksum(data: bytes, zstd: bool) -> bytes:
    _, end = frame_spans(data)[-1]
    flipped = bytearray(data)
    flipped[end - 1] ^= 0xFF  # the last of the frame's four checksum bytes
    return bytes(flipped)


def _header_only(data: bytes, zstd: bool) -> bytes:
    if zstd:
        return data[: frame_spans(data)[0][1]]
    return data[: data.index(b"\n") + 1]


def _empty(data: bytes, zstd: bool) -> bytes:
    return b""


def _torn_header(data: bytes, zstd: bool) -> bytes:
    if zstd:
        start, end = frame_spans(data)[0]
        return data[: (end - start) // 2]
    return data[: data.index(b"\n") // 2]


def _partial_line_frame(data: bytes, zstd: bool) -> bytes:
    fragment = b'{"type":"session/title","seq":'
    return data + zstandard.ZstdCompressor(write_checksum=True).compress(fragment)


DAMAGES: Final[dict[str, Callable[[bytes, bool], bytes]]] = {
    "torn-last-frame": _torn_last,
    "flipped-checksum": _flipped_checksum,
    "header-only": _header_only,
    "empty-file": _empty,
    "torn-header": _torn_header,
    "partial-line-frame": _partial_line_frame,
}

_ZSTD_ONLY: Final = frozenset({"flipped-checksum", "partial-line-frame"})


def applies(name: str, compression: str) -> bool:
    """Whether the damage has a form in this encoding (checksums and frames are zstd's)."""
    return compression == "zstd" or name not in _ZSTD_ONLY


def damage(name: str, data: bytes, compression: str) -> bytes:
    """`data` with the damage `name` applied."""
    return DAMAGES[name](data, compression == "zstd")
