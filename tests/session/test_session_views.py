"""`Session.events`: O(1) bounded read-only views backed by the one log list."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Sequence

import pytest

from dsh.json import FrozenDict
from dsh.session import EventsView, Session, SessionEvent, SessionStore
from dsh.session.events import make_event


def _session_with(store: SessionStore, n: int) -> Session:
    """A live session of `n` events, built through the restore path (fast for large n)."""
    events = [make_event("turn/start", seq, 1, FrozenDict({"turn": seq + 1})) for seq in range(n - 1)]
    events.append(make_event("session/end-seed", n - 1, 1, FrozenDict()))
    header = store.prepare(f"h{n}").header
    return store.publish(store.prepare_restored(header, 0, events))


def test_old_views_keep_their_bound(store: SessionStore) -> None:
    """A view taken at length 5 keeps length 5 after two appends; index 5 raises; a new view has 7."""
    session = store.create()
    for turn in range(5):
        session.append("turn/start", {"turn": turn})
    old = session.events
    assert len(old) == 5
    session.append("turn/start", {"turn": 5})
    session.append("turn/start", {"turn": 6})
    assert len(old) == 5
    with pytest.raises(IndexError):
        old[5]
    with pytest.raises(IndexError):
        old[-6]
    assert old[-1].seq == 4
    assert len(session.events) == 7
    assert session.events[6].seq == 6


def test_view_slicing_and_iteration_stay_within_the_bound(store: SessionStore) -> None:
    """Slices return tuples bounded by the view; iteration stops at the bound."""
    session = store.create()
    for turn in range(5):
        session.append("turn/start", {"turn": turn})
    view = session.events
    session.append("turn/start", {"turn": 9})
    assert isinstance(view, Sequence)
    assert isinstance(view, EventsView)
    assert type(view[1:3]) is tuple
    assert [event.seq for event in view[1:3]] == [1, 2]
    assert [event.seq for event in view[::-2]] == [4, 2, 0]
    assert len(view[:]) == 5
    assert [event.seq for event in view] == [0, 1, 2, 3, 4]
    assert next(reversed(view)).seq == 4
    assert session.events[5] in session.events
    assert session.events[5] not in view or view.count(session.events[5]) == 0


def test_view_is_read_only(store: SessionStore) -> None:
    """An events view offers no mutation."""
    session = store.create()
    session.append("turn/start", {"turn": 1})
    view = session.events
    with pytest.raises(TypeError):
        view[0] = view[0]  # type: ignore[index]
    with pytest.raises(AttributeError):
        view.append  # type: ignore[attr-defined]  # noqa: B018


@pytest.mark.slow
def test_views_share_the_one_log_list(store: SessionStore) -> None:
    """Over a 100,000-event session every view, before and after appends, is backed by the same list."""
    session = _session_with(store, 100_000)
    first = session.events
    views = [first]
    for turn in range(10):
        session.append("turn/start", {"turn": turn})
        views.append(session.events)
        views.append(session.events)
    assert all(view.backing is first.backing for view in views)
    assert len(first) == 100_000
    assert len(views[-1]) == 100_010
    assert views[-1][100_009].seq == 100_009


def _view_allocation(session: Session, count: int) -> int:
    """Bytes still allocated after taking `count` views and reading through them (views kept alive)."""
    gc.collect()
    tracemalloc.start()
    try:
        start, _ = tracemalloc.get_traced_memory()
        kept: list[EventsView] = []
        for _ in range(count):
            view = session.events
            _ = view[len(view) - 1]
            _ = view[-1]
            kept.append(view)
        end, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(kept) == count
    return end - start


@pytest.mark.slow
def test_taking_views_allocates_nothing_proportional_to_the_log(store: SessionStore) -> None:
    """tracemalloc: views of a 100,000-event log cost the same bytes as views of a 1,000-event log."""
    # Both lengths are outside CPython's small-int cache, so each view's bound costs the same.
    small = _session_with(store, 1_000)
    large = _session_with(store, 100_000)
    _view_allocation(small, 200)  # warm up any one-off interpreter allocations
    small_bytes = _view_allocation(small, 200)
    large_bytes = _view_allocation(large, 200)
    # A view is two slots; 200 views plus the list holding them is a few KiB whatever the log length.
    # A single copy of the 100,000-entry log would be at least 800,000 bytes.
    assert large_bytes < 64 * 1024
    assert large_bytes <= small_bytes + 1024


@pytest.mark.slow
def test_appends_between_views_do_not_copy_the_log(store: SessionStore) -> None:
    """With appends between reads, memory grows by the new events only, not by log copies."""
    session = _session_with(store, 100_000)
    gc.collect()
    tracemalloc.start()
    try:
        start, _ = tracemalloc.get_traced_memory()
        for turn in range(50):
            session.append("turn/start", {"turn": turn})
            view = session.events
            assert type(view[len(view) - 1]) is SessionEvent
        end, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # 50 small events are some tens of KiB; one log copy alone would be 800 KB.
    assert end - start < 400 * 1024
