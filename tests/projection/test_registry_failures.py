"""Containment: units and listeners that break the contract anyway.

See docs/projections.md#containment.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from dsh.projection import ClientView, ProjectionError, ProjectionRegistry, ProjectionUnit
from dsh.session import SessionEvent, SessionStore

_REGISTRY_LOGGER = "dsh.projection.registry"


def _unit(kit, key: str, **overrides: Any) -> ProjectionUnit[Any, Any]:
    fields: dict[str, Any] = {
        "key": key,
        "state_version": 1,
        "init": lambda: {"n": 0},
        "apply": lambda s, e: {"n": s["n"] + 1},
        "state_schema": kit.object_schema,
        "view": ClientView(render=lambda s: {"n": s["n"]}, schema=kit.any_schema),
    }
    fields.update(overrides)
    return ProjectionUnit(**fields)


def test_a_bad_view_fails_only_readers_that_select_it(
    registry: ProjectionRegistry, store: SessionStore, counter, kit, emit
) -> None:
    """A render returning a set: snapshot(['counter']) works, snapshot() names the bad key."""
    registry.register(counter.unit)
    registry.register(_unit(kit, "setty", view=ClientView(render=lambda s: {1, 2}, schema=kit.any_schema)))
    s = store.create()
    emit.user(s)
    assert registry.snapshot(s, ["counter"]).values == {"counter": {"n": 1}}
    with pytest.raises(ProjectionError) as info:
        registry.snapshot(s)
    assert info.value.code == "PROJECTION_INVALID_VIEW"
    assert info.value.key == "setty"
    assert '"setty"' in info.value.message


@pytest.mark.parametrize(
    "view",
    [
        "raises",
        "schema",
        "awaitable",
        "nan",
    ],
)
def test_invalid_views_raise_invalid_view_and_never_fail_the_cell(
    registry: ProjectionRegistry, store: SessionStore, kit, emit, view: str, caplog
) -> None:
    """A render that raises, returns an awaitable, fails its schema or is not JSON: INVALID_VIEW, cell intact."""

    def raising(state: dict[str, Any]) -> object:
        raise RuntimeError("render broke")

    async def awaitable(state: dict[str, Any]) -> object:
        return state

    renders = {
        "raises": ClientView(render=raising, schema=kit.any_schema),
        "schema": ClientView(render=lambda s: {"n": "many"}, schema=kit.count_schema),
        "awaitable": ClientView(render=awaitable, schema=kit.any_schema),
        "nan": ClientView(render=lambda s: {"n": float("nan")}, schema=kit.any_schema),
    }
    registry.register(_unit(kit, "bad", view=renders[view]))
    pushed: list[object] = []
    registry.on_changed(lambda s, k, v, q: pushed.append(v))
    s = store.create()
    with caplog.at_level(logging.ERROR, logger=_REGISTRY_LOGGER):
        emit.user(s)
    assert pushed == []
    assert any('"bad" produced an invalid view' in r.getMessage() for r in caplog.records)
    with pytest.raises(ProjectionError) as info:
        registry.snapshot(s)
    assert info.value.code == "PROJECTION_INVALID_VIEW"
    assert registry.state_of(s, "bad") == {"n": 1}
    assert registry.checkpoint(s)["bad"]["val"] == {"n": 1}


def test_a_raising_unit_is_disabled_for_that_session_only(
    registry: ProjectionRegistry, store: SessionStore, bomb, counter, emit, changes, caplog
) -> None:
    """bomb raises: appends succeed, counter counts, one error logged, bomb's readers fail."""
    registry.register(bomb.unit)
    registry.register(counter.unit)
    s = store.create()
    other = store.create()
    with caplog.at_level(logging.ERROR, logger=_REGISTRY_LOGGER):
        emit.user(s)
        boom = emit.boom(s)
        emit.user(s)
        emit.user(s)
        emit.user(other)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in errors] == [
        f'session projection "bomb" raised on session "{s.id}" at seq {boom.seq}; unit disabled for this session'
    ]
    assert errors[0].exc_info is not None
    assert registry.snapshot(s, ["counter"]).values == {"counter": {"n": 3}}
    with pytest.raises(ProjectionError) as info:
        registry.state_of(s, "bomb")
    assert info.value.code == "PROJECTION_UNIT_FAILED"
    assert info.value.key == "bomb"
    assert info.value.session_id == s.id
    assert s.id in info.value.message
    with pytest.raises(ProjectionError) as info:
        registry.snapshot(s)
    assert info.value.code == "PROJECTION_UNIT_FAILED"
    assert list(registry.checkpoint(s)) == ["counter"]
    applies = bomb.applies
    emit.user(s)
    assert bomb.applies == applies  # a failed cell is never advanced again
    assert [c[1] for c in changes if c[0] is s and c[1] == "bomb"] == ["bomb"]  # only the pre-boom push
    assert registry.snapshot(other).values == {"bomb": {"n": 1}, "counter": {"n": 1}}


