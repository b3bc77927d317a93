"""The `subagent/descriptor` payload v2: parse rules in their pinned order, the write rule, the resume fold.

Parse rules are checked one at a time and in order: the payload is an object, the version is a number
(a number other than 2 is unsupported and parses to None), the mode is known, no unknown field, then
provider, label and the optional fields. The listing imports neither descriptor reader: mode and label
reach it only through the `subagent` projection unit (docs/glossary.md#descriptor).
"""

from __future__ import annotations

import ast
import math
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dsh
import dsh.subagent.listing
from dsh.errors import DshError
from dsh.json import FrozenDict, NotJsonError, freeze
from dsh.session.events import SessionEvent, make_event
from dsh.subagent.descriptor import (
    SUBAGENT_DESCRIPTOR_TYPE,
    SUBAGENT_DESCRIPTOR_VERSION,
    ContinuableDescriptor,
    Descriptor,
    OneShotDescriptor,
    ToolFilter,
    fold_descriptor_for_resume,
    parse_descriptor,
    snapshot_descriptor,
)
from dsh.subagent.errors import SubagentDescriptorError
from tests.helpers import examples

PREFIX = "persisted subagent descriptor "


def invalid(data: object) -> str:
    """Parse `data`, expect a `SubagentDescriptorError`, and return its message without the prefix."""
    with pytest.raises(SubagentDescriptorError) as caught:
        parse_descriptor(data)
    message = str(caught.value)
    assert message.startswith(PREFIX), message
    return message[len(PREFIX) :]


def continuable(**extra: object) -> dict[str, object]:
    """A valid continuable payload plus (or overriding) `extra` fields, in insertion order."""
    return {"version": 2, "mode": "continuable", "provider": "spawn", "label": "summarize the doc", **extra}


def one_shot(**extra: object) -> dict[str, object]:
    """A valid one-shot payload plus (or overriding) `extra` fields."""
    return {"version": 2, "mode": "one-shot", "provider": "spawn", **extra}


def descriptor_event(seq: int, data: object) -> SessionEvent:
    """A `subagent/descriptor` event at `seq` carrying `data`."""
    return make_event(SUBAGENT_DESCRIPTOR_TYPE, seq, 1000 + seq, freeze(data))


def other_event(seq: int) -> SessionEvent:
    """A `turn/start` event at `seq`."""
    return make_event("turn/start", seq, 1000 + seq, freeze({"turn": 0}))


# ------------------------------------------------------------------------------ resume fold


def test_resume_fold_of_no_events_is_none() -> None:
    """The resume fold over an empty own suffix returns None."""
    assert fold_descriptor_for_resume([]) is None


def test_resume_fold_without_a_descriptor_is_none() -> None:
    """The resume fold ignores every other event type and returns None when no descriptor exists."""
    assert fold_descriptor_for_resume([other_event(0), other_event(1)]) is None


def test_resume_fold_is_first_wins() -> None:
    """The resume fold takes the first descriptor of the own suffix, unlike the last-wins unit."""
    events = [
        other_event(0),
        descriptor_event(1, continuable(label="first")),
        descriptor_event(2, continuable(label="second")),
    ]
    folded = fold_descriptor_for_resume(events)
    assert isinstance(folded, ContinuableDescriptor)
    assert folded.label == "first"


def test_resume_fold_first_descriptor_decides_even_when_bad() -> None:
    """A malformed first descriptor raises and an unsupported first one gives None, even before a valid one."""
    good = descriptor_event(2, continuable(label="later"))
    with pytest.raises(SubagentDescriptorError, match="provider must be a string"):
        fold_descriptor_for_resume([descriptor_event(1, continuable(provider=7)), good])
    assert fold_descriptor_for_resume([descriptor_event(1, {"version": 3}), good]) is None


# ------------------------------------------------------------------------------ write rule


def test_one_shot_snapshot_without_label_holds_three_fields() -> None:
    """A one-shot snapshot without a label is exactly {version, mode, provider} and parses back equal."""
    payload = snapshot_descriptor("one-shot", provider="spawn")
    assert payload == {"version": 2, "mode": "one-shot", "provider": "spawn"}
    assert list(payload) == ["version", "mode", "provider"]
    assert isinstance(payload, FrozenDict)
    parsed = parse_descriptor(payload)
    assert parsed == OneShotDescriptor(provider="spawn")
    assert parsed is not None
    assert parsed.to_json() == payload
    assert parsed.mode == "one-shot"


