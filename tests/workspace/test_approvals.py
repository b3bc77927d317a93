"""Approvals: rules decide each call; a question is asked, recorded in the harness's shapes, and answered.

Deny rules beat everything; the defaults ask for write, edit and bash; `allow_all` turns asks into
allows. An ask writes `approval/asked` and `approval/decided`; "always" also writes an ignorable
grant that lets the next matching call through for the rest of the session (resumes included). A
subagent inherits its parent's permissions, never more, and asks with its own label.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from dsh.abort import AbortController, AbortSignal
from dsh.agent.approval import ApprovalBroker, ApprovalRequest, ApprovalRule, Permissions
from dsh.agent.errors import ApprovalError
from dsh.config import Config
from tests.workspace.helpers import GUARD_S, bash_call, call, result_blocks, result_texts, scripted, workspace_runtime


def _rule(spec: str, action: str) -> ApprovalRule:
    return ApprovalRule.parse(spec, action)  # type: ignore[arg-type]


# ---------------------------------------------------------------- the rules


def test_the_defaults_allow_reading_and_ask_for_changes_and_commands() -> None:
    """Without rules: read, glob, grep and other tools are allowed; write, edit and bash ask."""
    permissions = Permissions()
    for tool in ("read", "glob", "grep", "list_agents", "my_function"):
        assert permissions.decide(tool, "anything") == ("allow", None)
    for tool in ("write", "edit", "bash"):
        assert permissions.decide(tool, "anything") == ("ask", None)


def test_a_deny_rule_beats_every_allow_and_allow_all() -> None:
    """A matching deny rule refuses the call even when a flag allows it and allow_all is on."""
    permissions = Permissions(
        flag_rules=(_rule("bash:*", "allow"),), rules=(_rule("bash:rm *", "deny"),), allow_all=True
    )
    assert permissions.decide("bash", "rm -rf build")[0] == "deny"
    assert permissions.decide("bash", "ls")[0] == "allow"


def test_flags_then_session_grants_then_configured_rules_decide_in_that_order() -> None:
    """The first matching allow/ask rule wins, flags first, then grants, then the configuration."""
    config = Config(approvals={"rules": [{"tool": "bash", "pattern": "pytest*", "action": "ask"}]})
    permissions = Permissions.from_config(config, allow=["bash:pytest -q"])
    assert permissions.decide("bash", "pytest -q")[0] == "allow"
    assert permissions.decide("bash", "pytest -x")[0] == "ask"
    granted = [_rule("bash:pytest -x", "allow")]
    assert permissions.decide("bash", "pytest -x", granted)[0] == "allow"
    assert Permissions.from_config(config, allow_all=True).decide("bash", "pytest -x")[0] == "allow"


def test_rule_specs_parse_as_tool_or_tool_and_pattern() -> None:
    """`TOOL` means every call of it; `TOOL:PATTERN` matches the whole subject with wildcards."""
    assert _rule("write", "allow") == ApprovalRule("write", "*", "allow")
    rule = _rule("bash:python -m pytest*", "allow")
    assert rule.matches("bash", "python -m pytest -q")
    assert not rule.matches("bash", "echo python -m pytest")
    assert not rule.matches("edit", "python -m pytest")


# ---------------------------------------------------------------- the broker


def _request(request_id: str = "approval-1") -> ApprovalRequest:
    return ApprovalRequest(request_id, "s1", "main", "bash", "ls", "$ ls", "ls", "call-1", 0)


async def test_without_an_answerer_or_remote_decisions_a_question_is_unavailable() -> None:
    """Nobody to ask: the outcome is `unavailable` (fail closed)."""
    decision = await ApprovalBroker().request(_request(), AbortController().signal)
    assert decision.outcome == "unavailable"


async def test_an_answerer_decides_and_a_failing_answerer_fails_closed() -> None:
    """allow → allowed-once, always → allowed-once with a grant, deny → rejected, a raise → unavailable."""
    broker = ApprovalBroker()
    for answer, outcome, always in (
        ("allow", "allowed-once", False),
        ("always", "allowed-once", True),
        ("deny", "rejected", False),
    ):

        async def answerer(request: ApprovalRequest, signal: AbortSignal, answer: Any = answer) -> Any:
            return answer

        broker.set_answerer(answerer)
        decision = await broker.request(_request(), AbortController().signal)
        assert (decision.outcome, decision.always) == (outcome, always)

    async def broken(request: ApprovalRequest, signal: AbortSignal) -> Any:
        raise RuntimeError("terminal gone")

    broker.set_answerer(broken)
    assert (await broker.request(_request(), AbortController().signal)).outcome == "unavailable"


async def test_remote_requests_wait_for_a_decision_or_their_time() -> None:
    """A pending request is listed and pushed, settled by `decide`; unanswered, it is unavailable after its time."""
    broker = ApprovalBroker()
    broker.enable_remote(GUARD_S)
    seen: list[tuple[str, str]] = []
    broker.subscribe(lambda kind, request, decision: seen.append((kind, request.id)))
    waiting = asyncio.ensure_future(broker.request(_request(), AbortController().signal))
    while not broker.pending():
        await asyncio.sleep(0)
    assert [request.id for request in broker.pending()] == ["approval-1"]
    broker.decide("approval-1", "deny")
    assert (await waiting).outcome == "rejected"
    assert seen == [("pending", "approval-1"), ("settled", "approval-1")]
    with pytest.raises(ApprovalError) as raised:
        broker.decide("approval-1", "allow")
    assert raised.value.code == "APPROVAL_NOT_FOUND"
    broker.enable_remote(0.01)
    late = await broker.request(_request("approval-2"), AbortController().signal)
    assert late.outcome == "unavailable"
    assert late.detail == "no decision within 0.01 s"


async def test_an_aborted_signal_withdraws_the_question() -> None:
    """Aborting the call's signal while someone is asked settles the request as `cancelled`."""
    broker = ApprovalBroker()
    broker.enable_remote(GUARD_S)
    controller = AbortController()
    waiting = asyncio.ensure_future(broker.request(_request(), controller.signal))
    while not broker.pending():
        await asyncio.sleep(0)
    controller.abort(RuntimeError("stop"))
    assert (await waiting).outcome == "cancelled"
    assert broker.pending() == ()


