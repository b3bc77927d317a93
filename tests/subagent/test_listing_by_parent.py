"""Enumeration by parent lists exactly what the whole-corpus enumeration lists (docs/catalog.md#enumeration).

The catalog reads the corpus filtered by parent: the children of one parent, one more read for
`hasChildren`, and one read per level for descendants (docs/catalog.md#descendants). The reference
here is the enumeration it replaced, kept verbatim: one `list_sessions` read, pairing, and a parent
index over the whole corpus. A hypothesis property builds JSONL homes with live and stored sessions,
forks, ordinary sessions, damaged headers and logs, ids stored twice, parent cycles, sessions
written after the parent index was built, sessions another writer adds in the clock tick of the
index write while this store creates sessions in the same folders (docs/storage-format.md#creations-and-the-index),
and damaged index files, and compares the rows of both for every root.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsh.abort import AbortSignal
from dsh.persistence.jsonl import _index as index_module
from dsh.persistence.jsonl import project_key
from dsh.session import HeaderInit, Session, SessionHeader, SessionId
from dsh.subagent import listing as catalog
from dsh.subagent.rows import SubagentDescendantEntry, SubagentListEntry
from tests.helpers import examples
from tests.subagent.helpers import (
    PARENT,
    Stack,
    child_events,
    desc,
    fork_events,
    one_shot_desc,
    open_stack,
    stored_header,
    turn_end,
    turn_start,
    user_message,
)
from tests.subagent.spies import SpyQuery

# --------------------------------------------------------------------------------------------------
# The reference: the whole-corpus enumeration


def _order(header: SessionHeader) -> tuple[int, str]:
    return (header.created_at, header.id)


async def _whole_corpus(stack: Stack) -> list[tuple[SessionHeader, Session | None]]:
    records = await stack.query.list_sessions()
    paired: list[tuple[SessionHeader, Session | None]] = []
    for record in records:
        live = stack.store.get(record.header.id)
        paired.append((live.header, live) if live is not None else (record.header, None))
    return paired


def _parents_of_subagents(paired: Sequence[tuple[SessionHeader, Session | None]]) -> set[str]:
    return {h.parent_session for h, _ in paired if h.origin == "subagent" and h.parent_session is not None}


async def reference_children(stack: Stack, parent_id: str) -> list[SubagentListEntry]:
    """The rows of `list_children` computed from the whole corpus."""
    listing = catalog._Listing(stack.services, AbortSignal.none(), 4, None)
    paired = await _whole_corpus(stack)
    parents = _parents_of_subagents(paired)
    candidates = [
        catalog._Candidate(header, live, SessionId(parent_id), 1)
        for header, live in sorted(paired, key=lambda pair: _order(pair[0]))
        if header.origin == "subagent" and header.parent_session == parent_id
    ]
    await listing.resolve(candidates)
    return [row for candidate in candidates if (row := listing.row(candidate, parents)) is not None]


async def reference_descendants(stack: Stack, root_id: str) -> list[SubagentDescendantEntry]:
    """The rows of `list_descendants` computed from the whole corpus."""
    listing = catalog._Listing(stack.services, AbortSignal.none(), 4, None)
    paired = await _whole_corpus(stack)
    parents = _parents_of_subagents(paired)
    children: dict[str, list[tuple[SessionHeader, Session | None]]] = {}
    for header, live in sorted(paired, key=lambda pair: _order(pair[0])):
        if header.parent_session is not None:
            children.setdefault(header.parent_session, []).append((header, live))
    positions = []
    visited = {root_id}
    stack_: list[tuple[SessionHeader, Session | None, str, int]] = [
        (h, lv, root_id, 1) for h, lv in reversed(children.get(root_id, []))
    ]
    while stack_:
        header, live, parent_id, depth = stack_.pop()
        if header.id in visited:
            continue
        visited.add(header.id)
        if header.origin == "subagent":
            positions.append(catalog._Candidate(header, live, SessionId(parent_id), depth))
        stack_.extend((h, lv, header.id, depth + 1) for h, lv in reversed(children.get(header.id, [])))
    await listing.resolve(positions)
    out = []
    for candidate in positions:
        row = listing.row(candidate, parents)
        if row is not None:
            out.append(SubagentDescendantEntry(row, candidate.parent_id, candidate.depth))
    return out


# --------------------------------------------------------------------------------------------------
# Generated homes

_IDS = ["a", "b", "c", "d", "e", "f", "g", "h"]
_CWDS = [None, "/w/one", "/w/two"]
_KINDS = ["stored", "live", "live-stored", "fork", "one-shot", "no-descriptor", "bad-header", "bad-log", "twice"]


@dataclass(frozen=True)
class Spec:
    """One generated session."""

    session_id: str
    parent: str | None
    origin: bool
    kind: str
    cwd: str | None
    created_at: int
    late: bool  # written after the parent index was built


@st.composite
def homes(draw: st.DrawFn) -> tuple[list[Spec], list[str], bool]:
    """A list of sessions (each id once), the project folders whose index file gets damaged, and
    whether the late sessions are written in the clock tick of the index write."""
    chosen = draw(st.lists(st.sampled_from(_IDS), unique=True, max_size=len(_IDS)))
    specs = [
        Spec(
            session_id=session_id,
            parent=draw(st.sampled_from([PARENT, None, *_IDS])),
            origin=draw(st.booleans()),
            kind=draw(st.sampled_from(_KINDS)),
            cwd=draw(st.sampled_from(_CWDS)),
            created_at=draw(st.integers(1, 4)),
            late=draw(st.booleans()),
        )
        for session_id in chosen
    ]
    spoiled = draw(st.lists(st.sampled_from(["_no-cwd", "--w-one--", "--w-two--"]), unique=True, max_size=2))
    return specs, spoiled, draw(st.booleans())


def _header(spec: Spec, **overrides: object) -> dict[str, object]:
    fields: dict[str, object] = {
        "createdAt": spec.created_at,
        "parentSession": spec.parent,
        "origin": "subagent" if spec.origin else None,
        "delegationDepth": 1 if spec.origin else 0,
        "cwd": spec.cwd,
    }
    fields.update(overrides)
    return stored_header(spec.session_id, **fields)


async def _store(stack: Stack, spec: Spec) -> None:
    """Write one stored session (or damaged entry) straight into the JSONL root."""
    session_id = spec.session_id
    if spec.kind == "bad-header":
        text = b'{"type":"session","version":0,"id":"' + session_id.encode() + b'","createdAt":"never"}\n'
        await stack.writer.write_bytes(session_id, stack.writer.frame(text), cwd=spec.cwd)
        return
    events = {
        "fork": fork_events(desc(session_id)),
        "one-shot": child_events(one_shot_desc(session_id)),
        "no-descriptor": [turn_start(0), user_message(1), turn_end(2)],
    }.get(spec.kind, child_events(desc(session_id)))
    overrides = {"seedLength": 4} if spec.kind == "fork" else {}
    await stack.writer.write(session_id, _header(spec, **overrides), events)
    if spec.kind == "bad-log":
        await stack.writer.damage_events(session_id)
    if spec.kind == "twice":
        # The same id, valid, in a second project folder (under another parent, so that a listing
        # by parent reads one copy only): both copies are damaged, the id unlisted.
        other = next(cwd for cwd in _CWDS if cwd != spec.cwd)
        elsewhere = "elsewhere" if spec.parent == PARENT else PARENT
        data = stack.writer.encode(_header(spec, cwd=other, parentSession=elsewhere), events)
        path = stack.writer.path_for(session_id, cwd=other)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        Path(path).write_bytes(data)


async def _live(stack: Stack, spec: Spec) -> None:
    session = stack.store.create(
        spec.session_id,
        header=HeaderInit(
            created_at=spec.created_at,
            parent_session=spec.parent,
            origin="subagent" if spec.origin else None,
            delegation_depth=1 if spec.origin else 0,
            cwd=spec.cwd,
        ),
    )
    session.append("turn/start", {"turn": 0})
    if spec.kind != "no-descriptor":
        session.append("subagent/descriptor", desc(spec.session_id))
    if spec.kind == "live-stored":
        await stack.store.flush(session)


async def _one_tick(stack: Stack) -> int:
    """Pin every project folder and the index write to one clock tick `T`: the index is rewritten "at
    `T`" with every folder at `T`, so each stamp is racily clean (a coarse clock's same tick)."""
    folders = [folder for folder in stack.root.iterdir() if folder.is_dir()] if stack.root.is_dir() else []
    tick = max((os.lstat(folder).st_mtime_ns for folder in folders), default=0) + 5_000_000_000
    for folder in folders:
        os.utime(folder, ns=(tick, tick))
    with mock.patch.object(index_module.Writer, "stamp", return_value=tick):
        await stack.coordinator.list(parents={PARENT})
    return tick


