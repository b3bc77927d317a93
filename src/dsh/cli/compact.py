"""`dsh compact ID`: summarise a top-level session's conversation now (docs/cli.md#dsh-compact).

Layer: CLI (thin: it opens a `Runtime` with the configured model, or a `--script` one, calls
`Runtime.compact` and renders the result). The session is resumed for the compaction and closed
again; its log gains one compaction (`compaction/start` ... `compaction/end`), or nothing when there
is nothing useful to summarise. A failed summary request exits 6 and leaves the session as it was.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dsh.cli.app import Globals, app, fail
from dsh.cli.drive import ModelOption, ScriptOption
from dsh.cli.text import json_text, safe

if TYPE_CHECKING:
    from dsh.agent.compaction import CompactionResult
    from dsh.agent.model import ModelClient

__all__ = ["compact"]


async def _compact(
    globals_: Globals, session_id: str, script: Path | None, model_name: str | None
) -> CompactionResult | None:
    from dsh.runtime import Runtime

    config = globals_.config()
    if script is not None:
        from dsh.agent.models.scripted import ScriptedModelClient

        client: ModelClient = ScriptedModelClient.from_file(script)
    else:
        from dsh.agent.models.openai_compat import OpenAICompatibleClient, resolve_model_settings

        client = OpenAICompatibleClient(resolve_model_settings(config.model, model=model_name))
    try:
        async with Runtime.open(config, model=client) as rt:
            return await rt.compact(session_id)
    finally:
        await client.aclose()


@app.command()
def compact(
    ctx: typer.Context,
    session_id: Annotated[str, typer.Argument(help="The top-level session to compact.", metavar="ID")],
    script: ScriptOption = None,
    model: ModelOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as one JSON document.")] = False,
) -> None:
    """Summarise a session's earlier conversation so its next requests are smaller.

    The model writes the summary; the log keeps every event, and the summary replaces the
    earlier messages in what the model is sent from now on.

    \b
    Example:
      dsh compact 00000001-0000-4000-8000-000000000001
    """
    globals_: Globals = ctx.obj
    try:
        result = asyncio.run(_compact(globals_, session_id, script, model))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except Exception as error:
        raise fail(ctx, error) from error
    if as_json:
        body: dict[str, object] = {"compacted": result is not None}
        if result is not None:
            body["compaction"] = result.to_json()
        typer.echo(json_text(body))
    elif result is None:
        typer.echo(safe(f"session {session_id}: nothing to compact"))
    else:
        typer.echo(
            safe(
                f"session {session_id}: compacted {len(result.shadowed_seqs)} messages "
                f"(about {result.shadowed_tokens:,} tokens) into a summary of {len(result.summary):,} characters"
            )
        )
