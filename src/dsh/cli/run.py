"""`dsh run PROMPT`: one prompt on a new (or resumed) top-level agent, streamed as it happens.

Layer: CLI (thin: it opens a `Runtime`, sends the prompt and renders what the loop writes). The
session id goes to stderr at the start. Text mode streams the answers to stdout, each on its own,
and tool activity to stderr (`dsh.cli.turns`); after the turn it waits for background subagents and
shows each one's answer as it settles, and the main agent's reply to its notice, labelled.
`--json` writes one JSON line per event of the main session (`dsh.cli.drive.event_line`, with tool
arguments and results) and a last `{"type": "result", "sessionId", "output", "stopReason"}` line, and
nothing else, to stdout. A spinner shows on stderr only when stderr is a terminal, never with
`--json`, and never erases output. A reader that closes the pipe early (`| head`) simply stops the
output; the run goes on. Ctrl-C cancels the turn, which then ends `aborted`, and exits 130
(docs/agent.md#cancellation).

The agent and its subagents get the workspace tools on `--workspace DIR` (default: the current
folder), whose `.dsh/config.toml` is read too. A tool call that needs approval is asked about on the
terminal (`dsh.cli.approve`); with `--json` or without a terminal it is refused and the model told
why, so an unattended run passes the `--allow` rules it needs (docs/cli.md#dsh-run).
"""

# No `from __future__ import annotations`: typer reads the options from the annotations, and as
# strings each would be evaluated again on every run (docs/architecture.md#import-cost).
import asyncio
import contextlib
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dsh.cli.app import Globals, app, fail
from dsh.cli.approve import AllowAllOption, AllowOption, DenyOption, TerminalApprover, permissions_from_flags
from dsh.cli.drive import (
    InstructionsOption,
    ModelOption,
    ScriptOption,
    Work,
    WorkspaceOption,
    event_line,
    last_session,
    model_client,
    work_from_flags,
)
from dsh.cli.errors import EXIT_CODES, exit_code_for_code
from dsh.cli.text import json_text, safe

if TYPE_CHECKING:
    # The agent loop loads when `dsh run` runs, not when the CLI registers its commands
    # (docs/architecture.md#import-cost).
    from dsh.agent.loop import TurnResult
    from dsh.agent.usage import TokenTotals
    from dsh.cli.turns import Terminal
    from dsh.session.events import SessionEvent
    from dsh.session.session import Session

__all__ = ["run"]


@dataclass(slots=True)
class _Outcome:
    result: "TurnResult | None" = None
    interrupted: bool = False
    timed_out: bool = False
    tokens: "TokenTotals | None" = None  # the session's tree, subagents included


class _JsonLines:
    """`--json`: one line per event of the main session."""

    def __init__(self, terminal: "Terminal") -> None:
        self.terminal = terminal
        self.main_id: str | None = None

    def event(self, session: "Session", event: "SessionEvent") -> None:
        if session.id != self.main_id:
            return
        line = event_line(session.id, event)
        if line is not None:
            self.terminal.out(line + "\n")


def _interactive(as_json: bool) -> bool:
    """Questions are asked only on a terminal (stdin and stderr), never with `--json`."""
    if as_json:
        return False
    try:
        return sys.stdin.isatty() and sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


