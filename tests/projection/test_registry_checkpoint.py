"""Checkpoints and cold folds: checkpoint, restore_floor, view_checkpoint, restore.

See docs/projections.md#checkpoints-and-cold-restore.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

import dsh.session.stored as stored_module
from dsh.projection import ClientView, ProjectionError, ProjectionRegistry, ProjectionUnit
from dsh.session import SessionEvent, SessionStore
from tests.projection.helpers import stored_events

REREAD = (
    'session projection "{key}" cannot restore from seq {base}: its checkpoint row is missing, '
    "version-mismatched, or beyond the supplied log end; re-read from seq 0"
)


def _log(store: SessionStore, emit, kinds: list[str]) -> tuple[SessionEvent, ...]:
    s = store.create()
    for kind in kinds:
        emit.by_kind(s, kind)
    return tuple(s.events)


def test_checkpoint_rows_are_detached_copies(
    registry: ProjectionRegistry, store: SessionStore, counter, hostonly, emit
) -> None:
    """Mutating a checkpoint's val changes nothing; rows carry ver and seq; empty log → -1, init."""
    registry.register(counter.unit)
    registry.register(hostonly.unit)
    empty = store.create()
    assert registry.checkpoint(empty) == {
        "counter": {"ver": 1, "seq": -1, "val": {"n": 0}},
        "hostonly": {"ver": 1, "seq": -1, "val": {"n": 0}},
    }
    s = store.create()
    emit.user(s)
    emit.turn_start(s)
    first = registry.checkpoint(s)
    first["counter"]["val"]["n"] = 99
    first["hostonly"]["val"].clear()
    assert registry.checkpoint(s) == {
        "counter": {"ver": 1, "seq": 1, "val": {"n": 1}},
        "hostonly": {"ver": 1, "seq": 1, "val": {"n": 2}},
    }
    assert registry.checkpoint(s, ["hostonly", "nope"]) == {"hostonly": {"ver": 1, "seq": 1, "val": {"n": 2}}}


def test_restore_floor_is_the_oldest_usable_row_seq(registry: ProjectionRegistry, kit) -> None:
    """None without units; 0 for missing/mismatched/fresh rows; the lowest row seq otherwise; keys narrow it."""
    assert registry.restore_floor({}) is None
    assert registry.restore_floor(None) is None
    registry.register(kit.counting("a").unit)
    registry.register(kit.counting("b").unit)
    assert registry.restore_floor({"a": {"ver": 1, "seq": 10, "val": {}}}) == 0  # b missing
    assert registry.restore_floor(None) == 0
    mismatched = {"a": {"ver": 2, "seq": 10, "val": {}}, "b": {"ver": 1, "seq": 10, "val": {}}}
    assert registry.restore_floor(mismatched) == 0
    fresh = {"a": {"ver": 1, "seq": -1, "val": {}}, "b": {"ver": 1, "seq": -1, "val": {}}}
    assert registry.restore_floor(fresh) == 0
    rows = {"a": {"ver": 1, "seq": 10, "val": {}}, "b": {"ver": 1, "seq": 5, "val": {}}}
    assert registry.restore_floor(rows) == 5
    assert registry.restore_floor(rows, ["a"]) == 10
    assert registry.restore_floor(rows, ["unknown"]) is None


@pytest.mark.parametrize(
    "row",
    [
        {"ver": True, "seq": 10, "val": {}},
        {"ver": 1, "seq": 10.0, "val": {}},
        {"ver": 1, "seq": -2, "val": {}},
        {"ver": 1, "seq": 10},
        "not a row",
        None,
    ],
)
def test_restore_floor_treats_malformed_rows_as_missing(registry: ProjectionRegistry, kit, row: object) -> None:
    """A malformed row never raises: restore_floor treats it as missing (0)."""
    registry.register(kit.counting("a").unit)
    assert registry.restore_floor({"a": row}) == 0  # type: ignore[dict-item]


