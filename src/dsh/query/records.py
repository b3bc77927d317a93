"""Result records of the session query: corpus records, observations, history pages, lineage.

Layer: query. Frozen dataclasses, except `SessionCorpus` (a list of records) and `LineageNode`
(a tree node compared by identity). Two kinds of
header-bearing results exist on purpose: `SessionRecord` (a corpus entry) carries only the
*logical* header — `is_seeded`, never the integer fork cut — while `SessionObservation` and
`HistoryPage` carry the exact cut (`inherited_event_count`) beside the events they were read with,
because a cut is only meaningful together with the events it splits. Events are the immutable
`SessionEvent` objects of the session layer; results share them and never deep-copy.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from dsh.session.events import SessionEvent
from dsh.session.header import SessionHeader, SessionId

if TYPE_CHECKING:
    from dsh.persistence.base import DamagedSession
    from dsh.projection.unit import ProjectionSnapshot

__all__ = [
    "HistoryPage",
    "LineageNode",
    "SessionCorpus",
    "SessionFilter",
    "SessionLineage",
    "SessionObservation",
    "SessionRecord",
]


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """One entry of the live-preferred corpus.

    Attributes:
        header: The logical header (exposes `is_seeded`, never the integer cut). For a live
            session it is the live header, whatever persistence stores for the id.
        live: Published in this process's store at the time of the call.
        persisted: Listed by persistence during the call.
    """

    header: SessionHeader
    live: bool
    persisted: bool

    @property
    def id(self) -> SessionId:
        """The session id (the header's)."""
        return self.header.id

    def to_json(self) -> dict[str, object]:
        """Wire form `{"header": {..., "isSeeded": ...}, "live": ..., "persisted": ...}`."""
        return {"header": dict(self.header.to_json()), "live": self.live, "persisted": self.persisted}


@dataclass(frozen=True, slots=True)
class SessionFilter:
    """What `SessionQuery.filter_sessions` keeps of the corpus.

    Attributes:
        parents: Keep the records whose `parentSession` is in this collection of session ids
            (None in it keeps the sessions without a parent; an empty collection keeps nothing).
            None (the default) does not filter by parent. `filter_sessions` validates and copies
            it before its first await, so the caller may reuse the collection at once.
    """

    parents: Collection[str | None] | None = None


class SessionCorpus(list[SessionRecord]):
    """What `list_sessions` returns: the corpus records (a plain list of them), plus `unreadable`.

    `unreadable` holds the stored entries persistence could not list (an unreadable or invalid
    header, a log that is not a regular file, an unreadable folder ...): they are in no record, and
    consumers report how many there are instead of letting them vanish silently
    (docs/storage-format.md#damage-stays-visible).
    """

    __slots__ = ("unreadable",)

    def __init__(self, records: list[SessionRecord], unreadable: tuple[DamagedSession, ...] = ()) -> None:
        super().__init__(records)
        self.unreadable = unreadable


@dataclass(frozen=True, slots=True)
class SessionObservation:
    """One body-carrying read of a session: header, events and the exact inherited cut.

    Attributes:
        header: The observed logical header.
        events: Immutable events, contiguous from seq 0. For a live session, a read-only view
            bounded at the moment of the call (it never grows); for a cold one, the persistence
            observation's events as returned (possibly frozen lazily), never copied.
        inherited_event_count: The exact fork cut (`0 <= cut <= len(events)`).
        live: Served from a live session rather than from a stored log.
        torn_tail: The stored log ends in a torn tail (a crash fragment, or a defect followed only
            by log-only events); it stays on disk until a resume repairs it.
    """

    header: SessionHeader
    events: Sequence[SessionEvent]
    inherited_event_count: int
    live: bool
    torn_tail: bool = False

    def is_own_seq(self, seq: int) -> bool:
        """True when `seq` lies in the own suffix (`seq >= inherited_event_count`)."""
        return seq >= self.inherited_event_count


@dataclass(frozen=True, slots=True)
class HistoryPage:
    """One message-aligned page of a session's log, newest page first when paging backwards.

    Attributes:
        session_id: The session the page belongs to.
        header: The observed logical header.
        inherited_event_count: The exact fork cut of the observed log.
        live: Read from a live session.
        events: The page's events in log order (a contiguous run of seqs).
        has_more: Older events exist before the page.
        next_before_seq: The page's first seq when `has_more`, else None; pass it as `before_seq`
            to read the previous page.
        projections: The projection snapshot of the observed log, on the tail page only (and only
            when a registry is mounted and every selected unit rendered).
    """

    session_id: SessionId
    header: SessionHeader
    inherited_event_count: int
    live: bool
    events: Sequence[SessionEvent]
    has_more: bool
    next_before_seq: int | None
    projections: ProjectionSnapshot | None

    def to_json(self) -> dict[str, object]:
        """Wire form in camelCase; `nextBeforeSeq` and `projections` are omitted when None."""
        out: dict[str, object] = {
            "sessionId": self.session_id,
            "header": dict(self.header.to_json()),
            "inheritedEventCount": self.inherited_event_count,
            "live": self.live,
            "events": list(self.events),
            "hasMore": self.has_more,
        }
        if self.next_before_seq is not None:
            out["nextBeforeSeq"] = self.next_before_seq
        if self.projections is not None:
            out["projections"] = self.projections.to_json()
        return out


class LineageNode:
    """A descendant of the traced session with its own descendants.

    Equality is identity and the repr is shallow: lineage trees can be thousands of levels deep,
    and field-wise `__eq__`/`__repr__` methods would recurse once per level.

    Attributes:
        record: The descendant's corpus record.
        children: Its children, by `createdAt` ascending, then id.
    """

    __slots__ = ("children", "record")

    def __init__(self, record: SessionRecord, children: tuple[LineageNode, ...]) -> None:
        self.record: Final = record
        self.children: Final = children

    def __repr__(self) -> str:
        # Shallow on purpose: a generated repr would recurse once per tree level.
        return f"LineageNode(id={self.record.header.id!r}, children={len(self.children)})"


@dataclass(frozen=True, slots=True)
class SessionLineage:
    """Where a session sits in its `parentSession` tree, from one corpus listing.

    Attributes:
        target: The traced session's record.
        ancestors: Its ancestors found in the corpus, immediate parent first.
        descendants: Its children (each with their own descendants), by `createdAt`, then id.
        complete: The ancestor walk reached a session without a parent.
        root: That parentless session when `complete` (the target itself when it has no parent).
        unresolved_parent_id: When not `complete`, the first parent id missing from the corpus.
    """

    target: SessionRecord
    ancestors: tuple[SessionRecord, ...]
    descendants: tuple[LineageNode, ...]
    complete: bool
    root: SessionRecord | None
    unresolved_parent_id: SessionId | None


# Shown under the name users import (docs/architecture.md#public-names).
HistoryPage.__module__ = "dsh.query"
LineageNode.__module__ = "dsh.query"
SessionCorpus.__module__ = "dsh.query"
SessionFilter.__module__ = "dsh.query"
SessionLineage.__module__ = "dsh.query"
SessionObservation.__module__ = "dsh.query"
SessionRecord.__module__ = "dsh.query"
