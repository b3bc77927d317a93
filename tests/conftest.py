"""Shared pytest fixtures for the whole suite (fixtures only; helpers live in `tests/helpers.py`)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import dsh
from dsh.testing.sqlite_writer import SqliteLoopGuard
from dsh.testing.stored_logs import StepClock


@pytest.fixture
def clock() -> StepClock:
    """A deterministic epoch-ms clock for stores under test: +1 ms per read, `clock.now` is the next value."""
    return StepClock()


@pytest.fixture
def ids() -> Callable[[], str]:
    """A deterministic id factory (`s0001`, `s0002`, ...)."""
    counter = itertools.count(1)
    return lambda: f"s{next(counter):04d}"


_DSH_SOURCE = str(Path(dsh.__file__).resolve().parent)


@pytest.fixture(autouse=True)
def _no_sqlite_on_the_loop(request: pytest.FixtureRequest) -> Iterator[None]:
    """Whole-suite guard: no `sqlite3` call made by library code runs on an event loop thread.

    A blocking database call on the loop would stall every other task, so the SQLite backend and the
    projection cache must do their database work on worker threads
    (docs/architecture.md#threads-and-the-event-loop). The guard watches every test, not just the
    SQLite ones, so a new code path that slips a call onto the loop fails wherever it is first run.
    Tests that make such a call on purpose (the guard's own self-tests) carry the
    `sqlite_on_loop_on_purpose` marker.
    """
    if request.node.get_closest_marker("sqlite_on_loop_on_purpose") is not None:
        yield
        return
    with SqliteLoopGuard(only_from=_DSH_SOURCE) as guard:
        yield
    guard.assert_clean()
