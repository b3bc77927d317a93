"""The `subagent` identity unit and the `subagentTiming` unit.

Lazy registration by `SubagentRuntime` and its release in the runtime's close order
(docs/architecture.md#open-and-close-order), the identity fold (last valid descriptor wins, a bad one
resets, the identity carries its seq, an unchanged state comes back as the same object), hypothesis
fuzzing of descriptor data against both units (docs/projections.md#unit-contract), the cache ignoring
version-1 rows, and the timing fold's numbers.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh.config import SubagentConfig
from dsh.json import SAFE_INT_MAX, FrozenDict, JsonValue, freeze, is_json
from dsh.persistence.coordinator import PersistenceCoordinator
from dsh.persistence.memory import MemoryBackend
from dsh.projection import ProjectionRegistry, ProjectionUnit
from dsh.projection.cache import ProjectionCache
from dsh.projection.cache_storage import CacheIdentity, CacheRecord, MemoryCacheStorage
from dsh.query.service import SessionQuery
from dsh.services import Services
from dsh.session import KNOWN_EVENT_TYPES, Session, SessionEvent, SessionStore
from dsh.session.header import SESSION_FORMAT_VERSION, SessionHeader, SessionId, SessionLogOffset
from dsh.subagent.descriptor import SUBAGENT_DESCRIPTOR_TYPE, parse_descriptor
from dsh.subagent.runtime import SubagentRuntime
from dsh.subagent.units import (
    SUBAGENT_IDENTITY_KEY,
    SUBAGENT_TIMING_KEY,
    subagent_identity_unit,
    subagent_timing_unit,
)
from dsh.testing import ManualTimer, check_unit
from tests.helpers import examples

IDENTITY = subagent_identity_unit()
TIMING = subagent_timing_unit()


def desc(label: str = "was valid", *, version: object = 2, **extra: object) -> dict[str, object]:
    """A continuable descriptor payload; `version` and `extra` override or extend its fields."""
    return {"version": version, "mode": "continuable", "provider": "spawn", "label": label, **extra}


def event(kind: str, seq: int = 0, time: object = 0, data: object = None) -> SessionEvent:
    """A bare event for folding a unit by hand; `time` may be malformed on purpose."""
    fields: dict[str, Any] = {"type": kind, "seq": seq, "time": time, "data": freeze(data)}
    return SessionEvent(fields)


def fold(unit: ProjectionUnit[Any, Any], events: Sequence[SessionEvent], state: Any = None) -> Any:
    """Fold `events` through `unit`, starting from `state` (default: `init()`)."""
    current = unit.init() if state is None else state
    for item in events:
        current = unit.apply(current, item)
    return current


def view(unit: ProjectionUnit[Any, Any], state: Any) -> Any:
    """Render `state` and validate it with the unit's own view schema (what the registry serves)."""
    assert unit.view is not None
    return unit.view.schema.validate_python(unit.view.render(state))


def timeline(*steps: tuple[str, int]) -> list[SessionEvent]:
    """Events `(type, time)` with contiguous seqs from 0; descriptors carry a valid payload."""
    return [
        event(kind, seq, time, desc() if kind == SUBAGENT_DESCRIPTOR_TYPE else {"turn": 0})
        for seq, (kind, time) in enumerate(steps)
    ]


@pytest.fixture
def store() -> Iterator[SessionStore]:
    """A session store with a deterministic clock and ids."""
    ticks = itertools.count(1_000)
    ids = itertools.count(1)
    sessions = SessionStore(clock=lambda: next(ticks), id_factory=lambda: f"s{next(ids):04d}")
    yield sessions
    sessions.close()


@pytest.fixture
def registry(store: SessionStore) -> Iterator[ProjectionRegistry]:
    """A registry holding both subagent units (released, then closed, at teardown)."""
    projections = ProjectionRegistry(store)
    disposers = [projections.register(subagent_identity_unit()), projections.register(subagent_timing_unit())]
    yield projections
    for dispose in disposers:
        dispose()
    projections.close()


def live_child(store: SessionStore, session_id: str = "child") -> Session:
    """A published subagent child with an open turn (seq 0)."""
    session = store.create(session_id)
    session.append("turn/start", {"turn": 0})
    return session


# ------------------------------------------------------------------------------ registration


