"""The registry's live side: drive from the store's event feed, lazy cells, reads and push frames.

See docs/projections.md#registry and docs/projections.md#push-frames.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import orjson
import pytest

from dsh.projection import ClientView, ProjectionRegistry, ProjectionSnapshot, ProjectionUnit, push_frame
from dsh.session import Session, SessionEvent, SessionId, SessionSeq, SessionStore


def test_three_user_messages_are_counted(registry: ProjectionRegistry, store: SessionStore, counter, emit) -> None:
    """Three appended user messages give as_of_seq 2 and {"counter": {"n": 3}}."""
    registry.register(counter.unit)
    s = store.create()
    for _ in range(3):
        emit.user(s)
    snap = registry.snapshot(s)
    assert snap.as_of_seq == 2
    assert snap.values == {"counter": {"n": 3}}


def test_empty_session_serves_the_init_view(registry: ProjectionRegistry, store: SessionStore, counter) -> None:
    """An empty session snapshots at -1 with the init-derived view."""
    registry.register(counter.unit)
    s = store.create()
    snap = registry.snapshot(s)
    assert snap.as_of_seq == -1
    assert snap.values == {"counter": {"n": 0}}
    assert snap.to_json() == {"asOfSeq": -1, "values": {"counter": {"n": 0}}}


def test_late_registration_folds_the_backlog_once(
    registry: ProjectionRegistry, store: SessionStore, counter, emit
) -> None:
    """Five events before registration plus one after: all six counted, apply ran six times."""
    s = store.create()
    for _ in range(5):
        emit.user(s)
    registry.register(counter.unit)
    emit.user(s)
    assert registry.snapshot(s).values == {"counter": {"n": 6}}
    assert counter.applies == 6


def test_listener_gets_the_causing_seq_and_no_render_for_irrelevant_events(
    registry: ProjectionRegistry, store: SessionStore, counter, emit, changes
) -> None:
    """A relevant then an irrelevant event: one call with the causing seq; one render only."""
    registry.register(counter.unit)
    s = store.create()
    relevant = emit.user(s)
    emit.turn_start(s)
    assert changes == [(s, "counter", {"n": 1}, relevant.seq)]
    assert counter.renders == 1


def test_no_render_without_listeners(registry: ProjectionRegistry, store: SessionStore, counter, emit) -> None:
    """A state change with no `on_changed` listener renders nothing."""
    registry.register(counter.unit)
    s = store.create()
    emit.user(s)
    emit.user(s)
    assert counter.renders == 0
    assert counter.applies == 2


def test_hostonly_is_checkpointed_but_never_shown(
    registry: ProjectionRegistry, store: SessionStore, hostonly, emit, changes
) -> None:
    """A host-only unit: state_of counts, snapshots omit it, no push, checkpoint has its row."""
    registry.register(hostonly.unit)
    s = store.create()
    emit.turn_start(s)
    emit.user(s)
    assert registry.state_of(s, "hostonly") == {"n": 2}
    assert registry.snapshot(s).values == {}
    assert registry.snapshot(s, ["hostonly"]).values == {}
    assert changes == []
    assert registry.checkpoint(s) == {"hostonly": {"ver": 1, "seq": 1, "val": {"n": 2}}}
    assert registry.keys() == ("hostonly",)
    assert registry.view_keys() == ()


def test_cells_are_per_session(registry: ProjectionRegistry, store: SessionStore, counter, emit) -> None:
    """Events in one session leave another session's values unchanged."""
    registry.register(counter.unit)
    a, b = store.create(), store.create()
    emit.user(a)
    before = registry.snapshot(b)
    emit.user(a)
    emit.user(a)
    assert registry.snapshot(b) == before == ProjectionSnapshot(-1, {"counter": {"n": 0}})
    assert registry.snapshot(a).values == {"counter": {"n": 3}}


def test_keys_select_client_visible_registered_units_only(
    registry: ProjectionRegistry, store: SessionStore, counter, hostonly, nullish, emit
) -> None:
    """keys=["counter", "hostonly", "unknown"] gives values with only counter."""
    for spy in (counter, hostonly, nullish):
        registry.register(spy.unit)
    s = store.create()
    emit.user(s)
    snap = registry.snapshot(s, ["counter", "hostonly", "unknown"])
    assert snap.values == {"counter": {"n": 1}}
    assert snap.as_of_seq == 0
    assert nullish.applies == 1  # driven live, but not rendered for this selection
    assert nullish.renders == 0


