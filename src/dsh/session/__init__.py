"""Sessions: header, events, `Session`, `SessionStore`, fork and crash repair.

Layer: session, the innermost domain layer. It does no I/O and imports no other dsh layer (only
the base modules `dsh.json` and `dsh.errors`). Durability lives in `dsh.persistence`.
"""

from dsh.session.errors import SessionError, SessionForkError
from dsh.session.events import KNOWN_EVENT_TYPES, SessionEvent, SurfaceOp, SurfaceReplace
from dsh.session.header import (
    SESSION_FORMAT_VERSION,
    HeaderInit,
    SessionHeader,
    SessionId,
    SessionLogOffset,
    SessionSeq,
)
from dsh.session.ids import new_session_id
from dsh.session.repair import (
    TOOL_AWAITING_APPROVAL_TEXT,
    TOOL_NOT_STARTED_TEXT,
    TOOL_OUTCOME_UNKNOWN_TEXT,
    interrupted_turn_closers,
    last_activity_time,
)
from dsh.session.session import EventsView, Session, SessionState
from dsh.session.store import SessionStore, Unsubscribe, wall_clock_ms

__all__ = [
    "KNOWN_EVENT_TYPES",
    "SESSION_FORMAT_VERSION",
    "TOOL_AWAITING_APPROVAL_TEXT",
    "TOOL_NOT_STARTED_TEXT",
    "TOOL_OUTCOME_UNKNOWN_TEXT",
    "EventsView",
    "HeaderInit",
    "Session",
    "SessionError",
    "SessionEvent",
    "SessionForkError",
    "SessionHeader",
    "SessionId",
    "SessionLogOffset",
    "SessionSeq",
    "SessionState",
    "SessionStore",
    "SurfaceOp",
    "SurfaceReplace",
    "Unsubscribe",
    "interrupted_turn_closers",
    "last_activity_time",
    "new_session_id",
    "wall_clock_ms",
]
