"""The terminal's approval prompt of `dsh run`, and the permission flags `run` and `serve` share.

Layer: CLI (presentation: the decision rules are the library's, `dsh.agent.approval`). When a tool
call needs approval and both stdin and stderr are a terminal (and `--json` is off), `dsh run` shows,
on stderr, who asks (the agent's label: `main` or a subagent's), the tool and the exact command or
change, and reads one answer: `y` allows this call, `n` refuses it, `a` allows every call matching
the shown pattern for the rest of the session. One question is shown at a time; a subagent's
questions wait their turn. Without a terminal there is no prompt: the call is refused and the model
is told why (docs/cli.md#approvals-on-the-terminal).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Final, TextIO

import typer

from dsh.cli.text import safe

if TYPE_CHECKING:
    from dsh.abort import AbortSignal
    from dsh.agent.approval import ApprovalAnswer, ApprovalRequest, Permissions
    from dsh.config import Config

__all__ = [
    "AllowAllOption",
    "AllowOption",
    "DenyOption",
    "TerminalApprover",
    "parse_answer",
    "permissions_from_flags",
    "question_lines",
    "question_prompt",
]

_ANSWERS: Final[dict[str, ApprovalAnswer]] = {
    "y": "allow",
    "yes": "allow",
    "n": "deny",
    "no": "deny",
    "a": "always",
    "always": "always",
}
_MAX_PREVIEW_LINES: Final = 60

AllowOption = Annotated[
    list[str] | None,
    typer.Option(
        "--allow",
        help="Allow tool calls without asking: TOOL or TOOL:PATTERN (e.g. 'bash:pytest *'); repeatable.",
    ),
]
DenyOption = Annotated[
    list[str] | None,
    typer.Option("--deny", help="Refuse tool calls: TOOL or TOOL:PATTERN; beats every allow; repeatable."),
]
AllowAllOption = Annotated[
    bool,
    typer.Option("--allow-all", help="Run every tool call without asking (deny rules still apply). Use with care."),
]


def permissions_from_flags(
    config: Config, allow: Sequence[str] | None, deny: Sequence[str] | None, allow_all: bool
) -> Permissions:
    """The runtime's permissions: the configuration with the flags' rules first."""
    from dsh.agent.approval import Permissions

    return Permissions.from_config(config, allow=allow or (), deny=deny or (), allow_all=True if allow_all else None)


def question_lines(request: ApprovalRequest) -> list[str]:
    """Who asks, the tool, and the exact command or change (at most 60 lines of it), escaped."""
    lines = request.preview.splitlines() or [request.subject]
    shown = [f"  {safe(line)}" for line in lines[:_MAX_PREVIEW_LINES]]
    if len(lines) > _MAX_PREVIEW_LINES:
        shown.append(f"  ... ({len(lines) - _MAX_PREVIEW_LINES} more lines)")
    return [f"[{safe(request.label)}] {safe(request.tool)} needs approval:", *shown]


def question_prompt(request: ApprovalRequest) -> str:
    """`Allow? [y]es / [n]o / [a]lways allow TOOL:PATTERN in this session: `."""
    pattern = safe(f"{request.tool}:{request.pattern}")
    return f"Allow? [y]es / [n]o / [a]lways allow {pattern} in this session: "


def parse_answer(line: str) -> ApprovalAnswer | None:
    """`y`/`yes`, `n`/`no`, `a`/`always` (any case, spaces ignored); None for anything else."""
    return _ANSWERS.get(line.strip().lower())


class TerminalApprover:
    """Asks on the terminal, one question at a time (an `Answerer` of the runtime's `ApprovalBroker`).

    Args:
        before: Called before a question is shown (stops the spinner, ends a half-written line).
        stream: Where the question goes (stderr).
        answers: Where answers are read from (stdin).
    """

    def __init__(
        self, before: Callable[[], None], *, stream: TextIO | None = None, answers: TextIO | None = None
    ) -> None:
        self._before = before
        self._stream = stream or sys.stderr
        self._answers = answers or sys.stdin
        self._lock = asyncio.Lock()

    async def __call__(self, request: ApprovalRequest, signal: AbortSignal) -> ApprovalAnswer:
        """Show the question and wait for `y`, `n` or `a` (an unknown answer asks again; end of input is `n`)."""
        async with self._lock:
            self._before()
            self._write("\n".join(question_lines(request)) + "\n")
            while True:
                self._write(question_prompt(request))
                line = await self._read_line(signal)
                if line is None:
                    self._write("\n")
                    signal.throw_if_aborted()
                    return "deny"
                answer = parse_answer(line)
                if answer is not None:
                    return answer

    def _write(self, text: str) -> None:
        self._stream.write(text)
        self._stream.flush()

    async def _read_line(self, signal: AbortSignal) -> str | None:
        """One line from the answers stream; None at its end or when the signal aborts.

        The read runs in a daemon thread: a blocked terminal read can never keep the process from
        exiting (an abandoned read is simply left behind).
        """
        loop = asyncio.get_running_loop()
        done: asyncio.Future[str] = loop.create_future()

        def deliver(line: str) -> None:
            if not done.done():
                done.set_result(line)

        def read() -> None:
            try:
                line = self._answers.readline()
            except (OSError, ValueError):
                line = ""
            with contextlib.suppress(RuntimeError):  # the run ended while the question was open
                loop.call_soon_threadsafe(deliver, line)

        threading.Thread(target=read, name="dsh-approval-prompt", daemon=True).start()
        aborted: asyncio.Future[Any] = asyncio.ensure_future(signal.wait())
        waiters: set[asyncio.Future[Any]] = {done, aborted}
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            aborted.cancel()
        if not done.done():
            return None
        line = done.result()
        return line or None
