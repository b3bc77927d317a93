"""Each allowed difference, shown against the harness's own code; the allow-list matches the docs' list.

Every test here builds the smallest store that shows one entry of `differences.ALLOWED` and asserts
both sides' exact behaviour, so an entry that stops being true (or a difference that changes) fails
here. docs/storage-format.md#remaining-known-differences must list exactly the allowed entries.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from dsh.config import Config
from dsh.persistence.errors import SessionPersistenceError
from dsh.runtime import Runtime
from dsh.session import TOOL_NOT_STARTED_TEXT, TOOL_OUTCOME_UNKNOWN_TEXT
from dsh.testing.jsonl_writer import JsonlLogWriter
from dsh.testing.stored_logs import stored_header
from tests.interop.compare import harness_kind, harness_view, pydsh_kind, pydsh_view
from tests.interop.differences import ALLOWED, SHOWN, erase_closer_wording, shows
from tests.interop.harness import HarnessProcess, HarnessRefused

pytestmark = [pytest.mark.interop, pytest.mark.slow]

DOCS = Path(__file__).resolve().parents[2] / "docs" / "storage-format.md"


def _event(kind: str, seq: int, data: Any, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "seq": seq, "time": 1_000 + seq, "data": data, **extra}


def _turn(turn: int, start: int, reason: dict[str, Any] | None = None, **extra: Any) -> list[dict[str, Any]]:
    end = {"turn": turn, "reason": reason or {"kind": "completed"}, **extra}
    return [_event("turn/start", start, {"turn": turn}), _event("turn/end", start + 1, end)]


def _descriptor(seq: int, mode: str, label: str | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {"version": 2, "mode": mode, "provider": "spawn"}
    if label is not None:
        data["label"] = label
    return _event("subagent/descriptor", seq, data)


def _child(session_id: str, parent: str, *, depth: int = 1, created_at: int = 2_000, **fields: Any) -> dict[str, Any]:
    return stored_header(
        session_id, created_at=created_at, parentSession=parent, origin="subagent", delegationDepth=depth, **fields
    )


def _write(
    root: Path, sessions: Sequence[tuple[dict[str, Any], list[dict[str, Any]]]], compression: str = "none"
) -> None:
    writer = JsonlLogWriter(root, compression=compression)  # type: ignore[arg-type]
    for header, records in sessions:
        asyncio.run(writer.write(header["id"], header, records))


async def _pydsh_log(root: Path, session_id: str) -> Any:
    """pydsh's events of a log, or the kind of its refusal."""
    async with Runtime.open(Config(home=root.parent), read_only=True) as rt:
        try:
            return (await rt.persistence.inspect(session_id)).events
        except SessionPersistenceError as error:
            return pydsh_kind(error)


def _harness_log(harness: HarnessProcess, root: Path, session_id: str, compression: str = "none") -> Any:
    try:
        return harness.call("inspect", root=root, compression=compression, session=session_id)["events"]
    except HarnessRefused as error:
        return harness_kind(error)


def _harness_refusal(harness: HarnessProcess, root: Path, session_id: str, compression: str = "none") -> str:
    with pytest.raises(HarnessRefused) as refused:
        harness.call("inspect", root=root, compression=compression, session=session_id)
    return refused.value.message


# ---------------------------------------------------------------- the allow-list itself


def test_every_allowed_difference_is_shown_by_one_test() -> None:
    """Each entry of the allow-list has exactly one test here that shows it, and nothing else is allowed."""
    assert set(SHOWN) == {difference.key for difference in ALLOWED}
    assert len({difference.title for difference in ALLOWED}) == len(ALLOWED)
    assert all(difference.what and difference.why for difference in ALLOWED)


def test_the_docs_list_exactly_the_allowed_differences() -> None:
    """docs/storage-format.md's "Remaining known differences" names exactly the allow-list's entries."""
    text = DOCS.read_text()
    section = text.split("### Remaining known differences", 1)[1].split("\n#", 1)[0]
    titles = re.findall(r"^\* \*\*(.+?)\.\*\*", section, re.MULTILINE)
    assert titles == [difference.title for difference in ALLOWED]


# ---------------------------------------------------------------- one test per allowed difference