def _same_tick(stack: Stack, spec: Spec, tick: int) -> None:
    """Set back to `T` the folders another writer just changed: its session came in the index's tick."""
    for cwd in {spec.cwd, *((cwd for cwd in _CWDS if cwd != spec.cwd) if spec.kind == "twice" else ())}:
        folder = stack.root / project_key(cwd)
        if folder.is_dir():
            os.utime(folder, ns=(tick, tick))


async def _build(stack: Stack, specs: list[Spec], spoiled: list[str], tick: bool) -> None:
    at: int | None = None
    for late in (False, True):
        if late and tick:
            at = await _one_tick(stack)
        for spec in specs:
            if spec.late != late:
                continue
            if spec.kind in ("live", "live-stored"):
                await _live(stack, spec)  # a live-stored session is created by this store, in the index
            else:
                await _store(stack, spec)  # another writer, which knows nothing of the index
                if at is not None:
                    _same_tick(stack, spec, at)
        if not late:
            # A filtered read in a writing store (re)writes the index of every folder it scans.
            await stack.coordinator.list(parents={PARENT})
    index_dir = Path(f"{stack.root}.index")
    for folder in spoiled:
        if index_dir.is_dir():
            (index_dir / folder).write_bytes(b'{"format":"dsh-parent-index","version":1,"folder":')


