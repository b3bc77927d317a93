"""`dsh history ID`: one page of a session's conversation, observed read-only.

Layer: CLI (thin: it opens a read-only `Runtime`, reads one history page through the query service,
renders). The page is the one the server's history routes serve (docs/query.md#history-pages): the
newest messages, or with `--before SEQ` the ones before that seq, message-aligned, at most
`--limit` messages. Reading it only observes: nothing is resumed, repaired or written, and any
session can be read, subagent children included. Text mode shows each turn's messages with their
role, tool calls with their arguments, and tool results (errors marked); the last line says whether
older messages exist and gives the `--before` that reads them. `--json` prints the page itself
(`HistoryPage.to_json()`). An unknown id exits 3 (docs/cli.md#dsh-history).
"""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer

from dsh.cli.app import Globals, app, guarded
from dsh.cli.progress import spinner
from dsh.cli.text import json_text, safe

if TYPE_CHECKING:
    from rich.console import Console

    from dsh.agent.model import Usage
    from dsh.agent.usage import ModelPrice
    from dsh.query.records import HistoryPage

__all__ = ["history", "render_page"]

MAX_LIMIT: Final = 200

_SOURCES: Final = {"user": "user", "coordinator": "parent", "subagent-settled": "notice"}
_STYLES: Final = {
    "user": "bold cyan",
    "parent": "bold cyan",
    "notice": "bold blue",
    "assistant": "bold green",
    "call": "magenta",
    "result": "dim",
    "error": "bold red",
    "turn": "dim",
}


def _text_of(content: object) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, Sequence):
        return ""
    return "".join(
        str(block.get("text", ""))
        for block in content
        if isinstance(block, Mapping) and block.get("type") == "text" and isinstance(block.get("text"), str)
    )


class _Printer:
    def __init__(self, console: Console, plain: bool, prices: Mapping[str, ModelPrice] | None = None) -> None:
        self.console = console
        self.plain = plain
        self.calls: dict[str, str] = {}
        self.prices = prices or {}
        self.turn_usage: list[tuple[str, Usage]] | None = None  # None until this page shows a turn's start

    def line(self, label: str, body: str, style_key: str, *, indent: int = 2) -> None:
        """`label: body` with multi-line bodies aligned under the first line; every string escaped."""
        lines = safe(body, newlines=True).replace("\t", "    ").split("\n") or [""]
        from rich.text import Text  # rich loads when a page is printed (docs/architecture.md#import-cost)

        head = f"{' ' * indent}{label}: "
        text = Text(" " * indent)
        text.append(f"{label}:", style="" if self.plain else _STYLES[style_key])
        text.append(f" {lines[0]}")
        for more in lines[1:]:
            text.append("\n" + " " * len(head) + more)
        self.console.print(text, soft_wrap=True)

    def event(self, event: Mapping[str, Any]) -> None:
        from rich.text import Text

        kind = event.get("type")
        data = event.get("data")
        data = data if isinstance(data, Mapping) else {}
        if kind == "turn/start":
            self.turn_usage = []
            self.console.print(Text(f"turn {data.get('turn', '?')}", style="" if self.plain else _STYLES["turn"]))
        elif kind == "turn/end":
            self.tokens()
            reason = data.get("reason")
            if isinstance(reason, Mapping) and reason.get("kind") != "completed":
                parts = [str(reason.get("kind", "ended"))]
                error = reason.get("error")
                cause = reason.get("reason")  # an aborted turn says why: {kind: "user" | "disposed" | ...}
                if isinstance(cause, Mapping) and cause.get("kind"):
                    parts.append(str(cause["kind"]))
                if isinstance(error, Mapping):
                    parts += [str(error[key]) for key in ("code", "message") if error.get(key)]
                self.line(f"turn {data.get('turn', '?')} ended", " · ".join(parts), "error")
        elif kind == "user/message":
            source = data.get("source")
            origin = source.get("kind") if isinstance(source, Mapping) else "user"
            label = _SOURCES.get(str(origin), str(origin))
            if origin == "plugin" and isinstance(source, Mapping) and source.get("plugin") == "compact":
                label = "summary"  # a compaction's summary (docs/agent.md#compaction)
            self.line(label, _text_of(data.get("content")), label if label in _STYLES else "user")
        elif kind == "assistant/message":
            self.assistant(data.get("message"))
            from dsh.agent.usage import usage_of_event

            usage = usage_of_event(event)
            message = data.get("message")
            source = message.get("source") if isinstance(message, Mapping) else None
            model = source.get("model") if isinstance(source, Mapping) else None
            if usage is not None and self.turn_usage is not None:
                self.turn_usage.append((model if isinstance(model, str) else "", usage))
        elif kind == "tool/call":
            call_id = str(data.get("callId", ""))
            if call_id not in self.calls:
                self.calls[call_id] = str(data.get("name", "tool"))
                self.line("calls", f"{data.get('name', 'tool')} {data.get('arguments', '')}", "call")
        elif kind == "tool/result":
            self.result(data.get("message"))

    def tokens(self) -> None:
        """The turn's token total, when this page shows the whole turn and the model reported usage."""
        if self.turn_usage:
            from dsh.agent.usage import turn_totals

            self.line("tokens", turn_totals(self.turn_usage, self.prices).summary(), "turn")
        self.turn_usage = None

    def assistant(self, message: object) -> None:
        if not isinstance(message, Mapping):
            return
        content = message.get("content")
        if isinstance(content, str):
            self.line("assistant", content, "assistant")
            return
        for block in content if isinstance(content, Sequence) else ():
            if not isinstance(block, Mapping):
                continue
            if block.get("type") == "text" and block.get("text"):
                self.line("assistant", str(block["text"]), "assistant")
            elif block.get("type") == "tool-call":
                name = str(block.get("name", "tool"))
                self.calls[str(block.get("id", ""))] = name
                self.line("calls", f"{name} {block.get('arguments', '')}", "call")

    def result(self, message: object) -> None:
        if not isinstance(message, Mapping):
            return
        content = message.get("content")
        block = (
            next(
                (item for item in content if isinstance(item, Mapping) and item.get("type") == "tool-result"),
                None,
            )
            if isinstance(content, Sequence) and not isinstance(content, str)
            else None
        )
        source = message.get("source")
        call_id = str(block.get("toolCallId", "")) if block is not None else ""
        if not call_id and isinstance(source, Mapping):
            call_id = str(source.get("callId", ""))
        name = self.calls.get(call_id, "tool")
        failed = bool(block.get("isError")) if block is not None else False
        text = _text_of(block.get("content")) if block is not None else _text_of(content)
        self.line(f"{name} {'error' if failed else 'result'}", text, "error" if failed else "result", indent=4)


