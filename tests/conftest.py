"""Shared pytest fixtures for the whole suite."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import dsh
from dsh.testing.sqlite_writer import SqliteLoopGuard


class StepClock:
    """A deterministic epoch-ms clock: starts at `start` and advances `step` per read."""

    def __init__(self, start: int = 1_789_000_000_000, step: int = 1) -> None:
        self.now = start
        self.step = step

    def __call__(self) -> int:
        value = self.now
        self.now += self.step
        return value


@pytest.fixture
def clock() -> StepClock:
    """A step clock for stores under test."""
    return StepClock()


@pytest.fixture
def ids() -> Callable[[], str]:
    """A deterministic id factory (`s0001`, `s0002`, ...)."""
    counter = itertools.count(1)
    return lambda: f"s{next(counter):04d}"


_DSH_SOURCE = str(Path(dsh.__file__).resolve().parent)


@pytest.fixture(autouse=True)
def _no_sqlite_on_the_loop(request: pytest.FixtureRequest) -> Iterator[None]:
    """Whole-suite guard (02 #51): no `sqlite3` call made by library code runs on an event loop thread.

    Tests that make such a call on purpose (the guard's own self-tests) carry the
    `sqlite_on_loop_on_purpose` marker.
    """
    if request.node.get_closest_marker("sqlite_on_loop_on_purpose") is not None:
        yield
        return
    with SqliteLoopGuard(only_from=_DSH_SOURCE) as guard:
        yield
    guard.assert_clean()
