"""`SessionStore`: ids, publication, seeds and the cut, restore, close."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from dsh.json import FrozenDict
from dsh.session import HeaderInit, Session, SessionError, SessionEvent, SessionStore
from tests.session.helpers import closed_turn_records, record, turn_end, user_message


def _five_events() -> list[dict[str, Any]]:
    return [*closed_turn_records(0, 1), record(4, "session/title", {"title": "t"})]


def _code(call: Any, *args: Any, **kwargs: Any) -> SessionError:
    with pytest.raises(SessionError) as caught:
        call(*args, **kwargs)
    return caught.value


def test_live_id_cannot_be_created_or_prepared_again(store: SessionStore) -> None:
    """create("a"), prepare("a") with "a" live raise SESSION_ALREADY_EXISTS with the upstream text."""
    live = store.create("a")
    for call in (store.create, store.prepare):
        error = _code(call, "a")
        assert error.code == "SESSION_ALREADY_EXISTS"
        assert error.message == 'session "a" already exists'
        assert error.session_id == "a"
    assert store.get("a") is live


def test_stale_prepared_session_cannot_overwrite_a_live_one(store: SessionStore) -> None:
    """Publishing a stale prepared "a" while another "a" is live is SESSION_ALREADY_EXISTS."""
    stale = store.prepare("a")
    live = store.create("a")
    error = _code(store.publish, stale)
    assert error.code == "SESSION_ALREADY_EXISTS"
    assert error.message == 'session "a" already exists'
    assert store.get("a") is live
    assert stale.state == "prepared"


def test_one_session_cannot_be_published_into_two_stores(store: SessionStore, clock: Any) -> None:
    """A session published in one store is refused by another (and by the same store again)."""
    other = SessionStore(clock=clock, id_factory=lambda: "x")
    session = store.create("a")
    error = _code(other.publish, session)
    assert error.code == "SESSION_ALREADY_EXISTS"
    assert error.message == 'session "a" is already attached to a store'
    assert other.get("a") is None
    assert _code(store.publish, session).message == 'session "a" is already attached to a store'


def test_disposed_id_can_be_reused(store: SessionStore) -> None:
    """After disposal, the id is free for a new session; the old object stays retired."""
    first = store.create("a")
    store.dispose(first)
    second = store.create("a")
    assert store.get("a") is second
    assert first.state == "retired"


def test_get_and_list_follow_publication_order(store: SessionStore) -> None:
    """list() is a fresh tuple in publication order; get() finds live sessions only."""
    b = store.create("b")
    a = store.create("a")
    prepared = store.prepare("c")
    listed = store.list()
    assert listed == (b, a)
    assert store.list() is not listed
    assert store.get("c") is None
    store.publish(prepared)
    assert store.list() == (b, a, prepared)
    store.dispose(b)
    assert store.list() == (a, prepared)


def test_states_follow_the_lifecycle(store: SessionStore) -> None:
    """A session goes prepared → live → retired."""
    session = store.prepare()
    assert session.state == "prepared"
    store.publish(session)
    assert session.state == "live"
    store.dispose(session)
    assert session.state == "retired"


def test_seed_gets_an_end_seed_marker(store: SessionStore) -> None:
    """A 5-event seed gives 6 events, end-seed at seq 5, first_live_seq 5, no event notification."""
    notified: list[SessionEvent] = []
    store.on_event(lambda s, e: notified.append(e))
    session = store.create(seed=_five_events())
    assert session.seq == 6
    assert session.events[5].type == "session/end-seed"
    assert session.events[5].data == {}
    assert session.events[5].seq == 5
    assert session.first_live_seq == 5
    assert session.inherited_event_count == 0
    assert notified == []
    assert [event.seq for event in session.events] == list(range(6))


def test_seed_events_are_frozen_copies(store: SessionStore) -> None:
    """Seed events cross the boundary: the caller's records stay the caller's."""
    seed = _five_events()
    session = store.create(seed=seed)
    seed[0]["data"]["turn"] = 99
    assert session.events[0].data == {"turn": 1}
    assert type(session.events[0]) is SessionEvent


def test_caller_built_session_events_in_a_seed_are_frozen_too(store: SessionStore) -> None:
    """A caller-constructed SessionEvent with mutable data is copied, so later mutation cannot reach the log."""
    data = {"turn": 1}
    sneaky = SessionEvent({"type": "turn/start", "seq": 0, "time": 1, "data": data})
    session = store.create(seed=[sneaky])
    data["turn"] = 42
    assert session.events[0].data == {"turn": 1}
    assert session.events[0] is not sneaky
    with pytest.raises(TypeError):
        session.events[0].data["turn"] = 2  # type: ignore[index]


@pytest.mark.parametrize(
    ("seed", "expected_types"),
    [
        ([*_five_events(), record(5, "session/end-seed", {})], 6),
        ([], 1),
        (None, 0),
    ],
    ids=["ends-with-marker", "empty", "no-seed"],
)
def test_end_seed_marker_is_added_only_when_missing(store: SessionStore, seed: Any, expected_types: int) -> None:
    """A seed ending with the marker gets none; an empty seed gets one at 0; no seed gets none."""
    session = store.create(seed=seed)
    assert session.seq == expected_types
    if seed is not None:
        assert session.events[-1].type == "session/end-seed"
        assert session.first_live_seq == len(seed)
    else:
        assert session.first_live_seq == 0


def test_non_contiguous_seed_is_refused(store: SessionStore) -> None:
    """A seed with seqs 0, 2 is INVALID_SEED with the upstream text."""
    seed = [record(0, "turn/start", {"turn": 1}), record(2, "turn/end", turn_end(1))]
    error = _code(store.prepare, "s", seed=seed)
    assert error.code == "INVALID_SEED"
    assert error.message == "seed event at index 1 has seq 2 (expected 1); seed must be contiguous from 0"


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ({"type": "turn/start", "seq": 0, "time": 1}, "data is required"),
        ({"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1}, "extra": 1}, "unknown envelope key 'extra'"),
        ({"type": "", "seq": 0, "time": 1, "data": {}}, "type must be a non-empty string"),
        (
            {"type": "turn/start", "seq": -1, "time": 1, "data": {"turn": 1}},
            "seq must be a non-negative safe integer, got -1",
        ),
        ({"type": "turn/start", "seq": 0, "time": 1.5, "data": {"turn": 1}}, "time must be a safe integer, got 1.5"),
        (
            {"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1}, "ignorable": False},
            "ignorable may only be the literal true",
        ),
        ("not a mapping", "it is not an object"),
    ],
)
def test_seed_envelope_problems_are_invalid_seed(store: SessionStore, bad: Any, reason: str) -> None:
    """A seed record with a bad envelope is refused with the envelope rule it breaks."""
    error = _code(store.prepare, "s", seed=[bad])
    assert error.code == "INVALID_SEED"
    assert error.message == f"seed event at index 0 has an invalid event envelope: {reason}"


@pytest.mark.parametrize(
    "bad",
    [
        record(0, "acme/unknown", {}),
        record(0, "request/header-delta", {}),
        record(0, "turn/start", {"turn": "one"}),
        record(0, "user/message", {"role": "user", "content": [], "source": {"kind": "user"}}, surfaceOp="append"),
    ],
    ids=["unknown", "legacy", "data-shape", "pre-identity"],
)
def test_seed_vocabulary_and_data_problems_are_invalid_seed(store: SessionStore, bad: dict[str, Any]) -> None:
    """Unknown non-ignorable types, legacy vocabulary and bad data shapes are refused in seeds."""
    error = _code(store.prepare, "s", seed=[bad])
    assert error.code == "INVALID_SEED"
    assert error.message.startswith("invalid seed event at index 0: ")


def test_seed_with_ignorable_foreign_type_is_accepted(store: SessionStore) -> None:
    """An unknown type marked ignorable passes through a seed unchanged."""
    session = store.create(seed=[record(0, "acme/x", {"a": 1}, ignorable=True)])
    assert session.events[0]["ignorable"] is True


@pytest.mark.parametrize("seed", ["abc", b"abc", {"type": "turn/start"}, 5])
def test_seed_must_be_a_sequence_of_records(store: SessionStore, seed: Any) -> None:
    """A seed that is not a sequence of mappings is INVALID_SEED."""
    assert _code(store.prepare, "s", seed=seed).code == "INVALID_SEED"


@pytest.mark.parametrize(("count", "seed"), [(6, "five"), (1, None)])
def test_cut_beyond_the_seed_is_refused(store: SessionStore, count: int, seed: Any) -> None:
    """inherited_event_count 6 with a 5-event seed, or 1 without a seed, is INVALID_SEED."""
    error = _code(store.prepare, "s", seed=_five_events() if seed == "five" else None, inherited_event_count=count)
    assert error.code == "INVALID_SEED"


@pytest.mark.parametrize("count", [-1, True, 1.5, 2**53])
def test_cut_must_be_a_safe_non_negative_int(store: SessionStore, count: Any) -> None:
    """The cut must be a safe non-negative int."""
    assert _code(store.prepare, "s", seed=_five_events(), inherited_event_count=count).code == "INVALID_SEED"


def test_is_own_seq_separates_inherited_from_own(store: SessionStore) -> None:
    """With cut 4: is_own_seq(3) False, is_own_seq(4) True, is_seeded True; unseeded: all own."""
    session = store.create(seed=_five_events(), inherited_event_count=4)
    assert session.inherited_event_count == 4
    assert session.header.is_seeded is True
    assert session.is_own_seq(3) is False
    assert session.is_own_seq(4) is True
    assert session.is_own_seq(10**6) is True  # no range check
    plain = store.create()
    assert plain.header.is_seeded is False
    assert all(plain.is_own_seq(seq) for seq in range(50))


def test_cut_equal_to_seed_length_and_zero_with_seed(store: SessionStore) -> None:
    """A cut equal to the seed length is valid; a seed with cut 0 is not seeded."""
    full = store.create(seed=_five_events(), inherited_event_count=5)
    assert full.header.is_seeded is True
    assert full.is_own_seq(5) is True  # the end-seed marker is the first own event
    none = store.create(seed=_five_events())
    assert none.header.is_seeded is False
    assert none.first_live_seq == 5


def test_header_must_be_a_header_init(store: SessionStore) -> None:
    """prepare refuses a header that is not a HeaderInit."""
    assert _code(store.prepare, header={"cwd": "/x"}).code == "INVALID_HEADER"


def test_prepare_restored_takes_ownership_without_copying(store: SessionStore) -> None:
    """prepare_restored adopts the given list as the log, rebuilds the surface and adds the marker once."""
    source = store.create("s", seed=_five_events(), inherited_event_count=2)
    source.append("user/message", user_message("late"))
    header = source.header
    store.dispose(source)
    events = list(source.events)
    restored = store.prepare_restored(header, 2, events)
    assert restored.events.backing is events
    assert restored.seq == 8
    assert restored.events[7].type == "session/end-seed"
    assert restored.first_live_seq == 7
    assert restored.inherited_event_count == 2
    assert restored.surface.nodes == (1, 2, 6)
    assert restored.header == header
    store.publish(restored)
    store.dispose(restored)
    again = store.prepare_restored(header, 2, list(restored.events))
    assert again.seq == 8  # already ends with the marker: the log does not grow per pickup


def test_prepare_restored_accepts_any_sequence(store: SessionStore) -> None:
    """A tuple (or lazy stored sequence) of events is materialised into the session's list."""
    source = store.create("s", seed=_five_events())
    store.dispose(source)
    restored = store.prepare_restored(source.header, 0, tuple(source.events))
    assert restored.seq == 6


