"""Entry point of the `dsh` command, and the `demo` command.

Layer: CLI (thin: parse, call the library, render; no business logic lives here). The other
commands live in their own modules (`agents`, `doctor`, `run`, `serve`) and register on import.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from dsh.cli import agents as _agents_command  # noqa: F401 - importing registers `dsh agents`
from dsh.cli import doctor as _doctor_command  # noqa: F401 - importing registers `dsh doctor`
from dsh.cli import run as _run_command  # noqa: F401 - importing registers `dsh run`
from dsh.cli import serve as _serve_command  # noqa: F401 - importing registers `dsh serve`
from dsh.cli.app import Globals, app, fail
from dsh.cli.errors import EXIT_CODES, exit_code_for, exit_code_for_code
from dsh.cli.render import catalog_table
from dsh.errors import ConfigError

if TYPE_CHECKING:
    from dsh.demo.scenario import DemoPhaseError


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
        self.console.print(_escape(text), markup=False)

    def catalog(self, view: Any) -> None:
        catalog_table(self.console, view.title, view.rows, rungs=view.rungs, reads=view.reads, plain=self.plain)

    def busy(self, label: str) -> contextlib.AbstractContextManager[Any]:
        if not self.spinner.is_terminal:
            return contextlib.nullcontext()
        return self.spinner.status(f"{_escape(label)}…", spinner="dots")


def _escape(text: str) -> str:
    """Control characters shown escaped (newlines stay), so no text can drive the terminal."""
    return "".join(ch if ch == "\n" or (ch.isprintable() and ch != "\x1b") else f"\\x{ord(ch):02x}" for ch in text)


def _demo_hint(home: Path, parent: str) -> list[str]:
    """Commands to look further, global options first; only commands this build has."""
    names = {info.name or getattr(info.callback, "__name__", "").replace("_", "-") for info in app.registered_commands}
    prefix = f"dsh --home {shlex.quote(str(home))}"
    hints = []
    if "agents" in names:
        hints += [f"{prefix} agents {parent}", f"{prefix} agents {parent} --descendants --json"]
    if "serve" in names:
        hints.append(f"{prefix} serve")
    return hints


@app.command()
def demo(
    ctx: typer.Context,
    home: Annotated[Path | None, typer.Option("--home", help="Empty or absent folder to use as the home.")] = None,
    keep: Annotated[bool, typer.Option("--keep", help="Keep the temporary home afterwards.")] = False,
    plain: Annotated[bool, typer.Option("--plain", help="Fixed-width output without colour.")] = False,
) -> None:
    """Run the keyless walkthrough: real scripted agents delegate, continue, restart and meet a damaged child."""
    from dsh.demo.home import prepare_home
    from dsh.demo.scenario import DemoPhaseError, run_demo

    globals_: Globals = ctx.obj
    try:
        target = prepare_home(home or globals_.home)
    except ConfigError as error:
        raise fail(ctx, error) from error
    console = globals_.console(plain=plain)
    reporter = _DemoReporter(console, globals_.console(stderr=True), plain)
    try:
        result = asyncio.run(run_demo(target.path, reporter))
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
    """Console-script entry point."""
    app()