# ---------------------------------------------------------------- through the loop


class Answers:
    """An answerer that replies from a list and records every question it was asked."""

    def __init__(self, *answers: str) -> None:
        self.answers = list(answers)
        self.asked: list[ApprovalRequest] = []

    async def __call__(self, request: ApprovalRequest, signal: AbortSignal) -> Any:
        self.asked.append(request)
        return self.answers.pop(0)


def _approval_events(events: list[Any]) -> list[tuple[str, Any]]:
    return [(event.type, dict(event.data)) for event in events if event.type.startswith(("approval/", "dsh/"))]


async def test_always_lets_the_next_matching_call_through_unasked(tmp_path: Path) -> None:
    """An "always" answer runs the call and grants its pattern: the same command later is not asked about."""
    steps = [bash_call("echo hi"), bash_call("echo hi"), bash_call("echo other"), {"text": "done"}]
    answers = Answers("always", "deny")
    async with workspace_runtime(tmp_path / "home", scripted(steps), tmp_path, permissions=Permissions()) as rt:
        rt.approvals.set_answerer(answers)
        result = await asyncio.wait_for(rt.run("go"), GUARD_S)
        events = list(rt.sessions.get(result.session_id).events)  # type: ignore[union-attr]
    assert [request.subject for request in answers.asked] == ["echo hi", "echo other"]
    assert answers.asked[0].preview == "$ echo hi"
    assert answers.asked[0].label == "main"
    first, second, third = result_texts(events)
    assert (first, second) == ("hi\n", "hi\n")
    assert third.startswith("Error: not run: the user refused this bash call.")
    grants = [event for event in events if event.type == "dsh/approval/rule"]
    assert [event.ignorable for event in grants] == [True]
    kinds = [(kind, data.get("outcome")) for kind, data in _approval_events(events)]
    assert kinds == [
        ("approval/policy", None),
        ("approval/asked", None),
        ("approval/decided", "allowed-once"),
        ("dsh/approval/rule", None),
        ("approval/asked", None),
        ("approval/decided", "rejected"),
    ]
    asked = [data for kind, data in _approval_events(events) if kind == "approval/asked"]
    assert asked[0]["toolName"] == "bash"
    assert asked[0]["callId"] == events[[e.type for e in events].index("tool/call")].data["callId"]  # type: ignore[index]
    assert result_blocks(events)[2]["error"] == {"name": "ApprovalError", "code": "APPROVAL_REJECTED"}


async def test_a_grant_holds_after_the_session_is_resumed(tmp_path: Path) -> None:
    """The "always" grant is in the log, so a resumed agent still lets the same command through unasked."""
    answers = Answers("always")
    async with workspace_runtime(
        tmp_path / "home", scripted([bash_call("echo hi"), {"text": "a"}]), tmp_path, permissions=Permissions()
    ) as rt:
        rt.approvals.set_answerer(answers)
        session_id = (await asyncio.wait_for(rt.run("go"), GUARD_S)).session_id
    later = Answers()
    async with workspace_runtime(
        tmp_path / "home", scripted([bash_call("echo hi"), {"text": "b"}]), tmp_path, permissions=Permissions()
    ) as rt:
        rt.approvals.set_answerer(later)
        result = await asyncio.wait_for(rt.run("again", session_id), GUARD_S)
        events = list(rt.sessions.get(session_id).events)  # type: ignore[union-attr]
    assert result.output == "b"
    assert later.asked == []
    assert result_texts(events)[-1] == "hi\n"