@shows("tie-order")
def test_children_created_in_one_millisecond_are_ordered_differently(harness: HarnessProcess, tmp_path: Path) -> None:
    """Equal createdAt: pydsh orders by code point (`B` < `_` < `a`), the harness by locale (`_` < `a` < `B`)."""
    root = tmp_path / "home" / "sessions"
    children = ["tie-B", "tie-a", "tie-_", "tie-1"]
    _write(
        root,
        [
            (stored_header("p"), _turn(1, 0)),
            *((_child(child, "p"), [_descriptor(0, "one-shot"), *_turn(1, 1)]) for child in children),
        ],
    )
    ours = asyncio.run(pydsh_view(root, catalogs=["p"]))
    theirs = harness_view(harness, root, catalogs=["p"], compression="none")
    assert [row["id"] for row in ours.children["p"]] == ["tie-1", "tie-B", "tie-_", "tie-a"]
    assert [row["id"] for row in theirs.children["p"]] == ["tie-_", "tie-1", "tie-a", "tie-B"]
    assert sorted(ours.children["p"], key=lambda row: row["id"]) == sorted(
        theirs.children["p"], key=lambda row: row["id"]
    )


@shows("fork-replaying-an-ancestor-descriptor")
def test_a_fork_without_its_own_descriptor_is_corrupt_in_pydsh_only(harness: HarnessProcess, tmp_path: Path) -> None:
    """A subagent fork of a continuable child that never wrote its own descriptor: pydsh shows a corrupt
    diagnostic row, the harness a row with the ancestor's identity."""
    root = tmp_path / "home" / "sessions"
    keeper = [_descriptor(0, "continuable", "Keeper"), *_turn(1, 1)]
    fork = [*keeper, _event("session/end-seed", 3, {}), *_turn(2, 4)]
    _write(
        root,
        [
            (stored_header("p"), _turn(1, 0)),
            (_child("keeper", "p"), keeper),
            (_child("fork", "keeper", depth=2, created_at=3_000, seedLength=3), fork),
        ],
    )
    ours = asyncio.run(pydsh_view(root, catalogs=["keeper"]))
    theirs = harness_view(harness, root, catalogs=["keeper"], compression="none")
    assert ours.logs == theirs.logs  # the log itself reads the same
    assert ours.children["keeper"] == [{"kind": "diagnostic", "id": "fork", "reason": "corrupt"}]
    assert theirs.children["keeper"] == [
        {
            "kind": "child",
            "id": "fork",
            "mode": "continuable",
            "label": "Keeper",
            "activity": "inactive",
            "hasChildren": False,
        }
    ]


@shows("windows-cwd")
def test_a_windows_cwd_is_read_by_pydsh_and_refused_by_the_harness(harness: HarnessProcess, tmp_path: Path) -> None:
    """Both list the session; pydsh reads its log, the harness refuses it as corrupt."""
    root = tmp_path / "home" / "sessions"
    _write(
        root, [(stored_header("win", cwd="C:\\work"), _turn(1, 0)), (stored_header("posix", cwd="/srv"), _turn(1, 0))]
    )
    ours = asyncio.run(pydsh_view(root))
    listed = {header["id"] for header in harness.call("list", root=root, compression="none")}
    assert listed == set(ours.logs) == {"win", "posix"}
    assert ours.logs["win"].events is not None
    assert _harness_log(harness, root, "win") == "corrupt"
    assert _harness_log(harness, root, "posix") == [dict(event) for event in ours.logs["posix"].events or ()]


@shows("header-without-delegation-depth")
def test_a_header_without_delegation_depth_is_read_by_pydsh_only(harness: HarnessProcess, tmp_path: Path) -> None:
    """pydsh lists and reads it (depth 0); the harness leaves it out of its listing and refuses its log."""
    root = tmp_path / "home" / "sessions"
    _write(root, [(stored_header("old", delegationDepth=None), _turn(1, 0)), (stored_header("new"), _turn(1, 0))])
    ours = asyncio.run(pydsh_view(root))
    assert set(ours.logs) == {"old", "new"}
    assert ours.headers["old"]["delegationDepth"] == 0
    assert {header["id"] for header in harness.call("list", root=root, compression="none")} == {"new"}
    assert "not a session header" in _harness_refusal(harness, root, "old")


