"""`dsh sessions`: the stored sessions of a home, newest first, read from their headers alone.

Layer: CLI (thin: it opens a read-only `Runtime`, lists the query corpus, renders). The listing is
one corpus call (`SessionQuery.list_sessions`): headers only, **zero log reads**, so it stays quick
however long the logs are. Per session it shows the id, when it was created, its status, its title
when one is known without a log read (a registered `title` projection served by the projection
cache) and how many subagent children the corpus holds for it. Subagent sessions are left out
unless `--all`. Pages are keyed like the server's `listSessions`: `--cursor` takes the opaque
cursor of the previous page (base64url of `{createdAt, id}`), so sessions created meanwhile never
shift a page. The CLI's own process runs no agent, so every status is `stored`, even for a session
a running `dsh serve` holds live (docs/cli.md#dsh-sessions).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import datetime
import json
import shlex
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer

from dsh.cli.agents import unlisted_line
from dsh.cli.app import Globals, app, guarded
from dsh.cli.errors import EXIT_CODES
from dsh.cli.progress import spinner
from dsh.cli.text import cell, json_text, safe

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

    from dsh.agent.accounting import ListedFacts
    from dsh.query.records import SessionRecord
    from dsh.runtime import Runtime

__all__ = ["DROP_ORDER", "TITLE_MIN_WIDTH", "decode_cursor", "encode_cursor", "sessions"]

MAX_LIMIT: Final = 200
DROP_ORDER: Final = ("STATUS", "CREATED", "CHILDREN", "COST", "TOKENS")
"""Which columns are left out first when the table is wider than the console; ID and TITLE stay."""
TITLE_MIN_WIDTH: Final = 16
"""TITLE wraps down to this width before a column is left out."""
_GAP: Final = 2
_MAX_CURSOR_CHARS: Final = 1024


class CursorError(ValueError):
    """A `--cursor` this command (or the server) did not write."""


def encode_cursor(created_at: int, session_id: str) -> str:
    """The opaque keyset cursor after a session: base64url of `{createdAt, id}` (the server's form)."""
    raw = json.dumps({"createdAt": created_at, "id": session_id}, separators=(",", ":"), ensure_ascii=False)
    return base64.urlsafe_b64encode(raw.encode("utf-8")).decode("ascii").rstrip("=")


def decode_cursor(cursor: str) -> tuple[int, str]:
    """`(createdAt, id)` of a cursor.

    Raises:
        CursorError: Not a cursor this command or the server wrote.
    """
    if len(cursor) > _MAX_CURSOR_CHARS:
        raise CursorError("the cursor is too long")
    try:
        value = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError):
        raise CursorError("not a cursor of dsh sessions") from None
    if not isinstance(value, dict) or set(value) != {"createdAt", "id"}:
        raise CursorError("not a cursor of dsh sessions")
    created, session_id = value["createdAt"], value["id"]
    if type(created) is not int or type(session_id) is not str:
        raise CursorError("not a cursor of dsh sessions")
    return created, session_id


@dataclass(slots=True)
class _Page:
    items: list[dict[str, Any]] = field(default_factory=list)
    next_cursor: str | None = None
    unreadable: int = 0


async def _list(
    rt: Runtime, *, include_subagents: bool, limit: int, after: tuple[int, str] | None, search: str | None = None
) -> _Page:
    from dsh.server.models import summary_json

    corpus = await rt.query.list_sessions()
    children = Counter(
        record.header.parent_session
        for record in corpus
        if record.header.origin == "subagent" and record.header.parent_session is not None
    )
    page = _Page(unreadable=len(corpus.unreadable))
    chosen: list[tuple[SessionRecord, ListedFacts]] = []
    needle = search.casefold() if search is not None else None
    for record in corpus:
        header = record.header
        if not include_subagents and header.origin == "subagent":
            continue
        if after is not None and (-header.created_at, header.id) <= (-after[0], after[1]):
            continue
        if len(chosen) == limit:
            last = chosen[-1][0].header
            page.next_cursor = encode_cursor(last.created_at, last.id)
            break
        # Titles and totals come from the projection cache (zero log reads); a session without a
        # cached title never matches a search.
        facts = await rt.listed_facts(header)
        if needle is not None and (facts.title is None or needle not in facts.title.casefold()):
            continue
        chosen.append((record, facts))
    for record, facts in chosen:
        status = rt.agents.status(record.id) or "stored"
        tokens = facts.tokens.to_json() if facts.tokens is not None else None
        item = summary_json(record.header, status, facts.title, tokens)
        item["children"] = children.get(record.id, 0)
        page.items.append(item)
    return page


def _created(ms: int) -> str:
    try:
        return datetime.datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M")
    except (OverflowError, OSError, ValueError):
        return str(ms)


def _token_count(tokens: dict[str, Any]) -> str:
    """Billed input plus output, e.g. `12,345`."""
    keys = ("inputTokens", "cacheReadTokens", "cacheWriteTokens", "outputTokens")
    return f"{sum(int(tokens.get(key, 0)) for key in keys):,}"


def _cost(tokens: dict[str, Any]) -> str:
    """`$0.0123` (another currency by its code), or empty for an unpriced total."""
    cost = tokens.get("cost")
    if not isinstance(cost, int | float):
        return ""
    currency = tokens.get("currency")
    return f"${cost:.4f}" if currency == "USD" else f"{cost:.4f} {currency}"