@pytest.mark.parametrize(("seeded", "count"), [(False, 2), (True, 0)])
def test_prepare_restored_checks_the_cut_against_the_header(store: SessionStore, seeded: bool, count: int) -> None:
    """A cut that contradicts the header's is_seeded is INVALID_SEED."""
    source = store.create("s", seed=_five_events())
    store.dispose(source)
    header = dataclasses.replace(source.header, is_seeded=seeded)
    assert _code(store.prepare_restored, header, count, list(source.events)).code == "INVALID_SEED"


def test_prepare_restored_refuses_a_live_id_and_an_out_of_range_cut(store: SessionStore) -> None:
    """prepare_restored refuses a live id and a cut beyond the log."""
    source = store.create("s", seed=_five_events())
    events = list(source.events)
    assert _code(store.prepare_restored, source.header, 0, events).code == "SESSION_ALREADY_EXISTS"
    store.dispose(source)
    seeded = dataclasses.replace(source.header, is_seeded=True)
    assert _code(store.prepare_restored, seeded, 7, events).code == "INVALID_SEED"


def test_close_refuses_new_work_but_keeps_sessions(store: SessionStore) -> None:
    """close() makes prepare, publish, create and fork raise SESSION_STORE_CLOSED and disposes nothing."""
    live = store.create("a")
    prepared = store.prepare("b")
    store.close()
    assert store.closed is True
    for call, args in ((store.prepare, ()), (store.create, ()), (store.publish, (prepared,)), (store.fork, (live,))):
        error = _code(call, *args)
        assert error.code == "SESSION_STORE_CLOSED"
    assert store.get("a") is live
    assert live.append("turn/start", {"turn": 1}).seq == 0  # appends to live sessions still work


