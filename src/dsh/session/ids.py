"""Session ids: minting (ULID), validation of new ids, and the path-segment escaping.

Layer: session. The segment encoding lives here because id validation needs it (an id whose escaped
directory name would exceed 255 bytes is refused at creation); the JSONL backend uses the same
function for its layout, so the two can never disagree.
"""

from __future__ import annotations

import os
import time
from typing import Final

__all__ = ["encode_segment", "id_problem", "new_session_id", "utf16_length"]

_CROCKFORD: Final = "0123456789abcdefghjkmnpqrstvwxyz"
_SAFE: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
MAX_ID_UNITS: Final = 128
MAX_SEGMENT_BYTES: Final = 255


def new_session_id() -> str:
    """A 26-character lowercase ULID: 48-bit epoch milliseconds + 80 random bits.

    Ids must stay unique across restarts and hosts, so this is never a process-local counter.
    """
    value = (time.time_ns() // 1_000_000 & ((1 << 48) - 1)) << 80 | int.from_bytes(os.urandom(10), "big")
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def _utf16_units(value: str) -> list[int]:
    units: list[int] = []
    for ch in value:
        cp = ord(ch)
        if cp >= 0x10000:
            cp -= 0x10000
            units.extend((0xD800 | (cp >> 10), 0xDC00 | (cp & 0x3FF)))
        else:
            units.append(cp)
    return units


def utf16_length(value: str) -> int:
    """Length in UTF-16 code units (what a JavaScript reader calls `length`)."""
    return sum(2 if ord(ch) >= 0x10000 else 1 for ch in value)


def encode_segment(value: str) -> str:
    """Escape one path segment (docs/storage-format.md#id-escaping).

    Walks UTF-16 code units; keeps ASCII letters, digits, `.`, `_`, `-`; every other unit (`~`
    included) becomes `~` + 4 uppercase hex digits. The whole-segment values `.` and `..` are
    escaped so that an id can never name the current or parent directory.
    """
    if not value:
        raise ValueError("cannot encode an empty path segment")
    if value == ".":
        return "~002E"
    if value == "..":
        return "~002E~002E"
    if all(ch in _SAFE for ch in value):
        return value
    return "".join(chr(u) if chr(u) in _SAFE else f"~{u:04X}" for u in _utf16_units(value))


def id_problem(value: object) -> str | None:
    """Why `value` cannot be a new session id, or None when it can."""
    if type(value) is not str:
        return f"session id must be a string, got {type(value).__name__}"
    if not value:
        return "session id must not be empty"
    units = utf16_length(value)
    if units > MAX_ID_UNITS:
        return f"session id must be at most {MAX_ID_UNITS} UTF-16 code units, got {units}"
    for ch in value:
        cp = ord(ch)
        if cp <= 0x1F or cp == 0x7F:
            return f"session id must not contain control character U+{cp:04X}"
        if 0xD800 <= cp <= 0xDFFF:
            return f"session id must not contain a lone surrogate (U+{cp:04X})"
    encoded = len(encode_segment(value).encode())
    if encoded > MAX_SEGMENT_BYTES:
        return f"session id escapes to a {encoded}-byte directory name; the limit is {MAX_SEGMENT_BYTES}"
    return None