def test_removing_the_key_clears_the_failure(registry: ProjectionRegistry, store: SessionStore, bomb, emit) -> None:
    """The last disposer clears a failed cell; registering again refolds (and fails again on the same log)."""
    dispose = registry.register(bomb.unit)
    s = store.create()
    emit.user(s)
    emit.boom(s)
    dispose()
    assert registry.state_of(s, "bomb") is None
    t = store.create()
    emit.user(t)
    registry.register(bomb.unit)
    assert registry.state_of(t, "bomb") == {"n": 1}
    with pytest.raises(ProjectionError):
        registry.state_of(s, "bomb")


def test_a_coroutine_apply_fails_the_cell_without_a_warning(
    registry: ProjectionRegistry, store: SessionStore, counter, kit, emit, caplog
) -> None:
    """An async apply: the cell fails, the coroutine is closed (filterwarnings=error proves no warning)."""

    async def apply(state: dict[str, Any], event: SessionEvent) -> dict[str, Any]:
        return state

    registry.register(_unit(kit, "async", apply=apply))
    registry.register(counter.unit)
    s = store.create()
    with caplog.at_level(logging.ERROR, logger=_REGISTRY_LOGGER):
        emit.user(s)
    assert any('"async" raised on session' in r.getMessage() for r in caplog.records)
    with pytest.raises(ProjectionError) as info:
        registry.state_of(s, "async")
    assert info.value.code == "PROJECTION_UNIT_FAILED"
    assert registry.snapshot(s, ["counter"]).values == {"counter": {"n": 1}}


def test_a_coroutine_apply_in_a_lazy_build_is_closed_too(
    registry: ProjectionRegistry, store: SessionStore, kit, emit
) -> None:
    """A lazy build over existing events contains an async apply the same way as drive."""

    async def apply(state: dict[str, Any], event: SessionEvent) -> dict[str, Any]:
        return state

    s = store.create()
    emit.user(s)
    registry.register(_unit(kit, "async", apply=apply))
    with pytest.raises(ProjectionError) as info:
        registry.snapshot(s)
    assert info.value.code == "PROJECTION_UNIT_FAILED"


@pytest.mark.parametrize("init", ["raises", "list", "coroutine"])
def test_a_broken_init_fails_the_cell(
    registry: ProjectionRegistry, store: SessionStore, kit, emit, init: str, caplog
) -> None:
    """An init that raises, returns a non-object or a coroutine fails the cell, logged once."""

    def raising() -> dict[str, Any]:
        raise ValueError("no init")

    async def coroutine() -> dict[str, Any]:
        return {}

    inits = {"raises": raising, "list": list, "coroutine": coroutine}
    registry.register(_unit(kit, "broken", init=inits[init]))
    s = store.create()
    with caplog.at_level(logging.ERROR, logger=_REGISTRY_LOGGER):
        emit.user(s)
        emit.user(s)
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert messages == [
        f'session projection "broken" raised on session "{s.id}" at seq 0; unit disabled for this session'
    ]
    assert registry.checkpoint(s) == {}


