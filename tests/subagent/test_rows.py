"""Catalog row shapes and their JSON form (docs/catalog.md#rows-on-the-wire), and the subagent error kinds.

Key order and the absent `label`, the strictness of `from_json`, and the sample wire lines byte for
byte. On the error side: `SubagentError` is a `DshError` with a stable code from a closed set
(docs/errors.md#codes), and the retired code `SUBAGENT_CONTROL_SESSION_QUERY_UNAVAILABLE` appears
nowhere in `dsh`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dsh
from dsh.errors import DshError
from dsh.session.header import SessionId
from dsh.subagent.errors import SubagentDepthError, SubagentDescriptorError, SubagentError
from dsh.subagent.rows import (
    SubagentChildRow,
    SubagentDescendantEntry,
    SubagentDiagnosticRow,
    entry_from_json,
)
from tests.helpers import examples

# The four sample rows of the wire format (child, unlabelled one-shot, diagnostic, descendant), byte for byte.
SAMPLE_LINES = [
    b'{"kind":"child","id":"c1","mode":"continuable","label":"summarize the doc",'
    b'"activity":"inactive","hasChildren":false}',
    b'{"kind":"child","id":"c2","mode":"one-shot","activity":"running","hasChildren":true}',
    b'{"kind":"diagnostic","id":"c3","reason":"corrupt"}',
    b'{"kind":"child","id":"g1","mode":"continuable","label":"nested leaf","activity":"running",'
    b'"hasChildren":false,"parentId":"c1","depth":2}',
]


def child(**changes: Any) -> dict[str, Any]:
    """A valid continuable child row's JSON with `changes` applied (a None value deletes the key)."""
    data: dict[str, Any] = {
        "kind": "child",
        "id": "c1",
        "mode": "continuable",
        "label": "summarize the doc",
        "activity": "inactive",
        "hasChildren": False,
    }
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return data


# ------------------------------------------------------------------------------ serialization


def test_child_row_key_order() -> None:
    """A child row serializes as kind, id, mode, label, activity, hasChildren, in that order."""
    row = SubagentChildRow(SessionId("c1"), "continuable", "inactive", False, label="summarize the doc")
    assert list(row.to_json()) == ["kind", "id", "mode", "label", "activity", "hasChildren"]
    assert orjson.dumps(row.to_json()) == SAMPLE_LINES[0]


def test_unlabelled_one_shot_leaves_label_out() -> None:
    """An unlabelled one-shot row has no `label` key at all (never `null`)."""
    row = SubagentChildRow(SessionId("c2"), "one-shot", "running", True)
    assert row.to_json() == {
        "kind": "child",
        "id": "c2",
        "mode": "one-shot",
        "activity": "running",
        "hasChildren": True,
    }
    assert "label" not in row.to_json()
    assert orjson.dumps(row.to_json()) == SAMPLE_LINES[1]


def test_continuable_row_without_label_is_rejected() -> None:
    """`from_json` of a continuable row without `label` raises, and so does the constructor."""
    with pytest.raises(ValueError, match="label"):
        entry_from_json(child(label=None))
    with pytest.raises(ValueError, match="label"):
        SubagentChildRow.from_json(child(label=None))
    with pytest.raises(ValueError, match="requires a label"):
        SubagentChildRow(SessionId("c1"), "continuable", "inactive", False)


def test_unsupported_diagnostic_is_accepted() -> None:
    """`{"kind":"diagnostic","id":"x","reason":"unsupported"}` parses, although the listing never makes it."""
    data = {"kind": "diagnostic", "id": "x", "reason": "unsupported"}
    row = entry_from_json(data)
    assert row == SubagentDiagnosticRow(SessionId("x"), "unsupported")
    assert SubagentDiagnosticRow.from_json(data) == row
    assert row.to_json() == data


