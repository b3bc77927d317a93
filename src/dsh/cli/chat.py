"""`dsh chat`: an interactive session on the terminal, on prompt_toolkit's line editor.

Layer: CLI (thin: the conversation is an ordinary top-level agent of a `Runtime`; this module reads
lines, sends them and renders what the loop writes through `dsh.cli.turns`). The input line has
history (kept in `$XDG_STATE_HOME/dsh/chat-history`, default `~/.local/state`), multi-line editing
(Enter sends, Alt-Enter or Esc Enter starts a new line, a paste keeps its lines) and the usual
editing keys. One coroutine owns the terminal: it reads the next line, or waits for the running
turn, and in both states answers the approval questions the agents ask (a subagent's question that
comes while a line is being typed takes the terminal for the time of the answer, then the typed
text is back). Output that arrives while a line is being typed (a subagent settles, the agent
answers its notice) is printed above the prompt.

Ctrl-C during a turn cancels that turn (it ends `aborted`, the session stays usable); a second
Ctrl-C before it ended leaves. At the prompt Ctrl-C clears the line, and on an empty line a second
one leaves; Ctrl-D on an empty line and `/exit` leave. The session id is printed at the start, and
how to resume it at the end (docs/cli.md#dsh-chat).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dsh.cli.app import Globals, app, fail
from dsh.cli.approve import AllowAllOption, AllowOption, DenyOption, parse_answer, permissions_from_flags
from dsh.cli.drive import (
    InstructionsOption,
    ModelOption,
    ScriptOption,
    Work,
    WorkspaceOption,
    last_session,
    model_client,
    work_from_flags,
)
from dsh.cli.errors import EXIT_CODES
from dsh.cli.text import safe

if TYPE_CHECKING:
    from prompt_toolkit import PromptSession

    from dsh.abort import AbortSignal
    from dsh.agent.approval import ApprovalAnswer, ApprovalRequest
    from dsh.agent.loop import Agent
    from dsh.cli.turns import Spinner, Terminal, TurnView
    from dsh.runtime import Runtime

__all__ = ["ChatApprover", "chat", "history_file"]

_PROMPT = "you> "
_CONTINUATION = "...  "


def history_file() -> Path:
    """Where the chat's input history is kept: `$XDG_STATE_HOME/dsh/chat-history` (default `~/.local/state`)."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "dsh" / "chat-history"


@dataclass(slots=True)
class _Question:
    request: ApprovalRequest
    signal: AbortSignal
    answer: asyncio.Future[ApprovalAnswer]