async def test_the_never_policy_rejects_without_asking(tmp_path: Path) -> None:
    """Under `never`, an ask is rejected at once, recorded as a question rejected, and nobody is asked."""
    answers = Answers()
    async with workspace_runtime(
        tmp_path / "home",
        scripted([bash_call("echo hi"), {"text": "done"}]),
        tmp_path,
        permissions=Permissions(policy="never"),
    ) as rt:
        rt.approvals.set_answerer(answers)
        result = await asyncio.wait_for(rt.run("go"), GUARD_S)
        events = list(rt.sessions.get(result.session_id).events)  # type: ignore[union-attr]
    assert answers.asked == []
    (text,) = result_texts(events)
    assert 'approval policy "never"' in text
    assert [data.get("outcome") for kind, data in _approval_events(events) if kind == "approval/decided"] == [
        "rejected"
    ]


async def test_a_deny_rule_refuses_without_a_question(tmp_path: Path) -> None:
    """A deny rule refuses the call with `APPROVAL_RULE_DENIED`; no question is asked or recorded."""
    permissions = Permissions(flag_rules=(_rule("bash:rm *", "deny"),), allow_all=True)
    async with workspace_runtime(
        tmp_path / "home", scripted([bash_call("rm -rf x"), {"text": "done"}]), tmp_path, permissions=permissions
    ) as rt:
        result = await asyncio.wait_for(rt.run("go"), GUARD_S)
        events = list(rt.sessions.get(result.session_id).events)  # type: ignore[union-attr]
    (text,) = result_texts(events)
    assert text.startswith('Error: not run: the rule "bash:rm *" denies this bash call.')
    assert result_blocks(events)[0]["error"]["code"] == "APPROVAL_RULE_DENIED"
    assert not any(event.type == "approval/asked" for event in events)


async def test_a_cancelled_turn_withdraws_its_question(tmp_path: Path) -> None:
    """Cancelling the turn while a question waits settles it `cancelled` and the call is answered as cancelled."""
    asked = asyncio.Event()

    async def never_answers(request: ApprovalRequest, signal: AbortSignal) -> Any:
        asked.set()
        await signal.wait()
        signal.throw_if_aborted()

    async with workspace_runtime(
        tmp_path / "home", scripted([bash_call("echo hi")]), tmp_path, permissions=Permissions()
    ) as rt:
        rt.approvals.set_answerer(never_answers)
        agent = await rt.create_agent()
        pending = agent.turn_result(await agent.send("go"))
        await asyncio.wait_for(asked.wait(), GUARD_S)
        agent.cancel("user")
        result = await asyncio.wait_for(pending, GUARD_S)
        events = list(agent.session.events)
    assert result.stop_reason == "aborted"
    assert result_texts(events) == ["Error: tool call was cancelled"]
    assert [data.get("outcome") for kind, data in _approval_events(events) if kind == "approval/decided"] == [
        "cancelled"
    ]


# ---------------------------------------------------------------- subagents


def _delegating(label: str, child: list[dict[str, Any]]) -> Any:
    main = [call("agent", {"description": label, "prompt": "Run the checks."}), {"text": "parent done"}]
    return scripted(main, **{label: child})


async def test_a_childs_bash_call_asks_with_the_childs_label(tmp_path: Path) -> None:
    """A subagent's question reaches the same answerer with the child's label; its log records the delegation."""
    answers = Answers("allow")
    client = _delegating("Run checks", [bash_call("echo from child"), {"text": "child done"}])
    async with workspace_runtime(tmp_path / "home", client, tmp_path, permissions=Permissions()) as rt:
        rt.approvals.set_answerer(answers)
        result = await asyncio.wait_for(rt.run("delegate"), GUARD_S)
        await rt.settle(GUARD_S)
        (child_id,) = [request.session_id for request in answers.asked]
        child = list((await rt.query.observe_session(child_id)).events)
    assert result.output == "parent done"
    assert [request.label for request in answers.asked] == ["Run checks"]
    assert child_id != result.session_id
    knobs = {event.type: dict(event.data) for event in child if event.type in ("sandbox/mode", "approval/policy")}
    assert knobs == {
        "sandbox/mode": {"mode": "workspace-write", "source": "delegation"},
        "approval/policy": {"policy": "ask", "source": "delegation"},
    }


async def test_a_child_is_never_more_permissive_than_its_parent(tmp_path: Path) -> None:
    """The parent's deny rule holds in the child; the parent's allow rule lets the child through unasked."""
    permissions = Permissions(flag_rules=(_rule("bash:echo allowed", "allow"), _rule("bash:echo forbidden", "deny")))
    answers = Answers()
    child_steps = [bash_call("echo allowed"), bash_call("echo forbidden"), {"text": "child done"}]
    async with workspace_runtime(
        tmp_path / "home", _delegating("Child", child_steps), tmp_path, permissions=permissions
    ) as rt:
        rt.approvals.set_answerer(answers)
        await asyncio.wait_for(rt.run("delegate"), GUARD_S)
        await rt.settle(GUARD_S)
        sessions = [record for record in await rt.query.list_sessions() if record.header.origin == "subagent"]
        (child,) = sessions
        events = list((await rt.query.observe_session(child.id)).events)
    assert answers.asked == []
    allowed, forbidden = result_texts(events)
    assert allowed == "allowed\n"
    assert forbidden.startswith('Error: not run: the rule "bash:echo forbidden" denies')
