"""Small pure helpers of the turn loop: turn numbering and the texts of failed tool calls.

Layer: agent (private to `dsh.agent.loop`).
"""

from __future__ import annotations

from collections.abc import Mapping

from dsh.session.session import Session

__all__ = ["highest_turn_number", "message_of", "validation_summary"]


def highest_turn_number(session: Session) -> int:
    """The highest turn number in the whole log, inherited prefix included (0 for none).

    Scanned once per agent: afterwards only this agent writes turns to its session.
    """
    highest = 0
    for event in session.events:
        if event.type in ("turn/start", "turn/end"):
            data = event.data
            if isinstance(data, Mapping):
                turn = data.get("turn")
                if isinstance(turn, int) and not isinstance(turn, bool) and turn > highest:
                    highest = turn
    return highest


def message_of(error: BaseException) -> str:
    message = getattr(error, "message", None)
    if isinstance(message, str) and message:
        return message
    return str(error) or type(error).__name__


def validation_summary(error: Exception) -> str:
    errors = getattr(error, "errors", None)
    if callable(errors):
        try:
            items = errors(include_url=False, include_input=False)
        except TypeError:
            items = errors()
        parts = []
        for item in items:
            where = ".".join(str(part) for part in item.get("loc", ())) or "arguments"
            parts.append(f"{where}: {item.get('msg', 'invalid')}")
        if parts:
            return "; ".join(parts)
    return str(error)
