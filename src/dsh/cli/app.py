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
from dsh.cli.text import safe
from dsh.config import Config
from dsh.errors import DshError

__all__ = ["Globals", "app", "fail", "primary_error"]

# Plain help (no rich panels): flags show no `<bool>` placeholder, and the text fits 80 columns.
app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    help="pydsh: durable sessions and an honest subagent catalog.",
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
        """A console for stdout (or stderr): the terminal's width on a terminal, else 200 columns.

        Off a terminal (a pipe, a file, a golden test) a fixed width keeps the output stable; on a
        terminal the tables fit its width (docs/cli.md#tables-at-80-columns). Untrusted text is
        printed as `rich.text.Text` (`dsh.cli.text.cell`), never as markup; emoji codes are off.
        """
        stream = sys.stderr if stderr else sys.stdout
        return Console(
            no_color=plain or not self.color,
            highlight=False,
            emoji=False,
            stderr=stderr,
            width=None if _is_terminal(stream) else 200,
            force_terminal=False if plain else None,
        )


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


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


def _leaves(error: BaseException) -> list[BaseException]:
    """The errors an `ExceptionGroup` holds (recursively), or the error itself."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


def primary_error(error: BaseException) -> tuple[BaseException, int]:
    """The error a failure is reported as, and how many others came with it.

    A group (several close steps failed) is reported as its first `DshError`, or its first error
    when none is one, so a failure is always one line with its family's exit code.
    """
    leaves = _leaves(error)
    chosen = next((leaf for leaf in leaves if isinstance(leaf, DshError)), leaves[0])
    return chosen, len(leaves) - 1


def fail(ctx: typer.Context, error: BaseException) -> typer.Exit:
    """Report `error` as one escaped line on stderr (the traceback only with `-v`) and return the exit."""
    globals_: Globals = ctx.obj
    if globals_.verbose:
        import traceback

        traceback.print_exception(error)
    chosen, others = primary_error(error)
    code = exit_code_for(chosen)
    message = chosen.message if isinstance(chosen, DshError) else f"internal error: {chosen!r}"
    prefix = f"error [{chosen.code}]" if isinstance(chosen, DshError) else "error"
    more = f" (and {others} more; -v shows them)" if others else ""
    typer.echo(safe(f"{prefix}: {message}{more}"), err=True)
    return typer.Exit(code)
