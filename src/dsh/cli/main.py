"""Entry point of the `dsh` command: parse, call the library, render."""

from __future__ import annotations

import typer

from dsh.cli.demo import run_demo

app = typer.Typer(no_args_is_help=True, add_completion=False, help="pydsh: sessions and subagents.")


@app.callback()
def _root() -> None:
    """pydsh: durable sessions, projections and an honest subagent catalog."""


@app.command()
def demo() -> None:
    """Run the keyless demonstration of the session core."""
    raise typer.Exit(run_demo(typer.echo))


def main() -> None:
    """Console-script entry point."""
    app()
