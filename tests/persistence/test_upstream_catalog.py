"""A home full of logs in the TypeScript harness's default format lists, pages and folds like an unpacked home.

Two homes hold the same children: one as the harness writes them by default (packed delta runs,
several flush batches, older shapes in one child, a crash in another), one as plain current-shape
logs one event per line. Through a real `Runtime`, the subagent catalog must show the same rows with
the same rungs for cold, live and cached children, and history pages with their projection folds
must be equal (docs/catalog.md#identity-rungs,
docs/storage-format.md#compatibility-with-the-typescript-harness).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsh.config import Config
from dsh.projection import ClientView, ProjectionUnit
from dsh.runtime import Runtime
from dsh.subagent.listing import ListingReport
from dsh.subagent.rows import SubagentChildRow
from dsh.testing.jsonl_writer import JsonlLogWriter
from dsh.testing.stored_logs import StepClock, stored_header
from dsh.testing.upstream_logs import UpstreamLog, UpstreamLogBuilder
from tests.persistence.helpers import plain

PARENT = "parent"


def _child(
    session_id: str, descriptor: dict[str, Any], *, legacy: bool = False, open_turn: bool = False
) -> UpstreamLog:
    """A child session with a descriptor, streamed deltas of every kind and (optionally) older shapes or a crash."""
    b = UpstreamLogBuilder(session_id)
    b.turn_start(1, trigger={"kind": "message"} if legacy else None)
    b.user("do the task", legacy="identity" if legacy else None)
    b.add("subagent/descriptor", descriptor)
    for turn in (1, 2):
        if turn == 2:
            b.turn_start(2)
            b.user("and more", turn=2, legacy="steering" if legacy else None)
        b.step_start(turn, 1)
        b.deltas(turn, 1, ["thinking", " hard", " about", " it"], kind="reasoning")
        b.deltas(turn, 1, ["Sure", ",", " done"], index=1)
        b.flush()
        b.call_deltas(turn, 1, f"call-{turn}", ["{", '"x"', ":1", "}"], name="ls", name_on="first", index=2)
        if open_turn and turn == 2:
            return b.build()
        b.assistant(turn, 1, "Sure, done", legacy=legacy)
        b.step_end(turn, 1)
        b.turn_end(turn, legacy="disposed" if legacy and turn == 2 else None)
        b.flush()
    return b.build()


def _continuable(label: str) -> dict[str, Any]:
    return {"version": 2, "mode": "continuable", "provider": "spawn", "label": label}


def _children() -> dict[str, tuple[UpstreamLog, dict[str, Any]]]:
    """Child id -> (log, stored-header overrides)."""
    under_parent = {"parentSession": PARENT, "origin": "subagent", "delegationDepth": 1}
    return {
        "c1": (_child("c1", _continuable("reviewer")), {**under_parent, "createdAt": 10, "cwd": "/w"}),
        "c2": (
            _child("c2", {"version": 2, "mode": "one-shot", "provider": "spawn", "label": "scan"}, legacy=True),
            {**under_parent, "createdAt": 11},
        ),
        "c3": (_child("c3", _continuable("crashed"), open_turn=True), {**under_parent, "createdAt": 12}),
        "c4": (_child("c4", _continuable("resumed")), {**under_parent, "createdAt": 13}),
        "g1": (
            _child("g1", _continuable("grandchild")),
            {"parentSession": "c1", "origin": "subagent", "delegationDepth": 2, "createdAt": 14},
        ),
    }


async def _write_home(home: Path, *, upstream: bool) -> dict[str, UpstreamLog]:
    writer = JsonlLogWriter(home / "sessions")
    logs = {}
    for session_id, (log, overrides) in _children().items():
        header = stored_header(session_id, **overrides)
        if upstream:
            await writer.write(session_id, header, log.stored, batches=log.batches, pack_chunks=True)
        else:
            await writer.write(session_id, header, log.expected)
        logs[session_id] = log
    return logs


def _text_unit() -> ProjectionUnit[Any, Any]:
    """A fold over every streamed delta: text per kind, so a lost or misplaced delta changes the value."""

    def apply(state: dict[str, Any], event: Any) -> dict[str, Any]:
        chunk = event.data["chunk"]
        key = chunk["type"]
        piece = chunk.get("text", chunk.get("argumentsDelta", ""))
        return {**state, key: state.get(key, "") + piece, "last": [event.seq, event.time]}

    class _Passthrough:
        def validate_python(self, value: object, /) -> object:
            return value

    return ProjectionUnit(
        key="streamedText",
        state_version=1,
        init=dict,
        apply=apply,
        state_schema=_Passthrough(),  # type: ignore[arg-type]
        view=ClientView(render=dict, schema=_Passthrough()),  # type: ignore[arg-type]
        event_types=frozenset({"assistant/chunk"}),
    )


@dataclass
class _Seen:
    """What one home showed."""

    rows: dict[str, list[Any]] = field(default_factory=dict)
    rungs: dict[str, dict[str, int]] = field(default_factory=dict)
    pages: dict[str, Any] = field(default_factory=dict)


async def _list(rt: Runtime, seen: _Seen, phase: str) -> None:
    reports: list[ListingReport] = []
    seen.rows[phase] = await rt.subagents.list_children(PARENT, report=reports.append)
    seen.rungs[phase] = dict(reports[0].rungs)


async def _tour(home: Path) -> _Seen:
    """Cold listing, pages and folds; then one child resumed live; then, in a new runtime, the cached row."""
    seen = _Seen()
    config = Config(home=home)
    async with Runtime.open(config, clock=StepClock()) as rt:
        dispose = rt.projections.register(_text_unit())
        try:
            await _list(rt, seen, "cold")
            for session_id in _children():
                page = await rt.query.read_history(session_id, max_messages=200)
                seen.pages[session_id] = (plain(page.events), page.projections)
            prepared = await rt.persistence.prepare("c4")
            session = prepared.publish()
            session.append("turn/start", {"turn": 3})
            await _list(rt, seen, "live")
        finally:
            dispose()
    async with Runtime.open(config, clock=StepClock()) as rt:
        await _list(rt, seen, "cached")
    return seen


def _thawed_projections(snapshot: Any) -> Any:
    return None if snapshot is None else {key: plain([value])[0] for key, value in snapshot.values.items()}


async def test_an_upstream_home_shows_the_same_catalog_as_the_unpacked_home(tmp_path: Path) -> None:
    """Cold, live and cached children, their history pages and folds are equal for upstream-default and plain homes."""
    logs = await _write_home(tmp_path / "upstream", upstream=True)
    await _write_home(tmp_path / "plain", upstream=False)
    upstream = await _tour(tmp_path / "upstream")
    reference = await _tour(tmp_path / "plain")

    assert upstream.rows == reference.rows
    assert upstream.rungs == reference.rungs
    cold = upstream.rows["cold"]
    assert all(isinstance(row, SubagentChildRow) for row in cold)
    assert [(row.id, row.mode, row.label, row.has_children) for row in cold] == [
        ("c1", "continuable", "reviewer", True),
        ("c2", "one-shot", "scan", False),
        ("c3", "continuable", "crashed", False),
        ("c4", "continuable", "resumed", False),
    ]
    assert upstream.rungs["cold"] == {"c1": 3, "c2": 3, "c3": 3, "c4": 3}
    assert upstream.rungs["live"]["c4"] == 1
    assert next(row for row in upstream.rows["live"] if row.id == "c4").activity == "running"
    assert upstream.rungs["cached"]["c4"] == 2

    for session_id, log in logs.items():
        events, projections = upstream.pages[session_id]
        assert events[: len(log.expected)] == log.expected
        assert (events, _thawed_projections(projections)) == (
            reference.pages[session_id][0],
            _thawed_projections(reference.pages[session_id][1]),
        )
        assert projections is not None
        assert "streamedText" in projections.values