async def test_units_register_lazily_and_release_in_close_order(store: SessionStore) -> None:
    """A registry mounted after the runtime gets both units at the first listing; closing removes them."""
    services = Services(sessions=store, query=SessionQuery(store))
    runtime = SubagentRuntime(services, config=SubagentConfig())
    registry = ProjectionRegistry(store)
    services.projections = registry
    assert registry.keys() == ()
    session = store.create("empty")

    assert await runtime.list_children(SessionId("empty")) == []

    snapshot = registry.snapshot(session)
    assert snapshot.values == {"subagent": None, "subagentTiming": {"settledMs": 0}}
    assert "subagent" in snapshot.values
    assert orjson.loads(orjson.dumps(snapshot.to_json())) == {
        "asOfSeq": -1,
        "values": {"subagent": None, "subagentTiming": {"settledMs": 0}},
    }
    # A second listing registers nothing twice: one release below still removes the keys.
    await runtime.list_children(SessionId("empty"))

    # The runtime's close order: subagent runtime, then sessions, (the cache would close here), then the units.
    await runtime.aclose()
    await store.aclose()
    assert set(registry.keys()) == {SUBAGENT_IDENTITY_KEY, SUBAGENT_TIMING_KEY}
    runtime.release_units()
    remaining = registry.keys()
    assert SUBAGENT_IDENTITY_KEY not in remaining
    assert SUBAGENT_TIMING_KEY not in remaining
    assert registry.snapshot(session).values == {}
    runtime.release_units()  # idempotent
    registry.close()


async def test_runtime_registers_at_construction_when_a_registry_is_mounted(store: SessionStore) -> None:
    """A runtime built over a mounted registry registers both units at once, before any call."""
    registry = ProjectionRegistry(store)
    runtime = SubagentRuntime(Services(sessions=store, projections=registry), config=SubagentConfig())
    assert registry.keys() == (SUBAGENT_IDENTITY_KEY, SUBAGENT_TIMING_KEY)
    assert registry.view_keys() == (SUBAGENT_IDENTITY_KEY, SUBAGENT_TIMING_KEY)
    await runtime.aclose()
    runtime.release_units()
    assert registry.keys() == ()
    registry.close()


async def test_runtime_registrations_share_the_units_with_other_owners(store: SessionStore) -> None:
    """Registrations are refcounted: releasing the runtime's leaves another owner's registration in place."""
    registry = ProjectionRegistry(store)
    other = registry.register(subagent_identity_unit())
    runtime = SubagentRuntime(Services(sessions=store, projections=registry), config=SubagentConfig())
    await runtime.aclose()
    runtime.release_units()
    assert registry.keys() == (SUBAGENT_IDENTITY_KEY,)
    other()
    assert registry.keys() == ()
    registry.close()


async def test_runtime_serves_a_registry_swapped_in_later(store: SessionStore) -> None:
    """Each call registers in whichever registry is mounted then; release drops every registration."""
    first = ProjectionRegistry(store)
    services = Services(sessions=store, projections=first, query=SessionQuery(store))
    runtime = SubagentRuntime(services, config=SubagentConfig())
    second = ProjectionRegistry(store)
    services.projections = second
    await runtime.list_descendants(SessionId("nobody"))
    assert second.keys() == first.keys() == (SUBAGENT_IDENTITY_KEY, SUBAGENT_TIMING_KEY)
    await runtime.aclose()
    runtime.release_units()
    assert first.keys() == second.keys() == ()
    first.close()
    second.close()


def test_units_have_state_version_2_and_client_views() -> None:
    """Both units have `state_version == 2`, client views, and the identity unit declares its one type."""
    assert IDENTITY.key == "subagent"
    assert TIMING.key == "subagentTiming"
    assert IDENTITY.state_version == 2
    assert TIMING.state_version == 2
    assert IDENTITY.event_types == frozenset({"subagent/descriptor"})
    assert TIMING.event_types is None
    assert IDENTITY.view is not None
    assert TIMING.view is not None


@pytest.fixture
async def cache_parts(store: SessionStore, registry: ProjectionRegistry) -> AsyncIterator[ProjectionCache]:
    """A projection cache on memory storage over a memory-backed coordinator; closed in the runtime's close order."""
    async with PersistenceCoordinator(MemoryBackend(), store, timer=ManualTimer()) as coordinator:
        cache = await ProjectionCache.open(
            MemoryCacheStorage(), registry=registry, sessions=store, persistence=coordinator, timer=ManualTimer()
        )
        yield cache
        await cache.aclose()


