"""Rendering of catalog rows: fixed-width plain text when nothing is styled, rich tables otherwise.

Layer: CLI (presentation only; rows come from the library unchanged). Every cell is untrusted text
shown through `dsh.cli.text.safe` (control characters escaped; rich gets it as a `Text`, never as
markup). Tables fit the console width by one documented rule (docs/cli.md#tables-at-80-columns):
ids are never cut or wrapped; LABEL wraps; when the table is still too wide, whole columns are left
out in a fixed order, and a note names them.

Off a terminal and with `--plain` no style reaches the output, so `show_catalog` and
`show_descendants` lay the table out as plain lines themselves, byte for byte what rich prints, and
rich is not loaded (docs/architecture.md#import-cost). Rich renders when styles are shown, and when
LABEL has to wrap or an id is wider than the console.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final

from dsh.cli.text import safe, write_stdout
from dsh.subagent.rows import SubagentChildRow

if TYPE_CHECKING:
    from rich.console import Console

    from dsh.cli.app import Globals
    from dsh.subagent.rows import SubagentDescendantEntry, SubagentListEntry

__all__ = [
    "DROP_ORDER",
    "LABEL_MIN_WIDTH",
    "catalog_table",
    "descendants_table",
    "show_catalog",
    "show_descendants",
]

_RUNG_NAMES: Final = {1: "1 live", 2: "2 cache", 3: "3 log"}

DROP_ORDER: Final = ("LOG READS", "RUNG", "PARENT", "HAS CHILDREN", "MODE", "ACTIVITY")
"""Which columns are left out first when a table is wider than the console. ID and LABEL stay."""

LABEL_MIN_WIDTH: Final = 16
"""LABEL wraps down to this width before another column is left out."""

_GAP: Final = 2  # no box, one space of padding on each inner side of a cell
_WARNING: Final = "yellow"

_Cell = tuple[str, str]
"""One cell: its escaped text and its rich style ("" for none)."""


def _width(text: str) -> int:
    """Terminal cells `text` takes, as rich counts them (escaped ASCII is one cell a character)."""
    if text.isascii():
        return len(text)
    from rich.cells import cell_len  # only for non-ASCII text, so rich's width tables load rarely

    return cell_len(text)


class _Column:
    __slots__ = ("cells", "natural", "title")

    def __init__(self, title: str) -> None:
        self.title = title
        self.cells: list[_Cell] = []
        self.natural = _width(title)

    def add(self, text: str, style: str = "") -> None:
        self.cells.append((text, style))
        self.natural = max(self.natural, _width(text))


class _Table:
    """A laid-out catalog before it is printed: the columns, an optional title, or the empty line."""

    __slots__ = ("columns", "empty", "plain", "title")

    def __init__(self, columns: list[_Column], *, title: str | None, plain: bool, empty: str | None = None) -> None:
        self.columns = columns
        self.title = title
        self.plain = plain
        self.empty = empty


def _cells(entry: SubagentListEntry, plain: bool) -> list[_Cell]:
    if isinstance(entry, SubagentChildRow):
        label = entry.label if entry.label is not None else entry.id
        has_children = "yes" if entry.has_children else "no"
        return [(safe(entry.mode), ""), (safe(label), ""), (safe(entry.activity), ""), (has_children, "")]
    reason = safe(entry.reason)
    marker = (f"(diagnostic): {reason}", "") if plain else (f"⚠ diagnostic: {reason}", _WARNING)
    return [("—", ""), marker, ("—", ""), ("—", "")]


def _fit(columns: list[_Column], width: int) -> tuple[list[_Column], int, list[str]]:
    """The columns kept, the LABEL width, and the titles left out, for a console `width` wide.

    ID and every kept column but LABEL keep their natural width; LABEL takes what is left, down to
    `LABEL_MIN_WIDTH` (or its natural width when that is smaller); then columns are left out in
    `DROP_ORDER`. When even ID and LABEL alone are too wide, the line is longer than the console:
    an id is never cut.
    """
    kept = list(columns)
    dropped: list[str] = []
    label = next(column for column in columns if column.title == "LABEL")
    floor = min(label.natural, LABEL_MIN_WIDTH)

    def room() -> int:
        others = sum(column.natural for column in kept if column is not label)
        return width - others - _GAP * (len(kept) - 1)

    for title in DROP_ORDER:
        if room() >= floor:
            break
        victim = next((column for column in kept if column.title == title), None)
        if victim is not None:
            kept.remove(victim)
            dropped.append(title)
    return kept, max(floor, min(label.natural, room())), dropped


def _note(dropped: list[str]) -> str:
    return f"(not shown at this width: {', '.join(dropped)})"


def _text(table: _Table, width: int) -> str | None:
    """The table as plain lines at `width` columns, or None when LABEL would wrap or a line run on.

    Rich (box none, edges unpadded) pads every cell to its column's width and joins the cells with
    two spaces; the title, the empty line and the note are lines of their own.
    """
    if table.empty is not None:
        return table.empty + "\n"
    kept, label_width, dropped = _fit(table.columns, width)
    widths = [label_width if column.title == "LABEL" else column.natural for column in kept]
    if sum(widths) + _GAP * (len(kept) - 1) > width or any(
        column.natural > label_width for column in kept if column.title == "LABEL"
    ):
        return None
    lines = [] if table.title is None else [safe(table.title)]
    rows = [[column.title for column in kept]]
    rows += [list(cells) for cells in zip(*([text for text, _ in column.cells] for column in kept), strict=True)]
    lines.extend(
        "  ".join(text + " " * (size - _width(text)) for text, size in zip(row, widths, strict=True)) for row in rows
    )
    if dropped:
        lines.append(_note(dropped))
    return "\n".join(lines) + "\n"


def _print(console: Console, table: _Table) -> None:
    """Print `table` through rich: styles shown, LABEL wrapped, over-wide lines run on."""
    from rich.table import Table
    from rich.text import Text

    plain = table.plain
    if table.empty is not None:
        console.print(Text(table.empty), soft_wrap=True)
        return
    kept, label_width, dropped = _fit(table.columns, console.width)
    if table.title is not None:
        # On its own line and never wrapped: it names an id, and ids are never cut.
        console.print(Text(safe(table.title), style="" if plain else "italic"), soft_wrap=True)
    grid = Table(box=None, pad_edge=False, expand=False, show_edge=False)
    for column in kept:
        if column.title == "LABEL":
            grid.add_column(column.title, width=label_width, overflow="fold")
        else:
            grid.add_column(column.title, width=column.natural, no_wrap=True, overflow="ignore")
    for row in zip(*(column.cells for column in kept), strict=True):
        grid.add_row(*(Text(text, style=style) for text, style in row))
    total = sum(label_width if c.title == "LABEL" else c.natural for c in kept) + _GAP * (len(kept) - 1)
    if total <= console.width:
        console.print(grid)
    else:
        # Only when ID and LABEL alone do not fit: lay the table out wider than the console and
        # let each line run on, so an id is never cut.
        for line in console.render_lines(grid, console.options.update_width(total), pad=False):
            text = Text()
            for segment in line:
                if not segment.control:
                    text.append(segment.text, segment.style)
            console.print(text, soft_wrap=True)
    if dropped:
        console.print(Text(_note(dropped)) if plain else Text(_note(dropped), style="dim"), soft_wrap=True)


def _show(globals_: Globals, table: _Table) -> None:
    width = globals_.plain_width(plain=table.plain)
    text = None if width is None else _text(table, width)
    if text is not None:
        write_stdout(text)
    else:
        _print(globals_.console(plain=table.plain), table)


def _catalog(
    title: str,
    rows: Sequence[SubagentListEntry],
    *,
    rungs: Mapping[str, int] | None = None,
    reads: Mapping[str, int] | None = None,
    plain: bool = False,
) -> _Table:
    if not rows:
        return _Table([], title=None, plain=plain, empty=f"{safe(title)}: (no subagents)")
    names = ["ID", "MODE", "LABEL", "ACTIVITY", "HAS CHILDREN"]
    if rungs is not None:
        names.append("RUNG")
    if reads is not None:
        names.append("LOG READS")
    columns = [_Column(name) for name in names]
    for entry in rows:
        values = [(safe(entry.id), ""), *_cells(entry, plain)]
        if rungs is not None:
            rung = rungs.get(entry.id)
            values.append((_RUNG_NAMES.get(rung, "3 log") if rung is not None else "3 log", ""))
        if reads is not None:
            values.append((str(reads.get(entry.id, 0)), ""))
        for column, (text, style) in zip(columns, values, strict=True):
            column.add(text, style)
    return _Table(columns, title=title, plain=plain)


def _descendants(entries: Sequence[SubagentDescendantEntry], *, plain: bool = False) -> _Table:
    if not entries:
        return _Table([], title=None, plain=plain, empty="(no subagents)")
    columns = [_Column(name) for name in ("ID", "MODE", "LABEL", "ACTIVITY", "HAS CHILDREN", "PARENT")]
    for item in entries:
        indent = "  " * (item.depth - 1)
        values = [(safe(f"{indent}{item.entry.id}"), ""), *_cells(item.entry, plain), (safe(item.parent_id), "")]
        for column, (text, style) in zip(columns, values, strict=True):
            column.add(text, style)
    return _Table(columns, title=None, plain=plain)


def catalog_table(
    console: Console,
    title: str,
    rows: Sequence[SubagentListEntry],
    *,
    rungs: Mapping[str, int] | None = None,
    reads: Mapping[str, int] | None = None,
    plain: bool = False,
) -> None:
    """Print ID, MODE, LABEL, ACTIVITY, HAS CHILDREN (plus RUNG and LOG READS when known) through rich."""
    _print(console, _catalog(title, rows, rungs=rungs, reads=reads, plain=plain))


def descendants_table(console: Console, entries: Sequence[SubagentDescendantEntry], *, plain: bool = False) -> None:
    """Print the descendant rows as a tree indented by depth, with the parent id, through rich."""
    _print(console, _descendants(entries, plain=plain))


def show_catalog(globals_: Globals, title: str, rows: Sequence[SubagentListEntry], *, plain: bool = False) -> None:
    """`dsh agents`: the catalog on stdout, as plain lines when nothing is styled (rich otherwise)."""
    _show(globals_, _catalog(title, rows, plain=plain))


def show_descendants(globals_: Globals, entries: Sequence[SubagentDescendantEntry], *, plain: bool = False) -> None:
    """`dsh agents --descendants`: the indented tree on stdout, like `show_catalog`."""
    _show(globals_, _descendants(entries, plain=plain))