def test_unpublished_session_is_read_lazily(registry: ProjectionRegistry, store: SessionStore, counter, emit) -> None:
    """An unpublished session with events snapshots at session.seq - 1."""
    registry.register(counter.unit)
    s = store.prepare()
    emit.user(s)
    emit.user(s)
    snap = registry.snapshot(s)
    assert snap.as_of_seq == s.seq - 1 == 1
    assert snap.values == {"counter": {"n": 2}}


def test_events_appended_before_publication_are_caught_up_by_drive(
    registry: ProjectionRegistry, store: SessionStore, counter, emit, changes
) -> None:
    """A cell read while unpublished catches up the un-notified gap at the next live event."""
    registry.register(counter.unit)
    s = store.prepare()
    assert registry.snapshot(s).values == {"counter": {"n": 0}}
    emit.user(s)
    emit.user(s)
    store.publish(s)
    third = emit.user(s)
    assert changes == [(s, "counter", {"n": 3}, third.seq)]
    assert counter.applies == 3


def test_cell_already_past_the_event_is_left_alone(store: SessionStore, counter, emit) -> None:
    """A store listener that reads before drive runs folds the event; drive leaves that cell alone."""
    holder: list[ProjectionRegistry] = []
    seen: list[int] = []
    store.on_event(lambda session, event: seen.append(holder[0].state_of(session, "counter")["n"]))
    registry = ProjectionRegistry(store)  # subscribed after the reading listener
    holder.append(registry)
    registry.register(counter.unit)
    pushed: list[int] = []
    registry.on_changed(lambda s, k, v, q: pushed.append(q))
    s = store.create()
    emit.user(s)
    emit.user(s)
    assert seen == [1, 2]
    assert counter.applies == 2
    # Drive found each cell already at the event's seq: nothing changed during drive, so no push.
    assert pushed == []
    registry.close()


def test_listener_reads_see_a_consistent_cut_and_suppress_no_push(
    registry: ProjectionRegistry, store: SessionStore, counter, kit, emit
) -> None:
    """Pushes run after every unit folded the event: a listener's snapshot is current and later units still push."""
    registry.register(counter.unit)
    registry.register(kit.counting("second").unit)
    seen: list[tuple[str, Any]] = []

    def listener(session: Session, key: str, value: object, seq: int) -> None:
        seen.append((key, dict(registry.snapshot(session).values)))

    registry.on_changed(listener)
    s = store.create()
    emit.user(s)
    both = {"counter": {"n": 1}, "second": {"n": 1}}
    assert seen == [("counter", both), ("second", both)]


def test_declared_unit_skips_apply_for_other_types(
    registry: ProjectionRegistry, store: SessionStore, kit, emit
) -> None:
    """With event_types declared, drive and lazy builds never call apply for other types."""
    declared = kit.counting("declared", declared=True)
    s = store.create()
    emit.turn_start(s)
    emit.user(s)
    registry.register(declared.unit)
    emit.chunk(s)
    emit.user(s)
    emit.turn_end(s)
    assert registry.snapshot(s).values == {"declared": {"n": 2}}
    assert declared.seen_types == ["user/message", "user/message"]
    assert registry.checkpoint(s)["declared"]["seq"] == 4


def test_cells_are_released_with_the_session(registry: ProjectionRegistry, store: SessionStore, emit, kit) -> None:
    """Cells are weakly keyed: a disposed, dropped session and its states are collected."""

    class State(dict[str, Any]):
        """A dict that can be referenced weakly, to observe the cell's release."""

    states: list[weakref.ref[State]] = []

    def init() -> State:
        state = State(n=0)
        states.append(weakref.ref(state))
        return state

    unit: ProjectionUnit[Any, Any] = ProjectionUnit(
        key="weak", state_version=0, init=init, apply=lambda s, e: s, state_schema=kit.object_schema
    )
    registry.register(unit)
    s = store.create()
    emit.user(s)
    assert registry.state_of(s, "weak") == {"n": 0}
    session_ref = weakref.ref(s)
    store.dispose(s)
    del s
    gc.collect()
    assert session_ref() is None
    assert states
    assert all(ref() is None for ref in states)


def test_disposal_keeps_the_cells(registry: ProjectionRegistry, store: SessionStore, counter, emit) -> None:
    """Disposing a session drops nothing: a later checkpoint reads the cells without refolding."""
    registry.register(counter.unit)
    s = store.create()
    emit.user(s)
    emit.user(s)
    store.dispose(s)
    applies = counter.applies
    assert registry.checkpoint(s) == {"counter": {"ver": 1, "seq": 1, "val": {"n": 2}}}
    assert counter.applies == applies