def test_one_shot_snapshot_with_label_adds_it() -> None:
    """A one-shot snapshot with a label adds `label`."""
    payload = snapshot_descriptor("one-shot", provider="spawn", label="quick lookup")
    assert list(payload.items()) == [
        ("version", 2),
        ("mode", "one-shot"),
        ("provider", "spawn"),
        ("label", "quick lookup"),
    ]
    assert parse_descriptor(payload) == OneShotDescriptor(provider="spawn", label="quick lookup")


def test_continuable_with_every_field_round_trips() -> None:
    """A continuable snapshot with every field round-trips through parse, toolFilter{allow,deny} included."""
    payload = snapshot_descriptor(
        "continuable",
        provider="spawn",
        label="summarize the doc",
        agent_provider="deepseek",
        agent_model="deepseek-chat",
        persona="You are terse.",
        tool_filter={"allow": ["read", "grep"], "deny": ["write"]},
    )
    assert list(payload) == [
        "version",
        "mode",
        "provider",
        "label",
        "agentProvider",
        "agentModel",
        "persona",
        "toolFilter",
    ]
    parsed = parse_descriptor(payload)
    assert parsed == ContinuableDescriptor(
        provider="spawn",
        label="summarize the doc",
        agent_provider="deepseek",
        agent_model="deepseek-chat",
        persona="You are terse.",
        tool_filter=ToolFilter(allow=("read", "grep"), deny=("write",)),
    )
    assert parsed is not None
    assert parsed.mode == "continuable"
    assert parsed.to_json() == payload
    assert orjson.loads(orjson.dumps(payload)) == payload


def test_snapshot_accepts_a_tool_filter_record_and_tuples() -> None:
    """`snapshot_descriptor` takes a `ToolFilter` record or tuples and stores JSON arrays."""
    from_record = snapshot_descriptor("continuable", provider="fork", label="l", tool_filter=ToolFilter(deny=("x",)))
    from_tuple = snapshot_descriptor("continuable", provider="fork", label="l", tool_filter={"deny": ("x",)})
    assert (
        from_record
        == from_tuple
        == {
            "version": 2,
            "mode": "continuable",
            "provider": "fork",
            "label": "l",
            "toolFilter": {"deny": ["x"]},
        }
    )


def test_snapshot_without_optional_fields_leaves_them_out() -> None:
    """A continuable snapshot with only the required fields holds version, mode, provider and label."""
    payload = snapshot_descriptor("continuable", provider="spawn", label="l")
    assert payload == {"version": 2, "mode": "continuable", "provider": "spawn", "label": "l"}


@pytest.mark.parametrize(
    "bad",
    [
        {"allow": [object()]},
        {"allow": ["ok", float("nan")]},
        {"deny": {"a", "b"}},
        {"allow": [2**60]},
    ],
    ids=["object", "nan", "set", "unsafe-int"],
)
def test_snapshot_refuses_non_json(bad: dict[str, Any]) -> None:
    """A toolFilter holding a non-JSON value is refused with `not losslessly JSON-serializable`."""
    with pytest.raises(NotJsonError, match="not losslessly JSON-serializable") as caught:
        snapshot_descriptor("continuable", provider="spawn", label="l", tool_filter=bad)
    assert str(caught.value) == "subagent descriptor is not losslessly JSON-serializable"
    assert caught.value.path.startswith("$.toolFilter")


