"""The `subagent/descriptor` event payload (version 2): parse rules, the write snapshot, the resume fold.

Layer: subagent. The descriptor is the only durable authority for a child's mode and label. Two
folds read it, on purpose differently: the registered `subagent` projection unit (last-wins over the
whole log, used by the listing) and `fold_descriptor_for_resume` (the first descriptor of the own
suffix, used by cold resume). No third reader exists; the listing module imports neither parser.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from dsh.json import FrozenDict, FrozenList, JsonValue, NotJsonError, freeze
from dsh.session.events import SessionEvent
from dsh.subagent.errors import SubagentDescriptorError

__all__ = [
    "SUBAGENT_DESCRIPTOR_TYPE",
    "SUBAGENT_DESCRIPTOR_VERSION",
    "ContinuableDescriptor",
    "Descriptor",
    "OneShotDescriptor",
    "ToolFilter",
    "fold_descriptor_for_resume",
    "parse_descriptor",
    "snapshot_descriptor",
]

SUBAGENT_DESCRIPTOR_VERSION: Final = 2
SUBAGENT_DESCRIPTOR_TYPE: Final = "subagent/descriptor"

Mode = Literal["one-shot", "continuable"]

_ONE_SHOT_KEYS: Final = frozenset({"version", "mode", "provider", "label"})
_CONTINUABLE_KEYS: Final = _ONE_SHOT_KEYS | {"agentProvider", "agentModel", "persona", "toolFilter"}
_OPTIONAL_STRINGS: Final = (("agentProvider", "agent_provider"), ("agentModel", "agent_model"), ("persona", "persona"))


@dataclass(frozen=True, slots=True)
class ToolFilter:
    """A continuable child's tool restriction: allow and/or deny lists of tool names."""

    allow: tuple[str, ...] | None = None
    deny: tuple[str, ...] | None = None

    def to_json(self) -> FrozenDict:
        """The stored form, holding only the lists present."""
        out: dict[str, JsonValue] = {}
        if self.allow is not None:
            out["allow"] = FrozenList(self.allow)
        if self.deny is not None:
            out["deny"] = FrozenList(self.deny)
        return FrozenDict(out)


@dataclass(frozen=True, slots=True, kw_only=True)
class OneShotDescriptor:
    """A one-shot child: one delegation, exactly one result, never resumed."""

    provider: str
    label: str | None = None

    @property
    def mode(self) -> Literal["one-shot"]:
        """Always `"one-shot"`."""
        return "one-shot"

    def to_json(self) -> FrozenDict:
        """The normalized v2 payload."""
        out: dict[str, JsonValue] = {
            "version": SUBAGENT_DESCRIPTOR_VERSION,
            "mode": "one-shot",
            "provider": self.provider,
        }
        if self.label is not None:
            out["label"] = self.label
        return FrozenDict(out)


@dataclass(frozen=True, slots=True, kw_only=True)
class ContinuableDescriptor:
    """A continuable child: a durable conversation with a stable id and a required label."""

    provider: str
    label: str
    agent_provider: str | None = None
    agent_model: str | None = None
    persona: str | None = None
    tool_filter: ToolFilter | None = None

    @property
    def mode(self) -> Literal["continuable"]:
        """Always `"continuable"`."""
        return "continuable"

    def to_json(self) -> FrozenDict:
        """The normalized v2 payload."""
        out: dict[str, JsonValue] = {
            "version": SUBAGENT_DESCRIPTOR_VERSION,
            "mode": "continuable",
            "provider": self.provider,
            "label": self.label,
        }
        for wire, name in _OPTIONAL_STRINGS:
            value = getattr(self, name)
            if value is not None:
                out[wire] = value
        if self.tool_filter is not None:
            out["toolFilter"] = self.tool_filter.to_json()
        return FrozenDict(out)


Descriptor = OneShotDescriptor | ContinuableDescriptor


def _invalid(detail: str) -> SubagentDescriptorError:
    return SubagentDescriptorError(f"persisted subagent descriptor {detail}")


def _is_number(value: object) -> bool:
    return type(value) in (int, float)


def _tool_filter(value: object) -> ToolFilter:
    if not isinstance(value, Mapping):
        raise _invalid("toolFilter must be an object")
    for key in value:
        if key not in ("allow", "deny"):
            raise _invalid(f'toolFilter has unknown field "{key}"')
    lists: dict[str, tuple[str, ...]] = {}
    for key in ("allow", "deny"):
        if key in value:
            items = value[key]
            if not isinstance(items, list) or not all(type(item) is str for item in items):
                raise _invalid(f"toolFilter.{key} must be an array of strings")
            lists[key] = tuple(items)
    if not lists:
        raise _invalid("toolFilter must declare allow and/or deny")
    return ToolFilter(allow=lists.get("allow"), deny=lists.get("deny"))