_CACHED_HEADER = SessionHeader(
    version=SESSION_FORMAT_VERSION,
    id=SessionId("cold-child"),
    created_at=1,
    cwd="/w",
    parent_session=SessionId("parent"),
    origin="subagent",
)
_IDENTITY_ROW_VAL: dict[str, JsonValue] = {"identity": FrozenDict({"mode": "continuable", "label": "old", "seq": 2})}


async def _put(cache: ProjectionCache, rows: Mapping[str, Any]) -> None:
    record = CacheRecord(CacheIdentity(1, "/w", 0), dict(rows))
    await cache.storage.put(_CACHED_HEADER.id, record)


async def test_cache_ignores_a_version_1_subagent_row(cache_parts: ProjectionCache) -> None:
    """A `subagent` row at `ver: 1` is left out by `cached_snapshot`; the timing row still serves."""
    timing_row = {"ver": 2, "seq": 3, "val": {"descriptorSeen": True, "settledMs": 5}}
    await _put(cache_parts, {"subagent": {"ver": 1, "seq": 3, "val": _IDENTITY_ROW_VAL}, "subagentTiming": timing_row})

    selected = await cache_parts.cached_snapshot(_CACHED_HEADER, SessionLogOffset(0), ("subagent",))
    assert selected is None or "subagent" not in selected.values
    everything = await cache_parts.cached_snapshot(_CACHED_HEADER, SessionLogOffset(0))
    assert everything is not None
    assert "subagent" not in everything.values
    assert everything.values == {"subagentTiming": {"settledMs": 5}}


async def test_cache_serves_a_version_2_identity_row(cache_parts: ProjectionCache) -> None:
    """The same row at `ver: 2` is served as the identity view, keys in the order mode, label, seq."""
    await _put(cache_parts, {"subagent": {"ver": 2, "seq": 3, "val": _IDENTITY_ROW_VAL}})
    snapshot = await cache_parts.cached_snapshot(_CACHED_HEADER, SessionLogOffset(0), ("subagent",))
    assert snapshot is not None
    assert snapshot.values == {"subagent": {"mode": "continuable", "label": "old", "seq": 2}}
    value = snapshot.values["subagent"]
    assert isinstance(value, dict)
    assert list(value) == ["mode", "label", "seq"]
    assert snapshot.as_of_seq == 3


@pytest.mark.parametrize(
    "val",
    [
        {"identity": None},
        {"identity": {"mode": "continuable", "seq": 2}},
        {"identity": {"mode": "one-shot", "label": "x"}},
        {"identity": {"mode": "one-shot", "seq": True}},
        {"identity": {"mode": "one-shot", "seq": -1}},
        {"identity": {"mode": "one-shot", "seq": 1, "provider": "spawn"}},
        {"other": 1},
    ],
)
async def test_cache_ignores_a_schema_failing_identity_row(cache_parts: ProjectionCache, val: dict[str, Any]) -> None:
    """A version-matching row whose value fails the strict state schema is left out (a miss, never an error)."""
    await _put(cache_parts, {"subagent": {"ver": 2, "seq": 3, "val": val}})
    snapshot = await cache_parts.cached_snapshot(_CACHED_HEADER, SessionLogOffset(0), ("subagent",))
    assert snapshot is None or "subagent" not in snapshot.values


async def test_cache_serves_the_null_sentinel_row(cache_parts: ProjectionCache) -> None:
    """A checkpoint taken before the descriptor (`{}`) is served as `null`, which the listing treats as no value."""
    await _put(cache_parts, {"subagent": {"ver": 2, "seq": 0, "val": {}}})
    snapshot = await cache_parts.cached_snapshot(_CACHED_HEADER, SessionLogOffset(0), ("subagent",))
    assert snapshot is not None
    assert snapshot.values == {"subagent": None}


# ------------------------------------------------------------------------------ identity unit


def test_identity_state_and_view_after_a_descriptor_at_seq_1(store: SessionStore, registry: ProjectionRegistry) -> None:
    """Before a descriptor the state is `{}` and the view None; after one at seq 1, the wrapped identity."""
    session = live_child(store)
    assert registry.state_of(session, "subagent") == {}
    assert registry.snapshot(session, ["subagent"]).values == {"subagent": None}

    session.append(SUBAGENT_DESCRIPTOR_TYPE, desc("was valid"))

    state = registry.state_of(session, "subagent")
    assert state == {"identity": {"mode": "continuable", "label": "was valid", "seq": 1}}
    assert state is not None
    assert isinstance(state["identity"], dict)
    assert list(state["identity"]) == ["mode", "label", "seq"]
    value = registry.snapshot(session, ["subagent"]).get("subagent")
    assert value == {"mode": "continuable", "label": "was valid", "seq": 1}
    assert isinstance(value, dict)
    assert list(value) == ["mode", "label", "seq"]


