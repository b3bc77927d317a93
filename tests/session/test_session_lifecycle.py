"""The session lifecycle: one owner (`Session`), an explicit state enum and named transitions.

Every (state, transition) pair is driven through the public entry points and compared with the
declared `LIFECYCLE` table; a random walk of lifecycle and ordinary operations proves that only the
named transitions ever change the state.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh.session import Session, SessionError, SessionState, SessionStore
from dsh.session import session as session_module
from dsh.session.session import LIFECYCLE, SessionTransition
from tests.helpers import examples

_PREPARED, _LIVE, _RETIRED = SessionState.PREPARED, SessionState.LIVE, SessionState.RETIRED

# What each pair does when driven through its public entry point: the next state, or the code of
# the SessionError it raises (refused pairs change nothing).
_EXPECTED: dict[tuple[SessionState, SessionTransition], SessionState | str] = {
    (_PREPARED, SessionTransition.PUBLISH): _LIVE,
    (_LIVE, SessionTransition.PUBLISH): "SESSION_ALREADY_EXISTS",
    (_RETIRED, SessionTransition.PUBLISH): "SESSION_RETIRED",
    (_PREPARED, SessionTransition.VETO): _PREPARED,
    (_LIVE, SessionTransition.VETO): _RETIRED,
    (_RETIRED, SessionTransition.VETO): _RETIRED,
    (_PREPARED, SessionTransition.RETIRE_UNPUBLISHED): _RETIRED,
    (_LIVE, SessionTransition.RETIRE_UNPUBLISHED): _LIVE,
    (_RETIRED, SessionTransition.RETIRE_UNPUBLISHED): _RETIRED,
    (_PREPARED, SessionTransition.DISPOSE): _PREPARED,
    (_LIVE, SessionTransition.DISPOSE): _RETIRED,
    (_RETIRED, SessionTransition.DISPOSE): _RETIRED,
}


def _session_in(store: SessionStore, state: SessionState) -> Session:
    """A session brought into `state` through the public API only."""
    session = store.prepare()
    if state is not _PREPARED:
        store.publish(session)
    if state is _RETIRED:
        store.dispose(session)
    assert session.state is state
    return session


def _drive(store: SessionStore, session: Session, transition: SessionTransition) -> object:
    """Take `transition` through its public entry point; returns what that entry point returned."""
    if transition is SessionTransition.PUBLISH:
        return store.publish(session)
    if transition is SessionTransition.VETO:
        return session.veto()
    if transition is SessionTransition.RETIRE_UNPUBLISHED:
        return session.retire_unpublished()
    return store.dispose(session)


def test_the_expected_table_covers_every_pair_and_agrees_with_lifecycle() -> None:
    """The test's table has every (state, transition) pair, and its legal moves are exactly `LIFECYCLE`."""
    assert set(_EXPECTED) == {(state, t) for state in SessionState for t in SessionTransition}
    moves = {pair: after for pair, after in _EXPECTED.items() if isinstance(after, SessionState) and after != pair[0]}
    assert moves == dict(LIFECYCLE)


@pytest.mark.parametrize(("state", "transition"), list(_EXPECTED))
def test_every_transition_from_every_state(state: SessionState, transition: SessionTransition) -> None:
    """Each pair moves to the table's next state (disposed fires exactly when a live session retires)
    or is refused without any change."""
    store = SessionStore()
    disposed: list[Session] = []
    session = _session_in(store, state)
    store.on_disposed(disposed.append)
    expected = _EXPECTED[(state, transition)]
    if not isinstance(expected, SessionState):  # a refusal code
        with pytest.raises(SessionError) as caught:
            _drive(store, session, transition)
        assert caught.value.code == expected
        assert session.state is state
        assert disposed == []
        return
    result = _drive(store, session, transition)
    assert session.state is expected
    if transition is not SessionTransition.PUBLISH:
        assert result is (expected is not state)
    assert disposed == ([session] if state is _LIVE and expected is _RETIRED else [])
    assert (store.get(session.id) is session) == (expected is _LIVE)


def test_state_is_read_only_and_equals_the_plain_strings() -> None:
    """`Session.state` cannot be assigned, and each state compares equal to its plain string."""
    store = SessionStore()
    session = store.prepare()
    with pytest.raises(AttributeError):
        session.state = SessionState.LIVE  # type: ignore[misc]
    assert session.state == "prepared"
    assert [str(state) for state in SessionState] == ["prepared", "live", "retired"]
    assert repr(session).endswith("state='prepared', seq=0)")


def test_a_veto_by_a_created_listener_is_the_veto_transition() -> None:
    """A raising `created` listener drives live → retired through the veto, with one `disposed`."""
    store = SessionStore()
    seen: list[SessionState] = []
    disposed: list[Session] = []

    def refuse(session: Session) -> None:
        seen.append(session.state)
        raise LookupError("identity already owned")

    store.on_created(refuse)
    store.on_disposed(disposed.append)
    session = store.prepare()
    with pytest.raises(LookupError):
        store.publish(session)
    assert seen == [_LIVE]
    assert session.state is _RETIRED
    assert disposed == [session]


