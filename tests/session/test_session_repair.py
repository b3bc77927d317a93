"""Crash repair: `interrupted_turn_closers` and the two model-visible texts (docs/architecture.md#crash-repair)."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dsh.session import (
    TOOL_AWAITING_APPROVAL_TEXT,
    TOOL_NOT_STARTED_TEXT,
    TOOL_OUTCOME_UNKNOWN_TEXT,
    Session,
    SessionEvent,
    SessionStore,
    interrupted_turn_closers,
    last_activity_time,
)
from tests.helpers import examples
from tests.session.helpers import assistant_message, record, tool_call, tool_result, turn_end, user_message

_NOT_STARTED = (
    "This tool call was interrupted before it was recorded as started; it is fine to retry it if it is still needed."
)
_OUTCOME_UNKNOWN = (
    "This tool call was recorded as started but no result was durably recorded, so its outcome is unknown: "
    "retry only if the operation is read-only or idempotent; otherwise first verify the external state "
    "or ask the user, and never retry blindly."
)


def _store() -> SessionStore:
    ticks = itertools.count(1_000, 10)
    return SessionStore(clock=lambda: next(ticks), id_factory=lambda: "s")


def _open_tool_turn(session: Session) -> None:
    """Turn 1 open, step 1 open, assistant called c1 (recorded) and c2 (not recorded)."""
    session.append("turn/start", {"turn": 1})
    session.append("user/message", user_message())
    session.append("step/start", {"turn": 1, "step": 1})
    session.append("assistant/message", assistant_message(1, 1, tool_calls=["c1", "c2"]))
    session.append("tool/call", tool_call(1, 1, "c1"))


def test_repair_texts_are_frozen() -> None:
    """The two model-visible texts are pinned, one line each, with no trailing newline."""
    assert TOOL_NOT_STARTED_TEXT == _NOT_STARTED
    assert TOOL_OUTCOME_UNKNOWN_TEXT == _OUTCOME_UNKNOWN
    for text in (TOOL_NOT_STARTED_TEXT, TOOL_OUTCOME_UNKNOWN_TEXT):
        assert "\n" not in text
        assert "\r" not in text
        assert text == text.strip()


def test_a_call_waiting_for_approval_is_closed_as_not_run_and_its_question_cancelled() -> None:
    """An undecided `approval/asked` gets `approval/decided {cancelled}`; its call is answered as not run."""
    session = _store().create()
    session.append("turn/start", {"turn": 1})
    session.append("user/message", user_message())
    session.append("step/start", {"turn": 1, "step": 1})
    session.append("assistant/message", assistant_message(1, 1, tool_calls=["c1"]))
    session.append("tool/call", tool_call(1, 1, "c1"))
    session.append("approval/asked", {"id": "a1", "toolName": "bash", "callId": "c1"})
    closers = interrupted_turn_closers(list(session.events))
    assert [event.type for event in closers] == ["approval/decided", "tool/result", "step/end", "turn/end"]
    assert closers[0].data == {"id": "a1", "outcome": "cancelled"}
    result = closers[1].data
    assert result["error"] == {"name": "ToolNotStartedError", "code": "TOOL_NOT_STARTED"}  # type: ignore[index]
    block = result["message"]["content"][0]  # type: ignore[index]
    assert block["content"] == [{"type": "text", "text": TOOL_AWAITING_APPROVAL_TEXT}]
    assert "was not run" in TOOL_AWAITING_APPROVAL_TEXT
    for event in closers:
        session.append(event.type, event.data, source_event_seqs=event.source_event_seqs, surface_op=event.surface_op)
    assert interrupted_turn_closers(list(session.events)) == []


def test_a_decided_approval_needs_no_closer_of_its_own() -> None:
    """A question already decided is left alone; only the still-pending call is closed."""
    session = _store().create()
    _open_tool_turn(session)
    session.append("approval/asked", {"id": "a1", "toolName": "bash", "callId": "c1"})
    session.append("approval/decided", {"id": "a1", "outcome": "allowed-once"})
    closers = interrupted_turn_closers(list(session.events))
    assert "approval/decided" not in [event.type for event in closers]
    texts = [
        event.data["message"]["content"][0]["content"][0]["text"] for event in closers if event.type == "tool/result"
    ]  # type: ignore[index]
    assert texts == [TOOL_OUTCOME_UNKNOWN_TEXT, TOOL_NOT_STARTED_TEXT]


def test_repair_texts_tell_the_model_when_a_retry_is_safe() -> None:
    """Not-started: interrupted before starting, retry is fine; unknown: verify first, never retry blindly."""
    not_started = TOOL_NOT_STARTED_TEXT.lower()
    for phrase in ("interrupted", "before", "recorded as started", "retry", "still needed"):
        assert phrase in not_started, phrase
    unknown = TOOL_OUTCOME_UNKNOWN_TEXT.lower()
    for phrase in (
        "recorded",
        "no result was durably recorded",
        "outcome is unknown",
        "read-only",
        "idempotent",
        "verify",
        "ask the user",
        "never retry blindly",
    ):
        assert phrase in unknown, phrase


def test_balanced_or_empty_logs_need_no_closers() -> None:
    """A balanced log or an empty one yields []."""
    session = _store().create()
    assert interrupted_turn_closers(session.events) == []
    session.append("turn/start", {"turn": 1})
    session.append("turn/end", turn_end(1))
    session.append("session/title", {"title": "after the turn"})
    assert interrupted_turn_closers(session.events) == []


def test_open_turn_without_step_gets_one_turn_end() -> None:
    """An open turn without a step gets one interrupted turn/end with the last event's time."""
    session = _store().create()
    session.append("turn/start", {"turn": 3})
    last = session.append("user/message", user_message())
    closers = interrupted_turn_closers(session.events)
    assert closers == [
        {"type": "turn/end", "seq": 2, "time": last.time, "data": {"turn": 3, "reason": {"kind": "interrupted"}}}
    ]
    assert all(type(event) is SessionEvent for event in closers)
    assert list(closers[0]) == ["type", "seq", "time", "data"]