def test_sample_lines_round_trip() -> None:
    """Each sample wire line parses and serializes back to the same bytes."""
    for line in SAMPLE_LINES[:3]:
        assert orjson.dumps(entry_from_json(orjson.loads(line)).to_json()) == line
    descendant = SubagentDescendantEntry.from_json(orjson.loads(SAMPLE_LINES[3]))
    assert descendant.parent_id == "c1"
    assert descendant.depth == 2
    assert descendant.entry == SubagentChildRow(SessionId("g1"), "continuable", "running", False, label="nested leaf")
    assert orjson.dumps(descendant.to_json()) == SAMPLE_LINES[3]


def test_diagnostic_row_shape() -> None:
    """A diagnostic row is exactly `{kind, id, reason}`: no mode, label or hasChildren."""
    row = SubagentDiagnosticRow(SessionId("c3"), "corrupt")
    assert list(row.to_json()) == ["kind", "id", "reason"]
    assert orjson.dumps(row.to_json()) == SAMPLE_LINES[2]
    assert row.kind == "diagnostic"


def test_descendant_entry_appends_parent_and_depth() -> None:
    """A descendant row is the entry's JSON followed by `parentId` then `depth`."""
    entry = SubagentDescendantEntry(SubagentDiagnosticRow(SessionId("d"), "unavailable"), SessionId("p"), 1)
    assert list(entry.to_json()) == ["kind", "id", "reason", "parentId", "depth"]
    assert SubagentDescendantEntry.from_json(entry.to_json()) == entry


# ------------------------------------------------------------------------------ from_json strictness


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (child(extra=1), 'unknown field "extra"'),
        (child(seq=1), 'unknown field "seq"'),
        (child(parentId="p"), 'unknown field "parentId"'),
        (child(kind="grandchild"), "kind"),
        (child(kind=None), "kind"),
        (child(mode="forever"), "mode"),
        (child(mode=None), "mode"),
        (child(activity="idle"), "activity"),
        (child(activity="ready"), "activity"),
        (child(activity=None), "activity"),
        (child(hasChildren=None), "hasChildren"),
        (child(hasChildren=1), "hasChildren"),
        (child(hasChildren="false"), "hasChildren"),
        (child(id=""), "id"),
        (child(id=7), "id"),
        (child(id=None), "id"),
        (child(label=7), "label"),
        (child(label=["x"]), "label"),
        ({"kind": "diagnostic", "id": "x", "reason": "broken"}, "reason"),
        ({"kind": "diagnostic", "id": "x"}, "reason"),
        ({"kind": "diagnostic", "id": "x", "reason": "corrupt", "hasChildren": False}, 'unknown field "hasChildren"'),
        ({"kind": "diagnostic", "id": "x", "reason": "corrupt", "label": "leak"}, 'unknown field "label"'),
        ({"kind": "diagnostic", "id": "", "reason": "corrupt"}, "id"),
        ([], "object"),
        ("row", "object"),
        (None, "object"),
    ],
)
def test_from_json_is_strict(data: Any, match: str) -> None:
    """`from_json` rejects unknown keys, kinds, modes, activities and reasons, and wrongly typed fields."""
    with pytest.raises(ValueError, match=match):
        entry_from_json(data)


def test_from_json_rejects_a_null_label() -> None:
    """A present `label` must be a string: `"label": null` is not the wire form of an absent label."""
    with pytest.raises(ValueError, match="label"):
        entry_from_json(child(mode="one-shot") | {"label": None})


