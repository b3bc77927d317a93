"""The `dsh` Typer application, the global options every command shares, and error reporting.

Layer: CLI (thin: parse, call the library, render). Command groups live in their own modules
(`dsh.cli.main` for `demo` and `agents`, `dsh.cli.run` for `run`) and register on `app`; the
error families map to exit codes in one table (`dsh.cli.errors`, docs/errors.md#cli-exit-codes).
"""

# No `from __future__ import annotations`: typer reads the options from the annotations, and as
# strings each would be compiled again on every run (docs/architecture.md#import-cost).
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from typer.models import CommandFunctionType

from dsh.cli.errors import EXIT_CODES, exit_code_for
from dsh.cli.help import PlainCommand, PlainGroup
from dsh.cli.text import safe
from dsh.errors import DshError

if TYPE_CHECKING:
    # Loaded when a command needs them, so `dsh --help` and the light commands start fast
    # (docs/architecture.md#import-cost).
    from rich.console import Console

    from dsh.config import Config
    from dsh.config_files import LoadedConfig

__all__ = ["Globals", "app", "fail", "guarded", "primary_error"]

T = TypeVar("T")


class _Typer(typer.Typer):
    """The application: every command registers with the plain help of `dsh.cli.help`."""

    def command(self, *args: Any, **kwargs: Any) -> Callable[[CommandFunctionType], CommandFunctionType]:
        """`typer.Typer.command`, with `PlainCommand` as the default class."""
        kwargs.setdefault("cls", PlainCommand)
        return super().command(*args, **kwargs)


# Plain help (no rich panels): classic placeholders (`ID`, `--limit LIMIT`), flags without one, and
# text that fits 80 columns (docs/cli.md#help).
app = _Typer(
    cls=PlainGroup,
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    help="pydsh: durable sessions and an honest subagent catalog.",
)


class Globals:
    """The root options of one run, shared by every command (`ctx.obj`)."""

    __slots__ = ("color", "database_url", "home", "verbose")

    def __init__(
        self, home: Path | None = None, database_url: str | None = None, color: bool = True, verbose: bool = False
    ) -> None:
        self.home = home
        self.database_url = database_url
        self.color = color
        self.verbose = verbose

    def command_words(self) -> list[str]:
        """`dsh` and this run's root options, shell-quoted, for a hint to run another command.

        A password in `--database-url` is masked: hints go to a terminal or a log.
        """
        import shlex

        words = ["dsh"]
        if self.home is not None:
            words += ["--home", shlex.quote(str(self.home))]
        if self.database_url is not None:
            from dsh.persistence.postgres import mask_url

            words += ["--database-url", shlex.quote(mask_url(self.database_url))]
        return words

    def config(
        self, home: Path | None = None, *, workspace: Path | None = None, overrides: dict[str, Any] | None = None
    ) -> "Config":
        """The effective configuration: these flags, the environment, then the configuration files.

        The workspace file is `<workspace>/.dsh/config.toml` (the current directory when no
        workspace is given); the user file is `~/.config/dsh/config.toml` (docs/cli.md#configuration-files).
        Without either file the files' reader is not even loaded, so a light command stays light.
        """
        from dsh.config import Config, config_file_paths

        values = self._flag_values(home, overrides)
        user, local = config_file_paths(workspace or Path.cwd())
        if not user.is_file() and (local is None or not local.is_file()):
            return Config(**values)
        return self.loaded_config(home, workspace=workspace, overrides=overrides).config

    def loaded_config(
        self, home: Path | None = None, *, workspace: Path | None = None, overrides: dict[str, Any] | None = None
    ) -> "LoadedConfig":
        """Like `config`, with the source of every setting (what `dsh config` prints)."""
        from dsh.config_files import load_config

        values = self._flag_values(home, overrides)
        return load_config(workspace=workspace or Path.cwd(), user_file=None, read_user_file=True, overrides=values)

    def _flag_values(self, home: Path | None, overrides: dict[str, Any] | None) -> dict[str, Any]:
        values: dict[str, Any] = dict(overrides or {})
        if home is not None or self.home is not None:
            values["home"] = home or self.home
        if self.database_url is not None:
            values["database_url"] = self.database_url
        return values

    def console(self, *, plain: bool = False, stderr: bool = False) -> "Console":
        """A console for stdout (or stderr): the terminal's width on a terminal, else 200 columns.

        Off a terminal (a pipe, a file, a golden test) a fixed width keeps the output stable; on a
        terminal the tables fit its width (docs/cli.md#tables-at-80-columns). Untrusted text is
        printed as `rich.text.Text` (`dsh.cli.text.cell`), never as markup; emoji codes are off.
        """
        from rich.console import Console

        stream = sys.stderr if stderr else sys.stdout
        return Console(
            no_color=plain or not self.color,
            highlight=False,
            emoji=False,
            stderr=stderr,
            width=None if _is_terminal(stream) else 200,
            force_terminal=False if plain else None,
        )

    def plain_width(self, *, plain: bool = False) -> int | None:
        """The width `console(plain=plain)` would have, when it would print stdout without any style.

        None when rich would style the output (a terminal, `TTY_COMPATIBLE=1` or `FORCE_COLOR`
        without `--plain`): then only rich renders it. Off a terminal this is the fixed 200
        columns; with `--plain` on a terminal, the terminal's width found the way rich finds it
        (`COLUMNS`, else the first standard stream that is a terminal, else 80).
        """
        if not plain and _styled(sys.stdout):
            return None
        if not _is_terminal(sys.stdout):
            return 200
        if sys.platform == "win32":
            return None  # rich measures a Windows console its own way
        columns = os.environ.get("COLUMNS")
        if columns is not None and columns.isdigit():
            return int(columns)
        for descriptor in (0, 1, 2):
            try:
                return os.get_terminal_size(descriptor).columns or 80
            except (AttributeError, ValueError, OSError):
                continue
        return 80


def _styled(stream: Any) -> bool:
    """Whether a rich console on `stream` treats it as a terminal and so prints styles."""
    compatible = os.environ.get("TTY_COMPATIBLE", "")
    if compatible in ("0", "1"):
        return compatible == "1"
    force = os.environ.get("FORCE_COLOR")
    if force is not None:
        return force != ""
    return _is_terminal(stream)


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
    # `readable=False`: typer's default refuses an unreadable path as a usage error (exit 2) before
    # any command runs; the commands report it themselves (docs/cli.md#read-only-commands).
    home: Annotated[
        Path | None, typer.Option("--home", readable=False, metavar="DIR", help="Home folder (overrides DSH_HOME).")
    ] = None,
    database_url: Annotated[
        str | None,
        typer.Option(
            "--database-url", metavar="URL", help="sqlite:///<path>, postgresql://..., memory:, or unset for JSONL."
        ),
    ] = None,
    no_color: Annotated[bool, typer.Option("--no-color", help="Disable colour (also NO_COLOR).")] = False,
    verbose: Annotated[bool, typer.Option("-v", "--verbose", help="Log details and tracebacks.")] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """pydsh: durable sessions, projections and an honest subagent catalog."""
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


def guarded(ctx: typer.Context, work: Callable[[], T]) -> T:
    """Run a read command's work: Ctrl-C prints `interrupted` and exits 130; an error exits with its code."""
    try:
        return work()
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        raise typer.Exit(EXIT_CODES["interrupted"]) from None
    except Exception as error:
        raise fail(ctx, error) from error


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
