"""What a conversation looks like on the terminal: answers, tool calls, subagents, the spinner.

Layer: CLI (presentation only: it renders the events and chunks the agent loop writes; every
decision is the library's). `dsh run`, `dsh send` and `dsh chat` share it (docs/cli.md#dsh-run):

* the main agent's answer streams to stdout; every answer stands on its own (a second answer, or a
  second step's text, starts on a fresh line after a blank one), and an answer to a subagent's
  notice is introduced by a line naming the subagent (`── main, on the notice from "Checker":`);
* a subagent's answer is shown, introduced by its label, when its turn settles; one that settles
  while a turn of the main agent runs waits for that turn's end, so a turn's lines never interleave
  with others (and the order on the screen is the order a reader follows: the turn, then what
  settled during it, then the replies to the notices);
* tool calls go to stderr compactly: the tool, its key argument and a one-line result;
* the spinner (stderr, a terminal only, never with `--json`) draws on a line of its own and erases
  only that line (`\\r ESC[2K`): it never moves the cursor up, so it can erase no output. It shows only
  while nothing else is written, and it never starts in the middle of a line.

Untrusted text (model output, labels, tool arguments) goes through `dsh.cli.text.safe`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, TextIO

from dsh.cli.text import safe

if TYPE_CHECKING:
    from dsh.agent.loop import Agent
    from dsh.agent.model import ModelChunk
    from dsh.session.events import SessionEvent
    from dsh.session.session import Session

__all__ = ["KEY_ARGUMENTS", "Spinner", "Terminal", "TurnView", "key_argument", "one_line"]

KEY_ARGUMENTS: Final[Mapping[str, tuple[str, ...]]] = {
    "bash": ("command",),
    "read": ("file_path",),
    "write": ("file_path",),
    "edit": ("file_path",),
    "glob": ("pattern", "path"),
    "grep": ("pattern", "path"),
    "agent": ("description", "prompt"),
    "send_message": ("subagent_id", "message"),
    "interrupt_agent": ("agent_id",),
    "list_agents": ("scope",),
}
"""The argument a tool call is shown by (the first one present); other tools show their first string argument."""

_FRAMES: Final = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
_CLEAR_LINE: Final = "\r\x1b[2K"
_FRAME_S: Final = 0.1


def one_line(text: object, width: int) -> str:
    """`text` on one line (whitespace runs folded, control characters escaped), cut to `width` with `…`."""
    flat = " ".join(str(text).split())
    shown = safe(flat)
    return shown if len(shown) <= width else shown[: max(1, width - 1)] + "…"


def key_argument(name: str, arguments: object) -> str:
    """The argument a call of `name` is shown by: `KEY_ARGUMENTS`, else the first string value, else ""."""
    parsed: object = arguments
    if isinstance(arguments, str):
        import orjson

        try:
            parsed = orjson.loads(arguments) if arguments.strip() else {}
        except orjson.JSONDecodeError:
            return arguments
    if not isinstance(parsed, Mapping):
        return ""
    for key in KEY_ARGUMENTS.get(name, ()):
        value = parsed.get(key)
        if isinstance(value, str) and value:
            return value
    for value in parsed.values():
        if isinstance(value, str) and value:
            return value
    return ""


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Terminal:
    """stdout and stderr, with where each stands: at the start of a line, after a blank line.

    The streams are looked up on every write (`sys.stdout` may be replaced, e.g. by the chat's
    prompt); a reader that has gone (`| head`) silently drops the rest of stdout.
    """

    def __init__(self, *, width: int | None = None) -> None:
        self.out_at_start = True
        self.out_blank = True  # nothing written yet counts as "after a blank line"
        self.wrote_out = False
        self._width = width
        self._gone = False
        self.spinner: Spinner | None = None

    @property
    def width(self) -> int:
        """The terminal's width (80 when it cannot be told)."""
        if self._width is not None:
            return self._width
        columns = os.environ.get("COLUMNS")
        if columns is not None and columns.isdigit() and int(columns) > 0:
            return int(columns)
        for stream in (sys.stderr, sys.stdout):
            with contextlib.suppress(AttributeError, ValueError, OSError):
                return os.get_terminal_size(stream.fileno()).columns or 80
        return 80

    def out_is_terminal(self) -> bool:
        """Whether stdout is a terminal."""
        return _is_terminal(sys.stdout)

    def err_is_terminal(self) -> bool:
        """Whether stderr is a terminal."""
        return _is_terminal(sys.stderr)

    def out(self, text: str) -> None:
        """Write `text` to stdout (the spinner is cleared first)."""
        if not text or self._gone:
            return
        self.pause()
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except BrokenPipeError:
            self._gone = True
            devnull = os.open(os.devnull, os.O_WRONLY)
            with contextlib.suppress(OSError, ValueError):
                os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
            return
        self.wrote_out = True
        self.out_blank = text.endswith("\n\n") or (self.out_at_start and text == "\n")
        self.out_at_start = text.endswith("\n")

    def end_line(self) -> None:
        """End stdout's current line, if one is open."""
        if not self.out_at_start:
            self.out("\n")

    def new_block(self) -> None:
        """Start a block of its own on stdout: a fresh line after a blank one (nothing before the first)."""
        if not self.wrote_out:
            return
        self.end_line()
        if not self.out_blank:
            self.out("\n")

    def err(self, line: str) -> None:
        """Write one line to stderr (on a line of its own; stdout's open line is ended first on a terminal)."""
        self.pause()
        if self.out_is_terminal() and self.err_is_terminal():
            self.end_line()
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    def pause_for_question(self) -> None:
        """A question is about to be asked on the terminal: no spinner, and a fresh line."""
        if self.spinner is not None:
            self.spinner.stop()
        if self.out_is_terminal():
            self.end_line()

    def pause(self) -> None:
        """Clear the spinner's line now; it shows again on its next frame."""
        if self.spinner is not None:
            self.spinner.clear()


