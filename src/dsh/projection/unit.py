"""The projection unit contract and the plain records the registry and the cache exchange.

Layer: projection. A `ProjectionUnit` is a pure, synchronous fold over a session's events: `init`
gives the host state (a plain JSON object), `apply` returns the same object for an irrelevant event
or a new object for a relevant one, and an optional `ClientView` renders the state into the value
clients see. Units never raise by contract: "computed to nothing" is a value (a `{}` host state and a
JSON `null` view), never an error: the projection system has no failure channel. This
module also defines the checkpoint row, the snapshot and restore results, and the one push frame
shape carriers send. It holds types only; behaviour lives in `dsh.projection.registry`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeAlias, TypedDict, TypeVar

from dsh.json import JsonValue
from dsh.session.events import SessionEvent
from dsh.session.header import SessionId, SessionSeq

__all__ = [
    "Checkpoint",
    "CheckpointRow",
    "ClientView",
    "JsonObject",
    "ProjectionSnapshot",
    "ProjectionUnit",
    "Restored",
    "Schema",
    "push_frame",
]

JsonObject: TypeAlias = dict[str, JsonValue]
"""A host state or checkpoint value: a plain JSON object."""

T_co = TypeVar("T_co", covariant=True)
S = TypeVar("S", bound=Mapping[str, Any])
V = TypeVar("V")


class Schema(Protocol[T_co]):
    """Anything that validates a value and returns the validated value, raising otherwise.

    A pydantic `TypeAdapter` satisfies it. For views, validate into plain JSON shapes
    (`TypedDict`, `Literal`, `None` unions), never `BaseModel` instances: the validated value is what
    clients receive and it must survive JSON unchanged.
    """

    def validate_python(self, value: object, /) -> T_co:
        """Return the validated value or raise."""


@dataclass(frozen=True, slots=True)
class ClientView(Generic[S, V]):
    """How a unit's host state is shown to clients (immutable; compared by value).

    Attributes:
        render: Host state → client value; pure, synchronous, never raises; `None` means "no value".
        schema: Validates every rendered value before it is served or pushed.
    """

    render: Callable[[S], V]
    schema: Schema[V]


@dataclass(frozen=True, slots=True)
class ProjectionUnit(Generic[S, V]):
    """One registered fold (docs/projections.md#unit-contract); immutable, compared by value.

    Attributes:
        key: Non-empty registry key; also the client-visible key when `view` is set.
        state_version: Non-negative int; bump it when the state shape or fold semantics change, so
            older checkpoint rows are ignored (never migrated).
        init: The initial host state, a plain JSON object (never mutated, so it may be shared).
        apply: `(state, event) -> state`; never mutates its input; returns the same object when the
            event is irrelevant. Identity (`is`) is how the registry detects change.
        state_schema: Parses persisted state (a checkpoint `val`) into a fresh state, or raises; the
            only place a unit may raise by design.
        view: The client view; `None` makes the unit host-only (checkpointed, never shown).
        event_types: A promise that `apply` returns the same object for every other type. A read
            optimisation only: results, watermarks and pushes equal those of an undeclared twin.
    """

    key: str
    state_version: int
    init: Callable[[], S]
    apply: Callable[[S, SessionEvent], S]
    state_schema: Schema[S]
    view: ClientView[S, V] | None = None
    event_types: frozenset[str] | None = None


class CheckpointRow(TypedDict):
    """One unit's durable checkpoint: `{ver, seq, val}` (the cache stores these verbatim)."""

    ver: int
    """The unit's `state_version` at fold time."""
    seq: int
    """The last folded seq; -1 for the empty log."""
    val: JsonObject
    """The host state, as a detached copy."""


Checkpoint: TypeAlias = Mapping[str, CheckpointRow]
"""Checkpoint rows by unit key."""


@dataclass(frozen=True, slots=True)
class ProjectionSnapshot:
    """One consistent cut of client-visible values.

    Attributes:
        as_of_seq: The last seq every value reflects; -1 for an empty log.
        values: Client-visible keys only, each a validated view (`None` for "no value").
    """

    as_of_seq: int
    values: Mapping[str, JsonValue]

    def get(self, key: str) -> JsonValue:
        """The value of `key`; `None` both for a `null` value and for an absent key."""
        return self.values.get(key)

    def to_json(self) -> dict[str, object]:
        """The wire form `{"asOfSeq": n, "values": {...}}`; `null` values are kept."""
        return {"asOfSeq": self.as_of_seq, "values": dict(self.values)}


@dataclass(frozen=True, slots=True)
class Restored:
    """The result of a cold fold: the snapshot and refreshed checkpoint rows of the selected units."""

    snapshot: ProjectionSnapshot
    checkpoint: dict[str, CheckpointRow]


def push_frame(session_id: SessionId, key: str, value: JsonValue, seq: SessionSeq) -> dict[str, object]:
    """The push frame carriers send for one change (docs/projections.md#push-frames).

    Exactly `{"type": "session/projection", "sessionId", "key", "value", "seq"}`; `value` is kept
    even when it is `None`, so a serialised frame carries `"value":null` and resets a stale client.
    """
    return {"type": "session/projection", "sessionId": session_id, "key": key, "value": value, "seq": seq}


# Shown under the name users import (docs/architecture.md#public-names).
ClientView.__module__ = "dsh"
ProjectionSnapshot.__module__ = "dsh"
ProjectionUnit.__module__ = "dsh"
CheckpointRow.__module__ = "dsh.projection"
Restored.__module__ = "dsh.projection"
Schema.__module__ = "dsh.projection"
