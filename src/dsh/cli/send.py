"""`dsh send CHILD_ID MESSAGE`: another turn for a continuable subagent, given through its parent.

Layer: CLI (thin). The message goes the way the `send_message` tool sends it: the child's parent (a
top-level session, resumed when it is not live) relays it through the subagent service, with the
source `{kind: "coordinator", form: "relay", senderSessionId: <parent>}`, and the child is resumed
cold when it is not resident. The child's answer is shown when its turn settles; the parent then
gets the settlement notice as its next turn, whose reply is shown labelled, as `dsh run` shows it
(docs/cli.md#dsh-send). Refusals keep their codes: a session that is not a subagent, or a child
with no continuation, is `NOT_RESUMABLE` (exit 8).
"""

# No `from __future__ import annotations`: typer reads the options from the annotations, and as
# strings each would be evaluated again on every run (docs/architecture.md#import-cost).
import asyncio
import contextlib
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dsh.cli.app import Globals, app, fail
from dsh.cli.approve import AllowAllOption, AllowOption, DenyOption, TerminalApprover, permissions_from_flags
from dsh.cli.drive import ModelOption, ScriptOption, Work, WorkspaceOption, model_client, work_from_flags
from dsh.cli.errors import EXIT_CODES
from dsh.cli.text import safe

if TYPE_CHECKING:
    from dsh.cli.turns import Terminal
    from dsh.runtime import Runtime

__all__ = ["send"]


async def _parent_of(rt: "Runtime", child_id: str) -> str:
    """The parent session of a subagent, from the stored headers (no log read)."""
    from dsh.persistence.errors import SessionNotFoundError
    from dsh.subagent.errors import SubagentError

    for record in await rt.query.list_sessions():
        header = record.header
        if header.id != child_id:
            continue
        if header.origin != "subagent" or header.parent_session is None:
            raise SubagentError(
                f'session "{child_id}" is not a subagent: continue it with dsh run --session or dsh chat --session',
                "NOT_RESUMABLE",
            )
        return header.parent_session
    raise SessionNotFoundError(f'no session "{child_id}"', code="SESSION_NOT_FOUND", session_id=child_id)


async def _deliver(
    globals_: Globals,
    child_id: str,
    message: str,
    *,
    script: Path | None,
    model_name: str | None,
    work: Work,
    terminal: "Terminal",
    interactive: bool,
) -> tuple[str, bool]:
    from dsh.agent.messages import RelaySource, text
    from dsh.cli.turns import Spinner, TurnView
    from dsh.runtime import Runtime

    config = globals_.config(workspace=work.workspace)
    permissions = permissions_from_flags(config, work.allow, work.deny, work.allow_all)
    client = model_client(config, script, model_name)
    spinner = Spinner(terminal)
    view = TurnView(terminal, spinner=spinner)
    interrupted = False
    try:
        async with Runtime.open(config, model=client, workspace=work.workspace, permissions=permissions) as rt:
            if interactive:
                rt.approvals.set_answerer(TerminalApprover(terminal.pause_for_question))
            parent = await rt.resume_agent(await _parent_of(rt, child_id))
            typer.echo(f"session {safe(parent.id)} (parent of {safe(child_id)})", err=True)
            view.main_id = parent.id
            rt.sessions.on_event(view.event)
            parent.on_chunk(view.chunk)
            loop = asyncio.get_running_loop()

            def interrupt() -> None:
                nonlocal interrupted
                interrupted = True
                for agent in rt.agents.list():
                    agent.cancel("user")

            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signal.SIGINT, interrupt)
            try:
                await rt.subagents.followup(parent, child_id, [text(message)], source=RelaySource(parent.id))
                spinner.start("waiting for the subagent…")
                await rt.settle(timeout=None)
            finally:
                spinner.stop()
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.remove_signal_handler(signal.SIGINT)
            terminal.end_line()
            return parent.id, interrupted
    finally:
        await client.aclose()


@app.command()
def send(
    ctx: typer.Context,
    child_id: Annotated[str, typer.Argument(metavar="CHILD_ID", help="The continuable subagent to send to.")],
    message: Annotated[str, typer.Argument(help="The message: the subagent's next turn.")],
    script: ScriptOption = None,
    model: ModelOption = None,
    workspace: WorkspaceOption = None,
    allow: AllowOption = None,
    deny: DenyOption = None,
    allow_all: AllowAllOption = False,
) -> None:
    """Give a continuable subagent another turn, through its parent (as the send_message tool does).

    The subagent's answer is shown when it settles, then the parent's reply to its notice.

    Example: dsh send 01J9Z3K4M5N6P7Q8R9S0T1V2W3 "Now check the tests too"
    """
    import sys

    from dsh.cli.turns import Terminal

    globals_: Globals = ctx.obj
    terminal = Terminal()
    try:
        interactive = sys.stdin.isatty() and sys.stderr.isatty()
    except (AttributeError, ValueError):
        interactive = False
    try:
        work = work_from_flags(workspace, None, allow, deny, allow_all)
        _, interrupted = asyncio.run(
            _deliver(
                globals_,
                child_id,
                message,
                script=script,
                model_name=model,
                work=work,
                terminal=terminal,
                interactive=interactive,
            )
        )
    except KeyboardInterrupt:
        raise typer.Exit(EXIT_CODES["interrupted"]) from None
    except Exception as error:
        raise fail(ctx, error) from error
    if interrupted:
        typer.echo("interrupted: the running turns ended aborted", err=True)
        raise typer.Exit(EXIT_CODES["interrupted"])
