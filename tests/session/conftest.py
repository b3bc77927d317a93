"""Fixtures for the session-layer tests: a store wired to the deterministic clock and id factory."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dsh.session import SessionStore


@pytest.fixture
def store(clock: Callable[[], int], ids: Callable[[], str]) -> SessionStore:
    """A `SessionStore` using the suite's step clock and `s0001`-style ids."""
    return SessionStore(clock=clock, id_factory=ids)
