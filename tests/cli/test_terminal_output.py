"""What reaches the terminal: escaped untrusted text, tables that fit 80 columns, plain help, one-line errors.

Ids, labels, messages and paths come from stored logs and the command line; they reach the terminal
with control characters escaped and rich markup off, in the rich table, `--plain` and `--json`
alike (docs/cli.md#untrusted-text). Tables fit the console: ids are never cut, LABEL wraps, and
columns are left out in the documented order (docs/cli.md#tables-at-80-columns).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main
from rich.console import Console
from typer.testing import CliRunner

from dsh.cli import app as cli_app
from dsh.cli import render
from dsh.cli.app import primary_error
from dsh.cli.errors import exit_code_for
from dsh.cli.main import app
from dsh.cli.render import DROP_ORDER, catalog_table, descendants_table
from dsh.cli.text import cell, json_text, safe
from dsh.errors import ConfigError
from dsh.persistence.errors import StoreMisconfiguredError
from dsh.subagent.rows import SubagentChildRow, SubagentDescendantEntry, SubagentDiagnosticRow
from dsh.testing.jsonl_writer import JsonlLogWriter
from dsh.testing.stored_logs import stored_header

runner = CliRunner()

HOSTILE_LABEL = "Read \x1b]8;;https://evil.example\x07this\x1b]8;;\x07 \x1b[2J[bold red]now[/] :smile: \u202eedoc"
HOSTILE_ID = "kid\x1b[31m\x9b"
UUID = "33333333-3333-4333-8333-333333333333"
_GUARD_S = 60
_SGR = re.compile(r"\x1b\[[0-9;]*m")


async def _hostile_home(home: Path) -> None:
    """A parent `P` whose one cold child has a hostile id and label, written as another writer would."""
    writer = JsonlLogWriter(home / "sessions")
    descriptor = {"version": 2, "mode": "continuable", "provider": "spawn", "label": HOSTILE_LABEL}
    header = stored_header(HOSTILE_ID, parentSession="P", origin="subagent", delegationDepth=1)
    records = [
        {"type": "subagent/descriptor", "seq": 0, "time": 1, "data": descriptor},
        {"type": "turn/start", "seq": 1, "time": 2, "data": {"turn": 1}},
        {"type": "turn/end", "seq": 2, "time": 3, "data": {"turn": 1, "reason": {"kind": "completed"}}},
    ]
    await writer.write(HOSTILE_ID, header, records)


# ---------------------------------------------------------------- untrusted text


def test_safe_escapes_control_format_and_surrogate_characters() -> None:
    """ESC, BEL, C1, DEL, bidi overrides and lone surrogates show as escapes; ordinary text is untouched."""
    assert safe("plain é 😀 [b]x[/b]") == "plain é 😀 [b]x[/b]"
    assert safe("a\x1bb\x07c\x9bd\x7fe") == "a\\x1bb\\x07c\\x9bd\\x7fe"
    assert safe("\u202eevil\udcff") == "\\u202eevil\\udcff"
    assert safe("two\nlines\ttab") == "two\\x0alines\\x09tab"
    assert safe("two\nlines\ttab", newlines=True) == "two\nlines\ttab"
    assert cell("[bold]x[/bold]").plain == "[bold]x[/bold]"


def test_json_text_escapes_inside_strings_and_round_trips() -> None:
    """`json_text` writes one document whose strings carry control-like characters only as `\\u` escapes."""
    value = {"id": HOSTILE_ID, "label": HOSTILE_LABEL, "lone": "x\udcff", "tag": "\U000e0041"}
    text = json_text(value)
    for raw in ("\x1b", "\x9b", "\u202e"):
        assert raw not in text
    assert json.loads(text) == value
    assert text.isprintable()


@pytest.mark.parametrize("mode", [["--plain"], [], ["--json"], ["--descendants"], ["--descendants", "--plain"]])
def test_hostile_ids_and_labels_never_reach_the_terminal_raw(tmp_path: Path, mode: list[str]) -> None:
    """In every output mode the child's ESC/OSC/CSI sequences are escaped and its rich markup stays literal text."""
    asyncio.run(_hostile_home(tmp_path))
    result = runner.invoke(app, ["--home", str(tmp_path), "agents", "P", *mode], color=True)
    assert result.exit_code == 0, result.output
    for raw in ("\x1b", "\x07", "\x9b", "\u202e"):
        assert raw not in result.stdout
        assert raw not in result.stderr
    if mode == ["--json"]:
        rows = json.loads(result.stdout)
        assert [(row["id"], row["label"]) for row in rows] == [(HOSTILE_ID, HOSTILE_LABEL)]
    else:
        flat = "".join(result.stdout.split())
        assert "kid\\x1b[31m\\x9b" in flat
        assert "[boldred]now[/]:smile:" in flat