def test_snapshot_refuses_a_non_json_label() -> None:
    """A label with a lone surrogate cannot round-trip, so the snapshot refuses it."""
    with pytest.raises(NotJsonError, match="not losslessly JSON-serializable"):
        snapshot_descriptor("one-shot", provider="spawn", label="bad \ud800")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "continuable", "tool_filter": {}}, "toolFilter must declare allow and/or deny"),
        ({"mode": "continuable", "tool_filter": ToolFilter()}, "toolFilter must declare allow and/or deny"),
        ({"mode": "continuable", "tool_filter": {"allow": "read"}}, "toolFilter.allow must be an array of strings"),
        ({"mode": "continuable", "label": None}, "label must be a string"),
        ({"mode": "one-shot", "persona": "p"}, 'payload has unknown field "persona"'),
        ({"mode": "one-shot", "tool_filter": {"allow": []}}, 'payload has unknown field "toolFilter"'),
        ({"mode": "bogus"}, 'mode must be "one-shot" or "continuable"'),
        ({"mode": "one-shot", "provider": 7}, "provider must be a string"),
    ],
    ids=[
        "empty-filter",
        "empty-filter-record",
        "filter-string",
        "no-label",
        "one-shot-persona",
        "one-shot-filter",
        "bad-mode",
        "bad-provider",
    ],
)
def test_snapshot_never_writes_what_would_read_back_malformed(kwargs: dict[str, Any], message: str) -> None:
    """A payload that would later parse as malformed is refused at write time, so no writer stores a wreck."""
    arguments: dict[str, Any] = {"provider": "spawn", "label": "l", **kwargs}
    mode = arguments.pop("mode")
    with pytest.raises(SubagentDescriptorError) as caught:
        snapshot_descriptor(mode, **arguments)
    assert str(caught.value) == PREFIX + message


# ------------------------------------------------------------------------------ parse rules


@pytest.mark.parametrize("field", ["allow", "deny"])
def test_tool_filter_with_one_list_is_accepted(field: str) -> None:
    """A toolFilter with only `allow` (or only `deny`) is accepted with just that list."""
    parsed = parse_descriptor(continuable(toolFilter={field: ["read"]}))
    assert isinstance(parsed, ContinuableDescriptor)
    assert parsed.tool_filter == ToolFilter(**{field: ("read",)})
    assert parsed.to_json()["toolFilter"] == {field: ["read"]}


def test_empty_tool_filter_lists_are_accepted() -> None:
    """An empty list is still a declared list: `{allow: []}` parses (only a missing pair is refused)."""
    parsed = parse_descriptor(continuable(toolFilter={"allow": []}))
    assert isinstance(parsed, ContinuableDescriptor)
    assert parsed.tool_filter == ToolFilter(allow=())


@pytest.mark.parametrize(
    "data",
    [
        {"version": 3, "provider": "spawn"},
        {"version": 1, "mode": "one-shot", "provider": "spawn"},
        {"version": 2.5, "mode": "bogus"},
        {"version": 0, "extra": True},
        {"version": -2},
        {"version": 999, "mode": "continuable"},
    ],
)
def test_unsupported_version_is_none(data: dict[str, object]) -> None:
    """A number other than 2 is an unsupported version: None, no error, whatever else the payload holds."""
    assert parse_descriptor(data) is None


def test_version_two_point_zero_counts_as_two() -> None:
    """The number 2.0 is version 2 and is interpreted."""
    parsed = parse_descriptor({"version": 2.0, "mode": "one-shot", "provider": "spawn"})
    assert parsed == OneShotDescriptor(provider="spawn")
    assert parsed is not None
    assert parsed.to_json()["version"] == 2


@pytest.mark.parametrize("data", ["payload", None, [], [{"version": 2}], 2, True])
def test_non_object_payload_is_malformed(data: object) -> None:
    """A payload that is not a JSON object (str, None, list, ...) fails with `payload must be an object`."""
    assert invalid(data) == "payload must be an object"


@pytest.mark.parametrize(
    "data",
    [
        {"mode": "one-shot", "provider": "spawn"},
        {"version": "2", "mode": "one-shot", "provider": "spawn"},
        {"version": True, "mode": "one-shot", "provider": "spawn"},
        {"version": False},
        {"version": None},
        {"version": [2]},
    ],
    ids=["missing", "string", "true", "false", "null", "list"],
)
def test_version_must_be_a_number(data: dict[str, object]) -> None:
    """A missing, string or boolean version fails with `version must be a number` (True is not 1)."""
    assert invalid(data) == "version must be a number"


@pytest.mark.parametrize("mode", [None, "bogus", "One-Shot", 1, ["one-shot"]])
def test_mode_must_be_known(mode: object) -> None:
    """A missing or invalid mode fails with `mode must be "one-shot" or "continuable"`."""
    data: dict[str, object] = {"version": 2, "provider": "spawn"}
    if mode is not None:
        data["mode"] = mode
    assert invalid(data) == 'mode must be "one-shot" or "continuable"'


