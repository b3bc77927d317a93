"""`SessionStore.fork`: the prefix copy, the inherited cut, boundary and open-turn rules, and which error wins."""

from __future__ import annotations

from typing import Any

import pytest

from dsh.session import HeaderInit, Session, SessionForkError, SessionStore
from tests.session.helpers import append_closed_turn, assistant_message, turn_end, user_message


def _fork_error(store: SessionStore, *args: Any, **kwargs: Any) -> SessionForkError:
    before = store.list()
    with pytest.raises(SessionForkError) as caught:
        store.fork(*args, **kwargs)
    assert store.list() == before  # a failed fork publishes nothing
    return caught.value


def _source_with_seven_events(store: SessionStore) -> Session:
    source = store.create(
        "src",
        header=HeaderInit(cwd="/repo", origin="subagent", delegation_depth=2, agent_preset="coder", parent_session="p"),
    )
    append_closed_turn(source, 1)
    source.append("session/title", {"title": "t"})
    source.append("request/context", {"provider": "p", "model": "m"})
    source.append("acme/x", {"foreign": True}, ignorable=True)
    assert source.seq == 7
    return source


def test_fork_copies_the_whole_closed_log(store: SessionStore, clock: Any) -> None:
    """The child has the 7 source events plus end-seed at 7, cut 7, is_seeded, lineage and fresh header."""
    source = _source_with_seven_events(store)
    created: list[Session] = []
    store.on_created(created.append)
    stamp = clock.now
    child = store.fork(source)
    assert created == [child]
    assert child.state == "live"
    assert store.get(child.id) is child
    assert child.seq == 8
    assert list(child.events[:7]) == list(source.events)
    assert child.events[7].type == "session/end-seed"
    assert child.events[7].seq == 7
    assert child.inherited_event_count == 7
    assert child.first_live_seq == 7
    header = child.header
    assert header.is_seeded is True
    assert header.parent_session == "src"
    assert header.cwd == "/repo"
    assert header.created_at == stamp
    assert header.created_at != source.header.created_at
    assert header.origin is None
    assert header.agent_preset is None
    assert header.delegation_depth == 0
    assert child.is_own_seq(6) is False
    assert child.is_own_seq(7) is True
    assert child.surface.nodes == source.surface.nodes
    assert child.request_context() == {"provider": "p", "model": "m"}


def test_fork_shares_frozen_events_and_leaves_the_source_alone(store: SessionStore) -> None:
    """Forking copies no event data (events are immutable) and appending to the child never touches the source."""
    source = _source_with_seven_events(store)
    child = store.fork(source, child_id="kid")
    assert child.id == "kid"
    assert all(a is b for a, b in zip(child.events[:7], source.events, strict=True))
    child.append("turn/start", {"turn": 2})
    assert source.seq == 7
    assert child.seq == 9


def test_fork_by_id_and_with_an_earlier_boundary(store: SessionStore) -> None:
    """A source may be named by id; the boundary is the inclusive seq of the last copied event."""
    _source_with_seven_events(store)
    child = store.fork("src", boundary=3)
    assert child.inherited_event_count == 4
    assert [event.type for event in child.events] == [
        "turn/start",
        "user/message",
        "assistant/message",
        "turn/end",
        "session/end-seed",
    ]


def test_empty_source_forks_to_an_empty_prefix(store: SessionStore) -> None:
    """An empty source forks to a child with end-seed at 0, cut 0, not seeded, parent set."""
    store.create("empty")
    child = store.fork("empty")
    assert child.seq == 1
    assert child.events[0].type == "session/end-seed"
    assert child.inherited_event_count == 0
    assert child.header.is_seeded is False
    assert child.header.parent_session == "empty"
    assert child.first_live_seq == 0


def test_fork_of_a_fork_keeps_a_single_trailing_marker(store: SessionStore) -> None:
    """A prefix that already ends with end-seed gets no second marker."""
    _source_with_seven_events(store)
    child = store.fork("src")
    grandchild = store.fork(child)
    assert grandchild.seq == 8
    assert grandchild.inherited_event_count == 8
    assert grandchild.header.parent_session == child.id