def test_one_shot_identity_without_label_has_no_label_key(store: SessionStore, registry: ProjectionRegistry) -> None:
    """A one-shot descriptor without a label folds to `{mode, seq}` with no label key."""
    session = live_child(store)
    session.append(SUBAGENT_DESCRIPTOR_TYPE, {"version": 2, "mode": "one-shot", "provider": "spawn"})
    assert registry.state_of(session, "subagent") == {"identity": {"mode": "one-shot", "seq": 1}}
    assert registry.snapshot(session, ["subagent"]).get("subagent") == {"mode": "one-shot", "seq": 1}


def test_malformed_later_descriptor_gives_a_null_that_survives_json(
    store: SessionStore, registry: ProjectionRegistry
) -> None:
    """A later descriptor with `provider: 7` resets the view to null, and `"subagent": null` survives JSON."""
    session = live_child(store)
    session.append(SUBAGENT_DESCRIPTOR_TYPE, desc("first"))
    session.append(SUBAGENT_DESCRIPTOR_TYPE, desc("first", provider=7))
    snapshot = registry.snapshot(session)
    assert snapshot.values["subagent"] is None
    encoded = orjson.dumps(snapshot.to_json())
    assert b'"subagent":null' in encoded
    decoded = orjson.loads(encoded)["values"]
    assert "subagent" in decoded
    assert decoded["subagent"] is None
    assert registry.state_of(session, "subagent") == {}


def test_last_valid_descriptor_wins() -> None:
    """Of two valid descriptors the identity is the second one, with its seq."""
    state = fold(IDENTITY, [event(SUBAGENT_DESCRIPTOR_TYPE, 3, 0, desc("one")), event("turn/end", 4)])
    state = fold(IDENTITY, [event(SUBAGENT_DESCRIPTOR_TYPE, 7, 0, desc("two"))], state)
    assert state == {"identity": {"mode": "continuable", "label": "two", "seq": 7}}
    assert view(IDENTITY, state) == {"mode": "continuable", "label": "two", "seq": 7}


@pytest.mark.parametrize(
    "bad",
    [
        desc(version=3),
        desc(version=1),
        desc(provider=7),
        desc(extra=True),
        {"version": 2, "mode": "continuable", "provider": "spawn"},
        None,
        "descriptor",
        [desc()],
    ],
)
def test_bad_descriptor_resets_the_identity(bad: object) -> None:
    """A valid descriptor followed by an unsupported or malformed one folds to `{}` and a null view."""
    state = fold(IDENTITY, [event(SUBAGENT_DESCRIPTOR_TYPE, 0, 0, desc()), event(SUBAGENT_DESCRIPTOR_TYPE, 1, 0, bad)])
    assert state == {}
    assert view(IDENTITY, state) is None


def test_bad_descriptor_over_empty_state_returns_the_same_object() -> None:
    """A bad descriptor over the `{}` state changes nothing, so the same object comes back (no push)."""
    empty = IDENTITY.init()
    assert IDENTITY.apply(empty, event(SUBAGENT_DESCRIPTOR_TYPE, 0, 0, desc(version=3))) is empty
    assert IDENTITY.apply(empty, event(SUBAGENT_DESCRIPTOR_TYPE, 0, 0, {"version": "2"})) is empty


def test_good_descriptor_after_reset_is_served_again() -> None:
    """Reset is not sticky: a valid descriptor after a bad one is the identity again."""
    state = fold(
        IDENTITY,
        [
            event(SUBAGENT_DESCRIPTOR_TYPE, 0, 0, desc("a")),
            event(SUBAGENT_DESCRIPTOR_TYPE, 1, 0, desc(version=9)),
            event(SUBAGENT_DESCRIPTOR_TYPE, 2, 0, desc("c")),
        ],
    )
    assert view(IDENTITY, state) == {"mode": "continuable", "label": "c", "seq": 2}