async def test_aclose_disposes_every_live_session_in_publication_order(store: SessionStore) -> None:
    """aclose() refuses new work and disposes live sessions in publication order; it is idempotent."""
    disposed: list[str] = []
    store.on_disposed(lambda s: disposed.append(s.id))
    for name in ("c", "a", "b"):
        store.create(name)
    await store.aclose()
    assert disposed == ["c", "a", "b"]
    assert store.list() == ()
    assert _code(store.create).code == "SESSION_STORE_CLOSED"
    await store.aclose()
    assert disposed == ["c", "a", "b"]


def test_session_repr_and_read_surface(store: SessionStore) -> None:
    """The read surface exposes id, header, seq and state without copying the log."""
    session: Session = store.create("r", header=HeaderInit(cwd="/w"))
    assert session.id == session.header.id == "r"
    assert "r" in repr(session)
    assert session.seq == 0
    assert isinstance(session.events[0:0], tuple)


def test_end_seed_marker_uses_the_store_clock(store: SessionStore, clock: Any) -> None:
    """The constructor's end-seed marker is stamped by the store clock and has empty data."""
    session = store.prepare("m", seed=[])
    marker = session.events[0]
    assert marker.data == FrozenDict()
    assert marker.time == clock.now - 1


def test_identity_header_and_cut_are_read_only(store: SessionStore) -> None:
    """id, header, inherited_event_count and first_live_seq cannot be reassigned (the cut never changes)."""
    session = store.create("ro", seed=_five_events(), inherited_event_count=3)
    for name, value in (("id", "x"), ("header", None), ("inherited_event_count", 0), ("first_live_seq", 0)):
        with pytest.raises(AttributeError):
            setattr(session, name, value)
    assert session.inherited_event_count == 3


def test_log_validation_words_a_seq_gap_like_upstream() -> None:
    """The shared log check (used by the read pipeline) reports a seq gap with the upstream text."""
    from dsh.session.surface import Surface
    from dsh.session.validate import check_records

    records = [record(0, "turn/start", {"turn": 1}), record(2, "turn/end", turn_end(1))]
    problem = check_records(records, Surface())
    assert problem is not None
    assert problem.kind == "seq"
    assert problem.index == 1
    assert problem.message == "session event seq 2 is not contiguous; expected 1"