def test_unknown_fields_are_named_in_the_message() -> None:
    """A one-shot `persona` or a continuable `extra` is an unknown field, named in the message."""
    assert invalid(one_shot(persona="x")) == 'payload has unknown field "persona"'
    assert invalid(continuable(extra=1)) == 'payload has unknown field "extra"'


@pytest.mark.parametrize("field", ["agentProvider", "agentModel", "persona", "toolFilter"])
def test_one_shot_refuses_continuable_fields(field: str) -> None:
    """Every continuable-only field is unknown on a one-shot payload."""
    assert invalid(one_shot(**{field: "x"})) == f'payload has unknown field "{field}"'


def test_first_unknown_field_in_insertion_order_wins() -> None:
    """The unknown-field check names the first unknown key in insertion order, not alphabetical order."""
    data = {"zeta": 1, "version": 2, "mode": "continuable", "alpha": 2, "provider": "spawn", "label": "l"}
    assert invalid(data) == 'payload has unknown field "zeta"'
    assert invalid(continuable(zeta=1, alpha=2)) == 'payload has unknown field "zeta"'


@pytest.mark.parametrize("provider", [7, None, True, ["spawn"], {"name": "spawn"}])
def test_provider_must_be_a_string(provider: object) -> None:
    """A bad `provider` fails with `provider must be a string`, for either arm."""
    assert invalid(one_shot(provider=provider)) == "provider must be a string"
    assert invalid(continuable(provider=provider)) == "provider must be a string"


def test_missing_provider_fails_like_a_bad_one() -> None:
    """A missing provider fails like a bad one."""
    assert invalid({"version": 2, "mode": "one-shot"}) == "provider must be a string"


@pytest.mark.parametrize("label", [7, None, False, ["l"]])
def test_label_must_be_a_string(label: object) -> None:
    """A bad continuable label and a bad (present) one-shot label both fail with `label must be a string`."""
    assert invalid(continuable(label=label)) == "label must be a string"
    assert invalid(one_shot(label=label)) == "label must be a string"


def test_continuable_label_is_required() -> None:
    """A continuable payload without a label fails with `label must be a string`."""
    data = continuable()
    del data["label"]
    assert invalid(data) == "label must be a string"


@pytest.mark.parametrize("field", ["agentProvider", "agentModel", "persona"])
@pytest.mark.parametrize("value", [7, None, True, {"x": 1}])
def test_optional_strings_must_be_strings(field: str, value: object) -> None:
    """A present `agentProvider`/`agentModel`/`persona` that is not a string is named in the message."""
    assert invalid(continuable(**{field: value})) == f"{field} must be a string"


@pytest.mark.parametrize(
    ("tool_filter", "message"),
    [
        ([], "toolFilter must be an object"),
        (["read"], "toolFilter must be an object"),
        ("read", "toolFilter must be an object"),
        (None, "toolFilter must be an object"),
        ({"except": ["x"]}, 'toolFilter has unknown field "except"'),
        ({}, "toolFilter must declare allow and/or deny"),
        ({"allow": "read"}, "toolFilter.allow must be an array of strings"),
        ({"deny": [7]}, "toolFilter.deny must be an array of strings"),
        ({"allow": ["ok", None]}, "toolFilter.allow must be an array of strings"),
        ({"deny": {"x": 1}}, "toolFilter.deny must be an array of strings"),
    ],
)
def test_tool_filter_rules(tool_filter: object, message: str) -> None:
    """toolFilter: a non-list object, only allow/deny keys, string arrays, at least one list."""
    assert invalid(continuable(toolFilter=tool_filter)) == message


