"""`check_unit`: a property check that a projection unit keeps docs/projections.md#unit-contract.

Layer: testing, shipped with the library. It needs `hypothesis` (the `pydsh[testing]` extra);
`dsh.testing` imports this module only when `check_unit` is first used. Call it from an ordinary
test, never from inside another `@given` test. It folds the given events plus hypothesis-fuzzed
logs (random and malformed payloads of known and foreign types) and asserts, for every log:

* `init()` returns a plain JSON object, equal on every call;
* `apply` never raises, never returns an awaitable, always returns a plain JSON object, never
  mutates its input, and returns the same object for every type outside a declared `event_types`;
* the view (when there is one) renders without raising and passes its schema as plain JSON;
* restoring from a JSON round-tripped checkpoint taken at every prefix, through the registry's own
  `restore_floor`/`restore`, gives the live fold's final state and view.

A violation raises `AssertionError` naming the step.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any, Final

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsh.json import SAFE_INT_MAX, JsonValue, freeze, is_json
from dsh.projection.registry import ProjectionRegistry
from dsh.projection.unit import CheckpointRow, ProjectionUnit
from dsh.session.events import KNOWN_EVENT_TYPES, SessionEvent, make_event
from dsh.session.store import SessionStore

__all__ = ["check_unit"]

_FOREIGN_TYPE: Final = "x-foreign/event"


def _fail(message: str) -> AssertionError:
    return AssertionError(f"projection unit contract violated: {message}")


def _json_values() -> st.SearchStrategy[Any]:
    scalars = (
        st.none()
        | st.booleans()
        | st.integers(-SAFE_INT_MAX, SAFE_INT_MAX)
        | st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: f != 0.0 or str(f) == "0.0")
        | st.text(max_size=8)
    )
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
        max_leaves=10,
    )


def _normalise(events: Sequence[Mapping[str, Any]]) -> list[SessionEvent]:
    """Renumber `events` into a contiguous log from seq 0 (type, time and data are kept)."""
    log: list[SessionEvent] = []
    for index, event in enumerate(events):
        if type(event) is SessionEvent and event.seq == index:
            log.append(event)
            continue
        time = event.get("time", index)
        data: JsonValue = freeze(event.get("data"))
        log.append(make_event(str(event["type"]), index, time if isinstance(time, int) else index, data))
    return log


def _state(unit: ProjectionUnit[Any, Any], result: object, step: str) -> Any:
    if inspect.isawaitable(result):
        close = getattr(result, "close", None)
        if callable(close):
            close()
        raise _fail(f'"{unit.key}" {step} returned an awaitable')
    if not isinstance(result, dict):
        raise _fail(f'"{unit.key}" {step} returned {type(result).__name__}, not a JSON object')
    if not is_json(result):
        raise _fail(f'"{unit.key}" {step} returned a state that is not lossless JSON')
    return result


def _view(unit: ProjectionUnit[Any, Any], state: Any, step: str) -> JsonValue:
    view = unit.view
    if view is None:
        return None
    try:
        value = view.render(state)
    except Exception as error:
        raise _fail(f'"{unit.key}" render raised {error!r} {step}') from error
    if inspect.isawaitable(value):
        raise _fail(f'"{unit.key}" render returned an awaitable {step}')
    try:
        validated = view.schema.validate_python(value)
    except Exception as error:
        raise _fail(f'"{unit.key}" view fails its schema {step}: {error}') from error
    if not is_json(validated):
        raise _fail(f'"{unit.key}" view is not plain JSON {step}')
    return freeze(validated)


def _live_fold(unit: ProjectionUnit[Any, Any], log: Sequence[SessionEvent]) -> list[Any]:
    """Fold `log` checking every step; returns the state after each prefix (index k = k events)."""
    try:
        first = unit.init()
        again = unit.init()
    except Exception as error:
        raise _fail(f'"{unit.key}" init() raised {error!r}') from error
    state = _state(unit, first, "init()")
    if again != state:
        raise _fail(f'"{unit.key}" init() must return an equal state on every call (it must be pure)')
    _view(unit, state, "for the init state")
    states = [state]
    for event in log:
        before = orjson.dumps(state)
        try:
            result = unit.apply(state, event)
        except Exception as error:
            raise _fail(f'"{unit.key}" apply raised {error!r} at seq {event.seq} ({event.type})') from error
        if orjson.dumps(state) != before:
            raise _fail(f'"{unit.key}" apply mutated its input state at seq {event.seq}')
        declared = unit.event_types
        if declared is not None and event.type not in declared and result is not state:
            raise _fail(f'"{unit.key}" apply changed state on undeclared type "{event.type}" at seq {event.seq}')
        if result is not state:
            state = _state(unit, result, f"apply at seq {event.seq}")
        _view(unit, state, f"after seq {event.seq}")
        states.append(state)
    return states


def _check_restores(
    registry: ProjectionRegistry, unit: ProjectionUnit[Any, Any], log: Sequence[SessionEvent], states: list[Any]
) -> None:
    final_state = states[-1]
    final_view = _view(unit, final_state, "after the whole log")
    for prefix, state in enumerate(states):
        row: CheckpointRow = {"ver": unit.state_version, "seq": prefix - 1, "val": state}
        checkpoint: dict[str, CheckpointRow] = orjson.loads(orjson.dumps({unit.key: row}))
        floor = registry.restore_floor(checkpoint)
        assert floor is not None
        try:
            restored = registry.restore(checkpoint, log[floor:], floor)
        except Exception as error:
            raise _fail(f'"{unit.key}" restore from a checkpoint at seq {prefix - 1} raised {error!r}') from error
        if restored.checkpoint[unit.key]["val"] != final_state:
            raise _fail(f'"{unit.key}" state restored from a checkpoint at seq {prefix - 1} differs from the live fold')
        if unit.view is not None and restored.snapshot.get(unit.key) != final_view:
            raise _fail(f'"{unit.key}" view restored from a checkpoint at seq {prefix - 1} differs from the live fold')


def check_unit(unit: ProjectionUnit[Any, Any], events: Sequence[Mapping[str, Any]], *, max_examples: int = 50) -> None:
    """Assert that `unit` keeps the projection unit contract over `events` and fuzzed logs.

    Args:
        unit: The unit under test; it must also pass registry validation.
        events: A representative log (`SessionEvent`s or `{type, data, time?}` mappings); seqs are
            renumbered from 0. Fuzzed logs append random events and variants of these.
        max_examples: Fuzzed logs to try.

    Raises:
        AssertionError: The first contract violation found.
        ProjectionError: `PROJECTION_INVALID_UNIT` when the registry refuses the unit.
    """
    base = _normalise(events)
    registry = ProjectionRegistry(SessionStore())
    registry.register(unit)
    try:
        _check_restores(registry, unit, base, _live_fold(unit, base))
        types = sorted(KNOWN_EVENT_TYPES | (unit.event_types or frozenset()) | {_FOREIGN_TYPE})
        random_event = st.fixed_dictionaries({"type": st.sampled_from(types), "data": _json_values()})
        reused = st.sampled_from(base) if base else random_event
        extra_events = st.lists(random_event | reused, max_size=8)

        @settings(
            max_examples=max_examples,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(extra=extra_events)
        def fuzz(extra: list[Mapping[str, Any]]) -> None:
            log = _normalise([*base, *extra])
            _check_restores(registry, unit, log, _live_fold(unit, log))

        fuzz()
    finally:
        registry.close()