def test_a_session_disposed_by_a_created_listener_is_released_once() -> None:
    """A `created` listener that disposes the session, followed by one that raises, gives one `disposed`."""
    store = SessionStore()
    disposed: list[Session] = []
    store.on_created(store.dispose)

    def refuse(session: Session) -> None:
        raise LookupError("refused")

    store.on_created(refuse)
    store.on_disposed(disposed.append)
    session = store.prepare()
    with pytest.raises(LookupError):
        store.publish(session)
    assert session.state is _RETIRED
    assert disposed == [session]


def test_a_dispose_during_publication_keeps_the_session_live_until_it_unwinds() -> None:
    """During an append's publication a requested dispose is pending: the state stays live until it unwinds."""
    store = SessionStore()
    during: list[tuple[bool, SessionState]] = []
    store.on_event(lambda s, e: during.append((s.request_dispose(), s.state)))
    store.on_event(lambda s, e: during.append((s.request_dispose(), s.state)))
    session = store.create()
    session.append("turn/start", {"turn": 1})
    assert during == [(True, _LIVE), (False, _LIVE)]
    assert session.state is _RETIRED
    assert store.get(session.id) is None


def test_only_the_named_transitions_write_the_state() -> None:
    """In `Session`, `_state` is assigned only by the constructor and by `_move`, the one transition step."""
    # The module's source: `Session.__module__` is its public module, `dsh.session`.
    module = ast.parse(inspect.getsource(session_module))
    (session_class,) = [node for node in module.body if isinstance(node, ast.ClassDef) and node.name == "Session"]
    writers: set[str] = set()
    for function in ast.walk(session_class):
        if not isinstance(function, ast.FunctionDef):
            continue
        for node in ast.walk(function):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign | ast.AugAssign):
                targets = [node.target]
            if any(isinstance(t, ast.Attribute) and t.attr == "_state" for t in targets):
                writers.add(function.name)
    assert writers == {"__init__", "_move"}


# ------------------------------------------------------------------ random walk

_Op = tuple[str, int]


def _apply(store: SessionStore, sessions: list[Session], op: _Op) -> tuple[Session, SessionTransition | None]:
    """Run one operation on a session of the walk; returns it and the transition asked for, if any."""
    name, index = op
    session = sessions[index % len(sessions)]
    lifecycle: dict[str, tuple[SessionTransition, Callable[[], object]]] = {
        "publish": (SessionTransition.PUBLISH, lambda: store.publish(session)),
        "veto": (SessionTransition.VETO, session.veto),
        "retire_unpublished": (SessionTransition.RETIRE_UNPUBLISHED, session.retire_unpublished),
        "dispose": (SessionTransition.DISPOSE, lambda: store.dispose(session)),
        "request_dispose": (SessionTransition.DISPOSE, session.request_dispose),
    }
    ordinary: dict[str, Callable[[], object]] = {
        "append": lambda: session.append("session/title", {"title": "t"}),
        "fork": lambda: store.fork(session),
        "get": lambda: store.get(session.id),
        "list": store.list,
        "read": lambda: (session.events, session.surface, session.derive_messages(), session.seq),
        "prepare": lambda: sessions.append(store.prepare()),
    }
    if name in lifecycle:
        transition, call = lifecycle[name]
        with contextlib.suppress(SessionError):
            call()
        return session, transition
    with contextlib.suppress(SessionError):
        ordinary[name]()
    return session, None


_OPS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "publish",
                "veto",
                "retire_unpublished",
                "dispose",
                "request_dispose",
                "append",
                "fork",
                "get",
                "list",
                "read",
                "prepare",
            ]
        ),
        st.integers(0, 7),
    ),
    max_size=40,
)


@given(ops=_OPS)
@settings(max_examples=examples(300), deadline=None)
def test_random_walk_changes_state_only_by_lifecycle(ops: list[_Op]) -> None:
    """Under any sequence of operations, a state changes only through a named transition, as `LIFECYCLE` says."""
    store = SessionStore()
    sessions = [store.prepare() for _ in range(3)]
    for op in ops:
        before: dict[int, Any] = {id(s): s.state for s in sessions}
        target, transition = _apply(store, sessions, op)
        for session in sessions:
            if id(session) not in before:
                assert session.state is _PREPARED  # just prepared
                continue
            was, now = before[id(session)], session.state
            if now is was:
                continue
            assert session is target, f"{op} changed another session from {was} to {now}"
            assert transition is not None, f"{op} changed its session from {was} to {now}"
            assert LIFECYCLE[(was, transition)] is now
        live = {s.id for s in sessions if s.state is _LIVE}
        assert live <= {s.id for s in store.list()}