def test_a_non_object_apply_result_fails_the_cell(registry: ProjectionRegistry, store: SessionStore, kit, emit) -> None:
    """apply returning something other than a JSON object breaks the state contract and fails the cell."""
    registry.register(_unit(kit, "listy", apply=lambda s, e: [1]))
    s = store.create()
    emit.user(s)
    with pytest.raises(ProjectionError) as info:
        registry.state_of(s, "listy")
    assert info.value.code == "PROJECTION_UNIT_FAILED"


def test_a_raising_listener_is_contained(
    registry: ProjectionRegistry, store: SessionStore, counter, emit, caplog
) -> None:
    """A raising listener is logged; the append returns and the second listener is still called."""
    registry.register(counter.unit)

    def bad(*args: object) -> None:
        raise RuntimeError("listener broke")

    seen: list[object] = []
    registry.on_changed(bad)
    registry.on_changed(lambda s, k, v, q: seen.append(v))
    s = store.create()
    with caplog.at_level(logging.ERROR, logger=_REGISTRY_LOGGER):
        event = emit.user(s)
    assert event.seq == 0
    assert seen == [{"n": 1}]
    records = [r for r in caplog.records if r.getMessage().startswith("session projection listener raised: ")]
    assert len(records) == 1
    assert "listener broke" in records[0].getMessage()


def test_a_listener_returning_a_coroutine_is_closed(
    registry: ProjectionRegistry, store: SessionStore, counter, emit, caplog
) -> None:
    """A listener that returns a coroutine is contained: closed unawaited and logged."""
    registry.register(counter.unit)

    async def listener(*args: object) -> None:
        return None

    registry.on_changed(listener)  # type: ignore[arg-type]
    s = store.create()
    with caplog.at_level(logging.ERROR, logger=_REGISTRY_LOGGER):
        emit.user(s)
    assert any(r.getMessage().startswith("session projection listener raised: ") for r in caplog.records)


def test_a_listener_that_appends_is_refused_and_contained(
    registry: ProjectionRegistry, store: SessionStore, counter, emit, caplog
) -> None:
    """Listeners must not append: the store refuses the re-entrant append and the registry logs it."""
    registry.register(counter.unit)
    registry.on_changed(lambda s, k, v, q: s.append("session/title", {"title": "x"}))
    s = store.create()
    with caplog.at_level(logging.ERROR, logger=_REGISTRY_LOGGER):
        emit.user(s)
    assert s.seq == 1
    assert any("APPEND" in r.getMessage() or "reenter" in r.getMessage() for r in caplog.records)


def test_a_unit_raising_inside_an_unnotified_gap_is_contained(
    registry: ProjectionRegistry, store: SessionStore, bomb, emit, caplog
) -> None:
    """A raise while drive catches up events appended before publication names the raising event's seq."""
    registry.register(bomb.unit)
    s = store.prepare()
    registry.snapshot(s)
    emit.user(s)
    boom = emit.boom(s)
    store.publish(s)
    with caplog.at_level(logging.ERROR, logger=_REGISTRY_LOGGER):
        emit.user(s)
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert messages == [
        f'session projection "bomb" raised on session "{s.id}" at seq {boom.seq}; unit disabled for this session'
    ]


@pytest.mark.parametrize("broken", ["init-raises", "init-list", "apply-coroutine", "apply-list"])
def test_restore_reports_contract_breaches_as_unit_failed(
    registry: ProjectionRegistry, store: SessionStore, kit, emit, broken: str
) -> None:
    """In a cold fold, a raising or non-object init/apply of a selected unit is PROJECTION_UNIT_FAILED."""

    def raising() -> dict[str, Any]:
        raise ValueError("no init")

    async def coroutine(state: dict[str, Any], event: SessionEvent) -> dict[str, Any]:
        return state

    overrides: dict[str, dict[str, Any]] = {
        "init-raises": {"init": raising},
        "init-list": {"init": list},
        "apply-coroutine": {"apply": coroutine},
        "apply-list": {"apply": lambda s, e: [s]},
    }
    registry.register(_unit(kit, "broken", **overrides[broken]))
    s = store.prepare()
    emit.user(s)
    with pytest.raises(ProjectionError) as info:
        registry.restore(None, s.events, 0)
    assert info.value.code == "PROJECTION_UNIT_FAILED"
    assert info.value.key == "broken"
