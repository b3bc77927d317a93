"""What lists show next to a session, and a session's token total, read the cheap way first.

Layer: agent. `listed_facts` is for lists (`dsh sessions`, the HTTP session list, the web UI): the
title and token total of a session **without reading its log** — from the live registry's cells
when the session is live in this process, else from a projection-cache hit; otherwise the fact is
simply absent. `session_tokens` is the authoritative total of one session: live
cells, else one cold fold (the cache's anchored tail read when there is a cache, else a read of the
log). Both use the `title` and `tokens` units (`dsh.agent.titles`, `dsh.agent.usage`), which the
runtime registers; the cache checkpoints them when a session goes idle and when it closes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dsh.agent.units import TITLE_KEY, TOKENS_KEY
from dsh.agent.usage import ModelPrice, TokenTotals, totals_from_view
from dsh.services import Services
from dsh.session.header import SessionHeader, SessionId, SessionLogOffset

__all__ = ["ListedFacts", "listed_facts", "session_tokens"]

_log = logging.getLogger("dsh.agent")


@dataclass(frozen=True, slots=True)
class ListedFacts:
    """A session's title and token total as a list shows them (each None when not known without a log read)."""

    title: str | None = None
    tokens: TokenTotals | None = None


async def listed_facts(services: Services, header: SessionHeader, prices: Mapping[str, ModelPrice]) -> ListedFacts:
    """The title and token total of a listed session, with zero log reads (docs/projections.md#tokens-and-titles)."""
    registry = services.projections
    if registry is None:
        return ListedFacts()
    keys = tuple(key for key in (TITLE_KEY, TOKENS_KEY) if key in registry.view_keys())
    if not keys:
        return ListedFacts()
    values: Mapping[str, Any] | None = None
    try:
        live = services.sessions.get(header.id) if services.sessions is not None else None
        if live is not None:
            values = registry.snapshot(live, keys).values
        elif services.projection_cache is not None and not header.is_seeded:
            # Only an unseeded header proves its cut (0) without a body read.
            snapshot = await services.projection_cache.cached_snapshot(header, SessionLogOffset(0), keys)
            values = snapshot.values if snapshot is not None else None
    except Exception as error:
        _log.debug('session "%s": listed facts unavailable: %s', header.id, error)
        return ListedFacts()  # a title and a total are niceties: any failure leaves them out
    if values is None:
        return ListedFacts()
    title = values.get(TITLE_KEY)
    return ListedFacts(title if isinstance(title, str) else None, totals_from_view(values.get(TOKENS_KEY), prices))


async def session_tokens(services: Services, session_id: str, prices: Mapping[str, ModelPrice]) -> TokenTotals:
    """The authoritative token total of one session's own requests (zero when it made none).

    Raises:
        SessionPersistenceError: `SESSION_NOT_FOUND`, `SESSION_CORRUPT`, ... from a cold read.
    """
    registry = services.projections
    assert registry is not None
    assert services.persistence is not None
    live = services.sessions.get(session_id) if services.sessions is not None else None
    if live is not None:
        view = registry.snapshot(live, (TOKENS_KEY,)).get(TOKENS_KEY)
    elif services.projection_cache is not None:
        view = (await services.projection_cache.cold_snapshot(SessionId(session_id), (TOKENS_KEY,))).get(TOKENS_KEY)
    else:
        read = await services.persistence.read_events(session_id)
        view = registry.restore(None, read.events, 0, (TOKENS_KEY,)).snapshot.get(TOKENS_KEY)
    return totals_from_view(view, prices) or TokenTotals()
