"""The read validation pipeline: from a backend's `StoredLog` to a validated log.

Layer: persistence (private to the coordinator). Every `load` result crosses this pipeline once,
above the backends, so each rule is written once and reuses the session layer's own checks: the
stored header (`read_stored_header`, version first), identity, the migration of older
upstream shapes (one function per shape, below; the stored bytes are never rewritten), the format
refusals over the *whole* log (unknown non-ignorable types, retired vocabulary, integers outside
signed 64 bits), then the per-event rules (`check_records`: envelope, `seq == i`, data shapes,
surface fold), the cut, and finally the crash-repair closers. The three verdicts are never
confused: an intact log this build cannot interpret is format-unsupported, never corrupt.

Records are validated eagerly but frozen lazily (`StoredEvents`), so a full read costs parsing
plus validation, and freezing is paid only for the events someone looks at (a full read is the hot
path). A backend may hand over the fast-check verdicts it took while reading (`StoredLog.verdicts`);
the rules then visit only the records those verdicts are unsure of. Large logs are validated in a
worker thread so the event loop keeps serving other sessions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Sequence
from typing import Any, Final, Literal, NamedTuple

from dsh.json import is_safe_int
from dsh.persistence._legacy_shapes import MalformedAt, migrate_legacy_shapes
from dsh.persistence.base import Revision, StoredLog, TornMarker
from dsh.persistence.errors import (
    SessionCorruptionError,
    SessionFormatUnsupportedError,
    SessionPersistenceError,
    raw_log_suffix,
)
from dsh.persistence.headers import read_stored_header
from dsh.session.events import SessionEvent, data_problem, envelope_problem, legacy_problem
from dsh.session.header import SessionHeader, StoredHeaderError
from dsh.session.repair import interrupted_turn_closers
from dsh.session.stored import StoredEvents, StoredRecords, stored_records
from dsh.session.surface import Surface
from dsh.session.validate import LogProblem, check_records, first_refusal

__all__ = [
    "THREAD_THRESHOLD",
    "ValidatedLog",
    "validate_log",
    "validate_log_async",
    "validate_selection",
    "validate_selection_async",
    "validate_typed",
]

THREAD_THRESHOLD: Final = 1000
"""Logs with more records than this are validated in a worker thread (`asyncio.to_thread`)."""


# Not dataclasses: records on the start-up path are cheap to define (docs/architecture.md#import-cost).
class ValidatedLog(NamedTuple):
    """A validated stored log: logical header, exact cut, lazily frozen events and repair facts.

    Attributes:
        header: The logical header.
        inherited_event_count: The stored cut (`seedLength`).
        events: The stored events followed by `synthetic_tail` in-memory closers.
        revision: The revision of exactly the stored prefix that was read.
        torn: The backend's torn-tail marker, when a torn tail must be removed before writing.
        closers: The in-memory closers (also the last `len(closers)` items of `events`).
        stored_count: How many of `events` are stored (the stored next seq).
        location: The artifact path, when known.
    """

    header: SessionHeader
    inherited_event_count: int
    events: StoredEvents
    revision: Revision
    torn: TornMarker | None
    closers: tuple[SessionEvent, ...]
    stored_count: int
    location: str | None

    @property
    def synthetic_tail(self) -> int:
        """How many closers follow the stored events in memory."""
        return len(self.closers)

    @property
    def needs_repair(self) -> bool:
        """Whether `prepare` must commit a repair (a torn tail to remove or closers to store)."""
        return self.torn is not None or bool(self.closers)


def _corrupt(session_id: str, inner: str, location: str | None) -> SessionCorruptionError:
    return SessionCorruptionError(
        f'stored session "{session_id}" failed validation: {inner}', session_id=session_id, location=location
    )


def _where(records: Sequence[dict[str, Any]], problem: LogProblem) -> str:
    """A log problem's message, prefixed with the event it is about (a seq problem names it already)."""
    if problem.kind == "seq":
        return problem.message
    record = records[problem.index] if problem.index < len(records) else None
    seq = record.get("seq") if isinstance(record, dict) else None
    where = f"event seq {seq}" if is_safe_int(seq) else f"event at position {problem.index}"
    return f"{where}: {problem.message}"


