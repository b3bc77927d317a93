"""Fixtures for the subagent catalog tests: a real stack, spies over its services, hostile units.

The building blocks (authored events, `Stack`, `open_stack`, the hostile unit) live in
`tests.subagent.helpers`; the spy doubles in `tests.subagent.spies`. Test modules import those
directly and take only fixtures from here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from dsh.projection.unit import ClientView, ProjectionUnit
from dsh.session import Session, SessionHeader
from tests.subagent.helpers import (
    PassthroughSchema,
    Record,
    Stack,
    child_events,
    desc,
    install_hostile_subagent_unit,
    open_stack,
)
from tests.subagent.spies import SpyQuery


@pytest_asyncio.fixture
async def stack(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Stack]:
    """The stack; it carries a SQLite projection cache when the test also asks for `cache_stack`."""
    async with open_stack(tmp_path, cache="cache_stack" in request.fixturenames) as built:
        yield built


@pytest.fixture
def cache_stack(stack: Stack) -> Stack:
    """`stack` plus a projection cache (SQLite file in `tmp_path`, storage wrapped by a spy)."""
    assert stack.cache is not None
    return stack


@pytest.fixture
def author_child(stack: Stack) -> Callable[..., Awaitable[SessionHeader]]:
    """`author_child(id, header=None, events=None, cut=0)`: write a child log straight into persistence."""
    return stack.author_child


@pytest.fixture
def live_child(stack: Stack) -> Callable[..., Session]:
    """`live_child(label)`: a published origin child under `parent` with `turn/start` and `desc(label)`."""
    return stack.live_child


@pytest.fixture(name="desc")
def desc_fixture() -> Callable[..., Record]:
    """`desc(label, v=2)`: a continuable descriptor payload."""
    return desc


@pytest.fixture(name="child_events")
def child_events_fixture() -> Callable[[object], list[Record]]:
    """`child_events(d)`: a one-turn child log whose descriptor payload is `d`."""
    return child_events


@pytest.fixture
def spy_query(stack: Stack) -> SpyQuery:
    """Mount a `SpyQuery` over the stack's query service as `services.query`."""
    spy = SpyQuery(stack.query)
    stack.services.query = spy  # type: ignore[assignment]
    return spy


@pytest.fixture
def hostile_subagent_unit(stack: Stack) -> None:
    """The hostile `subagent` unit (see `install_hostile_subagent_unit`); the stack disposes it at close."""
    stack.disposers.append(install_hostile_subagent_unit(stack))


@pytest.fixture
def foreign_hostile_unit(stack: Stack) -> Iterator[ProjectionUnit[Any, Any]]:
    """Register an extra unit under another key whose `view` always raises."""

    def explode(_state: Mapping[str, Any]) -> object:
        raise RuntimeError("foreign view always raises")

    unit: ProjectionUnit[Any, Any] = ProjectionUnit(
        key="foreignHostile",
        state_version=1,
        init=dict,
        apply=lambda state, _event: state,
        state_schema=PassthroughSchema(),
        view=ClientView(render=explode, schema=PassthroughSchema()),
    )
    dispose = stack.registry.register(unit)
    yield unit
    dispose()
