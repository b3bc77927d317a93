"""The `dsh` Typer application, the global options every command shares, and error reporting.

Layer: CLI (thin: parse, call the library, render). Command groups live in their own modules
(`dsh.cli.main` for `demo` and `agents`, `dsh.cli.run` for `run`) and register on `app`; the
error families map to exit codes in one table (`dsh.cli.errors`, docs/errors.md#cli-exit-codes).
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from dsh.cli.errors import exit_code_for
from dsh.config import Config
from dsh.errors import DshError

__all__ = ["Globals", "app", "fail"]

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="pydsh: durable sessions and an honest subagent catalog."
)


@dataclass
class Globals:
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

    ctx.obj = Globals(
        home=home, database_url=database_url, color=not no_color and "NO_COLOR" not in os.environ, verbose=verbose
    )
    logging.basicConfig(level=logging.DEBUG if verbose else logging.ERROR, stream=sys.stderr)


def fail(ctx: typer.Context, error: BaseException) -> typer.Exit:
    globals_: Globals = ctx.obj
    if globals_.verbose:
        import traceback

        traceback.print_exception(error)
    code = exit_code_for(error)
    message = error.message if isinstance(error, DshError) else f"internal error: {error!r}"
    prefix = f"error [{error.code}]" if isinstance(error, DshError) else "error"
    typer.echo(f"{prefix}: {message}", err=True)
    return typer.Exit(code)