def _fork_with_ancestor(store: SessionStore) -> Session:
    """A fork child whose seed holds an ancestor descriptor at seq 2 (cut 4; `session/end-seed` at seq 4)."""
    ancestor = store.create("ancestor")
    ancestor.append("turn/start", {"turn": 0})
    ancestor.append("request/context", {"provider": "p", "model": "m"})
    ancestor.append(SUBAGENT_DESCRIPTOR_TYPE, desc("ancestor label"))
    ancestor.append("turn/end", {"turn": 0, "reason": {"kind": "completed"}})
    child = store.fork(ancestor, child_id="fork")
    assert child.inherited_event_count == 4
    return child


def test_own_descriptor_overrides_the_ancestor(store: SessionStore, registry: ProjectionRegistry) -> None:
    """With an ancestor descriptor at seq 2 and an own one at seq 5, the identity carries seq 5."""
    child = _fork_with_ancestor(store)
    own = child.append(SUBAGENT_DESCRIPTOR_TYPE, desc("own label"))
    assert own.seq == 5
    value = registry.snapshot(child, ["subagent"]).get("subagent")
    assert value == {"mode": "continuable", "label": "own label", "seq": 5}
    assert child.is_own_seq(5)


def test_unit_does_not_judge_provenance(store: SessionStore, registry: ProjectionRegistry) -> None:
    """Without an own descriptor the identity is the ancestor's at seq 2; only consumers judge it."""
    child = _fork_with_ancestor(store)
    value = registry.snapshot(child, ["subagent"]).get("subagent")
    assert value == {"mode": "continuable", "label": "ancestor label", "seq": 2}
    assert not child.is_own_seq(2)


def test_broken_own_descriptor_does_not_inherit(store: SessionStore, registry: ProjectionRegistry) -> None:
    """A fork whose own descriptor is broken does not inherit its ancestor's identity (last-wins reset)."""
    child = _fork_with_ancestor(store)
    child.append(SUBAGENT_DESCRIPTOR_TYPE, desc("own", mode="bogus"))
    assert registry.snapshot(child, ["subagent"]).get("subagent") is None


_OTHER_TYPES = sorted(KNOWN_EVENT_TYPES - {SUBAGENT_DESCRIPTOR_TYPE} | {"x-foreign/event"})
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-SAFE_INT_MAX, SAFE_INT_MAX)
    # -0.0 is not lossless JSON, so no event can carry it.
    | st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: f != 0.0 or str(f) == "0.0")
    | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)
_identity_states = st.sampled_from(
    [
        {},
        {"identity": {"mode": "continuable", "label": "l", "seq": 3}},
        {"identity": {"mode": "one-shot", "seq": 0}},
    ]
)


@settings(max_examples=examples(200), deadline=None)
@given(kind=st.sampled_from(_OTHER_TYPES), data=_json, state=_identity_states, time=st.integers(0, 10**13))
def test_identity_ignores_every_other_event(kind: str, data: Any, state: dict[str, Any], time: int) -> None:
    """Any event that is not a descriptor returns the very same state object."""
    assert IDENTITY.apply(state, event(kind, 9, time, data)) is state


# ------------------------------------------------------------------------------ fuzzing

_times = st.one_of(st.integers(0, 10**13), st.integers(0, 10**13), st.sampled_from(["x", None, 1.5, True, -1]))
_descriptor_data = st.one_of(
    _json,
    st.fixed_dictionaries(
        {"version": st.sampled_from([2, 2.0, 3, "2"]), "mode": st.sampled_from(["one-shot", "continuable", "x"])},
        optional={"provider": st.sampled_from(["spawn", 7]), "label": st.text(max_size=3) | _json, "persona": _json},
    ),
)
_kinds = st.sampled_from([SUBAGENT_DESCRIPTOR_TYPE] * 3 + ["turn/start", "turn/end", "assistant/chunk"])
_steps = st.lists(st.tuples(_kinds, _times, _descriptor_data), max_size=10)


def _check_state(unit: ProjectionUnit[Any, Any], state: Any) -> None:
    assert isinstance(state, dict)
    assert is_json(state)
    assert unit.state_schema.validate_python(orjson.loads(orjson.dumps(state))) == state
    rendered = view(unit, state)
    assert is_json(freeze(rendered))


