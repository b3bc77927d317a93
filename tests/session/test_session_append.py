"""`Session.append`: the built event, immutability, the event vocabulary and data-shape refusals."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from typing import Any

import pytest

from dsh.json import FrozenDict, FrozenList, thaw
from dsh.session import KNOWN_EVENT_TYPES, SessionError, SessionEvent, SessionStore, SurfaceReplace
from tests.session.helpers import assistant_message, record, tool_call, tool_result, turn_end, user_message

# The fixed vocabulary: every type this library writes plus the upstream harness's known types.
_EXPECTED_KNOWN_TYPES = [
    "agent-preset/selected",
    "agent/inbox/spliced",
    "approval/asked",
    "approval/decided",
    "approval/policy",
    "assistant/chunk",
    "assistant/message",
    "command/done",
    "command/run",
    "compaction/end",
    "compaction/prune",
    "compaction/start",
    "compaction/summary",
    "feedback/record",
    "goal/change",
    "hook/invoked",
    "hook/result",
    "llm/retry",
    "llm/retry-started",
    "permission/preset",
    "plan/mode",
    "request/context",
    "request/header",
    "sandbox/mode",
    "schedule/change",
    "session/end-seed",
    "session/title",
    "session/title-llm-request",
    "step/end",
    "step/start",
    "subagent/descriptor",
    "team/member",
    "team/message/delivered",
    "team/message/queued",
    "team/task",
    "todo/write",
    "tool-workflow/agent-end",
    "tool-workflow/agent-start",
    "tool-workflow/run-end",
    "tool-workflow/run-start",
    "tool/call",
    "tool/code-dispatch",
    "tool/code-dispatch-start",
    "tool/result",
    "turn/end",
    "turn/start",
    "user/message",
    "web/deepseek-search-llm-request",
]


def _refused(session: Any, *args: Any, **kwargs: Any) -> SessionError:
    before = session.seq
    with pytest.raises(SessionError) as caught:
        session.append(*args, **kwargs)
    assert session.seq == before
    return caught.value


def test_append_builds_the_canonical_event(store: SessionStore, clock: Any) -> None:
    """An appended event has seq = previous length, time = clock, canonical key order, frozen data."""
    session = store.create()
    session.append("turn/start", {"turn": 1})
    data = {"turn": 2, "extra": [1, {"k": "v"}]}
    previous = session.seq
    now = clock.now
    event = session.append("turn/start", data)
    assert isinstance(event, SessionEvent)
    assert event.seq == previous == 1
    assert event.time == now
    assert list(event) == ["type", "seq", "time", "data"]
    assert event.type == "turn/start"
    data["turn"] = 99
    data["extra"][1]["k"] = "changed"  # type: ignore[index]
    data["extra"].append(3)  # type: ignore[attr-defined]
    assert event.data == {"turn": 2, "extra": [1, {"k": "v"}]}
    assert session.events[1] is event
    assert session.seq == 2


def test_append_returns_the_frozen_copy_not_the_callers_object(store: SessionStore) -> None:
    """The committed event's data is a frozen copy, never the caller's object."""
    session = store.create()
    data = {"turn": 1}
    event = session.append("turn/start", data)
    assert event.data is not data
    assert type(event.data) is FrozenDict


def test_full_canonical_key_order(store: SessionStore) -> None:
    """All optional envelope keys appear in the canonical order."""
    session = store.create()
    session.append("user/message", user_message("u1"))
    event = session.append("acme/x", {}, ignorable=True)
    assert list(event) == ["type", "seq", "time", "data", "ignorable"]
    reply = session.append("assistant/message", assistant_message(1, 1), source_event_seqs=[0])
    assert list(reply) == ["type", "seq", "time", "data", "sourceEventSeqs", "surfaceOp"]
    assert reply.source_event_seqs == [0]
    assert type(reply.source_event_seqs) is FrozenList


def test_committed_events_refuse_mutation(store: SessionStore) -> None:
    """Item assignment, nested list append and update on a committed event raise TypeError."""
    session = store.create()
    event = session.append("session/title", {"title": "t", "messageSeqs": [1, 2], "source": {"kind": "user"}})
    data: Any = event.data
    with pytest.raises(TypeError):
        data["k"] = 1
    with pytest.raises(TypeError):
        data["messageSeqs"].append(3)
    with pytest.raises(TypeError):
        data.update({"k": 1})
    with pytest.raises(TypeError):
        event["seq"] = 7  # type: ignore[index]
    with pytest.raises(TypeError):
        event.update(seq=7)  # type: ignore[call-arg]
    copy = thaw(event)
    assert copy == event
    assert type(copy) is dict
    assert type(copy["data"]["messageSeqs"]) is list
    copy["data"]["messageSeqs"].append(3)
    assert event.data == {"title": "t", "messageSeqs": [1, 2], "source": {"kind": "user"}}


def test_surface_types_get_an_explicit_append_marker(store: SessionStore) -> None:
    """A surface-eligible append without surface_op stores surfaceOp "append"."""
    session = store.create()
    event = session.append("user/message", user_message())
    assert event["surfaceOp"] == "append"
    assert event.surface_op == "append"
    assert session.surface.nodes == (0,)


@pytest.mark.parametrize(
    "kwargs", [{"surface_op": "append"}, {"surface_op": SurfaceReplace(0, 0)}, {"source_event_seqs": [0]}]
)
def test_log_only_types_refuse_surface_metadata(store: SessionStore, kwargs: dict[str, Any]) -> None:
    """turn/start with surface_op (or sourceEventSeqs) is INVALID_EVENT."""
    session = store.create()
    session.append("user/message", user_message())
    error = _refused(session, "turn/start", {"turn": 1}, **kwargs)
    assert error.code == "INVALID_EVENT"
    assert "log-only" in error.message


def test_seed_user_message_without_marker_is_refused(store: SessionStore) -> None:
    """A seed user/message without surfaceOp is INVALID_SEED with the upstream text."""
    with pytest.raises(SessionError) as caught:
        store.prepare(seed=[record(0, "user/message", user_message())])
    assert caught.value.code == "INVALID_SEED"
    assert caught.value.message == (
        "invalid seed event at index 0: "
        'session event "user/message" is surface-eligible and requires a surfaceOp marker'
    )


def test_restored_user_message_without_marker_is_refused(store: SessionStore) -> None:
    """A stored user/message without surfaceOp is refused when restored."""
    source = store.create("src")
    source.append("turn/start", {"turn": 1})
    bad = SessionEvent(record(1, "user/message", FrozenDict(user_message())))
    with pytest.raises(SessionError) as caught:
        store.prepare_restored(dataclasses.replace(source.header, id="copy"), 0, [source.events[0], bad])
    assert caught.value.code == "INVALID_SEED"
    assert caught.value.message.endswith("requires a surfaceOp marker")


@pytest.mark.parametrize(
    ("type_", "data"),
    [
        ("user/message", {k: v for k, v in user_message().items() if k != "id"}),
        ("user/message", {**user_message(), "id": ""}),
        ("user/message", {**user_message(), "role": "assistant"}),
        ("user/message", {**user_message(), "source": {}}),
        ("user/message", {**user_message(), "content": [{"text": "no type"}]}),
        (
            "assistant/message",
            {**assistant_message(1, 1), "message": {**assistant_message(1, 1)["message"], "source": {"kind": "user"}}},
        ),
        ("assistant/message", {"turn": 1, "step": 1}),
        ("tool/result", {**tool_result(1, 1, "c1"), "message": {**user_message(), "source": {"kind": "tool"}}}),
        ("tool/call", {"turn": 1, "step": 1, "callId": "c", "name": "n", "arguments": {"not": "text"}}),
        ("turn/start", {"turn": -1}),
        ("turn/start", {"turn": True}),
        ("turn/end", {"turn": 1}),
        ("turn/end", {"turn": 1, "reason": {"kind": "aborted"}}),
        ("turn/end", {"turn": 1, "reason": {"kind": "error", "error": {"message": "m"}}}),
        ("step/start", {"turn": 1}),
        ("assistant/chunk", {"turn": 1, "step": 1, "chunk": "text"}),
        ("request/context", {"provider": "p"}),
        ("request/context", {"provider": "p", "model": "m", "contextWindow": -5}),
    ],
)
def test_malformed_checked_data_is_invalid_event(store: SessionStore, type_: str, data: object) -> None:
    """Checked types refuse bad shapes (user message without id, non-model assistant source ...)."""
    session = store.create()
    error = _refused(session, type_, data)
    assert error.code == "INVALID_EVENT"
    assert error.session_id == session.id


def test_checked_types_accept_extra_keys_and_valid_shapes(store: SessionStore) -> None:
    """Checked shapes tolerate and preserve extra keys; every core type appends."""
    session = store.create()
    session.append("request/context", {"provider": "p", "model": "m", "contextWindow": 10, "x": 1})
    session.append("turn/start", {"turn": 1, "note": "kept"})
    session.append("step/start", {"turn": 1, "step": 1})
    session.append("user/message", {**user_message(), "meta": {"k": 1}})
    session.append("assistant/chunk", {"turn": 1, "step": 1, "chunk": {"type": "text-delta", "text": "o"}})
    session.append("assistant/message", {**assistant_message(1, 1, tool_calls=["c1"]), "usage": {"in": 1}})
    session.append("tool/call", tool_call(1, 1, "c1"))
    session.append("tool/result", {**tool_result(1, 1, "c1", is_error=False), "error": {"name": "E", "code": "X"}})
    session.append("step/end", {"turn": 1, "step": 1})
    session.append("session/title", "opaque titles may be anything")
    session.append("subagent/descriptor", [1, "opaque"])
    session.append("turn/end", {"turn": 1, "reason": {"kind": "aborted", "reason": {"kind": "user"}}})
    session.append("turn/end", {"turn": 1, "reason": {"kind": "something-new"}})
    assert session.events[1].data == {"turn": 1, "note": "kept"}
    assert session.surface.nodes == (3, 5, 7)


def test_unknown_type_needs_ignorable(store: SessionStore) -> None:
    """An unknown type is INVALID_EVENT unless appended with ignorable=True."""
    session = store.create()
    assert _refused(session, "acme/x", {"a": 1}).code == "INVALID_EVENT"
    event = session.append("acme/x", {"a": 1}, ignorable=True)
    assert event["ignorable"] is True
    assert event.ignorable is True
    assert session.seq == 1


def test_known_event_types_is_the_fixed_vocabulary() -> None:
    """KNOWN_EVENT_TYPES is a frozenset of exactly the 48 known types, no more and no fewer."""
    assert type(KNOWN_EVENT_TYPES) is frozenset
    assert len(_EXPECTED_KNOWN_TYPES) == len(set(_EXPECTED_KNOWN_TYPES)) == 48
    assert frozenset(_EXPECTED_KNOWN_TYPES) == KNOWN_EVENT_TYPES


def test_known_type_with_ignorable_keeps_the_flag(store: SessionStore) -> None:
    """A known type may be marked ignorable; `ignorable` must be a real bool."""
    session = store.create()
    assert session.append("turn/start", {"turn": 1}, ignorable=True)["ignorable"] is True
    assert _refused(session, "turn/start", {"turn": 1}, ignorable=1).code == "INVALID_EVENT"


@pytest.mark.parametrize(
    ("type_", "data"),
    [
        ("session/end-seed", {}),
        ("request/header-delta", {}),
        ("mode/set", {}),
        ("steering/message", {}),
        ("request/header", {"reason": "fallback"}),
    ],
)
def test_constructor_only_and_legacy_types_are_refused(store: SessionStore, type_: str, data: object) -> None:
    """session/end-seed (written only by the store) and legacy vocabulary are INVALID_EVENT, even ignorable."""
    session = store.create()
    assert _refused(session, type_, data).code == "INVALID_EVENT"
    assert _refused(session, type_, data, ignorable=True).code == "INVALID_EVENT"


@pytest.mark.parametrize("type_", ["", 5, None])
def test_event_type_must_be_a_non_empty_string(store: SessionStore, type_: Any) -> None:
    """The event type must be a non-empty str."""
    session = store.create()
    assert _refused(session, type_, {}, ignorable=True).code == "INVALID_EVENT"


def test_source_event_seqs_rules(store: SessionStore) -> None:
    """sourceEventSeqs must be distinct earlier seqs, non-empty except on assistant/message."""
    session = store.create()
    session.append("user/message", user_message("u1"))
    assert _refused(session, "user/message", user_message("u2"), source_event_seqs=[1]).code == "INVALID_EVENT"
    assert _refused(session, "user/message", user_message("u2"), source_event_seqs=[0, 0]).code == "INVALID_EVENT"
    assert _refused(session, "user/message", user_message("u2"), source_event_seqs=[]).code == "INVALID_EVENT"
    assert _refused(session, "user/message", user_message("u2"), source_event_seqs="0").code == "INVALID_EVENT"
    assert _refused(session, "user/message", user_message("u2"), source_event_seqs=[True]).code == "INVALID_EVENT"
    empty = session.append("assistant/message", assistant_message(1, 1), source_event_seqs=[])
    assert empty.source_event_seqs == []


def test_invalid_surface_op_values_are_refused(store: SessionStore) -> None:
    """surface_op must be "append" or a SurfaceReplace of safe ints."""
    session = store.create()
    session.append("user/message", user_message("u1"))
    raw = {"op": "replace", "start": 0, "end": 0}
    assert _refused(session, "user/message", user_message("u2"), surface_op=raw).code == "INVALID_EVENT"
    bad = SurfaceReplace("0", 0)  # type: ignore[arg-type]
    assert _refused(session, "user/message", user_message("u2"), surface_op=bad).code == "INVALID_EVENT"


def test_prepared_session_appends_without_notifications(store: SessionStore) -> None:
    """A prepared (unpublished) session accepts appends and notifies nobody."""
    seen: list[object] = []
    store.on_event(lambda s, e: seen.append(e))
    session = store.prepare()
    session.append("turn/start", {"turn": 1})
    assert session.state == "prepared"
    assert seen == []
    store.publish(session)
    assert seen == []
    session.append("turn/end", turn_end(1))
    assert len(seen) == 1


def test_retired_session_refuses_appends(store: SessionStore) -> None:
    """A disposed session raises SESSION_RETIRED and stays unchanged."""
    session = store.create()
    store.dispose(session)
    error = _refused(session, "turn/start", {"turn": 1})
    assert error.code == "SESSION_RETIRED"
    assert session.state == "retired"


def test_request_context_is_the_latest(store: SessionStore) -> None:
    """request_context() returns the data of the latest request/context event."""
    session = store.create()
    assert session.request_context() is None
    session.append("request/context", {"provider": "a", "model": "m1"})
    session.append("request/context", {"provider": "b", "model": "m2"})
    assert session.request_context() == {"provider": "b", "model": "m2"}
    store.dispose(session)
    restored = store.prepare_restored(session.header, 0, list(session.events))
    assert restored.request_context() == {"provider": "b", "model": "m2"}


def test_derive_messages_projects_surface_nodes(store: SessionStore) -> None:
    """derive_messages maps user data, non-empty assistant messages and tool-result messages, in order."""
    session = store.create()
    session.append("user/message", user_message("u1"))
    session.append("assistant/message", assistant_message(1, 1, message_id="empty", text=""))
    session.append("assistant/message", assistant_message(1, 1, message_id="a1", tool_calls=["c1"]))
    session.append("tool/result", tool_result(1, 1, "c1"))
    ids = [message["id"] for message in session.derive_messages()]
    assert ids == ["u1", "a1", "r-c1"]


def test_clock_must_return_a_safe_int() -> None:
    """A store clock that returns a non-integer time is refused at append, not written."""
    ticks = iter([1, 2.5])
    store = SessionStore(clock=lambda: next(ticks), id_factory=lambda: "s")  # type: ignore[arg-type,return-value]
    session = store.create()
    error = _refused(session, "turn/start", {"turn": 1})
    assert error.code == "INVALID_EVENT"


_MUTATIONS_BY_KIND: dict[type, list[Any]] = {
    dict: [
        lambda d: d.__setitem__("k", 1),
        lambda d: d.__delitem__(next(iter(d))),
        lambda d: d.__ior__({"k": 1}),
        lambda d: d.clear(),
        lambda d: d.pop(next(iter(d))),
        lambda d: d.popitem(),
        lambda d: d.setdefault("k", 1),
        lambda d: d.update(k=1),
    ],
    list: [
        lambda v: v.__setitem__(0, 9),
        lambda v: v.__setitem__(slice(0, 1), [9]),
        lambda v: v.__delitem__(0),
        lambda v: v.__iadd__([9]),
        lambda v: v.__imul__(2),
        lambda v: v.append(9),
        lambda v: v.extend([9]),
        lambda v: v.insert(0, 9),
        lambda v: v.pop(),
        lambda v: v.remove(v[0]),
        lambda v: v.clear(),
        lambda v: v.sort(),
        lambda v: v.reverse(),
    ],
}


def test_every_container_of_a_committed_event_refuses_every_mutator(store: SessionStore) -> None:
    """No mutator works on the event or on any nested object or array; copies and pickles stay frozen."""
    session = store.create()
    event = session.append(
        "session/title",
        {"title": "t", "messageSeqs": [3, 1, 2], "source": {"kind": "provider", "model": {"provider": "p", "m": [1]}}},
    )
    snapshot = thaw(event)
    containers: list[Any] = [event]
    stack: list[Any] = [event]
    while stack:
        node = stack.pop()
        children = list(node.values()) if isinstance(node, dict) else list(node)
        for child in children:
            if isinstance(child, dict | list):
                containers.append(child)
                stack.append(child)
    assert len(containers) == 6
    for node in containers:
        for mutate in _MUTATIONS_BY_KIND[dict if isinstance(node, dict) else list]:
            with pytest.raises(TypeError):
                mutate(node)
    assert event == snapshot
    for clone in (copy.copy(event), copy.deepcopy(event), pickle.loads(pickle.dumps(event))):
        assert clone == event
        assert type(clone) is SessionEvent
        with pytest.raises(TypeError):
            clone["data"]["messageSeqs"].append(4)
    assert session.events[0] == snapshot
