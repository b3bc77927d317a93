"""Registration: validation, version conflicts, refcounted sharing and removal.

See docs/projections.md#registry.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from dsh.errors import ConfigError
from dsh.projection import ClientView, ProjectionError, ProjectionRegistry, ProjectionUnit
from dsh.session import SessionStore


def test_same_key_and_version_share_one_refcounted_unit(
    registry: ProjectionRegistry, store: SessionStore, counter, kit, emit
) -> None:
    """Two registrations share the first unit; the key survives the first disposer (run twice)."""
    twin = kit.counting()
    first = registry.register(counter.unit)
    second = registry.register(twin.unit)
    s = store.create()
    emit.user(s)
    assert twin.applies == 0  # the first definition is the one that folds
    first()
    first()
    assert registry.keys() == ("counter",)
    assert registry.snapshot(s).values == {"counter": {"n": 1}}
    second()
    assert registry.keys() == ()
    assert registry.state_of(s, "counter") is None
    assert registry.snapshot(s).values == {}
    assert registry.checkpoint(s) == {}


def test_version_conflict_has_the_exact_message(registry: ProjectionRegistry, counter, kit) -> None:
    """The same key at another stateVersion is refused with the exact text."""
    registry.register(counter.unit)
    with pytest.raises(ProjectionError) as info:
        registry.register(kit.counting(version=2).unit)
    assert info.value.code == "PROJECTION_VERSION_CONFLICT"
    assert info.value.key == "counter"
    assert info.value.message == (
        'session projection key "counter" is already registered at stateVersion 1; '
        "refusing to share it with stateVersion 2"
    )


def test_visibility_conflict_uses_the_same_code(registry: ProjectionRegistry, counter, kit) -> None:
    """Same key and version but different client visibility is a version conflict too."""
    registry.register(counter.unit)
    with pytest.raises(ProjectionError) as info:
        registry.register(kit.counting(visible=False).unit)
    assert info.value.code == "PROJECTION_VERSION_CONFLICT"
    assert registry.keys() == ("counter",)


@pytest.mark.parametrize(("version", "shown"), [(-1, "-1"), (1.5, "1.5"), (True, "True"), ("1", "'1'")])
def test_invalid_state_versions_are_refused(registry: ProjectionRegistry, counter, version, shown) -> None:
    """stateVersion -1, 1.5, True (and a string) → PROJECTION_INVALID_UNIT with the exact text."""
    unit = dataclasses.replace(counter.unit, state_version=version)
    with pytest.raises(ProjectionError) as info:
        registry.register(unit)
    assert info.value.code == "PROJECTION_INVALID_UNIT"
    assert (
        info.value.message == f'session projection "counter" stateVersion must be a non-negative integer, got {shown}'
    )
    assert registry.keys() == ()


@pytest.mark.parametrize(
    "change",
    [
        {"key": ""},
        {"key": 3},
        {"init": None},
        {"apply": "not callable"},
        {"state_schema": dict},
        {"view": "render"},
        {"view": ClientView(render=lambda s: s, schema=None)},  # type: ignore[arg-type]
        {"event_types": ["user/message"]},
        {"event_types": frozenset({""})},
    ],
)
def test_malformed_units_are_refused(registry: ProjectionRegistry, counter, change: dict[str, Any]) -> None:
    """Every malformed field of a unit is refused with PROJECTION_INVALID_UNIT at registration."""
    with pytest.raises(ProjectionError) as info:
        registry.register(dataclasses.replace(counter.unit, **change))
    assert info.value.code == "PROJECTION_INVALID_UNIT"


def test_non_units_are_refused(registry: ProjectionRegistry) -> None:
    """Registering something that is not a ProjectionUnit is PROJECTION_INVALID_UNIT."""
    with pytest.raises(ProjectionError) as info:
        registry.register({"key": "x"})  # type: ignore[arg-type]
    assert info.value.code == "PROJECTION_INVALID_UNIT"


def test_state_version_zero_is_valid(registry: ProjectionRegistry, counter) -> None:
    """A stateVersion of 0 is a valid version."""
    registry.register(dataclasses.replace(counter.unit, state_version=0))
    assert registry.keys() == ("counter",)


def test_reregistered_key_refolds_from_the_log(
    registry: ProjectionRegistry, store: SessionStore, counter, emit
) -> None:
    """A removed key's cells are dropped; registering it again refolds from the log."""
    dispose = registry.register(counter.unit)
    s = store.create()
    emit.user(s)
    emit.user(s)
    assert registry.snapshot(s).values == {"counter": {"n": 2}}
    dispose()
    emit.user(s)
    assert counter.applies == 2
    registry.register(counter.unit)
    assert registry.snapshot(s).values == {"counter": {"n": 3}}
    assert counter.applies == 5


def test_keys_and_view_keys_follow_registration_order(
    registry: ProjectionRegistry, counter, hostonly, nullish, kit
) -> None:
    """keys() lists every key and view_keys() the client-visible ones, in registration order."""
    registry.register(nullish.unit)
    registry.register(hostonly.unit)
    dispose = registry.register(kit.counting("gone").unit)
    registry.register(counter.unit)
    dispose()
    registry.register(kit.counting("gone").unit)
    assert registry.keys() == ("nullish", "hostonly", "counter", "gone")
    assert registry.view_keys() == ("nullish", "counter", "gone")


def test_unit_removed_by_a_listener_gets_no_pending_push(
    registry: ProjectionRegistry, store: SessionStore, counter, kit, emit
) -> None:
    """A unit unregistered by a change listener during an event's pushes is not pushed afterwards."""
    later = kit.counting("later")
    registry.register(counter.unit)
    dispose_later = registry.register(later.unit)
    pushed: list[str] = []

    def listener(session: object, key: str, value: object, seq: int) -> None:
        pushed.append(key)
        dispose_later()

    registry.on_changed(listener)
    s = store.create()
    emit.user(s)
    assert registry.keys() == ("counter",)
    assert pushed == ["counter"]


def test_registry_requires_a_store() -> None:
    """A registry built without a session store is a ConfigError."""
    with pytest.raises(ConfigError):
        ProjectionRegistry(None)  # type: ignore[arg-type]


def test_keys_must_be_a_sequence_not_a_string(registry: ProjectionRegistry, store: SessionStore, counter) -> None:
    """Passing a bare string as `keys` is a TypeError rather than a silent per-character selection."""
    registry.register(counter.unit)
    with pytest.raises(TypeError):
        registry.snapshot(store.create(), "counter")


def test_generic_unit_type_is_usable(registry: ProjectionRegistry, kit) -> None:
    """A ProjectionUnit parameterised by TypedDict state and view types registers and reads."""
    unit: ProjectionUnit[dict[str, Any], Any] = ProjectionUnit(
        key="typed", state_version=3, init=dict, apply=lambda s, e: s, state_schema=kit.object_schema
    )
    registry.register(unit)
    assert registry.keys() == ("typed",)