def test_kind_specific_parsers_refuse_the_other_kind() -> None:
    """`SubagentChildRow.from_json` refuses a diagnostic row and `SubagentDiagnosticRow.from_json` a child row."""
    with pytest.raises(ValueError, match="kind"):
        SubagentChildRow.from_json({"kind": "diagnostic", "id": "x", "mode": "one-shot"})
    with pytest.raises(ValueError, match="kind"):
        SubagentDiagnosticRow.from_json({"kind": "child", "id": "x"})
    with pytest.raises(ValueError, match="unknown field"):
        SubagentDiagnosticRow.from_json(child())


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (orjson.loads(SAMPLE_LINES[3]) | {"depth": 0}, "depth"),
        (orjson.loads(SAMPLE_LINES[3]) | {"depth": True}, "depth"),
        (orjson.loads(SAMPLE_LINES[3]) | {"depth": 1.0}, "depth"),
        (orjson.loads(SAMPLE_LINES[3]) | {"parentId": ""}, "parentId"),
        (orjson.loads(SAMPLE_LINES[2]), "parentId"),
        (orjson.loads(SAMPLE_LINES[3]) | {"extra": 1}, 'unknown field "extra"'),
    ],
)
def test_descendant_from_json_is_strict(data: dict[str, Any], match: str) -> None:
    """A descendant row needs a non-empty `parentId` and an integer depth >= 1, and no unknown keys."""
    with pytest.raises(ValueError, match=match):
        SubagentDescendantEntry.from_json(data)


@pytest.mark.parametrize(
    "build",
    [
        lambda: SubagentChildRow(SessionId("x"), "forever", "running", False),  # type: ignore[arg-type]
        lambda: SubagentChildRow(SessionId("x"), "one-shot", "idle", False),  # type: ignore[arg-type]
        lambda: SubagentChildRow(SessionId("x"), "one-shot", "running", 1),  # type: ignore[arg-type]
        lambda: SubagentChildRow(SessionId(""), "one-shot", "running", False),
        lambda: SubagentChildRow(SessionId("x"), "one-shot", "running", False, label=7),  # type: ignore[arg-type]
        lambda: SubagentChildRow(SessionId("x"), "one-shot", "running", False, kind="diagnostic"),  # type: ignore[arg-type]
        lambda: SubagentDiagnosticRow(SessionId("x"), "broken"),  # type: ignore[arg-type]
        lambda: SubagentDiagnosticRow(SessionId("x"), "corrupt", kind="child"),  # type: ignore[arg-type]
        lambda: SubagentDescendantEntry(SubagentDiagnosticRow(SessionId("x"), "corrupt"), SessionId("p"), 0),
        lambda: SubagentDescendantEntry(SubagentDiagnosticRow(SessionId("x"), "corrupt"), SessionId(""), 1),
        lambda: SubagentDescendantEntry({"kind": "child"}, SessionId("p"), 1),  # type: ignore[arg-type]
    ],
)
def test_records_validate_on_construction(build: Any) -> None:
    """Row records refuse values outside their vocabulary, so a bad row can never reach a consumer."""
    with pytest.raises(ValueError):
        build()


def test_rows_are_frozen() -> None:
    """Row records are immutable."""
    row = SubagentChildRow(SessionId("x"), "one-shot", "running", False)
    with pytest.raises(AttributeError):
        row.label = "changed"  # type: ignore[misc]


_ids = st.text(min_size=1, max_size=8)
_child_rows = st.builds(
    lambda row_id, mode, activity, has_children, label: SubagentChildRow(
        SessionId(row_id), mode, activity, has_children, label=label if mode == "one-shot" else (label or "l")
    ),
    _ids,
    st.sampled_from(["one-shot", "continuable"]),
    st.sampled_from(["running", "inactive"]),
    st.booleans(),
    st.none() | st.text(max_size=8),
)
_diagnostic_rows = st.builds(
    lambda row_id, reason: SubagentDiagnosticRow(SessionId(row_id), reason),
    _ids,
    st.sampled_from(["corrupt", "unsupported", "unavailable"]),
)
_rows = _child_rows | _diagnostic_rows


@settings(max_examples=examples(100))
@given(row=_rows, parent=_ids, depth=st.integers(1, 10_000), descend=st.booleans())
def test_rows_round_trip_through_json(
    row: SubagentChildRow | SubagentDiagnosticRow, parent: str, depth: int, descend: bool
) -> None:
    """Every valid row (and descendant row) survives `to_json` → JSON text → `from_json` unchanged."""
    if descend:
        entry = SubagentDescendantEntry(row, SessionId(parent), depth)
        assert SubagentDescendantEntry.from_json(orjson.loads(orjson.dumps(entry.to_json()))) == entry
    else:
        assert entry_from_json(orjson.loads(orjson.dumps(row.to_json()))) == row


