"""Fold laws on random logs built from real session appends (hypothesis), and `check_unit`.

Laws: the incremental (live drive) fold equals the rebuilt fold `restore(None, events, 0)`; restoring
from a checkpoint taken at any prefix plus the tail from `restore_floor` equals the full fold; a unit
that declares `event_types` gives the same values, checkpoints and pushes as its undeclared twin. See
docs/projections.md#unit-contract.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsh.json import JsonValue
from dsh.projection import ClientView, ProjectionRegistry, ProjectionUnit
from dsh.session import Session, SessionEvent, SessionStore
from dsh.testing import check_unit
from tests.helpers import examples
from tests.projection.helpers import KINDS, roundtrip, stored_events

_SETTINGS = settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],  # `kit` and `emit` are stateless helpers
)

ops_strategy = st.lists(st.tuples(st.sampled_from(KINDS), st.sampled_from(["a", "b", ""])), max_size=30)


class Pushes:
    """Records every pushed change as `key -> [(value, seq)]`."""

    def __init__(self, registry: ProjectionRegistry) -> None:
        self.by_key: dict[str, list[tuple[JsonValue, int]]] = {}
        registry.on_changed(self)

    def __call__(self, session: Session, key: str, value: JsonValue, seq: int) -> None:
        self.by_key.setdefault(key, []).append((value, seq))


@_SETTINGS
@given(ops=ops_strategy, register_at=st.integers(0, 30), read_every=st.integers(1, 8))
def test_incremental_fold_equals_rebuilt_fold(kit, emit, ops, register_at, read_every) -> None:
    """Live drive (with late registration and interleaved reads) equals restore(None, events, 0) and a lazy fold."""
    store = SessionStore()
    registry = ProjectionRegistry(store)
    units = [kit.counting(), kit.counting("hostonly", counts=None, visible=False), kit.nullish()]
    s = store.create()
    registered = False
    for index, (kind, value) in enumerate(ops):
        if index == register_at:
            for spy in units:
                registry.register(spy.unit)
            registered = True
        emit.by_kind(s, kind, value)
        if index % read_every == 0:
            registry.snapshot(s)
    if not registered:
        for spy in units:
            registry.register(spy.unit)
    live_snapshot, live_rows = registry.snapshot(s), registry.checkpoint(s)
    rebuilt = registry.restore(None, s.events, 0)
    assert rebuilt.snapshot == live_snapshot
    assert rebuilt.checkpoint == live_rows
    lazy = ProjectionRegistry(store)
    for spy in units:
        lazy.register(spy.unit)
    assert lazy.snapshot(s) == live_snapshot
    assert lazy.checkpoint(s) == live_rows
    assert registry.restore(None, stored_events(s.events), 0) == rebuilt
    lazy.close()
    registry.close()


@_SETTINGS
@given(
    ops=ops_strategy,
    cut=st.integers(0, 30),
    keys=st.one_of(st.none(), st.lists(st.sampled_from(["counter", "hostonly", "nullish", "nope"]), unique=True)),
)
def test_restore_from_any_prefix_checkpoint_equals_the_full_fold(kit, emit, ops, cut, keys) -> None:
    """A JSON round-tripped checkpoint at any prefix, plus the tail from restore_floor, equals the full fold."""
    store = SessionStore()
    registry = ProjectionRegistry(store)
    for spy in (kit.counting(), kit.counting("hostonly", counts=None, visible=False), kit.nullish()):
        registry.register(spy.unit)
    s = store.create()
    checkpoint = roundtrip(registry.checkpoint(s))
    for index, (kind, value) in enumerate(ops):
        emit.by_kind(s, kind, value)
        if index + 1 == cut:
            checkpoint = roundtrip(registry.checkpoint(s))
    full = registry.restore(None, s.events, 0, keys)
    floor = registry.restore_floor(checkpoint, keys)
    if floor is None:
        assert full.checkpoint == {}
        return
    tail = s.events[floor:]
    assert registry.restore(checkpoint, tail, floor, keys) == full
    assert registry.restore(checkpoint, stored_events(s.events, floor), floor, keys) == full
    assert full.snapshot == registry.snapshot(s, keys)
    assert full.checkpoint == registry.checkpoint(s, keys)


def _twins(kit) -> list[tuple[Any, Any]]:
    """(declared, undeclared) pairs with identical folds."""
    pairs = []
    for counts in ("user/message", "session/title", None):
        name = counts or "all"
        declared = kit.counting(f"d:{name}", counts=counts, declared=counts is not None)
        undeclared = kit.counting(f"u:{name}", counts=counts)
        pairs.append((declared, undeclared))
    title = kit.nullish("d:title")
    title.unit = dataclasses.replace(title.unit, event_types=frozenset({"session/title"}))
    pairs.append((title, kit.nullish("u:title")))
    return pairs


def _strip(mapping: Any, prefix: str) -> dict[str, Any]:
    return {key[2:]: value for key, value in dict(mapping).items() if key.startswith(prefix)}


@_SETTINGS
@given(ops=ops_strategy, register_at=st.integers(0, 30), cut=st.integers(0, 30))
def test_declared_event_types_match_the_undeclared_twin(kit, emit, ops, register_at, cut) -> None:
    """Declared units give the same values, checkpoints, pushes and restores as undeclared twins."""
    store = SessionStore()
    registry = ProjectionRegistry(store)
    pushes = Pushes(registry)
    pairs = _twins(kit)
    s = store.create()
    checkpoint: dict[str, Any] | None = None
    for index, (kind, value) in enumerate(ops):
        if index == register_at:
            for declared, undeclared in pairs:
                registry.register(declared.unit)
                registry.register(undeclared.unit)
        emit.by_kind(s, kind, value)
        if index == cut:
            checkpoint = roundtrip(registry.checkpoint(s))
    for declared, undeclared in pairs:
        registry.register(declared.unit)
        registry.register(undeclared.unit)
    snapshot = registry.snapshot(s)
    assert _strip(snapshot.values, "d:") == _strip(snapshot.values, "u:")
    rows = registry.checkpoint(s)
    assert _strip(rows, "d:") == _strip(rows, "u:")
    assert _strip(pushes.by_key, "d:") == _strip(pushes.by_key, "u:")
    if checkpoint is not None:
        floor = registry.restore_floor(checkpoint)
        assert floor is not None
        for events in (s.events[floor:], stored_events(s.events, floor)):
            restored = registry.restore(checkpoint, events, floor)
            assert _strip(restored.snapshot.values, "d:") == _strip(restored.snapshot.values, "u:")
            assert _strip(restored.checkpoint, "d:") == _strip(restored.checkpoint, "u:")
        # Declared-only selections over StoredEvents take the typed path (type_at, no freezing of others).
        typed_keys = [d.key for d, _ in pairs if d.unit.event_types is not None]
        plain_keys = [u.key for d, u in pairs if d.unit.event_types is not None]
        typed = registry.restore(checkpoint, stored_events(s.events, floor), floor, typed_keys)
        plain = registry.restore(checkpoint, s.events[floor:], floor, plain_keys)
        assert _strip(typed.snapshot.values, "d:") == _strip(plain.snapshot.values, "u:")
        assert _strip(typed.checkpoint, "d:") == _strip(plain.checkpoint, "u:")
    for declared, _ in pairs:
        types = declared.unit.event_types
        assert types is None or set(declared.seen_types) <= types
    registry.close()


# ---------------------------------------------------------------------------------------- check_unit


def _sample_log(store: SessionStore, emit) -> tuple[SessionEvent, ...]:
    s = store.create()
    for kind in ("turn/start", "user/message", "session/title", "assistant/chunk", "turn/end", "user/message"):
        emit.by_kind(s, kind, "x")
    return tuple(s.events)


@pytest.mark.slow
def test_check_unit_accepts_the_fixture_units(counter, hostonly, nullish, kit, store: SessionStore, emit) -> None:
    """The fixture units (and a declared twin) keep the unit contract under check_unit."""
    events = _sample_log(store, emit)
    for spy in (counter, hostonly, nullish, kit.counting("declared", declared=True)):
        check_unit(spy.unit, events, max_examples=examples(15))
    check_unit(counter.unit, [{"type": "user/message", "data": {"anything": 1}}], max_examples=examples(5))


def test_check_unit_catches_a_raising_apply(bomb, store: SessionStore, emit) -> None:
    """check_unit reports a unit whose apply raises on some event."""
    with pytest.raises(AssertionError, match="apply raised"):
        check_unit(bomb.unit, [{"type": "goal/change", "data": {"boom": True}}], max_examples=examples(5))


def test_check_unit_catches_input_mutation(kit) -> None:
    """check_unit reports an apply that mutates its input state."""

    def apply(state: dict[str, Any], event: SessionEvent) -> dict[str, Any]:
        state["n"] = state.get("n", 0) + 1
        return dict(state)

    unit: ProjectionUnit[Any, Any] = ProjectionUnit(
        key="mutates", state_version=1, init=dict, apply=apply, state_schema=kit.object_schema
    )
    with pytest.raises(AssertionError, match="mutated"):
        check_unit(unit, [{"type": "user/message", "data": {}}], max_examples=examples(5))


def test_check_unit_catches_a_broken_event_types_promise(kit) -> None:
    """check_unit reports a declared unit that changes state on an undeclared type."""
    spy = kit.counting("liar", counts=None)
    unit = dataclasses.replace(spy.unit, event_types=frozenset({"user/message"}))
    with pytest.raises(AssertionError, match="undeclared type"):
        check_unit(unit, [{"type": "turn/start", "data": {"turn": 1}}], max_examples=examples(5))


def test_check_unit_catches_a_state_that_does_not_restore(kit) -> None:
    """check_unit reports a unit whose state_schema loses information, so restores differ from the live fold."""
    spy = kit.counting()
    lossy = dataclasses.replace(spy.unit, state_schema=type(kit.object_schema)(dict[str, Any]), init=lambda: {"n": 0})

    class Forgetful:
        def validate_python(self, value: object, /) -> dict[str, Any]:
            return {"n": 0}

    unit = dataclasses.replace(lossy, state_schema=Forgetful())
    with pytest.raises(AssertionError, match="differs from the live fold"):
        check_unit(unit, [{"type": "user/message", "data": {}}], max_examples=examples(5))


def test_check_unit_catches_a_bad_view(kit) -> None:
    """check_unit reports a view that is not plain JSON."""
    spy = kit.counting()
    unit = dataclasses.replace(spy.unit, view=ClientView(render=lambda s: {1, 2}, schema=kit.any_schema))
    with pytest.raises(AssertionError, match="not plain JSON"):
        check_unit(unit, [], max_examples=examples(5))
