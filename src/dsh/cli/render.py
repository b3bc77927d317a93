"""Rendering of catalog rows for the terminal: rich tables, or fixed-width plain text.

Layer: CLI (presentation only; rows come from the library unchanged).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.console import Console
from rich.table import Table

from dsh.subagent.rows import SubagentChildRow, SubagentDescendantEntry, SubagentListEntry

__all__ = ["catalog_table", "descendants_table"]

_RUNG_NAMES = {1: "1 live", 2: "2 cache", 3: "3 log"}


def _cells(entry: SubagentListEntry, plain: bool) -> tuple[str, str, str, str]:
    if isinstance(entry, SubagentChildRow):
        label = entry.label if entry.label is not None else entry.id
        return entry.mode, label, entry.activity, "yes" if entry.has_children else "no"
    marker = "(diagnostic)" if plain else "[yellow]⚠ diagnostic[/yellow]"
    return "—", f"{marker}: {entry.reason}", "—", "—"


def catalog_table(
    console: Console,
    title: str,
    rows: Sequence[SubagentListEntry],
    *,
    rungs: Mapping[str, int] | None = None,
    reads: Mapping[str, int] | None = None,
    plain: bool = False,
) -> None:
    """Print ID, MODE, LABEL, ACTIVITY, HAS CHILDREN (plus RUNG and READS when known)."""
    table = Table(title=title, title_justify="left", box=None, pad_edge=False)
    columns = ["ID", "MODE", "LABEL", "ACTIVITY", "HAS CHILDREN"]
    if rungs is not None:
        columns.append("RUNG")
    if reads is not None:
        columns.append("LOG READS")
    for column in columns:
        table.add_column(column, no_wrap=True)
    if not rows:
        console.print(f"{title}: (no subagents)")
        return
    for entry in rows:
        cells = [entry.id, *_cells(entry, plain)]
        if rungs is not None:
            rung = rungs.get(entry.id)
            cells.append(_RUNG_NAMES.get(rung, "3 log") if rung is not None else "3 log")
        if reads is not None:
            cells.append(str(reads.get(entry.id, 0)))
        table.add_row(*cells)
    console.print(table)


def descendants_table(console: Console, entries: Sequence[SubagentDescendantEntry], *, plain: bool = False) -> None:
    """Print the descendant rows as a tree indented by depth, with the parent id."""
    if not entries:
        console.print("(no subagents)")
        return
    table = Table(box=None, pad_edge=False)
    for column in ("ID", "MODE", "LABEL", "ACTIVITY", "HAS CHILDREN", "PARENT"):
        table.add_column(column, no_wrap=True)
    for item in entries:
        mode, label, activity, has_children = _cells(item.entry, plain)
        indent = "  " * (item.depth - 1)
        table.add_row(f"{indent}{item.entry.id}", mode, label, activity, has_children, item.parent_id)
    console.print(table)