class Spinner:
    """A one-line `⠋ thinking…` on stderr that erases only its own line (never the output).

    It draws only when stderr is a terminal, the line is free (stdout is at the start of a line, or
    not on the terminal) and `enabled` holds; it appears after `delay_s`, so quick steps never
    flicker. `Terminal` clears it before every write.
    """

    def __init__(self, terminal: Terminal, *, label: str = "thinking…", delay_s: float = 0.5) -> None:
        self._terminal = terminal
        self._label = label
        self._delay_s = delay_s
        self._task: asyncio.Task[None] | None = None
        self._shown = False
        self.enabled = True
        terminal.spinner = self

    def start(self, label: str | None = None) -> None:
        """Show the spinner (after the delay) until `stop()`; a no-op when it already runs."""
        if label is not None:
            self._label = label
        if self._task is not None or not self._terminal.err_is_terminal():
            return
        self._task = asyncio.get_running_loop().create_task(self._spin(), name="dsh-spinner")

    def stop(self) -> None:
        """Stop and clear the spinner."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
        self.clear()

    def clear(self) -> None:
        """Erase the spinner's line, if it is drawn."""
        if self._shown:
            self._shown = False
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write(_CLEAR_LINE)
                sys.stderr.flush()

    def _free(self) -> bool:
        terminal = self._terminal
        return self.enabled and (terminal.out_at_start or not terminal.out_is_terminal())

    async def _spin(self) -> None:
        await asyncio.sleep(self._delay_s)
        frame = 0
        waited = 0.0
        while True:
            if self._free():
                text = one_line(f"{_FRAMES[frame % len(_FRAMES)]} {self._label} {int(waited + self._delay_s)}s", 60)
                with contextlib.suppress(OSError, ValueError):
                    sys.stderr.write(f"\r{text}\x1b[K")
                    sys.stderr.flush()
                self._shown = True
            frame += 1
            await asyncio.sleep(_FRAME_S)
            waited += _FRAME_S


@dataclass(slots=True)
class _Child:
    label: str
    answer: str = ""
    shown_turns: set[int] = field(default_factory=set)