@settings(max_examples=examples(200), deadline=None)
@given(steps=_steps)
def test_arbitrary_descriptor_data_never_breaks_either_unit(steps: list[tuple[str, object, Any]]) -> None:
    """Arbitrary JSON as descriptor data, any times: neither unit raises and every view passes its schema."""
    states = {IDENTITY.key: IDENTITY.init(), TIMING.key: TIMING.init()}
    for seq, (kind, time, payload) in enumerate(steps):
        data = payload if kind == SUBAGENT_DESCRIPTOR_TYPE else {"turn": 0}
        item = event(kind, seq, time, data)
        for unit in (IDENTITY, TIMING):
            previous = states[unit.key]
            before = orjson.dumps(previous)
            states[unit.key] = unit.apply(previous, item)
            assert orjson.dumps(previous) == before, "apply mutated its input state"
            _check_state(unit, states[unit.key])
    identity_view = view(IDENTITY, states[IDENTITY.key])
    assert identity_view is None or next(iter(identity_view)) == "mode"
    assert "settledMs" in view(TIMING, states[TIMING.key])


@settings(max_examples=examples(200), deadline=None)
@given(data=_descriptor_data, state=_identity_states, seq=st.integers(0, 10_000))
def test_identity_never_mutates_and_matches_the_parse(data: Any, state: dict[str, Any], seq: int) -> None:
    """The identity fold never mutates its input and yields the parsed mode/label with the event seq."""
    before = orjson.dumps(state)
    result = IDENTITY.apply(state, event(SUBAGENT_DESCRIPTOR_TYPE, seq, 0, data))
    assert orjson.dumps(state) == before
    try:
        parsed = parse_descriptor(freeze(data))
    except ValueError:
        parsed = None
    if parsed is None:
        assert result == {}
        assert (result is state) == (state == {})
    else:
        expected: dict[str, object] = {"mode": parsed.mode}
        if parsed.label is not None:
            expected["label"] = parsed.label
        expected["seq"] = seq
        assert result == {"identity": expected}
        assert list(result["identity"]) == list(expected)


_REPRESENTATIVE: list[dict[str, object]] = [
    {"type": "turn/start", "data": {"turn": 0}, "time": 100},
    {"type": SUBAGENT_DESCRIPTOR_TYPE, "data": desc("first"), "time": 110},
    {"type": "assistant/chunk", "data": {"turn": 0}, "time": 150},
    {"type": "turn/end", "data": {"turn": 0}, "time": 300},
    {"type": SUBAGENT_DESCRIPTOR_TYPE, "data": desc(provider=7), "time": 400},
    {"type": "turn/start", "data": {"turn": 1}, "time": 500},
    {"type": SUBAGENT_DESCRIPTOR_TYPE, "data": {"version": 2, "mode": "one-shot", "provider": "fork"}, "time": 510},
    {"type": SUBAGENT_DESCRIPTOR_TYPE, "data": desc(version=3), "time": 520},
    {"type": SUBAGENT_DESCRIPTOR_TYPE, "data": desc("last"), "time": 530},
    {"type": "turn/end", "data": {"turn": 1}, "time": 900},
]


@pytest.mark.parametrize("unit", [IDENTITY, TIMING], ids=["subagent", "subagentTiming"])
def test_both_units_keep_the_unit_contract(unit: ProjectionUnit[Any, Any]) -> None:
    """`check_unit`: pure init, no raise, same object for undeclared types, restore == live fold."""
    check_unit(unit, _REPRESENTATIVE, max_examples=examples(60))


# ------------------------------------------------------------------------------ timing unit


def test_settled_time_counts_turns_after_the_last_descriptor() -> None:
    """Two descriptors and three turns fold to `{settledMs: 5100}`."""
    state = fold(
        TIMING,
        timeline(
            ("turn/start", 100),
            (SUBAGENT_DESCRIPTOR_TYPE, 110),
            ("turn/end", 300),
            ("turn/start", 1000),
            (SUBAGENT_DESCRIPTOR_TYPE, 1100),
            ("turn/end", 4100),
            ("turn/start", 10000),
            ("turn/end", 12000),
        ),
    )
    assert view(TIMING, state) == {"settledMs": 5100}
    assert state == {"descriptorSeen": True, "settledMs": 5100}


def test_backwards_clock_adds_zero_and_an_open_turn_is_active() -> None:
    """A turn ending before it started adds 0, and an open turn shows `active` up to the last event."""
    state = fold(
        TIMING,
        timeline(
            ("turn/start", 1000),
            (SUBAGENT_DESCRIPTOR_TYPE, 1100),
            ("turn/end", 900),
            ("turn/start", 2000),
            ("assistant/chunk", 2500),
        ),
    )
    assert view(TIMING, state) == {"settledMs": 0, "active": {"since": 2000, "through": 2500}}
    assert list(view(TIMING, state)) == ["settledMs", "active"]