async def _drive(
    globals_: Globals,
    prompt: str,
    *,
    session_id: str | None,
    resume_last: bool,
    script: Path | None,
    model_name: str | None,
    as_json: bool,
    settle: bool,
    timeout: float | None,  # noqa: ASYNC109 - the turn is cancelled (not abandoned) when it expires
    work: Work,
    terminal: "Terminal",
) -> tuple[_Outcome, str]:
    from dsh.agent.messages import UserSource
    from dsh.cli.turns import Spinner, TurnView
    from dsh.runtime import Runtime

    config = globals_.config(workspace=work.workspace)
    permissions = permissions_from_flags(config, work.allow, work.deny, work.allow_all)
    client = model_client(config, script, model_name)
    spinner = None if as_json else Spinner(terminal)
    view = TurnView(terminal, spinner=spinner)
    lines = _JsonLines(terminal)
    outcome = _Outcome()
    try:
        async with Runtime.open(config, model=client, workspace=work.workspace, permissions=permissions) as rt:
            if _interactive(as_json):
                rt.approvals.set_answerer(TerminalApprover(terminal.pause_for_question))
            if resume_last:
                session_id = await last_session(rt, work.workspace)
            if session_id:
                agent = await rt.resume_agent(session_id, instructions=work.instructions)
            else:
                agent = await rt.create_agent(instructions=work.instructions)
            if model_name is not None and script is not None:
                agent.update_options(model=model_name)
            typer.echo(f"session {safe(agent.id)}", err=True)
            if as_json:
                lines.main_id = agent.id
                rt.sessions.on_event(lines.event)
            else:
                view.main_id = agent.id
                rt.sessions.on_event(view.event)
                agent.on_chunk(view.chunk)
            loop = asyncio.get_running_loop()

            def interrupt() -> None:
                outcome.interrupted = True
                agent.cancel("user")

            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signal.SIGINT, interrupt)
            try:
                message_id = await agent.send(prompt, UserSource())
                pending = agent.turn_result(message_id)
                try:
                    outcome.result = await asyncio.wait_for(asyncio.shield(pending), timeout)
                except TimeoutError:
                    outcome.timed_out = True
                    agent.cancel("user")
                    outcome.result = await pending
                if settle and not (outcome.interrupted or outcome.timed_out):
                    if spinner is not None and len(rt.agents.list()) > 1:
                        spinner.start("waiting for subagents…")
                    await rt.settle(timeout=None)
            finally:
                if spinner is not None:
                    spinner.stop()
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.remove_signal_handler(signal.SIGINT)
            terminal.end_line()
            with contextlib.suppress(Exception):  # a total is a nicety: the answer stands without it
                tokens = await rt.tokens(agent.id, tree=True)
                outcome.tokens = tokens if tokens.requests else None  # a model that reported no usage
            return outcome, agent.id
    finally:
        await client.aclose()


@app.command()
def run(
    ctx: typer.Context,
    prompt: Annotated[str, typer.Argument(help="The prompt to send.")],
    session: Annotated[
        str | None, typer.Option("--session", help="Continue this top-level session instead of starting one.")
    ] = None,
    resume_last: Annotated[
        bool, typer.Option("--continue", help="Continue the workspace's last session (the newest one started there).")
    ] = False,
    script: ScriptOption = None,
    model: ModelOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Write JSON lines: one per event, then the result.")] = False,
    no_settle: Annotated[
        bool, typer.Option("--no-settle", help="Do not wait for background subagents and their notices.")
    ] = False,
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="Cancel the turn after this many seconds.", min=0)
    ] = None,
    workspace: WorkspaceOption = None,
    instructions: InstructionsOption = None,
    allow: AllowOption = None,
    deny: DenyOption = None,
    allow_all: AllowAllOption = False,
) -> None:
    """Run one prompt on an agent and stream the answer (`--script FILE` runs keyless).

    The agent can read, search, edit and run commands in the workspace; write, edit and bash ask
    first on a terminal, and are refused without one unless --allow lets them through.

    Example: dsh run "Summarise the README" --model deepseek-chat
    """
    from dsh.cli.turns import Terminal

    globals_: Globals = ctx.obj
    terminal = Terminal()
    try:
        if session is not None and resume_last:
            from dsh.errors import ConfigError

            raise ConfigError("--session and --continue exclude each other: give one of them")
        work = work_from_flags(workspace, instructions, allow, deny, allow_all)
        outcome, session_id = asyncio.run(
            _drive(
                globals_,
                prompt,
                session_id=session,
                resume_last=resume_last,
                script=script,
                model_name=model,
                as_json=as_json,
                settle=not no_settle,
                timeout=timeout,
                work=work,
                terminal=terminal,
            )
        )
    except KeyboardInterrupt:
        raise typer.Exit(EXIT_CODES["interrupted"]) from None
    except Exception as error:
        raise fail(ctx, error) from error
    result = outcome.result
    if as_json and result is not None:
        record: dict[str, object] = {
            "type": "result",
            "sessionId": session_id,
            "output": result.output,
            "stopReason": result.stop_reason,
        }
        if outcome.tokens is not None:
            record["tokens"] = outcome.tokens.to_json()
        terminal.out(json_text(record, compact=True) + "\n")
    elif outcome.tokens is not None:
        typer.echo(safe(f"session {session_id}: {outcome.tokens.summary()}"), err=True)
    if outcome.interrupted or outcome.timed_out:
        reason = "interrupted" if outcome.interrupted else f"timed out after {timeout:g} s"
        typer.echo(f"{reason}: the turn ended aborted (session {session_id})", err=True)
        raise typer.Exit(EXIT_CODES["interrupted"])
    if result is not None and result.stop_reason == "error" and result.error is not None:
        code = str(result.error.get("code", ""))
        typer.echo(safe(f"error [{code}]: {result.error.get('message', '')}"), err=True)
        raise typer.Exit(exit_code_for_code(code))