def _header(session_id: str, log: StoredLog, location: str | None) -> tuple[SessionHeader, int]:
    """The first checks: the stored header (version first) and the identity rule."""
    try:
        header, cut = read_stored_header(log.header)
    except StoredHeaderError as error:
        if error.version_problem:
            found = error.found_version
            direction: Literal["newer", "older"] = "newer" if found > 0 else "older"  # type: ignore[operator]
            advice = (
                "the log is newer than this build: upgrade dsh to open it"
                if direction == "newer"
                else "the log is older than this build, which has no upgrade path for it"
            )
            raise SessionFormatUnsupportedError(
                f'stored session "{session_id}" uses format version {found}, but this build reads version 0; '
                f"{advice}{raw_log_suffix(location)}",
                session_id=session_id,
                location=location,
                found_version=found,
                direction=direction,
            ) from error
        raise _corrupt(session_id, str(error), location) from error
    if header.id != session_id:
        raise SessionCorruptionError(
            f'stored session identity mismatch: requested "{session_id}", header contains "{header.id}"',
            session_id=session_id,
            location=location,
        )
    return header, cut


def _refuse(
    session_id: str,
    records: Sequence[dict[str, Any]],
    oversized_at: int | None,
    location: str | None,
    *,
    first_unknown: tuple[str, int] | None = None,
    scan: bool = True,
    skip: int | None = None,
) -> None:
    """The format refusals, which win over shape defects, so a newer log is never called corrupt.

    `scan=False` skips the vocabulary scan when the caller proved there is nothing to find.
    `skip` names a record the scan ignores: a malformed older shape, which is corruption, not
    retired vocabulary.
    """
    refusal = None
    if scan:
        view = records if skip is None else [{} if index == skip else r for index, r in enumerate(records)]
        refusal = first_refusal(view)
    if first_unknown is not None:
        kind, unknown_seq = first_unknown
        raise _unknown_type(session_id, kind, unknown_seq, location)
    if oversized_at is not None and (refusal is None or oversized_at < refusal.index):
        found = records[oversized_at].get("seq")
        where = found if type(found) is int else oversized_at
        raise SessionFormatUnsupportedError(
            f'stored session "{session_id}" holds an integer outside the signed 64-bit range in the event '
            f"at seq {where}, which this build cannot represent exactly{raw_log_suffix(location)}",
            session_id=session_id,
            location=location,
            seq=where,
        )
    if refusal is None:
        return
    found = records[refusal.index].get("seq")
    where = found if type(found) is int else refusal.index
    if refusal.kind == "unknown":
        raise _unknown_type(session_id, refusal.event_type, where, location)
    raise SessionFormatUnsupportedError(
        f'stored session "{session_id}" uses retired vocabulary at seq {where} ({refusal.message}); '
        f"this build has no upgrader for it{raw_log_suffix(location)}",
        session_id=session_id,
        location=location,
        event_type=refusal.event_type,
        seq=where,
    )


def _unknown_type(session_id: str, kind: str, seq: int, location: str | None) -> SessionFormatUnsupportedError:
    return SessionFormatUnsupportedError(
        f'stored session "{session_id}" contains event type "{kind}" at seq {seq}, which this build does not '
        f"know; the log was likely written by a newer version{raw_log_suffix(location)}",
        session_id=session_id,
        location=location,
        event_type=kind,
        seq=seq,
    )


def _validated_records(
    session_id: str, log: StoredLog, location: str | None
) -> tuple[SessionHeader, int, StoredRecords]:
    """The pipeline over a full load: `(header, cut, records)`, the records validated and migrated."""
    header, cut = _header(session_id, log, location)
    records = stored_records(log.events)
    verdicts = log.verdicts
    # Older upstream shapes become current ones first, in place, so every rule below judges the
    # current shapes.
    malformed = migrate_legacy_shapes(session_id, records, verdicts=verdicts)
    if malformed is not None:
        raise _malformed_log(session_id, records, malformed, log.oversized_int_at, location)
    # Refusals take precedence over every shape defect anywhere in the log. `check_records` rejects
    # each unknown non-ignorable type and each retired shape it meets, so when it passes the whole
    # log there is no such refusal left to find; only on a defect does the full refusal scan run
    # (same verdicts, one pass fewer on the common, valid path).
    problem = check_records(records, Surface(), verdicts=verdicts)
    _refuse(session_id, records, log.oversized_int_at, location, scan=problem is not None)
    if problem is not None:
        raise _corrupt(session_id, _where(records, problem), location)
    if cut > len(records):
        raise _corrupt(session_id, f"seedLength {cut} exceeds the {len(records)} stored events", location)
    return header, cut, records


