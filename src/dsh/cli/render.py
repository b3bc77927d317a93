"""Rendering of catalog rows for the terminal: rich tables, or fixed-width plain text.

Layer: CLI (presentation only; rows come from the library unchanged). Every cell is untrusted text
shown through `dsh.cli.text.cell` (control characters escaped, no markup). Tables fit the console
width by one documented rule (docs/cli.md#tables-at-80-columns): ids are never cut or wrapped;
LABEL wraps; when the table is still too wide, whole columns are left out in a fixed order, and a
note names them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from dsh.cli.text import cell, safe
from dsh.subagent.rows import SubagentChildRow, SubagentDescendantEntry, SubagentListEntry

__all__ = ["DROP_ORDER", "LABEL_MIN_WIDTH", "catalog_table", "descendants_table"]

_RUNG_NAMES = {1: "1 live", 2: "2 cache", 3: "3 log"}

DROP_ORDER = ("LOG READS", "RUNG", "PARENT", "HAS CHILDREN", "MODE", "ACTIVITY")
"""Which columns are left out first when a table is wider than the console. ID and LABEL stay."""

LABEL_MIN_WIDTH = 16
"""LABEL wraps down to this width before another column is left out."""

_GAP = 2  # no box, one space of padding on each inner side of a cell
_WARNING = "yellow"


@dataclass(slots=True)
class _Column:
    title: str
    cells: list[Text] = field(default_factory=list)

    @property
    def natural(self) -> int:
        return max([cell_len(self.title), *(cell_len(text.plain) for text in self.cells)])


def _cells(entry: SubagentListEntry, plain: bool) -> tuple[Text, Text, Text, Text]:
    if isinstance(entry, SubagentChildRow):
        label = entry.label if entry.label is not None else entry.id
        return cell(entry.mode), cell(label), cell(entry.activity), cell("yes" if entry.has_children else "no")
    reason = safe(entry.reason)
    marker = Text(f"(diagnostic): {reason}") if plain else Text(f"⚠ diagnostic: {reason}", style=_WARNING)
    return cell("—"), marker, cell("—"), cell("—")


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


def _print(console: Console, columns: list[_Column], *, title: str | None, plain: bool) -> None:
    kept, label_width, dropped = _fit(columns, console.width)
    if title is not None:
        # On its own line and never wrapped: it names an id, and ids are never cut.
        console.print(Text(safe(title), style="" if plain else "italic"), soft_wrap=True)
    table = Table(box=None, pad_edge=False, expand=False, show_edge=False)
    for column in kept:
        if column.title == "LABEL":
            table.add_column(column.title, width=label_width, overflow="fold")
        else:
            table.add_column(column.title, width=column.natural, no_wrap=True, overflow="ignore")
    for row in zip(*(column.cells for column in kept), strict=True):
        table.add_row(*row)
    total = sum(label_width if c.title == "LABEL" else c.natural for c in kept) + _GAP * (len(kept) - 1)
    if total <= console.width:
        console.print(table)
    else:
        # Only when ID and LABEL alone do not fit: lay the table out wider than the console and
        # let each line run on, so an id is never cut.
        for line in console.render_lines(table, console.options.update_width(total), pad=False):
            text = Text()
            for segment in line:
                if not segment.control:
                    text.append(segment.text, segment.style)
            console.print(text, soft_wrap=True)
    if dropped:
        note = f"(not shown at this width: {', '.join(dropped)})"
        console.print(Text(note) if plain else Text(note, style="dim"), soft_wrap=True)


def catalog_table(
    console: Console,
    title: str,
    rows: Sequence[SubagentListEntry],
    *,
    rungs: Mapping[str, int] | None = None,
    reads: Mapping[str, int] | None = None,
    plain: bool = False,
) -> None:
    """Print ID, MODE, LABEL, ACTIVITY, HAS CHILDREN (plus RUNG and LOG READS when known)."""
    if not rows:
        console.print(Text(f"{safe(title)}: (no subagents)"), soft_wrap=True)
        return
    names = ["ID", "MODE", "LABEL", "ACTIVITY", "HAS CHILDREN"]
    if rungs is not None:
        names.append("RUNG")
    if reads is not None:
        names.append("LOG READS")
    columns = [_Column(name) for name in names]
    for entry in rows:
        values = [cell(entry.id), *_cells(entry, plain)]
        if rungs is not None:
            rung = rungs.get(entry.id)
            values.append(cell(_RUNG_NAMES.get(rung, "3 log") if rung is not None else "3 log"))
        if reads is not None:
            values.append(cell(str(reads.get(entry.id, 0))))
        for column, value in zip(columns, values, strict=True):
            column.cells.append(value)
    _print(console, columns, title=title, plain=plain)


def descendants_table(console: Console, entries: Sequence[SubagentDescendantEntry], *, plain: bool = False) -> None:
    """Print the descendant rows as a tree indented by depth, with the parent id."""
    if not entries:
        console.print(Text("(no subagents)"))
        return
    columns = [_Column(name) for name in ("ID", "MODE", "LABEL", "ACTIVITY", "HAS CHILDREN", "PARENT")]
    for item in entries:
        indent = "  " * (item.depth - 1)
        values = [cell(f"{indent}{item.entry.id}"), *_cells(item.entry, plain), cell(item.parent_id)]
        for column, value in zip(columns, values, strict=True):
            column.cells.append(value)
    _print(console, columns, title=None, plain=plain)