def test_initial_state_ignores_chunks_and_turn_ends() -> None:
    """From the initial state a chunk or a `turn/end` returns the same object."""
    initial = TIMING.init()
    assert initial == {"descriptorSeen": False, "settledMs": 0}
    assert TIMING.apply(initial, event("assistant/chunk", 0, 5)) is initial
    assert TIMING.apply(initial, event("turn/end", 0, 5)) is initial
    assert view(TIMING, initial) == {"settledMs": 0}


def test_turns_before_the_descriptor_never_count() -> None:
    """turn/start@100, turn/end@200, desc@300 fold to `{settledMs: 0}` with no active interval."""
    state = fold(TIMING, timeline(("turn/start", 100), ("turn/end", 200), (SUBAGENT_DESCRIPTOR_TYPE, 300)))
    assert view(TIMING, state) == {"settledMs": 0}
    assert state == {"descriptorSeen": True, "settledMs": 0}


def test_timing_pending_turn_start_is_kept_until_the_descriptor() -> None:
    """A turn opened before the descriptor becomes the active interval's start once the descriptor lands."""
    pending = fold(TIMING, timeline(("turn/start", 100), ("assistant/chunk", 105)))
    assert pending == {"descriptorSeen": False, "settledMs": 0, "pendingTurnStart": 100}
    assert view(TIMING, pending) == {"settledMs": 0}
    after = fold(TIMING, [event(SUBAGENT_DESCRIPTOR_TYPE, 2, 120, desc())], pending)
    assert after == {"descriptorSeen": True, "settledMs": 0, "active": {"since": 100, "through": 120}}


def test_timing_descriptor_inside_an_open_interval_keeps_its_start() -> None:
    """A descriptor while an interval is open resets settled time but keeps the open interval's start."""
    state = fold(
        TIMING,
        timeline(
            (SUBAGENT_DESCRIPTOR_TYPE, 10),
            ("turn/start", 20),
            ("turn/end", 70),
            ("turn/start", 100),
            (SUBAGENT_DESCRIPTOR_TYPE, 130),
        ),
    )
    assert state == {"descriptorSeen": True, "settledMs": 0, "active": {"since": 100, "through": 130}}
    finished = fold(TIMING, [event("turn/end", 5, 160)], state)
    assert view(TIMING, finished) == {"settledMs": 60}


def test_timing_every_descriptor_resets_even_a_malformed_one() -> None:
    """Every descriptor event resets timing, valid or not: seeded turns never count."""
    state = fold(TIMING, timeline((SUBAGENT_DESCRIPTOR_TYPE, 0), ("turn/start", 10), ("turn/end", 50)))
    assert view(TIMING, state) == {"settledMs": 40}
    reset = TIMING.apply(state, event(SUBAGENT_DESCRIPTOR_TYPE, 3, 60, {"version": "bogus"}))
    assert reset == {"descriptorSeen": True, "settledMs": 0}


def test_timing_same_object_cases() -> None:
    """Timing returns the same object for a turn end with no interval and for events outside an interval."""
    settled = fold(TIMING, timeline((SUBAGENT_DESCRIPTOR_TYPE, 0)))
    assert TIMING.apply(settled, event("turn/end", 1, 5)) is settled
    assert TIMING.apply(settled, event("user/message", 1, 5)) is settled
    active = fold(TIMING, timeline((SUBAGENT_DESCRIPTOR_TYPE, 0), ("turn/start", 10)))
    assert TIMING.apply(active, event("assistant/chunk", 2, 10)) is active


@pytest.mark.parametrize("time", ["100", None, 1.5, True, [1]])
@pytest.mark.parametrize("kind", ["turn/start", "turn/end", SUBAGENT_DESCRIPTOR_TYPE, "assistant/chunk"])
def test_timing_ignores_a_malformed_time(kind: str, time: object) -> None:
    """An event whose `time` is not an integer is treated as irrelevant: the same object, no raise."""
    for state in (
        TIMING.init(),
        fold(TIMING, timeline(("turn/start", 1))),
        fold(TIMING, timeline((SUBAGENT_DESCRIPTOR_TYPE, 0), ("turn/start", 10))),
    ):
        assert TIMING.apply(state, event(kind, 5, time, desc())) is state