@shows("mixed-encodings")
def test_a_root_holding_both_encodings_is_read_by_pydsh_and_refused_by_the_harness(
    harness: HarnessProcess, tmp_path: Path
) -> None:
    """pydsh reads both logs; the harness refuses to list the root in either compression mode."""
    root = tmp_path / "home" / "sessions"
    _write(root, [(stored_header("plain"), _turn(1, 0))], compression="none")
    _write(root, [(stored_header("zipped", created_at=9), _turn(1, 0))], compression="zstd")
    ours = asyncio.run(pydsh_view(root))
    assert {session_id: log.refused for session_id, log in ours.logs.items()} == {"plain": None, "zipped": None}
    for compression in ("zstd", "none"):
        with pytest.raises(HarnessRefused, match="use a separate root or select the matching compression mode"):
            harness.call("list", root=root, compression=compression)


@shows("float-integers")
def test_a_seq_spelled_as_a_float_is_read_by_the_harness_only(harness: HarnessProcess, tmp_path: Path) -> None:
    """`"seq": 1.0` is the integer 1 for the harness; pydsh refuses the log as corrupt."""
    root = tmp_path / "home" / "sessions"
    events = _turn(1, 0)
    events[1]["seq"] = 1.0
    _write(root, [(stored_header("f"), events)])
    assert asyncio.run(_pydsh_log(root, "f")) == "corrupt"
    assert [event["seq"] for event in _harness_log(harness, root, "f")] == [0, 1]


@shows("lone-surrogates")
def test_a_lone_surrogate_is_read_by_the_harness_only(harness: HarnessProcess, tmp_path: Path) -> None:
    """A title holding `\\ud800`, followed by a committed turn: the harness reads it, pydsh refuses the log."""
    root = tmp_path / "home" / "sessions"
    writer = JsonlLogWriter(root, compression="none")
    asyncio.run(writer.write("s", stored_header("s"), _turn(1, 0)))
    path = Path(writer.path_of("s"))
    title = b'{"type":"session/title","seq":2,"time":1002,"data":{"title":"\\ud800","messageSeqs":[],'
    title += b'"source":{"kind":"user"}}}\n'
    later = b"".join(
        (
            b'{"type":"turn/start","seq":3,"time":1003,"data":{"turn":2}}\n',
            b'{"type":"turn/end","seq":4,"time":1004,"data":{"turn":2,"reason":{"kind":"completed"}}}\n',
        )
    )
    path.write_bytes(path.read_bytes() + title + later)
    assert asyncio.run(_pydsh_log(root, "s")) == "corrupt"
    events = _harness_log(harness, root, "s")
    assert [event["type"] for event in events] == ["turn/start", "turn/end", "session/title", "turn/start", "turn/end"]


@shows("line-numbers")
def test_line_numbers_in_messages_differ_by_the_header(harness: HarnessProcess, tmp_path: Path) -> None:
    """An unparsable committed line is the fourth line of the file: pydsh says line 4, the harness line 3."""
    root = tmp_path / "home" / "sessions"
    writer = JsonlLogWriter(root, compression="none")
    asyncio.run(writer.write("l", stored_header("l"), [*_turn(1, 0), *_turn(2, 2)]))
    path = Path(writer.path_of("l"))
    lines = path.read_bytes().splitlines(keepends=True)
    lines[3] = b"not json\n"  # the header, two events, then the broken one; a turn/end follows
    path.write_bytes(b"".join(lines))
    with pytest.raises(SessionPersistenceError, match="unparsable committed event at line 4"):
        asyncio.run(_pydsh_inspect_raising(root, "l"))
    assert "unparsable committed event at line 3" in _harness_refusal(harness, root, "l")


async def _pydsh_inspect_raising(root: Path, session_id: str) -> None:
    async with Runtime.open(Config(home=root.parent), read_only=True) as rt:
        await rt.persistence.inspect(session_id)


@shows("turn-end-strictness")
def test_turn_ends_with_extra_keys_or_turn_zero_are_read_by_pydsh_only(harness: HarnessProcess, tmp_path: Path) -> None:
    """Extra data keys, an extra key in a simple reason, and turn 0: pydsh reads each, the harness refuses each."""
    root = tmp_path / "home" / "sessions"
    cases = {
        "extra-key": [
            _event("turn/start", 0, {"turn": 1}),
            _event("turn/end", 1, {"turn": 1, "reason": {"kind": "completed"}, "note": "x"}),
        ],
        "reason-key": _turn(1, 0, {"kind": "completed", "why": "x"}),
        "turn-zero": [
            _event("turn/start", 0, {"turn": 0}),
            _event("turn/end", 1, {"turn": 0, "reason": {"kind": "completed"}}),
        ],
    }
    _write(root, [(stored_header(name), events) for name, events in cases.items()])
    for name in cases:
        assert len(asyncio.run(_pydsh_log(root, name))) == 2, name
        assert "malformed pre-react-loop turn/end" in _harness_refusal(harness, root, name), name