def validate_log(session_id: str, log: StoredLog, location: str | None) -> ValidatedLog:
    """Run the pipeline over a full load and compute the closers (pure; safe in a worker thread).

    Args:
        session_id: The requested id.
        log: The backend's load result; ownership of its records moves into the result.
        location: The artifact path for messages, when known.

    Raises:
        SessionFormatUnsupportedError: Version, unknown type, retired vocabulary, oversized integer.
        SessionCorruptionError: Header shape, identity, any per-event rule, or a cut beyond the log.
    """
    header, cut, records = _validated_records(session_id, log, location)
    closers = tuple(interrupted_turn_closers(records, type_at=records.type_at))
    stored_count = len(records)
    return ValidatedLog(
        header=header,
        inherited_event_count=cut,
        events=StoredEvents(records, closers, verdicts=log.verdicts, viewable=log.viewable),
        revision=log.revision,
        torn=log.torn,
        closers=closers,
        stored_count=stored_count,
        location=location,
    )


def validate_selection(
    session_id: str, log: StoredLog, types: Collection[str] | None, from_seq: int, location: str | None
) -> tuple[SessionHeader, int, int, StoredEvents]:
    """Validate a full load like `validate_log`, then keep the records with `seq >= from_seq` and a
    type in `types` (all types when None), without closers.

    Returns:
        `(header, inherited_event_count, stored_count, events)`.
    """
    header, cut, records = _validated_records(session_id, log, location)
    stored_count = len(records)
    selected = records.select(types, from_seq)
    # Positions still equal seqs when the selection is the whole log.
    verdicts = log.verdicts if len(selected) == stored_count else None
    return header, cut, stored_count, StoredEvents(selected, verdicts=verdicts, viewable=log.viewable)


def _malformed_log(
    session_id: str,
    records: Sequence[dict[str, Any]],
    malformed: MalformedAt,
    oversized_at: int | None,
    location: str | None,
) -> SessionPersistenceError:
    """The verdict for a log holding a malformed older shape, in the upstream reader's order.

    Format refusals anywhere in the log come first, then a defect of an earlier event, then the
    malformed record itself (corruption).
    """
    _refuse(session_id, records, oversized_at, location, skip=malformed.index)
    problem = check_records(records[: malformed.index], Surface())
    return _corrupt(session_id, malformed.message if problem is None else _where(records, problem), location)


async def validate_log_async(session_id: str, log: StoredLog, location: str | None) -> ValidatedLog:
    """`validate_log`, in a worker thread when the log is large."""
    if len(log.events) > THREAD_THRESHOLD:
        return await asyncio.to_thread(validate_log, session_id, log, location)
    return validate_log(session_id, log, location)


async def validate_selection_async(
    session_id: str, log: StoredLog, types: Collection[str] | None, from_seq: int, location: str | None
) -> tuple[SessionHeader, int, int, StoredEvents]:
    """`validate_selection`, in a worker thread when the log is large."""
    if len(log.events) > THREAD_THRESHOLD:
        return await asyncio.to_thread(validate_selection, session_id, log, types, from_seq, location)
    return validate_selection(session_id, log, types, from_seq, location)


def validate_typed(
    session_id: str, log: StoredLog, types: Collection[str] | None, from_seq: int, location: str | None
) -> tuple[SessionHeader, int, int, Sequence[dict[str, Any]]]:
    """Validate a typed read (`load_typed`): refusals over the whole log, shapes for the selection.

    Returns:
        `(header, inherited_event_count, next_seq, records)` with the selected records in seq order.

    Raises:
        SessionFormatUnsupportedError: As `validate_log`, with the backend's whole-log `first_unknown`.
        SessionCorruptionError: A selected record breaks an envelope or data rule, seqs are not
            increasing within the stored log, or the cut exceeds the log.
    """
    header, cut = _header(session_id, log, location)
    records = stored_records(log.events)
    malformed = migrate_legacy_shapes(session_id, records, by_seq=True)
    skip = None if malformed is None else malformed.index
    _refuse(session_id, records, log.oversized_int_at, location, first_unknown=log.first_unknown, skip=skip)
    next_seq = log.next_seq if log.next_seq is not None else len(records)
    previous = from_seq - 1
    for index, record in enumerate(records):
        if malformed is not None and index == malformed.index:
            raise _corrupt(session_id, malformed.message, location)
        problem = envelope_problem(record)
        if problem is None:
            kind = record["type"]
            problem = legacy_problem(kind, record["data"]) or data_problem(kind, record["data"])
        if problem is None:
            seq = record["seq"]
            if not previous < seq < next_seq:
                problem = f"session event seq {seq} is out of order in a typed read"
            previous = seq
        if problem is not None:
            raise _corrupt(session_id, f"event seq {record.get('seq')!r}: {problem}", location)
        if types is not None and record["type"] not in types:
            raise _corrupt(session_id, f'typed read returned an unrequested type "{record["type"]}"', location)
    if cut > next_seq:
        raise _corrupt(session_id, f"seedLength {cut} exceeds the {next_seq} stored events", location)
    return header, cut, next_seq, records