def test_open_step_is_closed_before_the_turn() -> None:
    """An open step gets step/end before turn/end, seqs continuing the log."""
    session = _store().create()
    session.append("turn/start", {"turn": 1})
    session.append("step/start", {"turn": 1, "step": 2})
    last = session.append("assistant/chunk", {"turn": 1, "step": 2, "chunk": {"type": "text-delta"}})
    closers = interrupted_turn_closers(session.events)
    assert [(e.type, e.seq, e.time) for e in closers] == [("step/end", 3, last.time), ("turn/end", 4, last.time)]
    assert closers[0].data == {"turn": 1, "step": 2}


def test_unrecorded_tool_call_gets_a_not_started_result() -> None:
    """A tool-call block without tool/call gets TOOL_NOT_STARTED with the exact text, append, no sources."""
    session = _store().create()
    _open_tool_turn(session)
    closers = interrupted_turn_closers(session.events)
    c2 = closers[1]
    assert c2.type == "tool/result"
    assert c2.seq == 6
    assert c2["surfaceOp"] == "append"
    assert "sourceEventSeqs" not in c2
    assert c2.data == {
        "turn": 1,
        "step": 1,
        "message": {
            "id": "interrupted-tool-result-c2-6",
            "role": "user",
            "source": {"kind": "tool", "callId": "c2"},
            "content": [
                {
                    "type": "tool-result",
                    "toolCallId": "c2",
                    "isError": True,
                    "content": [{"type": "text", "text": TOOL_NOT_STARTED_TEXT}],
                }
            ],
        },
        "error": {"name": "ToolNotStartedError", "code": "TOOL_NOT_STARTED"},
    }


def test_recorded_tool_call_gets_an_outcome_unknown_result() -> None:
    """A recorded tool/call at seq c without a result gets TOOL_OUTCOME_UNKNOWN citing [c]."""
    session = _store().create()
    _open_tool_turn(session)
    closers = interrupted_turn_closers(session.events)
    c1 = closers[0]
    assert c1.seq == 5
    assert c1.source_event_seqs == [4]
    assert list(c1) == ["type", "seq", "time", "data", "sourceEventSeqs", "surfaceOp"]
    data: Any = c1.data
    assert data["error"] == {"name": "ToolOutcomeUnknownError", "code": "TOOL_OUTCOME_UNKNOWN"}
    assert data["message"]["id"] == "interrupted-tool-result-c1-5"
    assert data["message"]["content"][0]["content"] == [{"type": "text", "text": TOOL_OUTCOME_UNKNOWN_TEXT}]
    assert [e.type for e in closers] == ["tool/result", "tool/result", "step/end", "turn/end"]
    assert {e.time for e in closers} == {session.events[-1].time}