def parse_descriptor(data: object) -> Descriptor | None:
    """Parse a descriptor payload by ordered rules; the first rule it breaks names the error.

    Returns:
        The normalized descriptor, or None for a version other than 2 (unsupported, not an error).

    Raises:
        SubagentDescriptorError: The payload is malformed.
    """
    if not isinstance(data, Mapping):
        raise _invalid("payload must be an object")
    version = data.get("version")
    if not _is_number(version):
        raise _invalid("version must be a number")
    if version != SUBAGENT_DESCRIPTOR_VERSION:
        return None
    mode = data.get("mode")
    if mode not in ("one-shot", "continuable"):
        raise _invalid('mode must be "one-shot" or "continuable"')
    allowed = _ONE_SHOT_KEYS if mode == "one-shot" else _CONTINUABLE_KEYS
    for key in data:
        if key not in allowed:
            raise _invalid(f'payload has unknown field "{key}"')
    provider = data.get("provider")
    if type(provider) is not str:
        raise _invalid("provider must be a string")
    label: Any = data.get("label")
    if mode == "one-shot":
        if "label" in data and type(label) is not str:
            raise _invalid("label must be a string")
        return OneShotDescriptor(provider=provider, label=label)
    if type(label) is not str:
        raise _invalid("label must be a string")
    extras: dict[str, str | None] = {}
    for wire, name in _OPTIONAL_STRINGS:
        value = data.get(wire)
        if wire in data and type(value) is not str:
            raise _invalid(f"{wire} must be a string")
        extras[name] = value
    tool_filter = _tool_filter(data["toolFilter"]) if "toolFilter" in data else None
    return ContinuableDescriptor(provider=provider, label=label, tool_filter=tool_filter, **extras)


def snapshot_descriptor(
    mode: Mode,
    *,
    provider: str,
    label: str | None = None,
    agent_provider: str | None = None,
    agent_model: str | None = None,
    persona: str | None = None,
    tool_filter: ToolFilter | Mapping[str, object] | None = None,
) -> FrozenDict:
    """Build the v2 payload for `mode`, leaving out absent (None) optional fields.

    Every given field goes into the payload, and the payload must survive a lossless JSON round trip
    and read back under `parse_descriptor`. So a payload that would later read as malformed
    is never written: `toolFilter: {}`, a continuable child without a label, or a field the arm does
    not allow (a one-shot `persona` is refused, not silently dropped).

    Args:
        mode: `"one-shot"` or `"continuable"`.
        provider: The provider that establishes the child.
        label: Required for a continuable child; optional for a one-shot one.
        agent_provider: Continuable only.
        agent_model: Continuable only.
        persona: Continuable only.
        tool_filter: Continuable only: a `ToolFilter`, or a mapping `{allow?: [str], deny?: [str]}`.

    Returns:
        The frozen payload, keys in the order version, mode, provider, label, agentProvider,
        agentModel, persona, toolFilter.

    Raises:
        NotJsonError: `subagent descriptor is not losslessly JSON-serializable`.
        SubagentDescriptorError: The payload would not parse back (same messages as the parse rules).
    """
    payload: dict[str, object] = {"version": SUBAGENT_DESCRIPTOR_VERSION, "mode": mode, "provider": provider}
    optional = (
        ("label", label),
        ("agentProvider", agent_provider),
        ("agentModel", agent_model),
        ("persona", persona),
        ("toolFilter", tool_filter.to_json() if isinstance(tool_filter, ToolFilter) else tool_filter),
    )
    payload.update({wire: value for wire, value in optional if value is not None})
    try:
        frozen = freeze(payload)
    except NotJsonError as error:
        raise NotJsonError(
            "subagent descriptor is not losslessly JSON-serializable", path=error.path, reason=error.reason
        ) from error
    # Read it back under the same rules every reader applies: what we write is what they will see.
    parse_descriptor(frozen)
    assert isinstance(frozen, FrozenDict)
    return frozen


def fold_descriptor_for_resume(own_suffix: Sequence[SessionEvent]) -> Descriptor | None:
    """The first descriptor of the own suffix (first-wins), parsed; None when there is none.

    An ancestor descriptor from a fork seed is never looked at: callers pass only the own suffix.

    Raises:
        SubagentDescriptorError: The first descriptor is malformed.
    """
    for event in own_suffix:
        if event.type == SUBAGENT_DESCRIPTOR_TYPE:
            return parse_descriptor(event.data)
    return None