def test_mismatched_row_requires_a_reread(
    registry: ProjectionRegistry, store: SessionStore, counter, emit, kit
) -> None:
    """A version-mismatched row with a tail from 4 → REREAD_REQUIRED (exact text); from 0 → init."""
    registry.register(counter.unit)
    events = _log(store, emit, ["user/message"] * 6)
    rows = {"counter": {"ver": 7, "seq": 3, "val": {"n": 4}}}
    with pytest.raises(ProjectionError) as info:
        registry.restore(rows, events[4:], 4)
    assert info.value.code == "PROJECTION_REREAD_REQUIRED"
    assert info.value.message == REREAD.format(key="counter", base=4)
    restored = registry.restore(rows, events, 0)
    assert restored.snapshot.values == {"counter": {"n": 6}}
    assert restored.checkpoint == {"counter": {"ver": 1, "seq": 5, "val": {"n": 6}}}


def test_rows_at_the_tail_end_fold_nothing(registry: ProjectionRegistry, store: SessionStore, counter, emit) -> None:
    """Rows already at the end: apply is not called; an empty tail gives as_of_seq base - 1."""
    registry.register(counter.unit)
    events = _log(store, emit, ["user/message"] * 4)
    counter.applies = 0
    rows = {"counter": {"ver": 1, "seq": 3, "val": {"n": 4}}}
    restored = registry.restore(rows, events[3:], 3)
    assert counter.applies == 0
    assert restored.snapshot.as_of_seq == 3
    assert restored.snapshot.values == {"counter": {"n": 4}}
    empty = registry.restore(rows, (), 4)
    assert empty.snapshot.as_of_seq == 3
    assert empty.checkpoint == {"counter": {"ver": 1, "seq": 3, "val": {"n": 4}}}
    assert counter.applies == 0
    nothing = registry.restore(None, (), 0)
    assert nothing.snapshot.as_of_seq == -1
    assert nothing.snapshot.values == {"counter": {"n": 0}}


def test_restore_returns_rows_for_selected_units_only(
    registry: ProjectionRegistry, store: SessionStore, counter, hostonly, emit
) -> None:
    """Both rows refreshed, values only counter; keys=['counter'] never calls hostonly.apply."""
    registry.register(counter.unit)
    registry.register(hostonly.unit)
    events = _log(store, emit, ["user/message", "turn/start", "user/message", "turn/end"])
    rows = {
        "counter": {"ver": 1, "seq": 1, "val": {"n": 1}},
        "hostonly": {"ver": 1, "seq": 1, "val": {"n": 2}},
    }
    floor = registry.restore_floor(rows)
    assert floor == 1
    counter.applies = hostonly.applies = 0
    restored = registry.restore(rows, events[floor:], floor)
    assert restored.snapshot.values == {"counter": {"n": 2}}
    assert restored.checkpoint == {
        "counter": {"ver": 1, "seq": 3, "val": {"n": 2}},
        "hostonly": {"ver": 1, "seq": 3, "val": {"n": 4}},
    }
    assert counter.applies == 2  # seqs 2 and 3 only: the anchor event at the floor is not re-applied
    hostonly.applies = 0
    only = registry.restore(rows, events[floor:], floor, ["counter"])
    assert list(only.checkpoint) == ["counter"]
    assert hostonly.applies == 0


def test_a_row_beyond_the_log_end_requires_a_reread(
    registry: ProjectionRegistry, store: SessionStore, counter, emit
) -> None:
    """A row claiming seq 9 over a log ending at 6: REREAD_REQUIRED from the floor, clean from 0."""
    registry.register(counter.unit)
    events = _log(store, emit, ["user/message"] * 7)
    rows = {"counter": {"ver": 1, "seq": 9, "val": {"n": 100}}}
    floor = registry.restore_floor(rows)
    assert floor == 9
    with pytest.raises(ProjectionError) as info:
        registry.restore(rows, events[floor:], floor)
    assert info.value.code == "PROJECTION_REREAD_REQUIRED"
    with pytest.raises(ProjectionError):
        registry.restore(rows, events[5:], 5)
    assert registry.restore(rows, events, 0).snapshot.values == {"counter": {"n": 7}}