def test_rule_order_is_pinned() -> None:
    """The version error beats a bad mode, and the unknown-field error beats a bad provider."""
    assert invalid({"version": "2", "mode": "bogus"}) == "version must be a number"
    assert invalid({"version": 2, "mode": "one-shot", "provider": 7, "persona": "x"}) == (
        'payload has unknown field "persona"'
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        # The object check comes first: nothing is looked at inside a non-object.
        (["version"], "payload must be an object"),
        # The version before the mode and unknown fields.
        ({"version": True, "mode": "bogus", "extra": 1}, "version must be a number"),
        # The mode before unknown fields: the arm is unknown, so no field can be judged yet.
        ({"version": 2, "mode": "bogus", "extra": 1}, 'mode must be "one-shot" or "continuable"'),
        # Unknown fields before provider and label.
        ({"version": 2, "mode": "continuable", "provider": 7, "label": 7, "x": 1}, 'payload has unknown field "x"'),
        # Provider before label.
        ({"version": 2, "mode": "continuable", "provider": None, "label": 7}, "provider must be a string"),
        # Label before the optional strings, which go agentProvider, agentModel, persona, then toolFilter.
        (continuable(label=1, agentProvider=1), "label must be a string"),
        (continuable(persona=1, agentModel=1, agentProvider=1), "agentProvider must be a string"),
        (continuable(persona=1, agentModel=1), "agentModel must be a string"),
        (continuable(toolFilter=[], persona=1), "persona must be a string"),
        # toolFilter: the unknown key before the list checks, allow before deny.
        (continuable(toolFilter={"deny": 1, "other": 1}), 'toolFilter has unknown field "other"'),
        (continuable(toolFilter={"deny": 1, "allow": 1}), "toolFilter.allow must be an array of strings"),
    ],
)
def test_rule_order_details(data: object, message: str) -> None:
    """The first failing parse rule wins, in the fixed rule order at every step."""
    assert invalid(data) == message


def test_unsupported_version_beats_every_later_rule() -> None:
    """An unsupported version returns None before mode, field or provider checks can fail."""
    assert parse_descriptor({"version": 3, "mode": "bogus", "provider": 7, "extra": [], "label": 1}) is None


def test_descriptor_error_kind() -> None:
    """A malformed descriptor raises a `SubagentDescriptorError`: a `ValueError` and a `DshError` with a stable code."""
    with pytest.raises(SubagentDescriptorError) as caught:
        parse_descriptor([])
    error = caught.value
    assert isinstance(error, ValueError)
    assert isinstance(error, DshError)
    assert error.code == "SUBAGENT_DESCRIPTOR_INVALID"


def test_parse_reads_frozen_event_data_and_copies() -> None:
    """Parsing frozen event data works, and the result is detached from a mutable input."""
    source: dict[str, Any] = continuable(toolFilter={"allow": ["read"]})
    parsed = parse_descriptor(source)
    source["label"] = "changed"
    source["toolFilter"]["allow"].append("write")
    assert isinstance(parsed, ContinuableDescriptor)
    assert parsed.label == "summarize the doc"
    assert parsed.tool_filter == ToolFilter(allow=("read",))
    assert parse_descriptor(descriptor_event(0, continuable()).data) == parse_descriptor(continuable())


def test_parsed_descriptor_is_frozen() -> None:
    """The parse result is an immutable record."""
    parsed = parse_descriptor(continuable())
    with pytest.raises(AttributeError):
        parsed.label = "other"  # type: ignore[union-attr,misc]


def test_descriptor_constants() -> None:
    """The descriptor version is 2 and the event type is `subagent/descriptor`."""
    assert SUBAGENT_DESCRIPTOR_VERSION == 2
    assert SUBAGENT_DESCRIPTOR_TYPE == "subagent/descriptor"


# ------------------------------------------------------------------------------ properties

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_strings = st.one_of(st.text(max_size=4), st.text(max_size=4), st.text(max_size=4), st.sampled_from([7, None, ["x"]]))
_tool_filters = (
    st.fixed_dictionaries(
        {}, optional={"allow": st.lists(st.text(max_size=3), max_size=2) | _json, "deny": st.lists(st.text(max_size=3))}
    )
    | _json
)
# Mostly well-formed payloads with a few wrong fields, so every rule (and success) is reached often.
_versions = st.sampled_from([2, 2, 2, 2.0, 3, "2", True])
_providers = st.sampled_from(["spawn", "spawn", "fork", 7])
_continuable_extras = {
    "agentProvider": _strings,
    "agentModel": _strings,
    "persona": _strings,
    "toolFilter": _tool_filters,
}
# Mostly well-formed payloads of each arm with a few wrong fields, so every rule (and success) is reached.
_near_descriptors = st.one_of(
    st.fixed_dictionaries(
        {"version": _versions, "mode": st.just("one-shot"), "provider": _providers}, optional={"label": _strings}
    ),
    st.fixed_dictionaries(
        {"version": _versions, "mode": st.just("continuable"), "provider": _providers, "label": _strings},
        optional=_continuable_extras,
    ),
    st.fixed_dictionaries(
        {"version": _versions, "mode": st.sampled_from(["one-shot", "continuable", "bogus"])},
        optional={"provider": _providers, "label": _strings, **_continuable_extras},
    ),
)
_with_extra = st.builds(lambda payload, extra: {**payload, "extra": extra}, _near_descriptors, _json)


