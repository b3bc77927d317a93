"""Whole-log validation shared by constructor seeds and the persistence read pipeline.

Layer: session. The same per-event rules as a live append (envelope, vocabulary, data shapes,
contiguous seqs, surface fold), reported as a `LogProblem` so each caller words its own error.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from dsh.session.events import KNOWN_EVENT_TYPES, data_problem, envelope_problem, legacy_problem
from dsh.session.fastcheck import FAST_LOG_ONLY, FAST_SURFACE_APPEND, FAST_UNSURE, fast_check
from dsh.session.surface import Surface, SurfacePlan

__all__ = ["LogProblem", "Refusal", "check_records", "first_refusal"]

_SURFACE_APPEND = re.compile(b"%c" % FAST_SURFACE_APPEND)
"""Verdict positions of the surface appends the fast test is certain of (each becomes a surface node)."""

ProblemKind = Literal["envelope", "seq", "legacy", "unknown", "data", "surface"]


@dataclass(frozen=True, slots=True)
class LogProblem:
    """The first defect of a log: where, which rule, and the rule's message."""

    index: int
    kind: ProblemKind
    message: str
    found_seq: object = None


@dataclass(frozen=True, slots=True)
class Refusal:
    """A reason an intact log cannot be interpreted by this build (format-unsupported)."""

    index: int
    kind: Literal["unknown", "legacy"]
    event_type: str
    message: str


def first_refusal(records: Sequence[Mapping[str, Any]]) -> Refusal | None:
    """The first unknown non-ignorable type, else the first retired-vocabulary event, by position."""
    legacy: Refusal | None = None
    for index, record in enumerate(records):
        kind = record.get("type")
        if type(kind) is not str:
            continue
        if kind not in KNOWN_EVENT_TYPES:
            if record.get("ignorable") is not True:
                return Refusal(index, "unknown", kind, f'unknown event type "{kind}"')
            continue
        if legacy is None:
            problem = legacy_problem(kind, record.get("data"))
            if problem is not None:
                legacy = Refusal(index, "legacy", kind, problem)
    return legacy


def check_records(
    records: Sequence[Mapping[str, Any]],
    surface: Surface,
    *,
    verdicts: bytes | bytearray | None = None,
    known_only: bool = True,
) -> LogProblem | None:
    """Validate `records` as a log from seq 0, folding `surface` as it goes.

    `verdicts` are `fast_check` verdicts of `records` by position, when the caller has them (a
    backend may take them while it reads); only the records they are unsure of are then judged
    here. On a problem the surface holds the fold of the valid prefix only.
    """
    if verdicts is not None and len(verdicts) == len(records):
        return _check_scanned(records, verdicts, surface, known_only)
    nodes = surface.nodes
    for index in range(len(records)):
        record = records[index]
        verdict = fast_check(record, index)
        # Common case first: a record the fast test is certain about needs no further work (an
        # "append" surface event just becomes a node). Anything else gets the full rules below.
        if verdict == FAST_LOG_ONLY:
            continue
        if verdict == FAST_SURFACE_APPEND:
            nodes.append(index)
            continue
        problem = _full_rules(records, index, record, surface, known_only)
        if problem is not None:
            return problem
    return None


def _check_scanned(
    records: Sequence[Mapping[str, Any]], verdicts: bytes | bytearray, surface: Surface, known_only: bool
) -> LogProblem | None:
    """`check_records` over scanned verdicts: only positions the scan was unsure of are visited.

    Between two such positions every record is certain, and the certain surface appends become
    nodes in one C-level pass over the verdicts.
    """
    nodes = surface.nodes
    position = 0
    while True:
        unsure = verdicts.find(FAST_UNSURE, position)
        end = len(verdicts) if unsure < 0 else unsure
        nodes += [found.start() for found in _SURFACE_APPEND.finditer(verdicts, position, end)]
        if unsure < 0:
            return None
        problem = _full_rules(records, unsure, records[unsure], surface, known_only)
        if problem is not None:
            return problem
        position = unsure + 1


def _full_rules(
    records: Sequence[Mapping[str, Any]], index: int, record: Mapping[str, Any], surface: Surface, known_only: bool
) -> LogProblem | None:
    """The full rules for the record at `index` (the fast test was unsure); folds the surface."""
    problem = envelope_problem(record)
    if problem is not None:
        return LogProblem(index, "envelope", problem)
    kind: str = record["type"]
    data = record["data"]
    if kind not in KNOWN_EVENT_TYPES:
        if known_only and record.get("ignorable") is not True:
            return LogProblem(index, "unknown", f'unknown event type "{kind}"')
    else:
        problem = legacy_problem(kind, data) or data_problem(kind, data)
        if problem is not None:
            return LogProblem(index, "data", problem)
    seq = record["seq"]
    if seq != index:
        return LogProblem(index, "seq", f"session event seq {seq} is not contiguous; expected {index}", seq)
    plan = surface.plan(record, records)
    if isinstance(plan, str):
        return LogProblem(index, "surface", plan)
    if isinstance(plan, SurfacePlan):
        surface.commit(plan)
    return None