def _table(console: Console, items: Sequence[dict[str, Any]], *, plain: bool) -> None:
    """ID, CREATED, STATUS, CHILDREN (and TITLE when a session has one), fitted to the console width."""
    from rich.cells import cell_len  # rich loads when a table is printed (docs/architecture.md#import-cost)
    from rich.table import Table
    from rich.text import Text

    titled = any("title" in item for item in items)
    counted = any("tokens" in item for item in items)
    priced = any("cost" in item.get("tokens", {}) for item in items)
    columns: dict[str, list[Text]] = {"ID": [], "CREATED": [], "STATUS": [], "CHILDREN": []}
    if counted:
        columns["TOKENS"] = []
    if priced:
        columns["COST"] = []
    if titled:
        columns["TITLE"] = []
    for item in items:
        columns["ID"].append(cell(item["id"]))
        columns["CREATED"].append(cell(_created(item["createdAt"])))
        columns["STATUS"].append(cell(item["status"]))
        columns["CHILDREN"].append(cell(str(item["children"])))
        tokens = item.get("tokens")
        if counted:
            columns["TOKENS"].append(cell(_token_count(tokens) if tokens is not None else ""))
        if priced:
            columns["COST"].append(cell(_cost(tokens) if tokens is not None else ""))
        if titled:
            columns["TITLE"].append(cell(item.get("title", "")))
    natural = {
        name: max([cell_len(name), *(cell_len(text.plain) for text in cells)]) for name, cells in columns.items()
    }
    kept = list(columns)
    dropped: list[str] = []
    floor = min(natural.get("TITLE", 0), TITLE_MIN_WIDTH)

    def room() -> int:
        fixed = sum(natural[name] for name in kept if name != "TITLE")
        return console.width - fixed - _GAP * (len(kept) - 1)

    for name in DROP_ORDER:
        if room() >= floor:
            break
        kept.remove(name)
        dropped.append(name)
    widths = {name: natural[name] for name in kept}
    if titled:
        widths["TITLE"] = max(floor, min(natural["TITLE"], room()))
    table = Table(box=None, pad_edge=False, expand=False, show_edge=False, header_style="" if plain else "bold")
    for name in kept:
        if name == "TITLE":
            table.add_column(name, width=widths[name], overflow="fold")
        else:
            table.add_column(name, width=widths[name], no_wrap=True, overflow="ignore")
    for row in zip(*(columns[name] for name in kept), strict=True):
        table.add_row(*row)
    total = sum(widths.values()) + _GAP * (len(kept) - 1)
    if total > console.width:
        # Only when an id alone is wider than the console: lines run on rather than cut an id.
        for line in console.render_lines(table, console.options.update_width(total), pad=False):
            console.print(Text("".join(segment.text for segment in line if not segment.control)), soft_wrap=True)
    else:
        console.print(table)
    if dropped:
        note = f"(not shown at this width: {', '.join(dropped)})"
        console.print(Text(note) if plain else Text(note, style="dim"), soft_wrap=True)


@app.command()
def sessions(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print the page as one JSON document.")] = False,
    all_: Annotated[bool, typer.Option("--all", help="Also list subagent sessions.")] = False,
    limit: Annotated[int, typer.Option("--limit", min=1, max=MAX_LIMIT, help="Sessions per page (1-200).")] = 50,
    cursor: Annotated[
        str | None, typer.Option("--cursor", help="Continue after the page that printed this cursor.")
    ] = None,
    plain: Annotated[bool, typer.Option("--plain", help="Fixed-width output without colour.")] = False,
    search: Annotated[
        str | None, typer.Option("--search", help="Only sessions whose title contains this text (any case).")
    ] = None,
) -> None:
    """List the stored sessions, newest first (read-only; no log is read).

    Shows each session's id, creation time, status, how many subagent children it has, and its
    token total, cost and title when they are known without reading its log. Subagent sessions
    are left out unless --all; --search keeps the sessions whose title contains the text.

    \b
    Example:
      dsh --home ./demo-home sessions --all --limit 20
    """
    from dsh.runtime import Runtime

    globals_: Globals = ctx.obj
    try:
        after = decode_cursor(cursor) if cursor is not None else None
    except CursorError as error:
        typer.echo(safe(f"error: --cursor: {error}"), err=True)
        raise typer.Exit(EXIT_CODES["usage"]) from None

    async def run() -> _Page:
        async with Runtime.open(globals_.config(), read_only=True) as rt:
            return await _list(rt, include_subagents=all_, limit=limit, after=after, search=search)

    def work() -> _Page:
        with spinner(globals_.console(stderr=True), "listing sessions…", enabled=not as_json):
            return asyncio.run(run())

    page = guarded(ctx, work)
    if as_json:
        typer.echo(json_text({"items": page.items, "nextCursor": page.next_cursor}))
    else:
        console = globals_.console(plain=plain)
        if page.items:
            _table(console, page.items, plain=plain)
        else:
            from rich.text import Text

            console.print(Text("(no sessions yet)" if cursor is None else "(no more sessions)"))
        if page.next_cursor is not None:
            words = [*globals_.command_words(), "sessions", *(["--all"] if all_ else [])]
            if search is not None:
                words += ["--search", shlex.quote(search)]
            if limit != 50:
                words += ["--limit", str(limit)]
            words += ["--cursor", page.next_cursor]
            typer.echo(safe(f"more: {' '.join(words)}"), err=True)
    if page.unreadable:
        typer.echo(safe(unlisted_line(page.unreadable, globals_)), err=True)
