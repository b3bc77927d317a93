"""`dsh agents PARENT_ID`: a parent's subagent catalog, read from the home folder without changing it.

Layer: CLI (thin: it opens a read-only `Runtime`, lists, renders). The runtime is opened with
`read_only=True` (docs/cli.md#read-only-commands): no folder, file or table is created. stdout
carries the table (or, with `--json`, exactly the rows as one JSON document); stderr carries the
two hints: how many stored sessions could not be read at all (`N stored sessions could not be read;
run dsh doctor`, docs/cli.md#damage-on-the-command-line) and, for a parent that is not stored,
`no session X in <home>`. `--verify` opens the runtime without the projection cache, so every cold
child is read (docs/cli.md#when-damage-shows).
"""

# No `from __future__ import annotations`: typer reads the options from the annotations, and as
# strings each would be compiled again on every run (docs/architecture.md#import-cost).
import asyncio
from typing import Annotated, Any

import typer

from dsh.cli.app import Globals, app, guarded
from dsh.cli.text import json_text, safe

__all__ = ["agents", "doctor_hint", "unlisted_line"]


def doctor_hint(globals_: Globals) -> str:
    """`dsh doctor` with the global options of this run before the command."""
    return " ".join([*globals_.command_words(), "doctor"])


def unlisted_line(count: int, globals_: Globals) -> str:
    """The stderr line for stored entries the listing could not read."""
    noun = "session" if count == 1 else "sessions"
    return f"{count} stored {noun} could not be read; run {doctor_hint(globals_)}"


async def _parent_known(rt: Any, parent_id: str) -> bool:
    """Whether the parent is live or stored (an unreadable stored parent counts as known)."""
    if rt.sessions.get(parent_id) is not None:
        return True
    try:
        return await rt.persistence.revision(parent_id) is not None
    except Exception:
        return True


@app.command()
def agents(
    ctx: typer.Context,
    parent_id: Annotated[str, typer.Argument(help="The parent session id.", metavar="PARENT_ID")],
    descendants: Annotated[bool, typer.Option("--descendants", help="Walk the whole subtree.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows as one JSON document.")] = False,
    plain: Annotated[bool, typer.Option("--plain", help="Fixed-width output without colour.")] = False,
    verify: Annotated[
        bool, typer.Option("--verify", help="Read every cold child's log instead of trusting the projection cache.")
    ] = False,
) -> None:
    """List a parent's subagents (read-only).

    Reads the home folder and changes nothing in it. A cold child the projection cache knows is
    shown from the cache without reading its log; --verify reads every cold child's log, so damage
    to any of them shows.

    \b
    Example:
      dsh --home ./demo-home agents 00000001-0000-4000-8000-000000000001 --descendants
    """
    from dsh.runtime import Runtime

    globals_: Globals = ctx.obj
    reports: list[Any] = []

    async def run() -> tuple[list[Any], bool]:
        # Without the projection cache the catalog's cached-identity rung is skipped: every cold
        # child's identity comes from one read of its log (docs/catalog.md#identity-rungs).
        async with Runtime.open(globals_.config(), read_only=True, use_cache=not verify) as rt:
            if descendants:
                rows: list[Any] = list(await rt.subagents.list_descendants(parent_id, report=reports.append))
            else:
                rows = list(await rt.subagents.list_children(parent_id, report=reports.append))
            return rows, bool(rows) or await _parent_known(rt, parent_id)

    rows, known = guarded(ctx, lambda: asyncio.run(run()))
    if as_json:
        typer.echo(json_text([row.to_json() for row in rows]))
    else:
        from dsh.cli.render import show_catalog, show_descendants

        if descendants:
            show_descendants(globals_, rows, plain=plain)
        else:
            show_catalog(globals_, f"subagents of {parent_id}", rows, plain=plain)
    unlisted = reports[-1].unlisted if reports else 0
    if unlisted:
        typer.echo(safe(unlisted_line(unlisted, globals_)), err=True)
    if not known:
        typer.echo(safe(f"no session {parent_id} in {globals_.config().home}"), err=True)