@shows("role-without-id")
def test_a_message_with_a_role_but_no_id_is_refused_with_different_kinds(
    harness: HarnessProcess, tmp_path: Path
) -> None:
    """pydsh refuses it as unsupported (retired vocabulary), the harness as corrupt (failed validation)."""
    root = tmp_path / "home" / "sessions"
    message = {"role": "user", "content": [{"type": "text", "text": "hi"}], "source": {"kind": "user"}}
    events = [_event("turn/start", 0, {"turn": 1}), _event("user/message", 1, message, surfaceOp="append")]
    events.append(_event("turn/end", 2, {"turn": 1, "reason": {"kind": "completed"}}))
    _write(root, [(stored_header("r"), events)])
    assert asyncio.run(_pydsh_log(root, "r")) == "unsupported"
    assert _harness_log(harness, root, "r") == "corrupt"


@shows("closer-wording")
def test_the_closers_of_a_crashed_step_differ_only_in_their_words(harness: HarnessProcess, tmp_path: Path) -> None:
    """A step left open with one call recorded and one never started: both sides synthesize the same closers,
    except that the text of the two error results is each side's own."""
    root = tmp_path / "home" / "sessions"
    calls = [{"type": "tool-call", "id": call_id, "name": "ls", "arguments": "{}"} for call_id in ("c-run", "c-new")]
    assistant = {
        "id": "a1",
        "role": "assistant",
        "content": calls,
        "source": {"kind": "model", "provider": "p", "model": "m"},
    }
    events = [
        _event("turn/start", 0, {"turn": 1}),
        _event("step/start", 1, {"turn": 1, "step": 1}),
        _event("assistant/message", 2, {"turn": 1, "step": 1, "message": assistant}, surfaceOp="append"),
        _event("tool/call", 3, {"turn": 1, "step": 1, "callId": "c-run", "name": "ls", "arguments": "{}"}),
    ]
    _write(root, [(stored_header("s"), events)])
    ours = [dict(event) for event in asyncio.run(_pydsh_view_events(root, "s"))]
    theirs = _harness_log(harness, root, "s")
    assert erase_closer_wording(ours) == erase_closer_wording(theirs)
    assert [event["type"] for event in ours[4:]] == ["tool/result", "tool/result", "step/end", "turn/end"]

    def texts(log: list[dict[str, Any]]) -> dict[str, str]:
        return {
            event["data"]["error"]["code"]: event["data"]["message"]["content"][0]["content"][0]["text"]
            for event in log
            if event["type"] == "tool/result"
        }

    assert texts(ours) == {"TOOL_OUTCOME_UNKNOWN": TOOL_OUTCOME_UNKNOWN_TEXT, "TOOL_NOT_STARTED": TOOL_NOT_STARTED_TEXT}
    assert set(texts(theirs)) == set(texts(ours))
    assert all(texts(theirs)[code] != text for code, text in texts(ours).items())


async def _pydsh_view_events(root: Path, session_id: str) -> list[dict[str, Any]]:
    view = await pydsh_view(root)
    return list(view.logs[session_id].events or ())


@shows("revisions")
def test_revisions_are_each_sides_own_tokens(harness: HarnessProcess, tmp_path: Path) -> None:
    """The same unchanged log has a stable revision on each side, and the two tokens differ."""
    root = tmp_path / "home" / "sessions"
    _write(root, [(stored_header("s"), _turn(1, 0))])

    async def revision() -> str | None:
        async with Runtime.open(Config(home=root.parent), read_only=True) as rt:
            return await rt.persistence.revision("s")

    ours = asyncio.run(revision())
    theirs = [snapshot["revision"] for snapshot in harness.call("snapshots", root=root, compression="none")]
    assert ours is not None
    assert ours == asyncio.run(revision())
    assert theirs == [snapshot["revision"] for snapshot in harness.call("snapshots", root=root, compression="none")]
    assert theirs != [ours]
