"""Helpers of the terminal tests: `dsh` on a pseudo-terminal (pexpect, 80 columns) and what its screen shows.

`screen()` replays what a terminal would do with the bytes written (text, `\\r`, `\\n`, erase-line,
erase-to-end, cursor up, the prompt's cursor moves), so a test can check that nothing written was
erased afterwards — the bug where a spinner's `\\r ESC[1A ESC[2K` removed an answer.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pexpect

__all__ = ["COLUMNS", "GUARD_S", "dsh_argv", "screen", "spawn", "terminal_env", "write_script"]

COLUMNS = 80
GUARD_S = 60
"""How long a test waits for something before failing: a guard against hangs, never a timing assertion."""

_CSI = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])")
_OSC_OR_OTHER = re.compile(r"\x1b[\]PX^_].*?(?:\x07|\x1b\\)|\x1b[()][A-Za-z0-9]|\x1b[=>78]")


def write_script(folder: Path, agents: Mapping[str, Any], name: str = "script.json") -> Path:
    """A scripted-model file with these agent tracks (`{"main": {"steps": [...]}, ...}`)."""
    path = folder / name
    path.write_text(json.dumps({"version": 1, "model": "scripted-terminal", "agents": dict(agents)}), encoding="utf-8")
    return path


def terminal_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a `dsh` on the pseudo-terminal: its own HOME, no colour, 80 columns."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("DSH_")}
    env.update(
        {
            "HOME": str(tmp_path),
            "XDG_CONFIG_HOME": str(tmp_path / "config"),
            "XDG_STATE_HOME": str(tmp_path / "state"),
            "NO_COLOR": "1",
            "COLUMNS": str(COLUMNS),
            "TERM": "xterm",
            # pexpect answers no cursor-position request; prompt_toolkit then waits for nothing.
            "PROMPT_TOOLKIT_NO_CPR": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra)
    return env


def dsh_argv(home: Path, *words: str) -> list[str]:
    """`python -m dsh --home HOME WORDS...`."""
    return ["-m", "dsh", "--home", str(home), *words]


def spawn(tmp_path: Path, argv: Sequence[str], **env: str) -> pexpect.spawn:
    """`python ARGV` on a pseudo-terminal of 24 x 80, everything it writes kept in `child.transcript`."""
    child = pexpect.spawn(
        sys.executable,
        list(argv),
        env=terminal_env(tmp_path, **env),
        encoding="utf-8",
        timeout=GUARD_S,
        dimensions=(24, COLUMNS),
        cwd=str(tmp_path),
    )
    child.transcript = []  # type: ignore[attr-defined]
    child.logfile_read = _Recorder(child.transcript)  # type: ignore[attr-defined]
    return child


class _Recorder:
    def __init__(self, parts: list[str]) -> None:
        self.parts = parts

    def write(self, text: str) -> None:
        self.parts.append(text)

    def flush(self) -> None:
        pass


def screen(raw: str) -> list[str]:
    """The lines a terminal shows after `raw` (scrolled-off lines included), right-trimmed."""
    raw = _OSC_OR_OTHER.sub("", raw)
    lines: list[list[str]] = [[]]
    row = col = 0
    position = 0
    for match in _CSI.finditer(raw):
        row, col = _text(lines, row, col, raw[position : match.start()])
        row, col = _control(lines, row, col, match.group(1), match.group(2))
        position = match.end()
    _text(lines, row, col, raw[position:])
    return ["".join(line).rstrip() for line in lines]


def _text(lines: list[list[str]], row: int, col: int, text: str) -> tuple[int, int]:
    for ch in text:
        if ch == "\r":
            col = 0
        elif ch == "\n":
            row += 1
            while len(lines) <= row:
                lines.append([])
        elif ch == "\b":
            col = max(0, col - 1)
        elif ch >= " ":
            if col >= COLUMNS:
                row, col = row + 1, 0
                while len(lines) <= row:
                    lines.append([])
            line = lines[row]
            while len(line) <= col:
                line.append(" ")
            line[col] = ch
            col += 1
    return row, col


def _control(lines: list[list[str]], row: int, col: int, params: str, final: str) -> tuple[int, int]:
    count = int(params) if params.isdigit() else 1
    if final == "A":
        row = max(0, row - count)
    elif final == "B":
        row += count
        while len(lines) <= row:
            lines.append([])
    elif final == "C":
        col += count
    elif final == "D":
        col = max(0, col - count)
    elif final == "K":
        line = lines[row]
        if params in ("", "0"):
            del line[col:]
        elif params == "2":
            line.clear()
        elif params == "1":
            for index in range(min(col + 1, len(line))):
                line[index] = " "
    elif final == "J" and params in ("", "0"):
        del lines[row][col:]
        del lines[row + 1 :]
    return row, col
