"""`dsh doctor [--json]`: the home folder and every stored session checked, read-only.

Layer: CLI (thin: `dsh.doctor.run_doctor` does every check; this module renders its report). One
line per check and one per problem (severity, kind, session id, path, reason), every untrusted
string escaped; `--json` writes exactly one JSON document. A progress bar shows on stderr only when
stderr is a terminal, never with `--json`. Exit 7 when anything fails (a damaged session, a failed
check), 0 otherwise: warnings alone exit 0 (docs/cli.md#dsh-doctor).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dsh.cli.app import Globals, app, guarded
from dsh.cli.errors import EXIT_CODES
from dsh.cli.text import json_text, safe

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["doctor"]

_STYLES = {"ok": "green", "warn": "yellow", "fail": "red"}


@contextlib.contextmanager
def _progress_bar(console: Console, enabled: bool) -> Iterator[Any]:
    """A transient rich progress bar on `console` (stderr), or None when it must not show."""
    if not enabled or not console.is_terminal:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(
        TextColumn("reading sessions"), BarColumn(), MofNCompleteColumn(), console=console, transient=True
    ) as progress:
        task = progress.add_task("sessions", total=None)

        def update(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        yield update


def _render(console: Console, report: Any, *, plain: bool) -> None:
    from rich.text import Text  # rich loads when the report is printed (docs/architecture.md#import-cost)

    console.print(Text(f"dsh doctor: {safe(report.home)}"), soft_wrap=True)
    for check in report.checks:
        style = "" if plain else _STYLES[check.status]
        line = Text(f"{check.status:<4}  ", style=style)
        line.append(f"{check.name:<11} {safe(check.detail)}")
        console.print(line, soft_wrap=True)
    for problem in report.problems:
        style = "" if plain else _STYLES[problem.severity]
        line = Text(f"{problem.severity:<4}  ", style=style)
        fields = [problem.kind, problem.session_id or "-", problem.path or "-", problem.reason]
        line.append("  ".join(safe(field) for field in fields))
        if problem.fix is not None:
            line.append(f"  (fix: {safe(problem.fix)})")
        console.print(line, soft_wrap=True)
    failing = sum(problem.severity == "fail" for problem in report.problems)
    warning = len(report.problems) - failing
    summary = f"{report.sessions} stored sessions read; {failing} damaged, {warning} warnings"
    if report.status == "fail":
        summary += "; exit 7"
    console.print(Text(summary), soft_wrap=True)


@app.command()
def doctor(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON document.")] = False,
    plain: Annotated[bool, typer.Option("--plain", help="Output without colour.")] = False,
    online: Annotated[bool, typer.Option("--online", help="Also call GET /models on the model endpoint.")] = False,
) -> None:
    """Check the home and every stored session (read-only).

    Exits 7 when something is damaged, 0 otherwise; changes nothing.

    \b
    Example:
      dsh --home ./demo-home doctor --json
    """
    from dsh.doctor import DoctorReport, run_doctor

    globals_: Globals = ctx.obj
    stderr = globals_.console(stderr=True)

    def work() -> DoctorReport:
        config = globals_.config()
        with _progress_bar(stderr, enabled=not as_json) as progress:
            return asyncio.run(run_doctor(config, progress=progress, online=online))

    report = guarded(ctx, work)
    if as_json:
        typer.echo(json_text(report.to_json()))
    else:
        _render(globals_.console(plain=plain), report, plain=plain)
    if report.status == "fail":
        raise typer.Exit(EXIT_CODES["doctor"])
