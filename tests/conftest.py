"""Shared pytest fixtures for the whole suite."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest


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
