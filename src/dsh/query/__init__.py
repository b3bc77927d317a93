"""Session query: the live-preferred corpus, observations, history pages and lineage.

Layer: query (imports session, persistence and projection; imported by subagent and the adapters).
`SessionQuery` is `Services.query`, the one read service every consumer shares; it is read-only and
keeps no state between calls.
"""

from dsh.query.errors import SessionQueryError
from dsh.query.records import (
    HistoryPage,
    LineageNode,
    SessionCorpus,
    SessionFilter,
    SessionLineage,
    SessionObservation,
    SessionRecord,
)
from dsh.query.service import QueryConfig, SessionQuery

__all__ = [
    "HistoryPage",
    "LineageNode",
    "QueryConfig",
    "SessionCorpus",
    "SessionFilter",
    "SessionLineage",
    "SessionObservation",
    "SessionQuery",
    "SessionQueryError",
    "SessionRecord",
]