def render_page(
    console: Console,
    page: HistoryPage,
    *,
    more_hint: str | None,
    plain: bool = False,
    prices: Mapping[str, ModelPrice] | None = None,
) -> None:
    """Print one page: a heading, the page's turns and messages, and where the older messages are."""
    from rich.text import Text

    events: list[Mapping[str, Any]] = list(page.events)  # each event is a frozen mapping
    span = f"seq {events[0]['seq']}-{events[-1]['seq']}" if events else "no events"
    where = "live" if page.live else "stored"
    heading = f"session {safe(page.session_id)} ({where}; {span})"
    console.print(Text(heading, style="" if plain else "bold"), soft_wrap=True)
    printer = _Printer(console, plain, prices)
    first = events[0] if events else None
    data = first.get("data") if first is not None else None
    turn = data.get("turn") if isinstance(data, Mapping) else None
    if first is not None and first.get("type") != "turn/start" and turn is not None:
        console.print(Text(f"turn {turn} (continued)", style="" if plain else _STYLES["turn"]))
    for event in events:
        printer.event(event)
    if page.has_more and more_hint is not None:
        console.print(Text(f"older messages: {more_hint}"), soft_wrap=True)
    elif not page.has_more:
        console.print(Text("(this is the start of the session)", style="" if plain else "dim"), soft_wrap=True)


def _hint(globals_: Globals, session_id: str, before: int, limit: int | None) -> str:
    words = globals_.command_words()
    words += ["history", shlex.quote(session_id), "--before", str(before)]
    if limit is not None:
        words += ["--limit", str(limit)]
    return safe(" ".join(words))


@app.command()
def history(
    ctx: typer.Context,
    session_id: Annotated[
        str, typer.Argument(help="The session id (any session, subagent children too).", metavar="ID")
    ],
    before: Annotated[
        int | None, typer.Option("--before", min=0, help="Read the messages before this seq (the hint's value).")
    ] = None,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, max=MAX_LIMIT, help="Messages per page (1-200; default 50).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the page as one JSON document.")] = False,
    plain: Annotated[bool, typer.Option("--plain", help="Output without colour.")] = False,
) -> None:
    """Show one page of a session's messages, tool calls and results (read-only).

    The newest page first; the last line gives the --before that reads the older one.

    \b
    Example:
      dsh --home ./demo-home history 00000001-0000-4000-8000-000000000001 --limit 10
    """
    from dsh.runtime import Runtime
    from dsh.session.header import SessionId

    globals_: Globals = ctx.obj

    async def run() -> HistoryPage:
        async with Runtime.open(globals_.config(), read_only=True) as rt:
            return await rt.query.read_history(SessionId(session_id), before_seq=before, max_messages=limit)

    def work() -> HistoryPage:
        with spinner(globals_.console(stderr=True), "reading the session…", enabled=not as_json):
            return asyncio.run(run())

    page = guarded(ctx, work)
    if as_json:
        typer.echo(json_text(page.to_json()))
        return
    hint = _hint(globals_, session_id, page.next_before_seq, limit) if page.next_before_seq is not None else None
    from dsh.agent.usage import price_table

    prices = price_table(globals_.config().prices)
    render_page(globals_.console(plain=plain), page, more_hint=hint, plain=plain, prices=prices)
