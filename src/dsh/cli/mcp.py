"""`dsh mcp list`: every configured MCP server, whether it starts, and the tools it offers.

Layer: CLI (thin: it loads the configuration the way every command does, asks `dsh.tools.mcp.probe`,
renders). Each enabled server is started once (all at once), asked for its tools and stopped again;
nothing in the home folder is read or written. The exit code is 0 when every enabled server
started and 1 otherwise, so a script can check its configuration (docs/tools.md#mcp-servers).
"""

# No `from __future__ import annotations`: typer reads the options from the annotations, and as
# strings each would be compiled again on every run (docs/architecture.md#import-cost).
import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer

from dsh.cli.app import Globals, app, guarded
from dsh.cli.help import PlainCommand, PlainGroup
from dsh.cli.text import json_text, safe, write_stdout

__all__ = ["mcp_app"]

mcp_app = typer.Typer(
    name="mcp",
    cls=PlainGroup,
    help="MCP servers configured as tools: `dsh mcp list` shows whether each starts, and its tools.\n\n"
    "\b\nExample:\n  dsh mcp list --json",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)
app.add_typer(mcp_app)


@mcp_app.command("list", cls=PlainCommand)
def mcp_list(
    ctx: typer.Context,
    workspace: Annotated[
        Path | None,
        typer.Option("--workspace", help="Read <DIR>/.dsh/config.toml (default: the current directory)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document: every server and its tools.")] = False,
) -> None:
    """Start each configured MCP server once and show whether it starts and its tools.

    Exit 1 when an enabled server does not start.

    \b
    Example:
      dsh mcp list --workspace ./project
    """
    globals_: Globals = ctx.obj

    def work() -> bool:
        from dsh.tools.mcp import probe

        config = globals_.config(workspace=workspace)
        reports = asyncio.run(probe(config.mcp))
        if as_json:
            document: list[dict[str, Any]] = [
                {
                    "name": r.name,
                    "transport": r.transport,
                    "target": r.target,
                    "enabled": r.enabled,
                    "started": r.started,
                    "error": r.error,
                    "tools": [{"name": t.name, "tool": t.public_name, "description": t.description} for t in r.tools],
                }
                for r in reports
            ]
            write_stdout(json_text({"servers": document}) + "\n")
        else:
            write_stdout(_render(reports))
        return all(r.started or not r.enabled for r in reports)

    if not guarded(ctx, work):
        raise typer.Exit(1)


def _render(reports: Any) -> str:
    if not reports:
        return "no MCP servers configured (add [mcp.servers.<name>] to a configuration file)\n"
    lines: list[str] = []
    for report in reports:
        if not report.enabled:
            status = "disabled"
        elif report.started:
            status = f"started, {len(report.tools)} tool{'s' if len(report.tools) != 1 else ''}"
        else:
            status = "failed to start"
        lines.append(f"{safe(report.name)}  {report.transport}  {safe(report.target)}  [{status}]")
        if report.error:
            lines.append(f"  error: {safe(report.error)}")
        for tool in report.tools:
            summary = " ".join(tool.description.split())
            summary = summary if len(summary) <= 70 else summary[:69] + "…"
            lines.append(f"  {safe(tool.public_name)}  {safe(summary)}")
    return "\n".join(lines) + "\n"