class _FeedOnly:
    """A stand-in store offering only the event subscription: any other store access would fail loudly."""

    def on_event(self, fn: object) -> Any:
        return lambda: None


def test_view_checkpoint_serves_only_valid_rows(kit, caplog) -> None:
    """Valid, mismatched, schema-invalid, render-raising rows: only the valid key, nothing raises, no I/O."""
    registry = ProjectionRegistry(_FeedOnly())  # type: ignore[arg-type]

    def raising(state: dict[str, Any]) -> object:
        raise RuntimeError("render broke")

    registry.register(kit.counting("valid").unit)
    registry.register(kit.counting("mismatched").unit)
    registry.register(kit.counting("invalid").unit)
    registry.register(
        ProjectionUnit(
            key="unrenderable",
            state_version=1,
            init=dict,
            apply=lambda s, e: s,
            state_schema=kit.object_schema,
            view=ClientView(render=raising, schema=kit.any_schema),
        )
    )
    registry.register(kit.counting("hidden", visible=False).unit)
    rows: dict[str, Any] = {
        "valid": {"ver": 1, "seq": 4, "val": {"n": 2}},
        "mismatched": {"ver": 0, "seq": 4, "val": {"n": 2}},
        "invalid": {"ver": 1, "seq": 4, "val": {"n": "two"}},
        "unrenderable": {"ver": 1, "seq": 4, "val": {}},
        "hidden": {"ver": 1, "seq": 4, "val": {"n": 1}},
        "stranger": {"ver": 1, "seq": 4, "val": {"n": 1}},
    }
    with caplog.at_level(logging.DEBUG, logger="dsh.projection.registry"):
        assert registry.view_checkpoint(rows) == {"valid": {"n": 2}}
    assert registry.view_checkpoint(rows, ["mismatched", "hidden"]) == {}
    assert registry.view_checkpoint({}) == {}
    assert {r.levelno for r in caplog.records} <= {logging.DEBUG}


def test_an_invalid_state_and_seq_gaps_are_refused(
    registry: ProjectionRegistry, store: SessionStore, counter, emit
) -> None:
    """A version-matching row failing state_schema → INVALID_STATE; a seq gap → ValueError."""
    registry.register(counter.unit)
    events = _log(store, emit, ["user/message"] * 5)
    rows = {"counter": {"ver": 1, "seq": 2, "val": {"n": "three"}}}
    with pytest.raises(ProjectionError) as info:
        registry.restore(rows, events[2:], 2)
    assert info.value.code == "PROJECTION_INVALID_STATE"
    with pytest.raises(ValueError, match="contiguous"):
        registry.restore(None, (events[0], events[2]), 0)
    with pytest.raises(ValueError, match="contiguous"):
        registry.restore(None, events[1:], 0)
    with pytest.raises(ValueError, match="base_seq"):
        registry.restore(None, events, -1)


def test_restore_contains_a_raising_unit_as_unit_failed(
    registry: ProjectionRegistry, store: SessionStore, bomb, counter, emit
) -> None:
    """In restore a selected unit that raises fails the fold with UNIT_FAILED; unselected, it is never run."""
    registry.register(bomb.unit)
    registry.register(counter.unit)
    s = store.create()
    emit.user(s)
    emit.boom(s)
    with pytest.raises(ProjectionError) as info:
        registry.restore(None, s.events, 0)
    assert info.value.code == "PROJECTION_UNIT_FAILED"
    assert info.value.key == "bomb"
    assert registry.restore(None, s.events, 0, ["counter"]).snapshot.values == {"counter": {"n": 1}}