async def _compare(stack: Stack) -> None:
    for root in [PARENT, *_IDS]:
        assert await stack.list_children(root) == await reference_children(stack, root), root
        assert await stack.list_descendants(root) == await reference_descendants(stack, root), root


@pytest.mark.slow
@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(home=homes())
def test_rows_equal_the_whole_corpus_enumeration(home: tuple[list[Spec], list[str], bool]) -> None:
    """For every root, children and descendants by parent equal the whole-corpus rows (hasChildren included)."""
    specs, spoiled, tick = home

    async def scenario() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            async with open_stack(Path(tmp)) as stack:
                await _build(stack, specs, spoiled, tick)
                await _compare(stack)

    asyncio.run(scenario())


# --------------------------------------------------------------------------------------------------
# How many reads, and which


async def test_children_cost_two_filtered_reads_and_no_whole_corpus(stack: Stack, spy_query: SpyQuery) -> None:
    """`list_children(P)` reads the corpus under P, then under the listed ids; never the whole corpus."""
    await stack.author_child("c1", header={"createdAt": 1})
    await stack.author_child("c2", header={"createdAt": 2})
    await stack.author_child("g1", header={"parentSession": "c1", "delegationDepth": 2})
    stack.live_child("live one", session_id="l1")
    rows = await stack.list_children()
    assert [row.id for row in rows] == ["c1", "c2", "l1"]
    assert [sorted(f.parents or ()) for f in spy_query.filters] == [[PARENT], ["c1", "c2", "l1"]]
    assert spy_query.lists == 2


async def test_no_children_cost_one_read(stack: Stack, spy_query: SpyQuery) -> None:
    """A parent without children costs one filtered read: there is nobody to ask `hasChildren` about."""
    assert await stack.list_children("nobody") == []
    assert spy_query.lists == 1


async def test_descendants_read_one_level_at_a_time(stack: Stack, spy_query: SpyQuery) -> None:
    """Three levels below the root: one filtered read per level plus the empty last one, no `hasChildren` read."""
    await stack.author_child("c1", header={"createdAt": 1})
    await stack.author_child("g1", header={"parentSession": "c1", "delegationDepth": 2})
    await stack.author_child("gg1", header={"parentSession": "g1", "delegationDepth": 3})
    rows = await stack.list_descendants()
    assert [(entry.entry.id, entry.depth) for entry in rows] == [("c1", 1), ("g1", 2), ("gg1", 3)]
    assert [sorted(f.parents or ()) for f in spy_query.filters] == [[PARENT], ["c1"], ["g1"], ["gg1"]]


async def test_a_deep_walk_finishes_from_one_whole_corpus_read(
    stack: Stack, spy_query: SpyQuery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the level limit the walk reads the whole corpus once and still lists the same rows."""
    monkeypatch.setattr(catalog, "_LEVELS_BEFORE_FULL_READ", 2)
    parent = PARENT
    for index in range(5):
        session_id = f"n{index}"
        await stack.author_child(session_id, header={"parentSession": parent, "createdAt": index + 1})
        parent = session_id
    rows = await stack.list_descendants()
    assert [(entry.entry.id, entry.depth) for entry in rows] == [(f"n{i}", i + 1) for i in range(5)]
    assert len(spy_query.filters) == 2
    assert spy_query.lists == 3
    assert rows == await reference_descendants(stack, PARENT)


async def test_a_grandchild_published_between_the_two_reads_counts(stack: Stack, spy_query: SpyQuery) -> None:
    """The documented window: a grandchild published after the children read sets `hasChildren`."""
    stack.live_child("child", session_id="c1")

    async def publish_grandchild(records: list[object], _signal: object) -> list[object]:
        spy_query.after_list = None
        stack.live_child("grandchild", session_id="g1", parent="c1")
        return records

    spy_query.after_list = publish_grandchild  # type: ignore[assignment]
    (row,) = await stack.list_children()
    assert row.id == "c1"
    assert row.has_children is True  # type: ignore[union-attr]