def _on_a_terminal(*args: str) -> tuple[int, str]:
    """Run `dsh` (a real process) with stdout a pseudo-terminal 200 columns wide; its exit code and output."""
    leader, follower = pty.openpty()
    argv = [sys.executable, "-c", "from dsh.cli.main import main; main()", *args]
    env = {**os.environ, "COLUMNS": "200", "TERM": "xterm-256color"}
    for name in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE"):
        env.pop(name, None)
    with subprocess.Popen(argv, stdout=follower, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, env=env) as child:
        os.close(follower)
        chunks: list[bytes] = []
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the terminal closes with the child (EIO on Linux)
                break
            if not chunk:
                break
            chunks.append(chunk)
        child.wait(timeout=_GUARD_S)
    os.close(leader)
    return child.returncode, b"".join(chunks).decode(errors="replace")


@pytest.mark.slow
@pytest.mark.parametrize("mode", [[], ["--descendants"]])
def test_a_real_terminal_gets_the_rich_table_with_hostile_text_escaped(tmp_path: Path, mode: list[str]) -> None:
    """On a real terminal rich draws the table: rich's own colours only, the child's escapes and markup as text."""
    asyncio.run(_hostile_home(tmp_path))
    code, out = _on_a_terminal("--home", str(tmp_path), "agents", "P", *mode)
    assert code == 0, out
    assert _SGR.search(out), "expected a styled table from rich on a terminal"
    unstyled = _SGR.sub("", out)
    for raw in ("\x1b", "\x07", "\x9b", "\u202e"):
        assert raw not in unstyled
    flat = "".join(unstyled.split())
    assert "kid\\x1b[31m\\x9b" in flat
    assert "[boldred]now[/]:smile:" in flat
    assert "\\x1b]8;;https://evil.example\\x07" in flat


def test_error_lines_escape_what_they_quote(tmp_path: Path) -> None:
    """A failure naming a hostile path is one line with the path's control characters escaped."""
    home = tmp_path / "home\x1b]0;owned\x07"
    home.write_text("a file, not a home folder")
    result = runner.invoke(app, ["--home", str(home), "agents", "P"])
    assert result.exit_code == 5
    assert "\x1b" not in result.stderr
    assert "home\\x1b]0;owned\\x07" in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_an_unknown_parent_hint_is_escaped(tmp_path: Path) -> None:
    """The `no session X` hint shows a hostile X escaped."""
    result = runner.invoke(app, ["--home", str(tmp_path), "agents", "P\x1b[2J"])
    assert result.exit_code == 0
    assert result.stderr == f"no session P\\x1b[2J in {tmp_path}\n"
    assert "\x1b" not in result.stdout


def test_a_group_of_failures_is_reported_as_its_first_dsh_error() -> None:
    """An `ExceptionGroup` from a close is reported as its first `DshError` (and how many more), with its exit code."""
    group = ExceptionGroup(
        "runtime close failed", [RuntimeError("x"), ExceptionGroup("inner", [StoreMisconfiguredError("bad home")])]
    )
    chosen, others = primary_error(group)
    assert isinstance(chosen, StoreMisconfiguredError)
    assert others == 1
    assert exit_code_for(chosen) == 5
    single = ConfigError("bad")
    assert primary_error(single) == (single, 0)


# ---------------------------------------------------------------- tables at 80 columns


def _rows() -> list[SubagentChildRow | SubagentDiagnosticRow]:
    return [
        SubagentChildRow(UUID, "continuable", "running", True, label="Collect sources about the history of the area"),  # type: ignore[arg-type]
        SubagentChildRow(UUID.replace("3", "4"), "one-shot", "inactive", False),  # type: ignore[arg-type]
        SubagentDiagnosticRow(UUID.replace("3", "5"), "corrupt"),  # type: ignore[arg-type]
    ]


def _render(width: int, *, rungs: bool = False, descendants: bool = False) -> list[str]:
    console = Console(width=width, record=True, no_color=True, force_terminal=False, emoji=False, highlight=False)
    with console.capture() as captured:
        if descendants:
            entries = [
                SubagentDescendantEntry(row, UUID.replace("3", "9"), 1 + index % 2) for index, row in enumerate(_rows())
            ]
            descendants_table(console, entries, plain=True)
        else:
            catalog_table(
                console, "subagents of P", _rows(), rungs={} if rungs else None, reads={} if rungs else None, plain=True
            )
    return captured.get().splitlines()


@pytest.mark.parametrize("descendants", [False, True])
@pytest.mark.parametrize("rungs", [False, True])
def test_tables_fit_80_columns_without_cutting_ids(rungs: bool, descendants: bool) -> None:
    """At 80 columns every line fits, every id is whole on one line, and a note names the columns left out."""
    lines = _render(80, rungs=rungs, descendants=descendants)
    assert all(len(line.rstrip()) <= 80 for line in lines), lines
    for row in _rows():
        assert any(row.id in line for line in lines), (row.id, lines)
    assert lines[-1].startswith("(not shown at this width: ")
    dropped = lines[-1].removeprefix("(not shown at this width: ").rstrip(")").split(", ")
    assert dropped == [title for title in DROP_ORDER if title in dropped]
    header = next(line for line in lines if line.startswith("ID"))
    for title in ("ID", "LABEL"):
        assert title in header
    for title in dropped:
        assert title not in header