def test_restore_render_failure_is_invalid_view(registry: ProjectionRegistry, store: SessionStore, kit) -> None:
    """A selected view that cannot be rendered in restore raises PROJECTION_INVALID_VIEW."""
    registry.register(
        ProjectionUnit(
            key="setty",
            state_version=1,
            init=dict,
            apply=lambda s, e: s,
            state_schema=kit.object_schema,
            view=ClientView(render=lambda s: {1}, schema=kit.any_schema),
        )
    )
    with pytest.raises(ProjectionError) as info:
        registry.restore(None, (), 0)
    assert info.value.code == "PROJECTION_INVALID_VIEW"


@pytest.fixture
def frozen_types(monkeypatch) -> list[str]:
    """Every event type StoredEvents freezes during the test (spy on its adopt hook)."""
    seen: list[str] = []
    original = stored_module.adopt_event

    def spy(record: dict[str, Any]) -> SessionEvent:
        seen.append(record["type"])
        return original(record)

    monkeypatch.setattr(stored_module, "adopt_event", spy)
    return seen


def test_declared_units_never_freeze_other_types_of_stored_events(
    registry: ProjectionRegistry, store: SessionStore, kit, emit, frozen_types
) -> None:
    """With every selected unit declared, restore over StoredEvents freezes only declared types."""
    registry.register(kit.counting("users", declared=True).unit)
    registry.register(kit.counting("titles", counts="session/title", declared=True).unit)
    registry.register(kit.counting("all").unit)  # undeclared, not selected below
    kinds = ["turn/start", "user/message", "assistant/chunk", "session/title", "user/message", "turn/end"] * 3
    events = _log(store, emit, kinds)
    plain = registry.restore(None, events, 0, ["users", "titles"])
    frozen_types.clear()
    lazy = registry.restore(None, stored_events(events), 0, ["users", "titles"])
    assert lazy == plain
    assert set(frozen_types) == {"user/message", "session/title"}
    assert len(frozen_types) == 9


def test_stored_events_with_an_undeclared_unit_give_identical_results(
    registry: ProjectionRegistry, store: SessionStore, kit, emit
) -> None:
    """When a selected unit is undeclared, restore over StoredEvents folds every event, same results."""
    registry.register(kit.counting("users", declared=True).unit)
    registry.register(kit.counting("all", counts=None).unit)
    events = _log(store, emit, ["turn/start", "user/message", "session/title", "user/message", "turn/end"])
    rows = registry.restore(None, events[:2], 0).checkpoint
    floor = registry.restore_floor(rows)
    assert floor == 1
    plain = registry.restore(rows, events[floor:], floor)
    lazy = registry.restore(rows, stored_events(events, floor), floor)
    assert lazy == plain
    assert plain.snapshot.values == {"users": {"n": 2}, "all": {"n": 5}}


def test_stored_events_from_a_floor_are_checked_where_touched(
    registry: ProjectionRegistry, store: SessionStore, kit, emit
) -> None:
    """A StoredEvents whose touched event sits at the wrong seq is refused with ValueError."""
    registry.register(kit.counting("users", declared=True).unit)
    events = _log(store, emit, ["turn/start", "user/message", "user/message"])
    with pytest.raises(ValueError, match="contiguous"):
        registry.restore(None, stored_events(events, 1), 0)


def test_restored_values_equal_the_live_snapshot(
    registry: ProjectionRegistry, store: SessionStore, counter, nullish, hostonly, emit
) -> None:
    """A cold fold of a live log equals the live snapshot and checkpoint (incremental == rebuilt)."""
    for spy in (counter, nullish, hostonly):
        registry.register(spy.unit)
    s = store.create()
    for kind in ["turn/start", "user/message", "session/title", "turn/end", "user/message"]:
        emit.by_kind(s, kind, "t")
    restored = registry.restore(None, s.events, 0)
    assert restored.snapshot == registry.snapshot(s)
    assert restored.checkpoint == registry.checkpoint(s)
