"""Untrusted text on the terminal: every id, label, message and path the CLI prints goes through here.

Layer: CLI (presentation only). Session ids, labels, error messages and paths come from stored logs,
model output and the command line, so they may hold escape sequences (ESC, OSC, CSI), other
control or format characters, rich markup (`[bold]`, `[link=...]`) or lone surrogates (an argument
that was not valid UTF-8). `safe` shows every such character as a visible escape, and `cell`
wraps the result in a rich `Text`, which rich never parses for markup or emoji codes. `json_text`
writes one JSON document with the same characters escaped inside its strings. Every output mode
(tables, `--plain`, `--json`, stderr lines) uses these (docs/cli.md#untrusted-text).
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from rich.text import Text

__all__ = ["cell", "json_text", "safe", "write_stdout"]

_ESCAPED_CATEGORIES: Final = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
"""Control, format (bidi overrides, invisible marks), surrogate and line/paragraph separator
characters: none of them is shown as itself."""

_JOINERS: Final = frozenset({"\u200c", "\u200d"})
"""Zero-width (non-)joiners are format characters that scripts and emoji sequences need; they
cannot drive a terminal or reorder text, so they stay."""


def _escape_char(ch: str) -> str:
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _needs_escape(ch: str) -> bool:
    import unicodedata  # only text that is not plainly printable gets here (docs/architecture.md#import-cost)

    return unicodedata.category(ch) in _ESCAPED_CATEGORIES and ch not in _JOINERS


def safe(text: object, *, newlines: bool = False) -> str:
    """`text` (any value, via `str`) with every control-like character shown as `\\xNN`/`\\uNNNN`.

    Args:
        text: The untrusted value.
        newlines: Keep `\\n` and `\\t` as they are (streamed model text); otherwise they are escaped
            too, so one value always stays on one line (table cells, one-line messages).
    """
    value = str(text)
    if value.isprintable():  # the common case: nothing to escape
        return value
    kept = "\n\t" if newlines else ""
    return "".join(ch if ch in kept or not _needs_escape(ch) else _escape_char(ch) for ch in value)


def cell(text: object, *, style: str = "") -> Text:
    """A rich `Text` holding `safe(text)`: rich renders it literally (no markup, no emoji codes)."""
    from rich.text import Text  # rich loads with the first table, not with every command

    return Text(safe(text), style=style)


def json_text(value: object, *, compact: bool = False) -> str:
    """One JSON document of `value` on one line, non-ASCII kept readable, control-like characters
    escaped as `\\uXXXX` inside strings (JSON allows that escape for any character).

    Args:
        value: Plain JSON data.
        compact: No spaces after separators (JSON lines).
    """
    raw = json.dumps(value, ensure_ascii=False, separators=(",", ":") if compact else None)
    if raw.isprintable():
        return raw
    # Control-like characters only occur inside strings here (JSON's own syntax is ASCII).
    return "".join(_json_escape(ch) if _needs_escape(ch) else ch for ch in raw)


def write_stdout(text: str) -> None:
    """Write `text` to stdout and flush, the way rich's console does (the plain tables' output).

    A closed pipe (`dsh agents | head -1`) ends the process with status 1 and no traceback, with
    stdout pointed at the null device so the interpreter's last flush cannot fail again.
    """
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise SystemExit(1) from None


def _json_escape(ch: str) -> str:
    """`\\uXXXX`, or a surrogate pair of them for a character outside the basic plane."""
    code = ord(ch)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 | (code >> 10):04x}\\u{0xDC00 | (code & 0x3FF):04x}"