def test_boundary_inside_an_open_turn_is_refused(store: SessionStore) -> None:
    """A prefix ending inside turn 2 is OPEN_TURN; an earlier boundary after turn 1 plus log-only works."""
    source = store.create("src")
    append_closed_turn(source, 1)  # seqs 0-3
    source.append("session/title", {"title": "t"})  # 4: log-only after a closed turn
    source.append("turn/start", {"turn": 2})  # 5
    source.append("user/message", user_message("u2"))  # 6
    error = _fork_error(store, source, boundary=6)
    assert error.code == "OPEN_TURN"
    assert error.message == 'fork boundary 6 in session "src" ends inside open turn 2'
    assert _fork_error(store, source, boundary=5).code == "OPEN_TURN"
    assert _fork_error(store, source).code == "OPEN_TURN"  # default boundary = last seq
    child = store.fork(source, boundary=4)
    assert child.inherited_event_count == 5
    assert child.events[4].type == "session/title"
    source.append("assistant/message", assistant_message(2, 1))
    source.append("turn/end", turn_end(2))
    assert store.fork(source).inherited_event_count == 9


@pytest.mark.parametrize(
    ("boundary", "text"),
    [
        (-1, 'fork boundary for session "src" must be a non-negative safe integer, got -1'),
        (1.5, 'fork boundary for session "src" must be a non-negative safe integer, got 1.5'),
        (True, 'fork boundary for session "src" must be a non-negative safe integer, got true'),
        (2**53, 'fork boundary for session "src" must be a non-negative safe integer, got 9007199254740992'),
        ("3", 'fork boundary for session "src" must be a non-negative safe integer, got "3"'),
        (7, 'fork boundary 7 does not exist in session "src" (last seq: 6)'),
    ],
)
def test_invalid_boundaries_are_refused_with_the_exact_text(store: SessionStore, boundary: Any, text: str) -> None:
    """-1, 1.5, True, 2**53 and last+1 are INVALID_BOUNDARY with the matching text."""
    _source_with_seven_events(store)
    error = _fork_error(store, "src", boundary=boundary)
    assert error.code == "INVALID_BOUNDARY"
    assert error.message == text


def test_boundary_on_an_empty_source_names_no_last_seq(store: SessionStore) -> None:
    """A boundary on an empty source reports `last seq: none`."""
    store.create("empty")
    error = _fork_error(store, "empty", boundary=0)
    assert error.message == 'fork boundary 0 does not exist in session "empty" (last seq: none)'


def test_unknown_source_is_not_found(store: SessionStore) -> None:
    """An unknown source id is SESSION_NOT_FOUND."""
    error = _fork_error(store, "ghost")
    assert error.code == "SESSION_NOT_FOUND"
    assert error.message == 'session "ghost" not found'


def test_replaced_source_object_is_not_live(store: SessionStore) -> None:
    """A disposed-and-replaced source object is SESSION_NOT_LIVE."""
    old = store.create("src")
    store.dispose(old)
    store.create("src")
    error = _fork_error(store, old)
    assert error.code == "SESSION_NOT_LIVE"
    assert error.message == 'session "src" is not the live store instance'
    prepared = store.prepare("unpublished")
    assert _fork_error(store, prepared).code == "SESSION_NOT_LIVE"


def test_live_child_id_is_checked_before_the_source(store: SessionStore) -> None:
    """A live child_id is SESSION_ALREADY_EXISTS, checked before the source (even an unknown one)."""
    store.create("taken")
    error = _fork_error(store, "ghost", child_id="taken")
    assert error.code == "SESSION_ALREADY_EXISTS"
    assert error.message == 'session "taken" already exists'
    store.create("src")
    assert _fork_error(store, "src", child_id="taken").code == "SESSION_ALREADY_EXISTS"


def test_fork_creation_errors_are_fork_errors(store: SessionStore) -> None:
    """A child id that fails id validation surfaces as a SessionForkError with the creation code."""
    store.create("src")
    error = _fork_error(store, "src", child_id="bad\x00id")
    assert error.code == "INVALID_HEADER"


def test_vetoed_fork_publishes_nothing(store: SessionStore) -> None:
    """A created-listener veto of the child propagates and leaves only the source live."""
    source = store.create("src")

    class VetoError(Exception):
        pass

    def veto(session: Session) -> None:
        raise VetoError

    store.on_created(veto)
    with pytest.raises(VetoError):
        store.fork(source, child_id="kid")
    assert store.list() == (source,)