def test_timing_event_without_time_is_ignored() -> None:
    """An event with no `time` at all is ignored instead of raising."""
    state = TIMING.init()
    bare = SessionEvent({"type": "turn/start", "seq": 0, "data": None})
    assert TIMING.apply(state, bare) is state


def test_timing_settled_time_stays_a_safe_integer() -> None:
    """Settled time is clamped to the safe-integer range, so the state always stays lossless JSON."""
    huge = [(SUBAGENT_DESCRIPTOR_TYPE, 0)]
    for _ in range(3):
        huge += [("turn/start", 0), ("turn/end", SAFE_INT_MAX)]
    state = fold(TIMING, timeline(*huge))
    assert state["settledMs"] == SAFE_INT_MAX
    assert is_json(state)


def test_renders_never_raise_on_foreign_states() -> None:
    """Both renders return a value for states no fold produces (the never-raise rule covers render too)."""
    assert IDENTITY.view is not None
    assert TIMING.view is not None
    for foreign in ({}, {"identity": "x"}, {"identity": None}):
        assert view(IDENTITY, foreign) is None
    assert IDENTITY.view.render(None) is None
    assert TIMING.view.render(None) == {"settledMs": 0}


def test_live_timing_through_the_registry(store: SessionStore, registry: ProjectionRegistry) -> None:
    """Through a live session, timing uses the store clock: an open turn shows `active` and a closed one settles."""
    session = store.create("timed")
    session.append("turn/start", {"turn": 0})
    session.append(SUBAGENT_DESCRIPTOR_TYPE, desc())
    first = registry.snapshot(session).get("subagentTiming")
    assert isinstance(first, dict)
    start = session.events[0].time
    assert first == {"settledMs": 0, "active": {"since": start, "through": session.events[1].time}}
    session.append("turn/end", {"turn": 0, "reason": {"kind": "completed"}})
    end = session.events[2].time
    assert registry.snapshot(session).get("subagentTiming") == {"settledMs": end - start}


def test_identity_state_schema_is_strict() -> None:
    """The identity state schema accepts `{}` and the two identity arms only (closed keys, strict types)."""
    schema = IDENTITY.state_schema
    assert schema.validate_python({}) == {}
    accepted = schema.validate_python({"identity": {"seq": 4, "label": "l", "mode": "continuable"}})
    assert list(accepted["identity"]) == ["mode", "label", "seq"]
    for bad in (
        {"identity": None},
        {"identity": {"mode": "continuable", "seq": 1}},
        {"identity": {"mode": "one-shot", "seq": 1.0}},
        {"identity": {"mode": "one-shot", "seq": 1, "label": None}},
        {"identity": {"mode": "one-shot", "seq": 1}, "more": 1},
    ):
        with pytest.raises(ValueError):
            schema.validate_python(bad)


def test_timing_and_view_schemas_are_strict_and_keep_declaration_order() -> None:
    """The timing state and view and the identity view accept their closed shapes only, in declared key order."""
    state = TIMING.state_schema.validate_python(
        {"pendingTurnStart": 3, "active": {"through": 2, "since": 1}, "descriptorSeen": True, "settledMs": 0}
    )
    assert list(state) == ["settledMs", "descriptorSeen", "active", "pendingTurnStart"]
    assert list(state["active"]) == ["since", "through"]
    assert TIMING.view is not None
    assert IDENTITY.view is not None
    assert TIMING.view.schema.validate_python({"settledMs": 5}) == {"settledMs": 5}
    assert IDENTITY.view.schema.validate_python(None) is None
    assert IDENTITY.view.schema.validate_python({"seq": 0, "mode": "one-shot"}) == {"mode": "one-shot", "seq": 0}
    for schema, bad in (
        (TIMING.state_schema, {"settledMs": 0, "descriptorSeen": 1}),
        (TIMING.state_schema, {"settledMs": True, "descriptorSeen": False}),
        (TIMING.state_schema, {"settledMs": -1, "descriptorSeen": False}),
        (TIMING.state_schema, {"settledMs": 0}),
        (TIMING.state_schema, {"settledMs": 0, "descriptorSeen": False, "active": {"since": 1}}),
        (TIMING.view.schema, {"settledMs": 0, "descriptorSeen": False}),
        (TIMING.view.schema, [("settledMs", 0)]),
        (IDENTITY.view.schema, {"mode": "forked", "seq": 0}),
        (IDENTITY.view.schema, {"mode": "continuable", "label": "l", "seq": -1}),
    ):
        with pytest.raises(ValueError):
            schema.validate_python(bad)
