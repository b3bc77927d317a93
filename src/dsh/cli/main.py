"""Entry point of the `dsh` command: parse, call the library, render. No business logic lives here."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from dsh.cli.errors import exit_code_for
from dsh.cli.render import catalog_table, descendants_table
from dsh.config import Config
from dsh.errors import DshError

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="pydsh: durable sessions and an honest subagent catalog."
)


@dataclass
class _Globals:
    home: Path | None = None
    database_url: str | None = None
    color: bool = True
    verbose: bool = False

    def config(self, home: Path | None = None) -> Config:
        values: dict[str, Any] = {}
        if home is not None or self.home is not None:
            values["home"] = home or self.home
        if self.database_url is not None:
            values["database_url"] = self.database_url
        return Config(**values)

    def console(self, *, plain: bool = False, stderr: bool = False) -> Console:
        stream = sys.stderr if stderr else sys.stdout
        # Off a terminal (a pipe, a CI log) rich would assume 80 columns and cut the ids short.
        wide = plain or not stream.isatty()
        return Console(
            no_color=plain or not self.color,
            highlight=False,
            stderr=stderr,
            width=200 if wide else None,
            force_terminal=False if plain else None,
        )


def _version(value: bool) -> None:
    if value:
        from dsh import __version__

        typer.echo(f"dsh {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    ctx: typer.Context,
    home: Annotated[Path | None, typer.Option("--home", help="Home folder (overrides DSH_HOME).")] = None,
    database_url: Annotated[
        str | None, typer.Option("--database-url", help="sqlite:///<path>, memory:, or unset for JSONL.")
    ] = None,
    no_color: Annotated[bool, typer.Option("--no-color", help="Disable colour (also NO_COLOR).")] = False,
    verbose: Annotated[bool, typer.Option("-v", "--verbose", help="Log details and tracebacks.")] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """pydsh: durable sessions, projections and an honest subagent catalog."""
    import os

    ctx.obj = _Globals(
        home=home, database_url=database_url, color=not no_color and "NO_COLOR" not in os.environ, verbose=verbose
    )
    logging.basicConfig(level=logging.DEBUG if verbose else logging.ERROR, stream=sys.stderr)


def _fail(ctx: typer.Context, error: BaseException) -> typer.Exit:
    globals_: _Globals = ctx.obj
    if globals_.verbose:
        import traceback

        traceback.print_exception(error)
    code = exit_code_for(error)
    message = error.message if isinstance(error, DshError) else f"internal error: {error!r}"
    prefix = f"error [{error.code}]" if isinstance(error, DshError) else "error"
    typer.echo(f"{prefix}: {message}", err=True)
    return typer.Exit(code)


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

    globals_: _Globals = ctx.obj
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
        raise _fail(ctx, error) from error
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

    globals_: _Globals = ctx.obj

    async def run() -> list[Any]:
        async with Runtime.open(globals_.config()) as rt:
            if descendants:
                return list(await rt.subagents.list_descendants(parent_id))
            return list(await rt.subagents.list_children(parent_id))

    try:
        rows = asyncio.run(run())
    except Exception as error:
        raise _fail(ctx, error) from error
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
