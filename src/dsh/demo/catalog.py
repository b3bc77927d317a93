"""The keyless catalog demonstration: a parent, its subagents, a restart, and a damaged child.

Layer: top (a scenario over the public services; the CLI only renders what it reports). Until the
agent runtime exists, children are built exactly as that runtime will build them: headers with
`origin="subagent"` and `parentSession`, a continuable child's descriptor staged in its creation seed
at seq == cut, a one-shot child's descriptor appended inside its first turn. The catalog is listed
live (zero log reads), the runtime is closed and reopened on the same home, one child's log is
rewritten without its descriptor (the state of a one-shot child cancelled before its first step),
and the catalog is listed cold: rung 2 (cache, zero reads), rung 3 (one read) and a `corrupt`
diagnostic row.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from dsh.config import Config
from dsh.projection.cache_storage import CacheStorage
from dsh.query.service import SessionQuery
from dsh.runtime import Runtime
from dsh.session.header import HeaderInit
from dsh.session.session import Session
from dsh.subagent.descriptor import snapshot_descriptor
from dsh.subagent.listing import ListingReport
from dsh.subagent.rows import SubagentDescendantEntry, SubagentListEntry
from dsh.testing.counting import CountingPersistence

__all__ = ["CatalogView", "DemoIds", "DemoReporter", "StepClock", "run_catalog_demo"]

DEMO_START_MS = 1_789_000_000_000


class StepClock:
    """A deterministic clock: +1 ms per read; it continues across the restart."""

    def __init__(self, start: int = DEMO_START_MS) -> None:
        self.now = start

    def __call__(self) -> int:
        self.now += 1
        return self.now


class DemoIds:
    """Deterministic ids from separate streams per kind (`00000001-0000-4000-8000-000000000001`, ...)."""

    def __init__(self) -> None:
        self._streams: dict[str, itertools.count[int]] = {}

    def next(self, kind: str) -> str:
        counter = self._streams.setdefault(kind, itertools.count(1))
        n = next(counter)
        prefix = {"session": 0, "message": 1, "call": 2}.get(kind, 9)
        return f"{prefix:01d}{n:07d}-0000-4000-8000-{n:012d}"

    def session(self) -> str:
        """The next session id."""
        return self.next("session")

    def message(self) -> str:
        """The next message id."""
        return self.next("message")

    def call(self) -> str:
        """The next call id."""
        return self.next("call")

    def run(self) -> str:
        """The next run id."""
        return self.next("run")


@dataclass(frozen=True, slots=True)
class CatalogView:
    """One printed catalog: the rows plus, per row, the rung that served it and the log reads it cost."""

    title: str
    rows: list[SubagentListEntry]
    rungs: Mapping[str, int]
    reads: Mapping[str, int]
    descendants: list[SubagentDescendantEntry] = field(default_factory=list)


class DemoReporter(Protocol):
    """What the demo tells its renderer."""

    def phase(self, title: str) -> None:
        """A new phase heading."""

    def info(self, text: str) -> None:
        """One line of narration."""

    def catalog(self, view: CatalogView) -> None:
        """A catalog table."""


def _text(ids: DemoIds, role: str, text: str, **source: Any) -> dict[str, Any]:
    return {
        "id": ids.next("message"),
        "role": role,
        "content": [{"type": "text", "text": text}],
        "source": source or {"kind": "user"},
    }


def _turn(session: Session, ids: DemoIds, turn: int, prompt: str, answer: str, *, close: bool = True) -> None:
    session.append("turn/start", {"turn": turn})
    session.append("user/message", _text(ids, "user", prompt))
    _answer(session, ids, turn, answer, close=close)


def _answer(session: Session, ids: DemoIds, turn: int, answer: str, *, close: bool = True) -> None:
    session.append("step/start", {"turn": turn, "step": 1})
    message = _text(ids, "assistant", answer, kind="model", provider="scripted", model="demo")
    session.append("assistant/message", {"turn": turn, "step": 1, "message": message})
    session.append("step/end", {"turn": turn, "step": 1})
    if close:
        session.append("turn/end", {"turn": turn, "reason": {"kind": "completed"}})


def _child_header(parent: Session) -> HeaderInit:
    return HeaderInit(
        cwd=parent.header.cwd,
        parent_session=parent.id,
        origin="subagent",
        delegation_depth=parent.header.delegation_depth + 1,
    )


@dataclass(slots=True)
class _Family:
    parent: str = ""
    children: dict[str, str] = field(default_factory=dict)  # label -> id


async def _build_family(rt: Runtime, ids: DemoIds, cwd: str, reporter: DemoReporter) -> tuple[_Family, Session]:
    store = rt.sessions
    family = _Family()
    parent = store.create(ids.session(), header=HeaderInit(cwd=cwd))
    family.parent = parent.id
    _turn(parent, ids, 1, "Research the teapot with three helpers.", "HELPERS_STARTED")
    reporter.info(f"parent P = {parent.id}")

    # One-shot child: its descriptor is appended inside its first turn, before the first step.
    one_shot = store.create(ids.session(), header=_child_header(parent))
    one_shot.append("turn/start", {"turn": 1})
    one_shot.append("subagent/descriptor", snapshot_descriptor("one-shot", provider="spawn", label="Summarize notes"))
    one_shot.append("user/message", _text(ids, "user", "Summarize the notes."))
    _answer(one_shot, ids, 1, "NOTES_OK")
    family.children["Summarize notes"] = one_shot.id

    # Continuable spawn child: descriptor staged in the creation seed at seq == cut == 0.
    sources = store.create(
        ids.session(),
        header=_child_header(parent),
        seed=[_descriptor_record("Collect sources", 0, store.clock())],
    )
    _turn(sources, ids, 1, "Collect sources on teapots.", "SOURCES_OK")
    family.children["Collect sources"] = sources.id

    # A grandchild under the sources helper, so that row shows hasChildren.
    grandchild = store.create(ids.session(), header=_child_header(sources))
    grandchild.append("turn/start", {"turn": 1})
    grandchild.append("subagent/descriptor", snapshot_descriptor("one-shot", provider="spawn", label="Check a link"))
    grandchild.append("user/message", _text(ids, "user", "Check the first link."))
    _answer(grandchild, ids, 1, "LINK_OK")
    family.children["Check a link"] = grandchild.id

    # Continuable fork child: inherits the parent's closed prefix (seeded), own descriptor at seq == cut.
    prefix = list(parent.events)
    outline = store.create(
        ids.session(),
        header=_child_header(parent),
        seed=[*prefix, _descriptor_record("Draft outline", len(prefix), store.clock())],
        inherited_event_count=len(prefix),
    )
    _turn(outline, ids, 2, "Draft an outline.", "OUTLINE_OK")
    outline.append("turn/start", {"turn": 3})
    outline.append("user/message", _text(ids, "user", "Add a conclusion."))
    family.children["Draft outline"] = outline.id

    for session in (one_shot, sources, grandchild):
        await store.flush(session)
        store.dispose(session)
    await store.flush(outline)
    await store.flush(parent)
    return family, outline


def _descriptor_record(label: str, seq: int, time: int) -> dict[str, Any]:
    payload = snapshot_descriptor("continuable", provider="spawn", label=label, agent_model="demo")
    return {"type": "subagent/descriptor", "seq": seq, "time": time, "data": payload}


async def _list(rt: Runtime, counting: CountingPersistence, parent: str, title: str) -> CatalogView:
    counting.reset()
    reports: list[ListingReport] = []
    rows = await rt.subagents.list_children(parent, report=reports.append)
    reads = dict(counting.reads)
    descendants = await rt.subagents.list_descendants(parent)
    return CatalogView(title, rows, {str(k): v for k, v in reports[0].rungs.items()}, reads, descendants)


def _counting_query(rt: Runtime) -> CountingPersistence:
    counting = CountingPersistence(rt.persistence)
    rt.services.query = SessionQuery(rt.sessions, counting, projections=rt.projections)
    return counting


async def _remove_descriptor(rt: Runtime, session_id: str, storage: CacheStorage | None) -> int:
    """Rewrite a stored log without its descriptor (seqs renumbered so the log stays valid)."""
    from dsh.persistence.jsonl import JsonlBackend
    from dsh.session.header import SessionId
    from dsh.testing.jsonl_writer import JsonlLogWriter

    backend = JsonlBackend(rt.config.sessions_dir)
    await backend.open()
    try:
        stored = await backend.load(session_id)
    finally:
        await backend.close()
    assert stored is not None
    kept = [dict(record) for record in stored.events if record["type"] != "subagent/descriptor"]
    renumber = {record["seq"]: new for new, record in enumerate(kept)}
    for new, record in enumerate(kept):
        record["seq"] = new
        if "sourceEventSeqs" in record:
            record["sourceEventSeqs"] = [renumber[seq] for seq in record["sourceEventSeqs"]]
    await JsonlLogWriter(rt.config.sessions_dir).write(session_id, stored.header, kept)
    if storage is not None:
        # Derived cache data may vanish at any time; it must not mask the damage.
        await storage.delete(SessionId(session_id))
    return len(stored.events) - len(kept)


async def run_catalog_demo(
    home: Path,
    reporter: DemoReporter,
    *,
    clock: Callable[[], int] | None = None,
    ids: DemoIds | None = None,
) -> dict[str, Any]:
    """Run the walkthrough in `home` (JSONL sessions + SQLite projection cache); returns a summary."""
    clock = clock or StepClock()
    ids = ids or DemoIds()
    config = Config(home=home)
    reporter.phase("1. Prepare")
    reporter.info(f"home {home} (JSONL+zstd logs in sessions/, projection cache in cache.sqlite3)")

    reporter.phase("2. Build a parent and its subagents (runtime R1)")
    async with Runtime.open(config, clock=clock, ids=ids) as r1:
        counting = _counting_query(r1)
        family, live_child = await _build_family(r1, ids, str(home), reporter)
        for label, child_id in family.children.items():
            reporter.info(f"  {label:<16} {child_id}")

        reporter.phase("3. Live catalog (Draft outline is still running)")
        live = await _list(r1, counting, family.parent, "list_children(P), live")
        reporter.catalog(live)
        reporter.info(f"reads for the running child: {live.reads.get(live_child.id, 0)} (live rung)")

    reporter.phase("4. Restart, and damage one child on purpose")
    async with Runtime.open(config, clock=clock, ids=ids) as r2:
        damaged = family.children["Summarize notes"]
        storage = r2.cache.storage if r2.cache is not None else None
        removed = await _remove_descriptor(r2, damaged, storage)
        reporter.info(
            f"rewrote {damaged} without its subagent/descriptor ({removed} event removed, seqs renumbered) "
            "and evicted its cache row: the state of a one-shot child cancelled before its first step"
        )
        counting = _counting_query(r2)

        reporter.phase("5. Cold catalog (runtime R2, same home, nothing live)")
        cold = await _list(r2, counting, family.parent, "list_children(P), cold")
        reporter.catalog(cold)

    reporter.phase("6. Done")
    reporter.info(f"try: dsh agents {family.parent} --home {home}")
    reporter.info(f"     dsh agents {family.parent} --home {home} --descendants --json")
    return {"parent": family.parent, "children": family.children, "live": live, "cold": cold}


def entry_rows(entries: Sequence[SubagentListEntry]) -> list[dict[str, object]]:
    """Rows as JSON (camelCase), in listing order."""
    return [entry.to_json() for entry in entries]