def test_close_unsubscribes_and_reads_still_catch_up(store: SessionStore, counter, emit) -> None:
    """After close() drive stops (no pushes), while reads still fold lazily; close is idempotent."""
    registry = ProjectionRegistry(store)
    registry.register(counter.unit)
    pushed: list[int] = []
    registry.on_changed(lambda s, k, v, q: pushed.append(q))
    s = store.create()
    emit.user(s)
    registry.close()
    registry.close()
    assert registry.closed
    emit.user(s)
    assert pushed == [0]
    assert registry.snapshot(s).values == {"counter": {"n": 2}}


def test_on_changed_disposer_is_idempotent(registry: ProjectionRegistry, store: SessionStore, counter, emit) -> None:
    """A disposed listener is not called again; disposing twice is harmless."""
    registry.register(counter.unit)
    calls: list[int] = []
    dispose = registry.on_changed(lambda s, k, v, q: calls.append(q))
    same: list[int] = []
    registry.on_changed(lambda s, k, v, q: same.append(q))
    s = store.create()
    emit.user(s)
    dispose()
    dispose()
    emit.user(s)
    assert calls == [0]
    assert same == [0, 1]


def test_state_of_returns_borrowed_state_and_none_for_unknown_keys(
    registry: ProjectionRegistry, store: SessionStore, counter, emit
) -> None:
    """state_of returns the live object itself (same identity while unchanged) and None for an unknown key."""
    registry.register(counter.unit)
    s = store.create()
    emit.user(s)
    first = registry.state_of(s, "counter")
    emit.turn_start(s)
    assert registry.state_of(s, "counter") is first
    assert registry.state_of(s, "unknown") is None


def test_snapshot_values_are_detached_from_live_state(
    registry: ProjectionRegistry, store: SessionStore, kit, emit
) -> None:
    """A view that returns part of the live state is served as a frozen copy the caller cannot mutate."""
    unit: ProjectionUnit[Any, Any] = ProjectionUnit(
        key="raw",
        state_version=0,
        init=lambda: {"inner": {"a": 1}},
        apply=lambda s, e: s,
        state_schema=kit.object_schema,
        view=ClientView(render=lambda s: s["inner"], schema=kit.any_schema),
    )
    registry.register(unit)
    s = store.create()
    value = registry.snapshot(s).get("raw")
    assert value == {"a": 1}
    with pytest.raises(TypeError):
        value["b"] = 2  # type: ignore[index]
    assert registry.state_of(s, "raw") == {"inner": {"a": 1}}


def test_null_view_is_kept_in_snapshots_and_frames(
    registry: ProjectionRegistry, store: SessionStore, nullish, emit, changes
) -> None:
    """A null view is present in snapshots; its pushed frame serialises "value":null exactly."""
    registry.register(nullish.unit)
    s = store.create()
    emit.turn_start(s)
    snap = registry.snapshot(s)
    assert "nullish" in snap.values
    assert snap.values["nullish"] is None
    assert snap.get("nullish") is None
    assert snap.get("absent") is None
    assert orjson.loads(orjson.dumps(snap.to_json())) == {"asOfSeq": 0, "values": {"nullish": None}}
    emit.title(s, "hello")
    s.append("session/title", {"title": 5})
    session, key, value, seq = changes[-1]
    assert value is None
    frame = push_frame(SessionId(session.id), key, value, SessionSeq(seq))
    assert list(frame) == ["type", "sessionId", "key", "value", "seq"]
    encoded = orjson.dumps(frame)
    assert b'"value":null' in encoded
    assert orjson.loads(encoded) == {
        "type": "session/projection",
        "sessionId": s.id,
        "key": "nullish",
        "value": None,
        "seq": 2,
    }
    assert [c[2] for c in changes] == ["hello", None]


def test_snapshot_follows_registration_order(registry: ProjectionRegistry, store: SessionStore, kit) -> None:
    """Snapshot and checkpoint dicts follow registration order, not the order of `keys`."""
    for key in ("b", "a", "c"):
        registry.register(kit.counting(key).unit)
    s = store.create()
    assert list(registry.snapshot(s, ["c", "a", "b"]).values) == ["b", "a", "c"]
    assert list(registry.checkpoint(s, ["c", "b"])) == ["b", "c"]


def test_apply_receives_the_committed_event_object(
    registry: ProjectionRegistry, store: SessionStore, emit, kit
) -> None:
    """apply receives the committed SessionEvent object itself."""
    seen: list[SessionEvent] = []

    def apply(state: dict[str, Any], event: SessionEvent) -> dict[str, Any]:
        seen.append(event)
        return state

    registry.register(
        ProjectionUnit(key="spy", state_version=0, init=dict, apply=apply, state_schema=kit.object_schema)
    )
    s: Session = store.create()
    event = emit.user(s)
    assert seen == [event]
    assert seen[0] is s.events[0]