class ChatApprover:
    """The runtime's answerer in `dsh chat`: questions wait in a queue for the loop that owns the terminal."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[_Question] = asyncio.Queue()

    async def __call__(self, request: ApprovalRequest, signal: AbortSignal) -> ApprovalAnswer:
        """Queue the question and wait for its answer; an aborted turn takes it back (`deny`)."""
        answer: asyncio.Future[ApprovalAnswer] = asyncio.get_running_loop().create_future()
        self.queue.put_nowait(_Question(request, signal, answer))
        aborted = asyncio.ensure_future(signal.wait())
        try:
            await asyncio.wait(_waiters(answer, aborted), return_when=asyncio.FIRST_COMPLETED)
        finally:
            aborted.cancel()
        if not answer.done():
            answer.cancel()  # the loop skips a question nobody waits for
            signal.throw_if_aborted()
            return "deny"
        return answer.result()


def _waiters(*futures: asyncio.Future[Any]) -> set[asyncio.Future[Any]]:
    """The futures to wait for together (their result types differ)."""
    return set(futures)


async def _settle(*tasks: asyncio.Future[Any]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class _Chat:
    """The loop that owns the terminal (see the module docs)."""

    def __init__(
        self,
        rt: Runtime,
        agent: Agent,
        *,
        terminal: Terminal,
        view: TurnView,
        spinner: Spinner,
        approver: ChatApprover,
        history: Path | None,
    ) -> None:
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import FileHistory, InMemoryHistory

        from dsh.cli.chat_commands import SlashCommands

        self.rt = rt
        self.agent = agent
        self.terminal = terminal
        self.view = view
        self.spinner = spinner
        self.approver = approver
        if history is not None:
            history.parent.mkdir(parents=True, exist_ok=True)
        self.input: PromptSession[str] = PromptSession(
            history=FileHistory(str(history)) if history is not None else InMemoryHistory(),
            multiline=True,
            key_bindings=_bindings(),
            prompt_continuation=_CONTINUATION,
        )
        self.ask: PromptSession[str] = PromptSession()
        self.commands = SlashCommands(self)
        self.leaving = False
        self._interrupts = 0

    # ---------------------------------------------------------------- the loop

    async def run(self) -> None:
        """Read and handle lines until the user leaves."""
        while not self.leaving:
            line = await self.read()
            if line is None:
                break
            text = line.strip()
            if not text:
                continue
            if text.startswith("/"):
                await self.commands.run(text)
            else:
                await self.turn(line)

    async def read(self) -> str | None:
        """The next line, answering questions that come meanwhile; None when the user leaves."""
        from prompt_toolkit.patch_stdout import patch_stdout

        typed = ""
        cleared_empty = False
        while True:
            self.spinner.enabled = False
            self.spinner.stop()
            with patch_stdout(raw=True):
                prompt = asyncio.ensure_future(self.input.prompt_async(_PROMPT, default=typed))
                question = asyncio.ensure_future(self.approver.queue.get())
                await asyncio.wait({prompt, question}, return_when=asyncio.FIRST_COMPLETED)
                if question.done():
                    typed = self.input.default_buffer.text
                    await _settle(prompt)
            self.spinner.enabled = True
            if question.done():
                await self.answer(question.result())
                continue
            await _settle(question)
            try:
                return prompt.result()
            except EOFError:
                return None
            except KeyboardInterrupt:
                had_text = bool(self.input.default_buffer.text.strip())
                typed = ""
                if had_text:
                    cleared_empty = False
                    continue
                if cleared_empty:
                    return None
                cleared_empty = True
                self.terminal.err("(Ctrl-C again, Ctrl-D or /exit leaves)")

    async def turn(self, text: str) -> None:
        """Send `text` and wait for its turn, answering questions; Ctrl-C cancels it, a second leaves."""
        from dsh.agent.messages import UserSource

        message_id = await self.agent.send(text, UserSource())
        pending = self.agent.turn_result(message_id)
        self._interrupts = 0
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGINT, self.interrupt)
        self.spinner.start("thinking…")
        try:
            while not pending.done():
                question = asyncio.ensure_future(self.approver.queue.get())
                await asyncio.wait(_waiters(pending, question), return_when=asyncio.FIRST_COMPLETED)
                if question.done():
                    await self.answer(question.result())
                else:
                    await _settle(question)
        finally:
            self.spinner.stop()
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signal.SIGINT)
        result = pending.result()
        self.terminal.end_line()
        if result.stop_reason == "aborted":
            self.terminal.err("(the turn was interrupted)")
        elif result.stop_reason == "error" and result.error is not None:
            self.terminal.err(safe(f"error [{result.error.get('code', '')}]: {result.error.get('message', '')}"))

    def interrupt(self) -> None:
        """Ctrl-C during a turn: the first cancels it, a second leaves as well."""
        self._interrupts += 1
        self.agent.cancel("user")
        if self._interrupts == 1:
            self.terminal.err("interrupting the turn… (Ctrl-C again leaves)")
        else:
            self.leaving = True

    async def answer(self, question: _Question) -> None:
        """Ask one approval question on the terminal; Ctrl-C refuses it and interrupts the turn."""
        from dsh.cli.approve import question_lines, question_prompt

        if question.answer.done():
            return  # its turn was cancelled meanwhile
        self.terminal.pause_for_question()
        for line in question_lines(question.request):
            self.terminal.err(line)
        while not question.answer.done():
            ask = asyncio.ensure_future(self.ask.prompt_async(question_prompt(question.request)))
            await asyncio.wait(_waiters(ask, question.answer), return_when=asyncio.FIRST_COMPLETED)
            if not ask.done():
                await _settle(ask)
                return
            try:
                answer = parse_answer(ask.result())
            except KeyboardInterrupt:
                question.answer.set_result("deny")
                self.interrupt()
                return
            except EOFError:
                question.answer.set_result("deny")
                return
            if answer is not None:
                question.answer.set_result(answer)


def _bindings() -> Any:
    """Enter sends the text; Alt-Enter (Esc Enter) inserts a new line."""
    from prompt_toolkit.key_binding import KeyBindings

    bindings = KeyBindings()

    @bindings.add("enter")
    def _send(event: Any) -> None:
        event.current_buffer.validate_and_handle()

    @bindings.add("escape", "enter")
    def _newline(event: Any) -> None:
        event.current_buffer.insert_text("\n")

    return bindings


async def _converse(
    globals_: Globals,
    *,
    session_id: str | None,
    resume_last: bool,
    script: Path | None,
    model_name: str | None,
    work: Work,
    terminal: Terminal,
) -> str | None:
    from dsh.cli.turns import Spinner, TurnView
    from dsh.runtime import Runtime

    config = globals_.config(workspace=work.workspace)
    permissions = permissions_from_flags(config, work.allow, work.deny, work.allow_all)
    client = model_client(config, script, model_name)
    spinner = Spinner(terminal)
    view = TurnView(terminal, spinner=spinner)
    approver = ChatApprover()
    agent_id: str | None = None
    try:
        async with Runtime.open(config, model=client, workspace=work.workspace, permissions=permissions) as rt:
            rt.approvals.set_answerer(approver)
            if resume_last:
                session_id = await last_session(rt, work.workspace)
            if session_id:
                agent = await rt.resume_agent(session_id, instructions=work.instructions)
            else:
                agent = await rt.create_agent(instructions=work.instructions)
            if model_name is not None and script is not None:
                agent.update_options(model=model_name)
            agent_id = agent.id
            view.main_id = agent.id
            rt.sessions.on_event(view.event)
            agent.on_chunk(view.chunk)
            terminal.err(f"dsh chat · session {safe(agent.id)} · model {safe(agent.options.model)}")
            terminal.err("Enter sends · Alt-Enter: new line · /help: commands · Ctrl-D: leave")
            chat = _Chat(
                rt, agent, terminal=terminal, view=view, spinner=spinner, approver=approver, history=history_file()
            )
            await chat.run()
            return agent_id
    finally:
        await client.aclose()


@app.command()
def chat(
    ctx: typer.Context,
    session: Annotated[
        str | None, typer.Option("--session", help="Continue this top-level session instead of starting one.")
    ] = None,
    resume_last: Annotated[
        bool, typer.Option("--continue", help="Continue the workspace's last session (the newest one started there).")
    ] = False,
    script: ScriptOption = None,
    model: ModelOption = None,
    workspace: WorkspaceOption = None,
    instructions: InstructionsOption = None,
    allow: AllowOption = None,
    deny: DenyOption = None,
    allow_all: AllowAllOption = False,
) -> None:
    """Chat with an agent on the terminal: streamed answers, tool calls, approvals, slash commands.

    Enter sends, Alt-Enter starts a new line; /help lists the commands. Ctrl-C interrupts the
    running turn (a second one leaves); Ctrl-D leaves.

    Example: dsh chat --continue
    """
    import sys

    from dsh.cli.turns import Terminal

    globals_: Globals = ctx.obj
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        typer.echo("error: dsh chat needs a terminal; use dsh run PROMPT for one prompt from a script", err=True)
        raise typer.Exit(EXIT_CODES["usage"])
    terminal = Terminal()
    try:
        if session is not None and resume_last:
            from dsh.errors import ConfigError

            raise ConfigError("--session and --continue exclude each other: give one of them")
        work = work_from_flags(workspace, instructions, allow, deny, allow_all)
        session_id = asyncio.run(
            _converse(
                globals_,
                session_id=session,
                resume_last=resume_last,
                script=script,
                model_name=model,
                work=work,
                terminal=terminal,
            )
        )
    except KeyboardInterrupt:
        raise typer.Exit(EXIT_CODES["interrupted"]) from None
    except Exception as error:
        raise fail(ctx, error) from error
    if session_id is not None:
        words = " ".join(globals_.command_words())
        typer.echo(f"to resume: {words} chat --session {safe(session_id)}", err=True)
