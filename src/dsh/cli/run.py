"""`dsh run PROMPT`: one prompt on a new (or resumed) top-level agent, streamed as it happens.

Layer: CLI (thin: it opens a `Runtime`, sends the prompt and renders what the loop writes). Text mode
streams the answer to stdout and tool activity to stderr; `--json` writes one JSON line per event
(`{"type": "event", "event": <event type>, "sessionId", "seq", "time", "turn"?, "step"?,
"summary"?}`) and a last `{"type": "result", "sessionId", "output", "stopReason"}` line, and nothing
else, to stdout. A spinner shows on stderr only when stderr is a terminal, never with `--json`. A
reader that closes the pipe early (`| head`) simply stops the output; the run goes on. Ctrl-C
cancels the turn, which then ends `aborted`, and exits 130 (docs/agent.md#cancellation).

The agent and its subagents get the workspace tools on `--workspace DIR` (default: the current
folder), whose `.dsh/config.toml` is read too. A tool call that needs approval is asked about on the
terminal (`dsh.cli.approve`); with `--json` or without a terminal it is refused and the model told
why, so an unattended run passes the `--allow` rules it needs (docs/cli.md#dsh-run).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dsh.cli.app import Globals, app, fail
from dsh.cli.approve import AllowAllOption, AllowOption, DenyOption, TerminalApprover, permissions_from_flags
from dsh.cli.errors import EXIT_CODES, exit_code_for_code
from dsh.cli.text import cell, json_text, safe

if TYPE_CHECKING:
    # The agent loop loads when `dsh run` runs, not when the CLI registers its commands
    # (docs/architecture.md#import-cost).
    from rich.console import Console

    from dsh.agent.loop import Agent, TurnResult
    from dsh.agent.model import ModelChunk, ModelClient
    from dsh.agent.usage import TokenTotals
    from dsh.session.events import SessionEvent
    from dsh.session.session import Session

__all__ = ["run"]


@dataclass(slots=True)
class _Outcome:
    result: TurnResult | None = None
    interrupted: bool = False
    timed_out: bool = False
    tokens: TokenTotals | None = None  # the session's tree, subagents included


def _line(value: object) -> str:
    return json_text(value, compact=True)


def _write(text: str) -> None:
    """Write to stdout; once the reader has gone (`| head`), later output is silently dropped."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # Point stdout at /dev/null so the interpreter's final flush does not complain either.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


class _Printer:
    """Renders the agent's activity as it happens."""

    def __init__(self, *, as_json: bool, stderr: Console) -> None:
        self.as_json = as_json
        self.stderr = stderr
        self.spinner: Any = None
        self.ended_with_newline = True
        self.session_id: str | None = None

    @contextlib.contextmanager
    def spinning(self) -> Iterator[None]:
        if not self.as_json and self.stderr.is_terminal:
            self.spinner = self.stderr.status("thinking…", spinner="dots")
            self.spinner.start()
        try:
            yield
        finally:
            self.stop_spinner()

    def stop_spinner(self) -> None:
        if self.spinner is not None:
            self.spinner.stop()
            self.spinner = None

    def chunk(self, agent: Agent, turn: int, step: int, chunk: ModelChunk) -> None:
        from dsh.agent.model import TextDelta

        if self.as_json or not isinstance(chunk, TextDelta):
            return
        self.stop_spinner()
        text = safe(chunk.text, newlines=True)
        _write(text)
        self.ended_with_newline = text.endswith("\n")

    def event(self, session: Session, event: SessionEvent) -> None:
        from dsh.query.summary import event_summary, is_summarised

        if session.id != self.session_id:
            return
        if self.as_json:
            if is_summarised(event):
                summary = event_summary(session.id, event)
                summary["event"] = summary.pop("type")
                _write(_line({"type": "event", **summary}) + "\n")
            return
        data = event.data if isinstance(event.data, dict) else {}
        if event.type == "tool/call":
            self.newline()
            self.stderr.print(cell(f"→ {safe(data.get('name'))} {safe(data.get('arguments'))}"))
        elif event.type == "tool/result":
            summary = event_summary(session.id, event).get("summary", {})
            failed = isinstance(summary, dict) and summary.get("isError")
            if failed:
                from dsh.agent.messages import message_text

                message = data.get("message")
                first = message_text(message).strip().splitlines() if isinstance(message, dict) else []
                reason = cell(f"← {safe(first[0][:200])}") if first else cell("← error")
                self.stderr.print(reason)
            else:
                self.stderr.print("← ok", markup=False)
        elif event.type == "step/start" and self.spinner is None and self.stderr.is_terminal:
            self.spinner = self.stderr.status("thinking…", spinner="dots")
            self.spinner.start()

    def newline(self) -> None:
        if not self.ended_with_newline:
            _write("\n")
            self.ended_with_newline = True

    def before_question(self) -> None:
        """An approval question is about to be shown: no spinner, and a fresh line."""
        self.stop_spinner()
        self.newline()


