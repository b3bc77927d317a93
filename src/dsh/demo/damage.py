"""Damage on purpose: rewrite a stored JSONL log without its `subagent/descriptor`.

Layer: demo (an adapter over the JSONL backend and the projection cache). The log is read with the
backend's own reader and written back with the backend's own layout and encoding
(`dsh.testing.JsonlLogWriter`), so the result is a valid log, only without the descriptor: the state
of a one-shot child cancelled before its first step. Later seqs are renumbered (a seq gap would read
as `unavailable`, not `corrupt`), and the child's projection-cache row is evicted, because derived
cache data may vanish at any time and must not mask the damage.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsh.persistence.jsonl import JsonlBackend
from dsh.projection.cache_storage import SqliteCacheStorage
from dsh.session.header import SessionId
from dsh.subagent.descriptor import SUBAGENT_DESCRIPTOR_TYPE
from dsh.testing.jsonl_writer import JsonlLogWriter

__all__ = ["Damage", "remove_descriptor"]


@dataclass(frozen=True, slots=True)
class Damage:
    """What `remove_descriptor` changed."""

    session_id: str
    events_before: int
    events_after: int
    removed_seqs: tuple[int, ...]
    cache_evicted: bool


def _renumbered(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The kept records with consecutive seqs; `sourceEventSeqs` follow their targets."""
    renumber = {record["seq"]: new for new, record in enumerate(records)}
    out = []
    for new, record in enumerate(records):
        copy = dict(record)
        copy["seq"] = new
        sources = copy.get("sourceEventSeqs")
        if isinstance(sources, list):
            copy["sourceEventSeqs"] = [renumber[seq] for seq in sources if seq in renumber]
        out.append(copy)
    return out


async def remove_descriptor(sessions_dir: Path, cache_path: Path | None, session_id: str) -> Damage:
    """Rewrite `session_id`'s log under `sessions_dir` without its descriptor; evict its cache row.

    Run it while no runtime has the home open (the backend takes the session's writer lock).

    Raises:
        LookupError: No stored session has that id.
    """
    backend = JsonlBackend(sessions_dir)
    await backend.open()
    try:
        stored = await backend.load(session_id)
    finally:
        await backend.close()
    if stored is None:
        raise LookupError(f"no stored session {session_id}")
    records = [dict(record) for record in stored.events]
    removed = tuple(record["seq"] for record in records if record["type"] == SUBAGENT_DESCRIPTOR_TYPE)
    kept = _renumbered([record for record in records if record["type"] != SUBAGENT_DESCRIPTOR_TYPE])
    await JsonlLogWriter(sessions_dir).write(session_id, stored.header, kept)
    evicted = False
    if cache_path is not None and await asyncio.to_thread(cache_path.exists):
        storage = await SqliteCacheStorage.open(cache_path)
        try:
            evicted = await storage.get(SessionId(session_id)) is not None
            await storage.delete(SessionId(session_id))
        finally:
            await storage.aclose()
    return Damage(session_id, len(records), len(kept), removed, evicted)