def _parse_outcome(data: object) -> Descriptor | SubagentDescriptorError | None:
    """The parse result, or the descriptor error it raised (any other exception propagates)."""
    try:
        return parse_descriptor(data)
    except SubagentDescriptorError as error:
        return error


@settings(max_examples=examples(300), deadline=None)
@given(data=st.one_of(_json, _near_descriptors, _near_descriptors, _with_extra))
def test_parse_either_returns_or_raises_the_descriptor_error(data: Any) -> None:
    """For any JSON payload, parsing gives a descriptor, None, or a prefixed `SubagentDescriptorError`, nothing else."""
    outcome = _parse_outcome(data)
    if isinstance(outcome, SubagentDescriptorError):
        assert str(outcome).startswith(PREFIX)
        return
    parsed = outcome
    if parsed is None:
        assert isinstance(data, dict)
        version = data["version"]
        assert type(version) in (int, float)
        assert version != 2
        return
    # A valid payload is already normalized: its canonical form is the payload with version 2.
    assert parse_descriptor(parsed.to_json()) == parsed
    assert parsed.to_json() == {**data, "version": 2}


_names = st.text(min_size=1, max_size=6)


@settings(max_examples=examples(100), deadline=None)
@given(
    label=st.none() | _names,
    agent_provider=st.none() | _names,
    agent_model=st.none() | _names,
    persona=st.none() | _names,
    allow=st.none() | st.lists(_names, max_size=3),
    deny=st.none() | st.lists(_names, max_size=3),
)
def test_snapshot_round_trips_every_continuable_input(
    label: str | None,
    agent_provider: str | None,
    agent_model: str | None,
    persona: str | None,
    allow: list[str] | None,
    deny: list[str] | None,
) -> None:
    """Every continuable input either snapshots to a payload that parses back to it, or is refused at write time."""
    tool_filter = (
        None
        if allow is None and deny is None
        else {k: v for k, v in (("allow", allow), ("deny", deny)) if v is not None}
    )
    arguments = {"label": label, "agent_provider": agent_provider, "agent_model": agent_model, "persona": persona}
    if label is None:
        with pytest.raises(SubagentDescriptorError, match="label must be a string"):
            snapshot_descriptor("continuable", provider="spawn", tool_filter=tool_filter, **arguments)
        return
    payload = snapshot_descriptor("continuable", provider="spawn", tool_filter=tool_filter, **arguments)
    parsed = parse_descriptor(orjson.loads(orjson.dumps(payload)))
    assert isinstance(parsed, ContinuableDescriptor)
    assert (parsed.label, parsed.agent_provider, parsed.agent_model, parsed.persona) == (
        label,
        agent_provider,
        agent_model,
        persona,
    )
    expected = (
        None
        if tool_filter is None
        else ToolFilter(allow=None if allow is None else tuple(allow), deny=None if deny is None else tuple(deny))
    )
    assert parsed.tool_filter == expected
    assert not any(value is None for value in payload.values())
    assert not any(isinstance(value, float) and math.isnan(value) for value in payload.values())


# ------------------------------------------------------------------------------ source checks


def _subagent_listing_imports() -> set[str]:
    tree = ast.parse(Path(dsh.subagent.listing.__file__).read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names.add(node.module or "")
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_listing_imports_no_descriptor_reader() -> None:
    """`dsh.subagent.listing` imports neither `parse_descriptor` nor the resume fold, nor their module."""
    imported = _subagent_listing_imports()
    assert "parse_descriptor" not in imported
    assert "fold_descriptor_for_resume" not in imported
    assert not any(name.startswith("dsh.subagent.descriptor") for name in imported)
    module_names = set(vars(dsh.subagent.listing))
    assert "parse_descriptor" not in module_names
    assert "fold_descriptor_for_resume" not in module_names
