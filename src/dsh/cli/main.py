"""Entry point of the `dsh` command, and the `demo` and `agents` commands.

Layer: CLI (thin: parse, call the library, render; no business logic lives here).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from dsh.cli import run as _run_command  # noqa: F401 - importing registers `dsh run`
from dsh.cli.app import Globals, app, fail
from dsh.cli.render import catalog_table, descendants_table


class _Reporter:
    def __init__(self, console: Console, plain: bool) -> None:
        self.console = console
        self.plain = plain

    def phase(self, title: str) -> None:
        self.console.print()
        self.console.print(f"== {title} ==" if self.plain else f"[bold]== {title} ==[/bold]")

    def info(self, text: str) -> None:
        self.console.print(text, markup=False)

    def catalog(self, view: Any) -> None:
        catalog_table(self.console, view.title, view.rows, rungs=view.rungs, reads=view.reads, plain=self.plain)
        self.console.print()
        self.console.print("list_descendants(P):")
        descendants_table(self.console, view.descendants, plain=self.plain)


@app.command()
def demo(
    ctx: typer.Context,
    home: Annotated[Path | None, typer.Option("--home", help="Empty or absent folder to use as the home.")] = None,
    keep: Annotated[bool, typer.Option("--keep", help="Keep the temporary home afterwards.")] = False,
    plain: Annotated[bool, typer.Option("--plain", help="Fixed-width output without colour.")] = False,
) -> None:
    """Run the keyless walkthrough: children, live catalog, restart, damaged child, cold catalog."""
    from dsh.demo.catalog import run_catalog_demo

    globals_: Globals = ctx.obj
    target = home or globals_.home
    temporary = target is None
    if target is None:
        target = Path(tempfile.mkdtemp(prefix="dsh-demo-"))
    elif target.exists() and any(target.iterdir()):
        typer.echo(f"error: demo home {target} is not empty", err=True)
        raise typer.Exit(4)
    console = globals_.console(plain=plain)
    try:
        asyncio.run(run_catalog_demo(target.resolve(), _Reporter(console, plain)))
    except Exception as error:
        raise fail(ctx, error) from error
    finally:
        if temporary and not keep:
            shutil.rmtree(target, ignore_errors=True)
        elif temporary:
            console.print(f"kept {target}", markup=False)


@app.command()
def agents(
    ctx: typer.Context,
    parent_id: Annotated[str, typer.Argument(help="The parent session id.")],
    descendants: Annotated[bool, typer.Option("--descendants", help="Walk the whole subtree.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows as one JSON document.")] = False,
    plain: Annotated[bool, typer.Option("--plain", help="Fixed-width output without colour.")] = False,
) -> None:
    """List a parent's subagents from the home folder (read-only)."""
    from dsh.runtime import Runtime

    globals_: Globals = ctx.obj

    async def run() -> list[Any]:
        async with Runtime.open(globals_.config()) as rt:
            if descendants:
                return list(await rt.subagents.list_descendants(parent_id))
            return list(await rt.subagents.list_children(parent_id))

    try:
        rows = asyncio.run(run())
    except Exception as error:
        raise fail(ctx, error) from error
    if as_json:
        typer.echo(json.dumps([row.to_json() for row in rows], ensure_ascii=False))
        return
    console = globals_.console(plain=plain)
    if descendants:
        descendants_table(console, rows, plain=plain)
    else:
        catalog_table(console, f"subagents of {parent_id}", rows, plain=plain)


def main() -> None:
    """Console-script entry point."""
    app()