class TurnView:
    """Renders one main agent's turns and its subagents' answers as they happen (see the module docs).

    Wire it with `agent.on_chunk(view.chunk)` and `rt.sessions.on_event(view.event)`.
    """

    def __init__(self, terminal: Terminal, *, spinner: Spinner | None = None) -> None:
        self.terminal = terminal
        self.spinner = spinner
        self.main_id: str | None = None
        self.answers = 0
        self._running = False
        self._step_text = False
        self._children: dict[str, _Child] = {}
        self._held: list[tuple[str, str]] = []  # (header, text) of subagent answers waiting for the turn's end
        self._tool_names: dict[str, str] = {}

    # ---------------------------------------------------------------- listeners

    def chunk(self, agent: Agent, turn: int, step: int, chunk: ModelChunk) -> None:
        """A streamed chunk of the main agent: its text goes to stdout as it comes."""
        from dsh.agent.model import TextDelta

        if agent.id != self.main_id or not isinstance(chunk, TextDelta) or not chunk.text:
            return
        if self.spinner is not None:
            self.spinner.stop()
        if not self._step_text:
            self._step_text = True
            if self.answers:
                self.terminal.new_block()
            self.answers += 1
        self.terminal.out(safe(chunk.text, newlines=True))

    def event(self, session: Session, event: SessionEvent) -> None:
        """A session event: the main agent's turn structure and tools, a subagent's label and answer."""
        data = event.data if isinstance(event.data, Mapping) else {}
        if session.id == self.main_id:
            self._main_event(event.type, data)
        else:
            self._child_event(session, event.type, data)

    # ---------------------------------------------------------------- the main agent

    def _main_event(self, kind: str, data: Mapping[str, Any]) -> None:
        if kind == "turn/start":
            self._running = True
        elif kind == "step/start":
            self._step_text = False
            if self.spinner is not None:
                self.spinner.start()
        elif kind == "user/message":
            source = data.get("source")
            if isinstance(source, Mapping) and source.get("kind") == "subagent-settled":
                sender = source.get("senderSessionId")
                label = self.label_of(sender) if isinstance(sender, str) else "a subagent"
                self.terminal.new_block()
                self.terminal.out(f"── main, on the notice from {label}:\n")
                self.terminal.out_blank = True  # the answer follows the header directly
        elif kind == "assistant/message":
            self.terminal.end_line()
        elif kind == "tool/call":
            name = str(data.get("name", ""))
            call_id = data.get("callId")
            if isinstance(call_id, str):
                self._tool_names[call_id] = name
            argument = key_argument(name, data.get("arguments"))
            self.terminal.err(one_line(f"→ {name} {argument}".rstrip(), self.terminal.width))
        elif kind == "tool/result":
            self.terminal.err(self._result_line(data))
        elif kind == "turn/end":
            if self.spinner is not None:
                self.spinner.stop()
            self._running = False
            self.terminal.end_line()
            self._release_held()

    def _result_line(self, data: Mapping[str, Any]) -> str:
        from dsh.agent.messages import message_text

        message = data.get("message")
        failed = False
        first = ""
        if isinstance(message, Mapping):
            content = message.get("content")
            if isinstance(content, list) and content and isinstance(content[0], Mapping):
                failed = bool(content[0].get("isError", False))
            lines = message_text(message).strip().splitlines()
            first = lines[0] if lines else ""
        marker = "← error" if failed else "← ok"
        return one_line(f"{marker}: {first}" if first else marker, self.terminal.width)

    # ---------------------------------------------------------------- subagents

    def label_of(self, session_id: str) -> str:
        """How a subagent is named: its quoted label, else its id."""
        child = self._children.get(session_id)
        return f'"{safe(child.label)}"' if child is not None and child.label else safe(session_id)

    def _child(self, session: Session) -> _Child | None:
        """The subagent whose session this is (its label from its descriptor), or None for another session."""
        child = self._children.get(session.id)
        if child is not None or session.header.origin != "subagent":
            return child
        label = ""
        for event in session.events:
            if event.type == "subagent/descriptor" and isinstance(event.data, Mapping):
                found = event.data.get("label")
                label = found if isinstance(found, str) else ""
                break
        child = self._children[session.id] = _Child(label)
        return child

    def _child_event(self, session: Session, kind: str, data: Mapping[str, Any]) -> None:
        child = self._child(session)
        if child is None:
            return
        session_id = session.id
        if kind == "subagent/descriptor":
            label = data.get("label")
            child.label = label if isinstance(label, str) else child.label
        elif kind == "turn/start":
            child.answer = ""
        elif kind == "assistant/message":
            from dsh.agent.messages import message_text

            message = data.get("message")
            text = message_text(message) if isinstance(message, Mapping) else ""
            if text.strip():
                child.answer = text
        elif kind == "turn/end":
            turn = data.get("turn")
            if not isinstance(turn, int) or turn in child.shown_turns:
                return
            child.shown_turns.add(turn)
            reason = data.get("reason")
            how = reason.get("kind") if isinstance(reason, Mapping) else None
            name = self.label_of(session_id)
            if how == "completed":
                header = f"── subagent {name} answered:"
            else:
                header = f"── subagent {name} ended ({safe(how)}):"
            self._held.append((header, child.answer))
            if not self._running:
                self._release_held()

    def _release_held(self) -> None:
        held, self._held = self._held, []
        for header, text in held:
            self.terminal.new_block()
            self.terminal.out(header + "\n")
            self.terminal.out_blank = True
            if text:
                self.terminal.out(safe(text, newlines=True))
                self.terminal.end_line()
            self.answers += 1
