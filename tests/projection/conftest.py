"""Fixtures for the projection tests: a store, a registry, event helpers and the 03 §5 units.

`counter` counts `user/message` events (view `{"n": int}`), `hostonly` counts every event (no view),
`nullish` shows `null` until a `session/title` event, `bomb` raises on an event whose data is
`{"boom": True}`. Each fixture is a `Spy`: the unit plus counters of `apply` and `render` calls.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import TypeAdapter
from typing_extensions import TypedDict

from dsh.json import JsonValue
from dsh.projection import ClientView, ProjectionRegistry, ProjectionUnit
from dsh.session import Session, SessionEvent, SessionStore


class Count(TypedDict):
    """State and view of the counting units."""

    n: int


class Title(TypedDict, total=False):
    """State of the `nullish` unit: `{}` until a title is known."""

    title: str


COUNT = TypeAdapter(Count)
TITLE = TypeAdapter(Title)
MAYBE_STR: TypeAdapter[str | None] = TypeAdapter(str | None)
ANY_VIEW: TypeAdapter[Any] = TypeAdapter(Any)
OBJECT: TypeAdapter[dict[str, Any]] = TypeAdapter(dict[str, Any])


@dataclass
class Spy:
    """A unit and the number of times the registry called its `apply` and `render`."""

    unit: ProjectionUnit[Any, Any] = field(init=False)
    applies: int = 0
    renders: int = 0
    seen_types: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        """The unit key."""
        return self.unit.key


def counting_unit(
    key: str = "counter",
    *,
    counts: str | None = "user/message",
    version: int = 1,
    visible: bool = True,
    declared: bool = False,
) -> Spy:
    """A spied unit counting events of type `counts` (every event when None)."""
    spy = Spy()

    def init() -> Count:
        return {"n": 0}

    def apply(state: Count, event: SessionEvent) -> Count:
        spy.applies += 1
        spy.seen_types.append(event.type)
        if counts is None or event.type == counts:
            return {"n": state["n"] + 1}
        return state

    def render(state: Count) -> Count:
        spy.renders += 1
        return {"n": state["n"]}

    spy.unit = ProjectionUnit(
        key=key,
        state_version=version,
        init=init,
        apply=apply,
        state_schema=COUNT,
        view=ClientView(render=render, schema=COUNT) if visible else None,
        event_types=frozenset({counts}) if declared and counts is not None else None,
    )
    return spy


def nullish_unit(key: str = "nullish") -> Spy:
    """`{}` until a `session/title` event; the view is the title or `null` (last wins)."""
    spy = Spy()

    def apply(state: Title, event: SessionEvent) -> Title:
        spy.applies += 1
        if event.type != "session/title":
            return state
        data = event.data
        title = data.get("title") if isinstance(data, dict) else None
        return {"title": title} if isinstance(title, str) else {}

    def render(state: Title) -> str | None:
        spy.renders += 1
        return state.get("title")

    spy.unit = ProjectionUnit(
        key=key,
        state_version=1,
        init=dict,
        apply=apply,
        state_schema=TITLE,
        view=ClientView(render=render, schema=MAYBE_STR),
    )
    return spy


def bomb_unit(key: str = "bomb") -> Spy:
    """A client-visible counter of every event whose `apply` raises on data `{"boom": True}`."""
    spy = Spy()

    def apply(state: Count, event: SessionEvent) -> Count:
        spy.applies += 1
        if event.data == {"boom": True}:
            raise RuntimeError("boom")
        return {"n": state["n"] + 1}

    def render(state: Count) -> Count:
        spy.renders += 1
        return {"n": state["n"]}

    spy.unit = ProjectionUnit(
        key=key,
        state_version=1,
        init=lambda: {"n": 0},
        apply=apply,
        state_schema=COUNT,
        view=ClientView(render=render, schema=COUNT),
    )
    return spy


class Emit:
    """Appends valid events of the kinds the projection tests use."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)

    def user(self, session: Session, text: str = "hi") -> SessionEvent:
        """A `user/message` with a fresh message id."""
        data = {
            "id": f"u{next(self._ids)}",
            "role": "user",
            "content": [{"type": "text", "text": text}],
            "source": {"kind": "user"},
        }
        return session.append("user/message", data)

    def title(self, session: Session, title: str) -> SessionEvent:
        """A `session/title` event."""
        return session.append("session/title", {"title": title})

    def turn_start(self, session: Session, turn: int = 1) -> SessionEvent:
        """A `turn/start` event."""
        return session.append("turn/start", {"turn": turn})

    def turn_end(self, session: Session, turn: int = 1) -> SessionEvent:
        """A completed `turn/end` event."""
        return session.append("turn/end", {"turn": turn, "reason": {"kind": "completed"}})

    def chunk(self, session: Session, text: str = "x", turn: int = 1, step: int = 1) -> SessionEvent:
        """An `assistant/chunk` text delta."""
        return session.append("assistant/chunk", {"turn": turn, "step": step, "chunk": {"type": "text", "text": text}})

    def boom(self, session: Session) -> SessionEvent:
        """The event the `bomb` unit raises on (an opaque known type)."""
        return session.append("goal/change", {"boom": True})

    def by_kind(self, session: Session, kind: str, value: str = "v") -> SessionEvent:
        """Append one event of `kind`, one of `KINDS`."""
        handlers: dict[str, Callable[[Session], SessionEvent]] = {
            "turn/start": self.turn_start,
            "turn/end": self.turn_end,
            "user/message": lambda s: self.user(s, value),
            "session/title": lambda s: self.title(s, value),
            "assistant/chunk": lambda s: self.chunk(s, value),
            "step/start": lambda s: s.append("step/start", {"turn": 1, "step": 1}),
            "goal/change": lambda s: s.append("goal/change", {"goal": value}),
        }
        return handlers[kind](session)