def test_only_pending_calls_of_the_open_turn_are_repaired() -> None:
    """Answered calls, calls of a closed step and of an earlier turn are left; pending ones close in order."""
    session = _store().create()
    session.append("turn/start", {"turn": 1})
    session.append("step/start", {"turn": 1, "step": 1})
    session.append("assistant/message", assistant_message(1, 1, tool_calls=["old"]))
    session.append("turn/end", {"turn": 1, "reason": {"kind": "aborted", "reason": {"kind": "user"}}})
    session.append("turn/start", {"turn": 2})
    session.append("step/start", {"turn": 2, "step": 1})
    session.append("assistant/message", assistant_message(2, 1, message_id="m1", tool_calls=["closed-step"]))
    session.append("step/end", {"turn": 2, "step": 1})
    session.append("step/start", {"turn": 2, "step": 2})
    session.append(
        "assistant/message", assistant_message(2, 2, message_id="m2", tool_calls=["zeta", "answered", "alpha"])
    )
    session.append("tool/call", tool_call(2, 2, "answered"))
    session.append("tool/result", tool_result(2, 2, "answered"))
    session.append("tool/call", tool_call(2, 2, "alpha"))
    closers = interrupted_turn_closers(session.events)
    repaired = [e.data["message"]["source"]["callId"] for e in closers if e.type == "tool/result"]  # type: ignore[index,call-overload]
    assert repaired == ["zeta", "alpha"]
    assert closers[0].data["error"]["code"] == "TOOL_NOT_STARTED"  # type: ignore[index,call-overload]
    assert closers[1].source_event_seqs == [12]
    assert [e.type for e in closers[2:]] == ["step/end", "turn/end"]
    assert closers[2].data == {"turn": 2, "step": 2}
    assert closers[3].data == {"turn": 2, "reason": {"kind": "interrupted"}}


def test_closers_work_on_raw_stored_records() -> None:
    """The same closers come out of raw parsed records (the read pipeline's form)."""
    session = _store().create()
    _open_tool_turn(session)
    raw = [dict(event) for event in session.events]
    assert interrupted_turn_closers(raw) == interrupted_turn_closers(session.events)


def test_last_activity_time_skips_the_end_seed_marker() -> None:
    """last_activity_time returns the time of the last event that is not session/end-seed."""
    assert last_activity_time([]) is None
    seed = [record(0, "turn/start", {"turn": 1}, time=5)]
    session = _store().create(seed=seed)
    assert session.events[-1].type == "session/end-seed"
    assert last_activity_time(session.events) == 5
    assert last_activity_time([record(0, "session/end-seed", {}, time=9)]) is None


# ------------------------------------------------------------------ property: every log plus its closers restores

_ACTIONS = st.lists(
    st.sampled_from(["turn", "step", "assistant", "assistant-calls", "call", "result", "user", "title"]),
    max_size=40,
)


def _drive(session: Session, actions: list[str], call_ids: itertools.count[int]) -> None:
    """Apply actions, keeping the log well-formed (a model of how an agent loop writes)."""
    turn = 0
    open_turn = False
    step = 0
    open_step = False
    pending: list[str] = []
    recorded: set[str] = set()
    for action in actions:
        if action == "turn":
            if open_turn:
                session.append("turn/end", turn_end(turn))
                open_turn, open_step, pending = False, False, []
            else:
                turn += 1
                step = 0
                open_turn = True
                session.append("turn/start", {"turn": turn})
        elif not open_turn:
            if action == "title":
                session.append("session/title", {"title": "between turns"})
        elif action == "step":
            if open_step:
                session.append("step/end", {"turn": turn, "step": step})
                open_step, pending = False, []
            else:
                step += 1
                open_step = True
                session.append("step/start", {"turn": turn, "step": step})
        elif action in ("assistant", "assistant-calls"):
            calls = [f"c{next(call_ids)}" for _ in range(2)] if action == "assistant-calls" else []
            session.append(
                "assistant/message", assistant_message(turn, step, message_id=f"m{session.seq}", tool_calls=calls)
            )
            pending.extend(calls)
        elif action == "call" and pending:
            candidates = [c for c in pending if c not in recorded]
            if candidates:
                recorded.add(candidates[0])
                session.append("tool/call", tool_call(turn, step, candidates[0]))
        elif action == "result" and pending:
            call_id = pending.pop(0)
            session.append("tool/result", tool_result(turn, step, call_id))
        elif action == "user":
            session.append("user/message", user_message(f"u{session.seq}"))


@settings(max_examples=examples(150), deadline=None)
@given(_ACTIONS)
def test_closers_always_restore(actions: list[str]) -> None:
    """Any log plus its closers restores through prepare_restored and is then balanced."""
    store = _store()
    session = store.create()
    _drive(session, actions, itertools.count())
    events = list(session.events)
    closers = interrupted_turn_closers(events)
    assert [e.seq for e in closers] == list(range(len(events), len(events) + len(closers)))
    header = session.header
    store.dispose(session)
    restored = store.prepare_restored(header, 0, events + closers)
    assert interrupted_turn_closers(list(restored.events)) == []
    if closers:
        assert closers[-1].type == "turn/end"
        assert {e.time for e in closers} == {events[-1].time}