def test_a_wide_console_shows_every_column() -> None:
    """At 200 columns nothing is left out and nothing wraps: one line per row."""
    lines = _render(200, rungs=True)
    assert not any(line.startswith("(not shown") for line in lines)
    header = next(line for line in lines if line.startswith("ID"))
    for title in ("MODE", "LABEL", "ACTIVITY", "HAS CHILDREN", "RUNG", "LOG READS"):
        assert title in header
    assert len(lines) == 1 + 1 + len(_rows())


def test_a_console_narrower_than_an_id_still_prints_the_whole_id() -> None:
    """Even at 30 columns an id is printed whole (the line runs on), never cut."""
    lines = _render(30)
    for row in _rows():
        assert any(row.id in line for line in lines)


def test_the_cli_honours_an_80_column_terminal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On an 80-column terminal `dsh agents` prints lines of at most 80 columns with whole ids."""
    asyncio.run(_hostile_home(tmp_path))
    monkeypatch.setattr(cli_app, "_is_terminal", lambda _stream: True)
    result = runner.invoke(app, ["--home", str(tmp_path), "agents", "P", "--plain"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert all(len(line.rstrip()) <= 80 for line in lines), lines
    assert any("kid\\x1b[31m\\x9b" in line for line in lines)


_AWKWARD_LABELS = [
    "Collect sources",
    "  padded  ",
    "wide 中文 characters and \uff21\uff22\uff23",
    "emoji 😀 and 👩\u200d💻 joined",
    "combining e\u0301 marks and a soft\u00adhyphen",
    "[bold]markup[/bold] :smile: stays literal",
    HOSTILE_LABEL,
    "x" * 150,
]


@pytest.mark.parametrize("descendants", [False, True])
@pytest.mark.parametrize("plain", [False, True])
@pytest.mark.parametrize("width", [30, 80, 200])
@pytest.mark.parametrize("label", _AWKWARD_LABELS)
def test_plain_tables_are_what_rich_prints(label: str, width: int, plain: bool, descendants: bool) -> None:
    """Off a terminal a table is laid out without rich, byte for byte what rich prints at that width."""
    rows = [
        SubagentChildRow(UUID, "continuable", "running", True, label=label),  # type: ignore[arg-type]
        SubagentChildRow(f"{UUID}\u202e", "one-shot", "inactive", False),  # type: ignore[arg-type]
        SubagentDiagnosticRow(UUID.replace("3", "5"), "corrupt"),  # type: ignore[arg-type]
    ]
    if descendants:
        entries = [SubagentDescendantEntry(row, UUID, 1 + index) for index, row in enumerate(rows)]
        table = render._descendants(entries, plain=plain)
    else:
        table = render._catalog(f"subagents of {label}", rows, plain=plain)
    text = render._text(table, width)
    if text is None:  # LABEL wraps or a line runs on: rich lays that out, as it always did
        kept, label_width, _ = render._fit(table.columns, width)
        label_column = next(column for column in kept if column.title == "LABEL")
        total = sum(label_width if column is label_column else column.natural for column in kept) + 2 * (len(kept) - 1)
        assert label_column.natural > label_width or total > width
        return
    captured = io.StringIO()
    console = Console(file=captured, width=width, no_color=plain, force_terminal=False, emoji=False, highlight=False)
    render._print(console, table)
    assert text == captured.getvalue()


def test_forced_colour_off_a_terminal_still_renders_through_rich(tmp_path: Path) -> None:
    """`FORCE_COLOR` makes rich style a pipe, so `dsh agents` prints through rich and keeps the styles."""
    asyncio.run(_hostile_home(tmp_path))
    result = runner.invoke(app, ["--home", str(tmp_path), "agents", "P"], env={"FORCE_COLOR": "1"}, color=True)
    assert result.exit_code == 0, result.output
    assert "\x1b[" in result.stdout
    plain = runner.invoke(app, ["--home", str(tmp_path), "agents", "P"], env={"FORCE_COLOR": None}, color=True)
    assert "\x1b[" not in plain.stdout
    assert "kid\\x1b[31m\\x9b" in plain.stdout


# ---------------------------------------------------------------- help


_COMMANDS = sorted(typer.main.get_group(app).commands)


@pytest.mark.parametrize("command", [[], *([name] for name in _COMMANDS)])
def test_help_shows_no_bool_placeholder(command: list[str]) -> None:
    """Flags of the root and of every command are listed without a `<bool>` value placeholder."""
    result = runner.invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.stdout
    assert "--help" in result.stdout