KINDS: tuple[str, ...] = (
    "turn/start",
    "turn/end",
    "user/message",
    "session/title",
    "assistant/chunk",
    "step/start",
    "goal/change",
)


@pytest.fixture
def store(clock: Callable[[], int], ids: Callable[[], str]) -> SessionStore:
    """A session store with a deterministic clock and ids."""
    return SessionStore(clock=clock, id_factory=ids)


@pytest.fixture
def registry(store: SessionStore) -> Iterator[ProjectionRegistry]:
    """A registry driven by `store`, closed after the test."""
    reg = ProjectionRegistry(store)
    yield reg
    reg.close()


@pytest.fixture
def emit() -> Emit:
    """Event helpers."""
    return Emit()


@pytest.fixture
def counter() -> Spy:
    """Client-visible unit counting `user/message` events (view `{"n": int}`)."""
    return counting_unit()


@pytest.fixture
def hostonly() -> Spy:
    """Host-only unit counting every event."""
    return counting_unit("hostonly", counts=None, visible=False)


@pytest.fixture
def nullish() -> Spy:
    """Unit whose view is `null` until a `session/title` event."""
    return nullish_unit()


@pytest.fixture
def bomb() -> Spy:
    """Client-visible unit whose `apply` raises on an event with data `{"boom": True}`."""
    return bomb_unit()


@pytest.fixture
def changes(registry: ProjectionRegistry) -> list[tuple[Session, str, JsonValue, int]]:
    """Every `(session, key, value, seq)` the registry pushes."""
    seen: list[tuple[Session, str, JsonValue, int]] = []
    registry.on_changed(lambda s, k, v, q: seen.append((s, k, v, q)))
    return seen


@dataclass(frozen=True)
class Kit:
    """Stateless factories and constants for tests that build their own units (hypothesis too)."""

    counting: Callable[..., Spy] = counting_unit
    nullish: Callable[..., Spy] = nullish_unit
    bomb: Callable[..., Spy] = bomb_unit
    kinds: tuple[str, ...] = KINDS
    count_schema: TypeAdapter[Count] = COUNT
    any_schema: TypeAdapter[Any] = ANY_VIEW
    object_schema: TypeAdapter[dict[str, Any]] = OBJECT


@pytest.fixture
def kit() -> Kit:
    """Unit factories, the event kinds of random logs, and the schemas the fixtures use."""
    return Kit()
