"""The slash commands of `dsh chat`: `/help`, `/agents`, `/history`, `/compact`, `/model`, `/tokens`, `/exit`.

Layer: CLI (thin: each command calls the library and prints what it returns; docs/cli.md#dsh-chat).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol

from dsh.cli.text import safe

if TYPE_CHECKING:
    from dsh.agent.loop import Agent
    from dsh.cli.turns import Terminal
    from dsh.runtime import Runtime

__all__ = ["COMMANDS", "ChatHost", "SlashCommands"]


class ChatHost(Protocol):
    """What the commands use of the chat: its runtime, its agent, the terminal, and the way out."""

    rt: Runtime
    agent: Agent
    terminal: Terminal
    leaving: bool


COMMANDS: Final[Mapping[str, str]] = {
    "/help": "this list",
    "/agents": "the session's subagents: id, mode, activity, label",
    "/history [N]": "the last N messages of the conversation (default 20)",
    "/compact": "summarise the conversation so far, so later turns send less",
    "/model [NAME]": "the model in use, or switch to NAME for the next turns",
    "/tokens": "the tokens the session and its subagents used so far, and their cost",
    "/exit": "leave (Ctrl-D does too)",
}
"""Each command with its one-line help, in the order `/help` lists them."""

_HISTORY_DEFAULT: Final = 20


class SlashCommands:
    """Runs a `/command` line of the chat."""

    def __init__(self, chat: ChatHost) -> None:
        self.chat = chat
        self._table: dict[str, Callable[[str], Awaitable[None]]] = {
            "/help": self.help,
            "/agents": self.agents,
            "/history": self.history,
            "/compact": self.compact,
            "/model": self.model,
            "/tokens": self.tokens,
            "/exit": self.exit,
            "/quit": self.exit,
        }

    def say(self, line: str) -> None:
        """One line of a command's answer (stdout)."""
        terminal = self.chat.terminal
        terminal.end_line()
        terminal.out(line + "\n")

    async def run(self, line: str) -> None:
        """Run the command `line` starts with; an unknown one is named, with the hint to `/help`."""
        name, _, rest = line.partition(" ")
        command = self._table.get(name.lower())
        if command is None:
            self.chat.terminal.err(f"unknown command {safe(name)}; /help lists the commands")
            return
        try:
            await command(rest.strip())
        except Exception as error:
            code = getattr(error, "code", None)
            prefix = f"error [{code}]" if isinstance(code, str) else "error"
            self.chat.terminal.err(safe(f"{prefix}: {getattr(error, 'message', None) or error}"))

    async def help(self, _: str) -> None:
        """Every command with its help."""
        width = max(len(name) for name in COMMANDS)
        for name, text in COMMANDS.items():
            self.say(f"  {name.ljust(width)}  {text}")
        self.say("  Enter sends, Alt-Enter starts a new line; Ctrl-C interrupts a turn, Ctrl-D leaves.")

    async def agents(self, _: str) -> None:
        """The direct subagents of the session, with the live status of the resident ones."""
        from dsh.subagent.rows import SubagentChildRow

        chat = self.chat
        rows = await chat.rt.subagents.list_children(chat.agent.id)
        if not rows:
            self.say("(no subagents)")
            return
        for row in rows:
            if isinstance(row, SubagentChildRow):
                live = chat.rt.agents.get(row.id)
                status = live.status if live is not None else "stored"
                label = safe(row.label) if row.label else "-"
                self.say(f"  {safe(row.id)}  {row.mode}  {row.activity} ({status})  {label}")
            else:
                self.say(f"  {safe(row.id)}  unreadable ({row.reason}); dsh doctor tells more")

    async def history(self, argument: str) -> None:
        """The last N user, notice and assistant messages and tool calls, one line each."""
        from dsh.agent.messages import message_text
        from dsh.cli.turns import key_argument, one_line

        count = int(argument) if argument.isdigit() and int(argument) > 0 else _HISTORY_DEFAULT
        width = self.chat.terminal.width - 2
        lines: list[str] = []
        for event in self.chat.agent.session.events:
            data = event.data if isinstance(event.data, Mapping) else {}
            message = data.get("message") if event.type != "user/message" else data
            if event.type == "tool/call":
                name = str(data.get("name", ""))
                lines.append(one_line(f"→ {name} {key_argument(name, data.get('arguments'))}", width))
                continue
            if event.type not in ("user/message", "assistant/message") or not isinstance(message, Mapping):
                continue
            who = _speaker(event.type, message)
            text = message_text(message)
            if who is not None and text.strip():
                lines.append(one_line(f"{who}: {text}", width))
        if not lines:
            self.say("(nothing yet)")
        for line in lines[-count:]:
            self.say(f"  {line}")

    async def compact(self, _: str) -> None:
        """Summarise the conversation so far now (`Agent.compact`, docs/agent.md#compaction)."""
        chat = self.chat
        spinner = chat.terminal.spinner
        if spinner is not None:
            spinner.start("compacting…")
        try:
            result = await chat.agent.compact()
        finally:
            if spinner is not None:
                spinner.stop()
        if result is None:
            self.say("nothing to compact yet")
            return
        self.say(
            f"compacted {len(result.shadowed_seqs)} messages (about {result.shadowed_tokens:,} tokens) "
            f"into a summary of {len(result.summary):,} characters"
        )

    async def model(self, argument: str) -> None:
        """Show the model, or switch the next turns to another one."""
        agent = self.chat.agent
        if argument:
            agent.update_options(model=argument)
            self.say(f"model: {safe(argument)} (from the next turn)")
        else:
            self.say(f"model: {safe(agent.options.model)}")

    async def tokens(self, _: str) -> None:
        """The session's token total, its subagents included, priced when every model has a price."""
        chat = self.chat
        total = await chat.rt.tokens(chat.agent.id, tree=True)
        if not total.requests:
            self.say("tokens: no request reported its usage yet")
            return
        self.say(f"tokens: {total.summary()} ({total.requests} requests)")

    async def exit(self, _: str) -> None:
        """Leave the chat."""
        self.chat.leaving = True


def _speaker(kind: str, message: Mapping[str, Any]) -> str | None:
    if kind == "assistant/message":
        return "main"
    source = message.get("source")
    source_kind = source.get("kind") if isinstance(source, Mapping) else None
    if source_kind == "user":
        return "you"
    if source_kind == "subagent-settled":
        return "notice"
    return None