# ------------------------------------------------------------------------------ errors


def test_subagent_error_carries_a_stable_code() -> None:
    """`SubagentError(message, code, cause)` is a `DshError` with `.code` and the cause chained."""
    cause = RuntimeError("disk")
    error = SubagentError("subagent listing was cancelled", "CANCELLED", cause)
    assert isinstance(error, DshError)
    assert error.code == "CANCELLED"
    assert error.message == "subagent listing was cancelled"
    assert error.__cause__ is cause
    keyword = SubagentError("listing subagents requires ...", code="SUBAGENT_CONTROL_QUERY_UNAVAILABLE")
    assert keyword.code == "SUBAGENT_CONTROL_QUERY_UNAVAILABLE"
    assert keyword.__cause__ is None


def test_subagent_error_codes_are_a_closed_set() -> None:
    """The codes `SubagentError` may carry are a closed set (docs/errors.md#codes); any other code is refused."""
    assert SubagentError.codes == {
        "DUPLICATE_PROVIDER",
        "NO_PROVIDER",
        "UNSUPPORTED_CAPABILITY",
        "CONTINUATION_UNAVAILABLE",
        "PERSISTENCE_UNAVAILABLE",
        "DUPLICATE_CHILD",
        "DRAINING",
        "ACTIVATION_CLOSING",
        "UNAUTHORIZED",
        "NOT_RESUMABLE",
        "ACTIVATION_TEARDOWN_FAILED",
        "SUBAGENT_CONTROL_PROJECTIONS_UNAVAILABLE",
        "SUBAGENT_CONTROL_SESSION_STORE_UNAVAILABLE",
        "SUBAGENT_CONTROL_QUERY_UNAVAILABLE",
        "SUBAGENT_CONTROL_UNITS_UNAVAILABLE",
        "CANCELLED",
    }
    with pytest.raises(TypeError):
        SubagentError("old", "SUBAGENT_CONTROL_" + "SESSION_QUERY_UNAVAILABLE")


def test_other_subagent_errors() -> None:
    """`SubagentDepthError` pins its message and attributes; `SubagentDescriptorError` is a `ValueError`."""
    depth = SubagentDepthError(attempted_depth=4, max_depth=3)
    assert str(depth) == "subagent depth 4 exceeds maxDepth 3"
    assert (depth.attempted_depth, depth.max_depth, depth.code) == (4, 3, "SUBAGENT_DEPTH_EXCEEDED")
    assert isinstance(depth, DshError)
    descriptor = SubagentDescriptorError("persisted subagent descriptor payload must be an object")
    assert isinstance(descriptor, ValueError)
    assert descriptor.code == "SUBAGENT_DESCRIPTOR_INVALID"


def test_retired_code_exists_nowhere_in_dsh() -> None:
    """`SUBAGENT_CONTROL_SESSION_QUERY_UNAVAILABLE` appears in no file of the `dsh` source tree."""
    retired = "SUBAGENT_CONTROL_" + "SESSION_QUERY_UNAVAILABLE"  # split so this file never matches a grep
    root = Path(dsh.__file__).parent
    # Every shipped file (code, docs, web assets), but not bytecode caches, which only mirror sources.
    files = [path for path in root.rglob("*") if path.is_file() and "__pycache__" not in path.parts]
    assert any(path.name == "errors.py" for path in files)
    offenders = [str(path.relative_to(root)) for path in files if retired.encode() in path.read_bytes()]
    assert offenders == []
    for cls in (SubagentError, SubagentDepthError, SubagentDescriptorError):
        assert retired not in cls.codes
