"""The differences between pydsh and the TypeScript harness that remain, each with its reason.

Layer: tests (interop). This is the one allow-list: every other comparison of the suite demands
equality. Each entry is shown by exactly one test of `test_differences.py` (registered with
`shows(key)`, which a test checks), and `title` is the bold title of its bullet in
docs/storage-format.md#remaining-known-differences, whose list must name exactly these entries.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

__all__ = ["ALLOWED", "SHOWN", "Difference", "erase_closer_wording", "shows"]


@dataclass(frozen=True, slots=True)
class Difference:
    """One allowed difference: its key, the docs bullet's title, what differs and why it stays."""

    key: str
    title: str
    what: str
    why: str


ALLOWED: Final[tuple[Difference, ...]] = (
    Difference(
        "tie-order",
        "Rows created in the same millisecond",
        "children (and listing rows) with equal createdAt: pydsh orders them by id in code-point order, "
        "the harness with localeCompare",
        "code-point order is the same on every machine; a locale's collation is not",
    ),
    Difference(
        "fork-replaying-an-ancestor-descriptor",
        "A fork that only replays an ancestor's descriptor",
        "a subagent fork whose own suffix holds no descriptor: pydsh lists a corrupt diagnostic row, "
        "the harness a child row with the ancestor's mode and label",
        "an identity folded from the inherited prefix belongs to the ancestor, not to the fork "
        "(docs/catalog.md#identity-rungs)",
    ),
    Difference(
        "windows-cwd",
        "A Windows cwd",
        "a header whose cwd the harness's reader refuses (C:\\work): both list it, the harness refuses "
        "to read its log, pydsh reads it (and dsh doctor warns)",
        "a log written on Windows stays readable where dsh runs (docs/storage-format.md#header-record)",
    ),
    Difference(
        "header-without-delegation-depth",
        "A header without delegationDepth",
        "pydsh reads an absent delegationDepth as 0; the harness neither lists the session nor reads it",
        "harness versions before the field existed wrote such headers; dsh always writes it",
    ),
    Difference(
        "mixed-encodings",
        "A root holding both encodings",
        "pydsh reads each log in the encoding its file name says; the harness refuses the whole root "
        "in either compression mode",
        "dsh detects the encoding per log; the harness is configured with one per root",
    ),
    Difference(
        "float-integers",
        "Integers spelled as floats",
        "a seq written as 1.0: the harness reads it as 1, pydsh refuses the log as corrupt",
        "Python keeps 1.0 a float; no writer spells integers that way",
    ),
    Difference(
        "lone-surrogates",
        "Lone surrogates",
        'a string holding "\\ud800": the harness reads it, pydsh refuses the line as unparsable',
        "a lone surrogate is not Unicode text and cannot be decoded into a Python string faithfully",
    ),
    Difference(
        "line-numbers",
        "Line numbers in error messages",
        "both refuse an unparsable committed line; pydsh's message counts the header as line 1, the "
        "harness's one line less",
        "only the wording differs",
    ),
    Difference(
        "turn-end-strictness",
        "Current turn/end events",
        "extra data keys, extra keys in a simple reason and turn 0: the harness refuses the log, pydsh reads it",
        "dsh accepts extra keys in every checked payload; it writes exactly {turn, reason} itself",
    ),
    Difference(
        "role-without-id",
        "A message with a role but no id",
        "pydsh refuses it as retired vocabulary (unsupported), the harness as failed validation (corrupt)",
        "the log is refused either way; only the kind of refusal differs",
    ),
    Difference(
        "closer-wording",
        "The words of a synthesized tool result",
        "closing a turn a crash left open, both synthesize the same events (ids, codes, seqs, times); "
        "the text of the error result for a call that never started or whose outcome is unknown is "
        "each side's own wording",
        "each project words its messages itself; once one side has repaired the log, both read the stored words",
    ),
    Difference(
        "revisions",
        "Revisions",
        "the revision token of one unchanged log differs between the two",
        "revisions are each side's own opaque tokens, compared only with tokens of the same side",
    ),
)

_CLOSER_CODES: Final = frozenset({"TOOL_NOT_STARTED", "TOOL_OUTCOME_UNKNOWN"})


def erase_closer_wording(events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The events with the text of each synthesized tool result blanked (allowed by `closer-wording`).

    A synthesized result is a `tool/result` whose `error.code` is one of the two recovery codes;
    everything else about it, and every other event, is kept for the comparison.
    """
    out: list[dict[str, Any]] = []
    for event in events:
        data = event.get("data")
        error = data.get("error") if isinstance(data, Mapping) else None
        if (
            event.get("type") != "tool/result"
            or not isinstance(error, Mapping)
            or error.get("code") not in _CLOSER_CODES
        ):
            out.append(dict(event))
            continue
        message = dict(data["message"])
        message["content"] = [dict(block, content=[{"type": "text", "text": "…"}]) for block in message["content"]]
        out.append(dict(event, data=dict(data, message=message)))
    return out


SHOWN: dict[str, Callable[..., Any]] = {}
"""Allow-list key -> the test that shows the difference (filled by `shows`)."""

F = TypeVar("F", bound=Callable[..., Any])


def shows(key: str) -> Callable[[F], F]:
    """Register the decorated test as the one that shows the allowed difference `key`."""

    def register(test: F) -> F:
        if key not in {difference.key for difference in ALLOWED}:
            raise KeyError(f"{key!r} is not in the allow-list")
        if key in SHOWN:
            raise KeyError(f"{key!r} is already shown by {SHOWN[key].__name__}")
        SHOWN[key] = test
        return test

    return register
