"""Message-aligned history paging: argument validation and the page cut (docs/query.md#history-pages).

Layer: query. Pure functions over one observed log; `SessionQuery.read_history` does the reading.
A page is cut on *message* boundaries so a client never sees half an assistant message: counting
backwards from the end of the window, each `user/message` or `assistant/message` whose `surfaceOp`
is `"append"` counts once, and it drags its whole *group* — its own seq plus the `sourceEventSeqs`
it was assembled from (the chunks of a streamed reply) — into the page. Because logs are
append-only and pages are contiguous runs of seqs, paging backwards with `next_before_seq` returns
every event of an unchanged log exactly once, and older pages stay valid while a session grows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from dsh.query.errors import INVALID_LIMIT, INVALID_WINDOW, SessionQueryError
from dsh.session.events import SessionEvent
from dsh.session.stored import StoredEvents

__all__ = ["MESSAGE_TYPES", "PageBounds", "check_before_seq", "check_max_messages", "is_message_event", "page_bounds"]

MESSAGE_TYPES: Final = frozenset({"user/message", "assistant/message"})
"""Event types that can count as a history message (when their `surfaceOp` is `"append"`)."""


def check_before_seq(before_seq: object) -> int | None:
    """Return `before_seq` if it is None or a non-negative `int` (`bool` refused).

    Raises:
        SessionQueryError: `SESSION_QUERY_INVALID_WINDOW`.
    """
    if before_seq is None:
        return None
    if type(before_seq) is not int or before_seq < 0:
        raise SessionQueryError(
            f"history beforeSeq must be a non-negative integer, got {before_seq!r}", code=INVALID_WINDOW
        )
    return before_seq


def check_max_messages(max_messages: object, *, default: int, maximum: int) -> int:
    """Return the page size: `default` for None, else an `int` in `1..maximum` (`bool` refused).

    Raises:
        SessionQueryError: `SESSION_QUERY_INVALID_LIMIT`.
    """
    if max_messages is None:
        return default
    if type(max_messages) is not int or not 1 <= max_messages <= maximum:
        raise SessionQueryError(
            f"history maxMessages must be an integer between 1 and {maximum}, got {max_messages!r}",
            code=INVALID_LIMIT,
        )
    return max_messages


def is_message_event(event: SessionEvent) -> bool:
    """True for a `user/message` or `assistant/message` appended to the surface (a history message)."""
    return event.type in MESSAGE_TYPES and event.get("surfaceOp") == "append"


@dataclass(frozen=True, slots=True)
class PageBounds:
    """The page is the events with `start <= seq < end`.

    Attributes:
        start: The cut: the smallest seq of the counted message groups, or 0.
        end: The window end (exclusive): `min(before_seq, len(events))`.
    """

    start: int
    end: int

    @property
    def has_more(self) -> bool:
        """Older events exist before the page."""
        return self.start > 0


def page_bounds(events: Sequence[SessionEvent], before_seq: int | None, max_messages: int) -> PageBounds:
    """Compute the page of an observed log (contiguous from seq 0, so seq == index).

    Walks the window backwards and counts message events until `max_messages` are counted; the cut
    is the smallest seq in the counted groups. A window holding fewer message events yields cut 0.
    Only the window is scanned; a lazily frozen stored log is inspected by type first, so events
    that cannot be messages are never frozen by the scan.
    """
    end = len(events) if before_seq is None else min(before_seq, len(events))
    typed = events if isinstance(events, StoredEvents) else None
    counted = 0
    cut = end
    for index in range(end - 1, -1, -1):
        kind = typed.type_at(index) if typed is not None else events[index].type
        if kind not in MESSAGE_TYPES:
            continue
        event = events[index]
        if not is_message_event(event):
            continue
        counted += 1
        cut = min(cut, event.seq)
        # The group: the seqs this message was assembled from (validated earlier seqs).
        for source in event.source_event_seqs or ():
            if isinstance(source, int) and source < cut:
                cut = source
        if counted == max_messages:
            return PageBounds(cut, end)
    return PageBounds(0, end)
