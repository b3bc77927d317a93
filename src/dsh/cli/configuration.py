"""`dsh config`: every effective setting, with the layer it came from; secrets masked.

Layer: CLI (thin: it loads the configuration the way every command does and renders it). A setting
comes from the defaults, the user file (`~/.config/dsh/config.toml`), the workspace file
(`<workspace>/.dsh/config.toml`), the environment (the variable is named) or the command line
(docs/cli.md#configuration-files). A key, a token or a password is never printed: a set secret shows
`***`. An unreadable or invalid file is one error line naming the file and the line and column (a
TOML syntax error) or the key path (a wrong value), exit 4.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dsh.cli.app import Globals, app, guarded
from dsh.cli.text import json_text, safe, write_stdout

__all__ = ["config"]


def _value_text(value: object) -> str:
    if value is None:
        return "(unset)"
    if isinstance(value, str):
        return value or '""'
    return json_text(value, compact=True)


@app.command("config")
def config(
    ctx: typer.Context,
    workspace: Annotated[
        Path | None,
        typer.Option("--workspace", help="Read <DIR>/.dsh/config.toml (default: the current directory)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document: every setting with its source.")] = False,
) -> None:
    """Show every effective setting and where it came from (files, environment, flags); secrets masked.

    \b
    Example:
      dsh config --workspace ./project
    """
    globals_: Globals = ctx.obj

    def work() -> None:
        loaded = globals_.loaded_config(workspace=workspace)
        settings = loaded.settings()
        if as_json:
            document = {
                "files": [str(path) for path in loaded.files],
                "settings": [{"key": s.key, "value": s.value, "source": s.source} for s in settings],
            }
            write_stdout(json_text(document) + "\n")
            return
        rows = [(s.key, safe(_value_text(s.value)), safe(s.source)) for s in settings]
        key_width = max(len(row[0]) for row in rows)
        value_width = min(max(len(row[1]) for row in rows), 48)
        lines = [f"{'SETTING':<{key_width}}  {'VALUE':<{value_width}}  SOURCE"]
        lines += [f"{key:<{key_width}}  {value:<{value_width}}  {source}" for key, value, source in rows]
        if loaded.files:
            lines.append("")
            lines += [f"read: {safe(str(path))}" for path in loaded.files]
        write_stdout("\n".join(lines) + "\n")

    guarded(ctx, work)
