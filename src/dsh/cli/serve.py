"""`dsh serve`: run the HTTP API and the web UI (docs/server.md#running-it, docs/ui.md).

Layer: CLI (thin: parse, call `dsh.server.serve.serve`, report). fastapi and uvicorn are imported
only when the command runs, so `dsh demo` and every other command work without them. The token
URL goes to stdout (once, when the token is new); warnings go to stderr. `--open` hands the UI's
URL, token fragment included, to the system's browser (Python's `webbrowser`, which honours
`BROWSER`) from a background thread, so a slow browser never holds the server up. Agents get the
workspace tools on `--workspace DIR` (default: the current folder); their approval questions wait on
the HTTP API for a decision (docs/server.md#approvals). A refused bind,
an unsafe token file or an unusable setting exits 4; Ctrl-C stops the server gracefully and exits 130.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from pathlib import Path
from typing import Annotated

import typer

from dsh.cli.app import Globals, app, fail
from dsh.cli.approve import AllowAllOption, AllowOption, DenyOption, permissions_from_flags

__all__ = ["open_in_browser", "serve"]


def open_in_browser(url: str) -> None:
    """Open `url` in the system's browser from a daemon thread; a failure is one line on stderr."""

    def run() -> None:
        import webbrowser

        try:
            opened = webbrowser.open(url)
        except Exception:
            opened = False
        if not opened:
            typer.echo("could not open a browser: open the URL above (the token is in the serve-token file)", err=True)

    threading.Thread(target=run, name="dsh-open-browser", daemon=True).start()


@app.command()
def serve(
    ctx: typer.Context,
    host: Annotated[
        str | None, typer.Option("--host", help="Address to listen on (default: server.host, loopback).")
    ] = None,
    port: Annotated[
        int | None,
        typer.Option("--port", min=0, max=65535, help="Port to listen on (default: server.port, 8765; 0 picks one)."),
    ] = None,
    allow_remote: Annotated[
        bool, typer.Option("--allow-remote", help="Allow a non-loopback --host (put TLS in front of it).")
    ] = False,
    rotate_token: Annotated[
        bool, typer.Option("--rotate-token", help="Replace the API token and print the new one once.")
    ] = False,
    script: Annotated[
        Path | None, typer.Option("--script", help="Answer every agent from this model script (no key needed).")
    ] = None,
    open_: Annotated[
        bool, typer.Option("--open", help="Open the web UI in the browser (the token goes in the URL fragment).")
    ] = False,
    workspace: Annotated[
        Path | None,
        typer.Option("--workspace", help="The folder the agents' tools work in (default: the current folder)."),
    ] = None,
    allow: AllowOption = None,
    deny: DenyOption = None,
    allow_all: AllowAllOption = False,
    database_url: Annotated[
        str | None,
        typer.Option(
            "--database-url",
            metavar="URL",
            help="The store (as the global option); postgresql://... lets several replicas serve it together.",
        ),
    ] = None,
    token_file: Annotated[
        Path | None,
        typer.Option(
            "--token-file",
            help="Read the API token from this file (mode 0600), e.g. one every replica shares; "
            "DSH_SERVE_TOKEN gives it directly.",
        ),
    ] = None,
    idle_release: Annotated[
        float | None,
        typer.Option(
            "--idle-release",
            min=0,
            metavar="SECONDS",
            help="PostgreSQL: release a session idle this long so any replica may take it (default 300; 0 never).",
        ),
    ] = None,
) -> None:
    """Serve the HTTP API and the web UI for this home until Ctrl-C.

    \b
    Example:
      dsh --home ./demo-home serve --open --script script.json
      dsh serve --database-url postgresql://db/dsh --token-file /run/dsh-token
    """
    globals_: Globals = ctx.obj
    if database_url is not None:
        globals_.database_url = database_url
    try:
        from dsh.server.security import shared_token
        from dsh.server.serve import serve as run_server

        model = None
        if script is not None:
            from dsh.agent.models import ScriptedModelClient

            model = ScriptedModelClient.from_file(script)
        if not globals_.verbose:
            # The access log (method, path, status, duration) is the server's normal output.
            logging.getLogger("dsh.server").setLevel(logging.INFO)
        root = Path(os.path.realpath(workspace if workspace is not None else os.getcwd()))
        config = globals_.config(workspace=root)
        if idle_release is not None:
            config = config.model_copy(
                update={"server": config.server.model_copy(update={"idle_release_s": idle_release})}
            )
        token = None
        file = token_file if token_file is not None else config.server.token_file
        if file is not None:
            token = shared_token(file=Path(file))
        elif os.environ.get("DSH_SERVE_TOKEN"):
            token = shared_token(value=os.environ["DSH_SERVE_TOKEN"])
        code = asyncio.run(
            run_server(
                config,
                workspace=root,
                permissions=permissions_from_flags(config, allow, deny, allow_all),
                host=host if host is not None else config.server.host,
                port=port if port is not None else config.server.port,
                allow_remote=allow_remote,
                rotate_token=rotate_token,
                model=model,
                announce=typer.echo,
                warn=lambda line: typer.echo(line, err=True),
                open_browser=open_in_browser if open_ else None,
                token=token,
            )
        )
    except Exception as error:
        raise fail(ctx, error) from error
    raise typer.Exit(code)
