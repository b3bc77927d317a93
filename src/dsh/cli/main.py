"""Entry point of the `dsh` command, and the `demo` command.

Layer: CLI (thin: parse, call the library, render; no business logic lives here). The other
commands live in their own modules (`agents`, `doctor`, `history`, `run`, `serve`, `sessions`) and register
on import. Reading `app` from this module registers every command (tests and tools drive it that
way); the `dsh` entry point, `main()`, imports only the module of the command it runs, so one
command never pays for the imports of the others (docs/architecture.md#import-cost).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import re
import shlex
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer

from dsh.cli import app as _cli
from dsh.cli.app import Globals, fail
from dsh.cli.errors import EXIT_CODES, exit_code_for, exit_code_for_code
from dsh.errors import ConfigError

if TYPE_CHECKING:
    from rich.console import Console

    from dsh.demo.scenario import DemoPhaseError

COMMAND_MODULES: Final = {
    "agents": "dsh.cli.agents",
    "chat": "dsh.cli.chat",
    "compact": "dsh.cli.compact",
    "config": "dsh.cli.configuration",
    "doctor": "dsh.cli.doctor",
    "history": "dsh.cli.history",
    "mcp": "dsh.cli.mcp",
    "run": "dsh.cli.run",
    "send": "dsh.cli.send",
    "serve": "dsh.cli.serve",
    "sessions": "dsh.cli.sessions",
}
"""The module that registers each command (`demo` is defined here)."""

_VALUE_OPTIONS: Final = frozenset({"--home", "--database-url"})
"""The root options that take a value as the next word."""


def register_commands(names: Iterable[str] | None = None) -> typer.Typer:
    """Import the modules of the commands `names` (every command by default); returns the app they join."""
    for name in COMMAND_MODULES if names is None else names:
        importlib.import_module(COMMAND_MODULES[name])
    if names is None and all(info.callback is not demo for info in _cli.app.registered_commands):
        _cli.app.command()(demo)  # last, as it always was in `dsh --help`
    return _cli.app


def command_of(argv: Sequence[str]) -> str | None:
    """The command word of a `dsh` argument list, or None when it cannot be told (help, `--`, none given).

    Only the root options come before the command: `--home` and `--database-url` take the next word,
    the others are flags or carry their value after `=`. Root help lists every command, so a
    `--help` before the command word gives None too.
    """
    words = iter(argv)
    for word in words:
        if word in _VALUE_OPTIONS:
            next(words, None)
        elif word in ("--", "--help"):
            return None
        elif not word.startswith("-"):
            return word
    return None


def __getattr__(name: str) -> typer.Typer:
    """`app`: the Typer application with every command registered."""
    if name == "app":
        return register_commands()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _DemoReporter:
    """Renders the demo's report: headings, narration, catalog tables; a spinner on a terminal's stderr."""

    def __init__(self, console: Console, spinner: Console, plain: bool) -> None:
        self.console = console
        self.spinner = spinner
        self.plain = plain

    def phase(self, title: str) -> None:
        self.console.print()
        heading = f"== {_escape(title)} =="
        if self.plain:
            self.console.print(heading, markup=False)
        else:
            self.console.print(heading, style="bold", markup=False)

    def info(self, text: str) -> None:
        # Wrapped here, at spaces and after commas, so a narrow terminal never folds a word in two
        # (rich would cut a long JSON argument anywhere); a token wider than the screen runs past it.
        for line in _escape(text).split("\n"):
            for piece in wrap_line(line, self.console.width):
                self.console.print(piece, markup=False, soft_wrap=True)

    def catalog(self, view: Any) -> None:
        from dsh.cli.render import catalog_table

        catalog_table(self.console, view.title, view.rows, rungs=view.rungs, reads=view.reads, plain=self.plain)

    def busy(self, label: str) -> contextlib.AbstractContextManager[Any]:
        if not self.spinner.is_terminal:
            return contextlib.nullcontext()
        return self.spinner.status(f"{_escape(label)}…", spinner="dots")


_BREAKS: Final = re.compile(r"(?<=[ ,])")
"""Where a demo line may break: after a space, or after a comma (JSON arguments have no spaces)."""


def wrap_line(line: str, width: int) -> list[str]:
    """`line` broken into lines of at most `width` columns, only after a space or a comma.

    Continuation lines keep the line's indentation and its quote bar (`| `), or hang two columns
    deeper; a piece that cannot fit (one long word) is left whole rather than cut.
    """
    if len(line) <= width:
        return [line]
    body = line.lstrip(" ")
    indent = " " * (len(line) - len(body))
    hang = indent + ("| " if body.startswith("| ") else "   " if body.startswith("-> ") else "  ")
    lines: list[str] = []
    current = indent
    for token in _BREAKS.split(body):
        if current.strip() and len(current) + len(token.rstrip()) > width:
            lines.append(current.rstrip())
            current = hang
        current += token
    lines.append(current.rstrip())
    return lines


def _escape(text: str) -> str:
    """Control characters shown escaped (newlines stay), so no text can drive the terminal."""
    return "".join(ch if ch == "\n" or (ch.isprintable() and ch != "\x1b") else f"\\x{ord(ch):02x}" for ch in text)


def _demo_hint(home: Path, parent: str) -> list[str]:
    """Commands to look further, global options first; only commands this build has."""
    commands = _cli.app.registered_commands
    names = {info.name or getattr(info.callback, "__name__", "").replace("_", "-") for info in commands}
    prefix = f"dsh --home {shlex.quote(str(home))}"
    hints = []
    if "agents" in names:
        hints += [f"{prefix} agents {parent}", f"{prefix} agents {parent} --descendants --json"]
    if "serve" in names:
        hints.append(f"{prefix} serve")
    return hints


def demo(
    ctx: typer.Context,
    home: Annotated[
        Path | None, typer.Option("--home", readable=False, help="Empty or absent folder to use as the home.")
    ] = None,
    keep: Annotated[bool, typer.Option("--keep", help="Keep the temporary home afterwards.")] = False,
    plain: Annotated[bool, typer.Option("--plain", help="Fixed-width output without colour.")] = False,
) -> None:
    """Run the keyless walkthrough: real scripted agents delegate, continue, restart and meet a damaged child.

    \b
    Example:
      dsh demo --home ./demo-home
    """
    from dsh.demo.home import prepare_home
    from dsh.demo.scenario import DemoPhaseError, run_demo

    globals_: Globals = ctx.obj
    try:
        target = prepare_home(home or globals_.home)
    except ConfigError as error:
        raise fail(ctx, error) from error
    console = globals_.console(plain=plain)
    reporter = _DemoReporter(console, globals_.console(stderr=True), plain)
    note = ""
    if target.temporary:
        note = (
            " (a temporary folder, kept: --keep)"
            if keep
            else " (a temporary folder, deleted at the end; --keep keeps it)"
        )
    try:
        result = asyncio.run(run_demo(target.path, reporter, home_note=note))
    except KeyboardInterrupt:
        if not keep:
            target.remove()
        raise typer.Exit(EXIT_CODES["interrupted"]) from None
    except DemoPhaseError as failure:
        if not keep:
            target.remove()
        raise _demo_failed(globals_, failure) from failure
    survives = keep or not target.temporary
    if survives:
        if target.temporary:
            reporter.info(f"kept the home: {target.path}")
        reporter.info("look further:")
        for line in _demo_hint(target.path, result.parent):
            reporter.info(f"  {line}")
    else:
        target.remove()
        reporter.info(f"deleted the temporary home {target.path}; dsh demo --keep keeps it to look around")
    reporter.info("Done.")


def _demo_failed(globals_: Globals, failure: DemoPhaseError) -> typer.Exit:
    """One line naming the failed phase; the exit code is the family of the error behind it."""
    if globals_.verbose:
        import traceback

        traceback.print_exception(failure)
    prefix = f"error [{failure.code}]" if failure.code else "error"
    typer.echo(_escape(f"{prefix}: demo phase {failure.phase} failed: {failure.reason}"), err=True)
    return typer.Exit(exit_code_for_code(failure.code) if failure.code else exit_code_for(failure.cause))


def main() -> None:
    """Console-script entry point: registers the command it runs (every command when that is unclear)."""
    command = command_of(sys.argv[1:])
    register_commands([command] if command in COMMAND_MODULES else None)()