@dataclass(frozen=True, slots=True)
class _Work:
    """Where the agent works and what it may do: the workspace, its instructions, the permission flags."""

    workspace: Path
    instructions: str | None
    allow: list[str]
    deny: list[str]
    allow_all: bool


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
    script: Path | None,
    model_name: str | None,
    as_json: bool,
    settle: bool,
    timeout: float | None,  # noqa: ASYNC109 - the turn is cancelled (not abandoned) when it expires
    work: _Work,
) -> tuple[_Outcome, str]:
    from dsh.agent.messages import UserSource
    from dsh.runtime import Runtime

    config = globals_.config(workspace=work.workspace)
    permissions = permissions_from_flags(config, work.allow, work.deny, work.allow_all)
    client: ModelClient
    if script is not None:
        from dsh.agent.models.scripted import ScriptedModelClient

        client = ScriptedModelClient.from_file(script)
    else:
        from dsh.agent.models.openai_compat import OpenAICompatibleClient, resolve_model_settings

        client = OpenAICompatibleClient(resolve_model_settings(config.model, model=model_name))
    printer = _Printer(as_json=as_json, stderr=globals_.console(stderr=True))
    outcome = _Outcome()
    try:
        async with Runtime.open(config, model=client, workspace=work.workspace, permissions=permissions) as rt:
            if _interactive(as_json):
                rt.approvals.set_answerer(TerminalApprover(printer.before_question))
            if session_id:
                agent = await rt.resume_agent(session_id, instructions=work.instructions)
            else:
                agent = await rt.create_agent(instructions=work.instructions)
            if model_name is not None and script is not None:
                agent.update_options(model=model_name)
            printer.session_id = agent.id
            rt.sessions.on_event(printer.event)
            agent.on_chunk(printer.chunk)
            loop = asyncio.get_running_loop()

            def interrupt() -> None:
                outcome.interrupted = True
                agent.cancel("user")

            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signal.SIGINT, interrupt)
            try:
                with printer.spinning():
                    message_id = await agent.send(prompt, UserSource())
                    pending = agent.turn_result(message_id)
                    try:
                        outcome.result = await asyncio.wait_for(asyncio.shield(pending), timeout)
                    except TimeoutError:
                        outcome.timed_out = True
                        agent.cancel("user")
                        outcome.result = await pending
                    if settle and not (outcome.interrupted or outcome.timed_out):
                        await rt.settle(timeout=None)
            finally:
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.remove_signal_handler(signal.SIGINT)
            printer.newline()
            with contextlib.suppress(Exception):  # a total is a nicety: the answer stands without it
                tokens = await rt.tokens(agent.id, tree=True)
                outcome.tokens = tokens if tokens.requests else None  # a model that reported no usage
            return outcome, agent.id
    finally:
        await client.aclose()


def _work(
    workspace: Path | None, instructions: Path | None, allow: list[str] | None, deny: list[str] | None, allow_all: bool
) -> _Work:
    from dsh.errors import ConfigError

    root = Path(os.path.realpath(workspace if workspace is not None else os.getcwd()))
    if not root.is_dir():
        raise ConfigError(f"the workspace {workspace} is not a folder")
    text = None
    if instructions is not None:
        try:
            text = instructions.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise ConfigError(f"cannot read the instructions file {instructions}: {error}") from None
    return _Work(root, text, list(allow or ()), list(deny or ()), allow_all)


@app.command()
def run(
    ctx: typer.Context,
    prompt: Annotated[str, typer.Argument(help="The prompt to send.")],
    session: Annotated[
        str | None, typer.Option("--session", help="Continue this top-level session instead of starting one.")
    ] = None,
    script: Annotated[
        Path | None, typer.Option("--script", help="Answer from this scripted-model file (keyless).")
    ] = None,
    model: Annotated[str | None, typer.Option("--model", help="The model name (overrides DSH_MODEL).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Write JSON lines: one per event, then the result.")] = False,
    no_settle: Annotated[
        bool, typer.Option("--no-settle", help="Do not wait for background subagents and their notices.")
    ] = False,
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="Cancel the turn after this many seconds.", min=0)
    ] = None,
    workspace: Annotated[
        Path | None,
        typer.Option("--workspace", help="The folder the tools work in (default: the current folder)."),
    ] = None,
    instructions: Annotated[
        Path | None, typer.Option("--instructions", help="A file of instructions added to the system prompt.")
    ] = None,
    allow: AllowOption = None,
    deny: DenyOption = None,
    allow_all: AllowAllOption = False,
) -> None:
    """Run one prompt on an agent and stream the answer (`--script FILE` runs keyless).

    The agent can read, search, edit and run commands in the workspace; write, edit and bash ask
    first on a terminal, and are refused without one unless --allow lets them through.

    Example: dsh run "Summarise the README" --model deepseek-chat
    """
    globals_: Globals = ctx.obj
    try:
        work = _work(workspace, instructions, allow, deny, allow_all)
        outcome, session_id = asyncio.run(
            _drive(
                globals_,
                prompt,
                session_id=session,
                script=script,
                model_name=model,
                as_json=as_json,
                settle=not no_settle,
                timeout=timeout,
                work=work,
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
        _write(_line(record) + "\n")
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
