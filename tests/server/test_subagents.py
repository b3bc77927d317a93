"""Subagent routes: the catalog as listed, address verification, follow-up prompts, interrupts, fixed failures."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dsh.query.errors import SessionQueryError
from dsh.subagent.errors import SubagentError
from dsh.subagent.rows import SubagentChildRow
from tests.server.helpers import (
    CHILD_LABEL,
    HANG_GUARD_S,
    Api,
    api,
    assert_error,
    continuable_child,
    scripted,
    seed_family,
    stored_session,
)

pytestmark = pytest.mark.slow  # each test starts a real HTTP server: `make test` only

PROMPT = {"content": [{"type": "text", "text": "one more thing"}]}


def _spy(target: Any, name: str, monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    calls: list[tuple[Any, ...]] = []
    real: Callable[..., Any] = getattr(target, name)

    async def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return await real(*args, **kwargs)

    monkeypatch.setattr(target, name, spy)
    return calls


class _Override:
    """The query service with some methods replaced (the service itself has slots and cannot be patched)."""

    def __init__(self, inner: Any, **methods: Callable[..., Any]) -> None:
        self._inner = inner
        self._methods = methods

    def __getattr__(self, name: str) -> Any:
        return self._methods.get(name) or getattr(self._inner, name)


def _raising(error: BaseException) -> Callable[..., Any]:
    async def fail(*args: Any, **kwargs: Any) -> Any:
        raise error

    return fail


async def test_the_catalog_is_the_listing_with_the_activity_rewrite(served: Api) -> None:
    """Rows equal `list_children` in order and arms; diagnostics untouched; a resident idle child is `inactive`."""
    rt = served.rt
    family = await seed_family(rt)
    expected = [row.to_json() for row in await rt.subagents.list_children(family.parent)]
    body = (await served.http.get(f"/api/v1/sessions/{family.parent}/subagents")).json()
    assert body == {"entries": expected, "parentAvailable": False, "unlisted": 0}
    assert [row["id"] for row in body["entries"]] == family.ids
    assert body["entries"][2] == {"kind": "diagnostic", "id": family.diagnostic, "reason": "corrupt"}
    await rt.resume_agent(family.parent)
    session = await rt.persistence.prepare(family.continuable)
    child = session.publish()
    rt.start_agent(child)  # resident and idle: the listing calls it live, the registry says idle
    body = (await served.http.get(f"/api/v1/sessions/{family.parent}/subagents")).json()
    assert body["parentAvailable"] is True
    assert body["entries"][0]["activity"] == "inactive"
    assert body["entries"][1:] == expected[1:]


async def test_a_running_child_is_running_on_the_wire(tmp_path: Path) -> None:
    """A child whose agent the registry holds with status `running` is `running`, in both scopes."""
    model = scripted(main=[{"hold": "busy", "text": "done"}])
    async with api(tmp_path / "home", model=model) as served:
        rt = served.rt
        family = await seed_family(rt)
        child = (await rt.persistence.prepare(family.continuable)).publish()
        agent = rt.start_agent(child)
        await agent.send("work")
        await asyncio.wait_for(model.wait_held("busy"), HANG_GUARD_S)
        for scope in ("children", "descendants"):
            body = (
                await served.http.get(f"/api/v1/sessions/{family.parent}/subagents", params={"scope": scope})
            ).json()
            assert body["entries"][0]["activity"] == "running"
        model.release("busy")
        await agent.wait_idle()


async def test_descendants_carry_parent_and_depth(served: Api) -> None:
    """`scope=descendants` gives `list_descendants` rows (with `parentId` and `depth`) in pre-order."""
    rt = served.rt
    family = await seed_family(rt)
    await continuable_child(rt, family.continuable, "grandchild")
    expected = [row.to_json() for row in await rt.subagents.list_descendants(family.parent)]
    body = (
        await served.http.get(f"/api/v1/sessions/{family.parent}/subagents", params={"scope": "descendants"})
    ).json()
    assert body["entries"] == expected
    assert [(row["id"], row["depth"]) for row in body["entries"]][:2] == [(family.continuable, 1), ("grandchild", 2)]


async def test_an_unknown_parent_has_an_empty_catalog(served: Api) -> None:
    """An unknown parent is 200 `{entries: [], parentAvailable: false, unlisted: 0}`."""
    response = await served.http.get("/api/v1/sessions/nobody/subagents")
    assert response.json() == {"entries": [], "parentAvailable": False, "unlisted": 0}
    assert_error(await served.http.get("/api/v1/sessions/x/subagents", params={"scope": "all"}), 400, "bad-request")


async def test_history_verifies_the_address_against_the_catalog(served: Api) -> None:
    """A one-shot child asked as continuable is 404; a diagnostic child is 409 with its reason and no history read."""
    rt = served.rt
    family = await seed_family(rt)
    base = f"/api/v1/sessions/{family.parent}/subagents"
    details = assert_error(
        await served.http.get(f"{base}/{family.one_shot}/history", params={"mode": "continuable"}),
        404,
        "subagent-not-found",
    )
    assert details == {"parentSessionId": family.parent, "childSessionId": family.one_shot}
    ok = await served.http.get(f"{base}/{family.one_shot}/history", params={"mode": "one-shot"})
    assert ok.status_code == 200
    served.reads.reset()
    response = await served.http.get(f"{base}/{family.diagnostic}/history")
    details = assert_error(response, 409, "subagent-catalog-diagnostic")
    assert details == {"parentSessionId": family.parent, "childSessionId": family.diagnostic, "reason": "corrupt"}
    assert response.json()["error"]["message"] == f'subagent "{family.diagnostic}" is corrupt'
    assert served.reads.reads[family.diagnostic] == 1, "only the catalog's own observation"
    assert_error(await served.http.get(f"{base}/stranger/history"), 404, "subagent-not-found")


async def test_history_rechecks_the_observed_parent(served: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """A child the (stubbed) catalog lists under P but whose header names Q is 403 after the read."""
    rt = served.rt
    await stored_session(rt, "q")
    await continuable_child(rt, "q", "child", live=True)
    row = SubagentChildRow("child", "continuable", "running", False, label=CHILD_LABEL)

    async def listed(parent_id: str, **kwargs: Any) -> list[Any]:
        return [row]

    monkeypatch.setattr(rt.subagents, "list_children", listed)
    response = await served.http.get("/api/v1/sessions/p/subagents/child/history")
    assert assert_error(response, 403, "subagent-unauthorized") == {"childSessionId": "child"}
    assert response.json()["error"]["message"] == "subagent parent changed during history read"


async def test_a_child_that_vanishes_before_its_history_read_is_subagent_not_found(
    served: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child the (stubbed) catalog still lists but that no longer exists is 404 `subagent-not-found`."""
    await stored_session(served.rt, "p")
    row = SubagentChildRow("ghost", "continuable", "inactive", False, label=CHILD_LABEL)

    async def listed(parent_id: str, **kwargs: Any) -> list[Any]:
        return [row]

    monkeypatch.setattr(served.rt.subagents, "list_children", listed)
    response = await served.http.get("/api/v1/sessions/p/subagents/ghost/history")
    details = assert_error(response, 404, "subagent-not-found")
    assert details == {"parentSessionId": "p", "childSessionId": "ghost"}
    assert response.json()["error"]["message"] == "subagent disappeared during history read"


async def test_prompting_a_child_of_an_offline_parent_reads_no_catalog(
    served: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A parent that is not live is 409 `subagent-parent-unavailable` before any catalog read."""
    family = await seed_family(served.rt)
    calls = _spy(served.rt.subagents, "list_children", monkeypatch)
    response = await served.http.post(
        f"/api/v1/sessions/{family.parent}/subagents/{family.continuable}/prompt", json=PROMPT
    )
    assert assert_error(response, 409, "subagent-parent-unavailable") == {"parentSessionId": family.parent}
    assert response.json()["error"]["message"] == f'parent session "{family.parent}" is not live'
    assert calls == []


async def test_prompting_a_child_of_a_live_parent(served: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """One-shot → 404; continuable → 202 with source `{kind: user, rpcId, clientTimeZone}`; bad zone → 400."""
    rt = served.rt
    family = await seed_family(rt, live_parent=True)
    base = f"/api/v1/sessions/{family.parent}/subagents"
    assert_error(await served.http.post(f"{base}/{family.one_shot}/prompt", json=PROMPT), 404, "subagent-not-found")
    assert_error(
        await served.http.post(f"{base}/{family.diagnostic}/prompt", json=PROMPT), 409, "subagent-catalog-diagnostic"
    )
    bad_zone = {**PROMPT, "clientTimeZone": "Not/A_Zone"}
    details = assert_error(
        await served.http.post(f"{base}/{family.continuable}/prompt", json=bad_zone), 400, "invalid-time-zone"
    )
    assert details == {"value": "Not/A_Zone"}
    body = {**PROMPT, "clientTimeZone": "Europe/Berlin"}
    response = await served.http.post(
        f"{base}/{family.continuable}/prompt", json=body, headers={"X-Request-Id": "rpc-7"}
    )
    assert response.status_code == 202, response.text
    message_id = response.json()["messageId"]
    await rt.settle(HANG_GUARD_S)
    events = (await rt.query.observe_session(family.continuable)).events
    sent = [event.data for event in events if event.type == "user/message" and event.data["id"] == message_id]  # type: ignore[index]
    assert sent[0]["source"] == {"kind": "user", "rpcId": "rpc-7", "clientTimeZone": "Europe/Berlin"}  # type: ignore[index]
    monkeypatch.setattr(rt.subagents, "followup", _raising(SubagentError("admission closed", "DRAINING")))
    response = await served.http.post(f"{base}/{family.continuable}/prompt", json=PROMPT)
    assert assert_error(response, 503, "subagent-delivery-unavailable") == {"childSessionId": family.continuable}
    assert response.headers["retry-after"] == "1"


@pytest.mark.parametrize(
    ("code", "status", "wire"),
    [
        ("NOT_RESUMABLE", 409, "subagent-not-resumable"),
        ("UNAUTHORIZED", 403, "subagent-unauthorized"),
        ("ACTIVATION_CLOSING", 503, "subagent-delivery-unavailable"),
        ("CONTINUATION_UNAVAILABLE", 503, "subagent-delivery-unavailable"),
        ("PERSISTENCE_UNAVAILABLE", 503, "subagent-delivery-unavailable"),
    ],
)
async def test_follow_up_failures_map_to_their_wire_codes(
    served: Api, monkeypatch: pytest.MonkeyPatch, code: str, status: int, wire: str
) -> None:
    """Each follow-up refusal code becomes its documented wire code and status."""
    family = await seed_family(served.rt, live_parent=True)
    monkeypatch.setattr(served.rt.subagents, "followup", _raising(SubagentError("refused", code)))
    url = f"/api/v1/sessions/{family.parent}/subagents/{family.continuable}/prompt"
    assert_error(await served.http.post(url, json=PROMPT), status, wire)


async def test_interrupting_a_child_needs_no_parent_and_reads_nothing(
    served: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An offline parent's child is interrupted with 200 and no catalog or history read."""
    family = await seed_family(served.rt)
    calls = _spy(served.rt.subagents, "list_children", monkeypatch)
    served.reads.reset()
    response = await served.http.post(f"/api/v1/sessions/{family.parent}/subagents/{family.continuable}/interrupt")
    assert response.json() == {"accepted": True}
    assert calls == []
    assert served.reads.total_reads == 0


async def test_interrupting_a_resident_child_for_another_parent_is_403(tmp_path: Path) -> None:
    """A running child refuses an interrupt naming another parent (403) and stops for its own (200, `aborted`)."""
    model = scripted(**{CHILD_LABEL: [{"hold": "child", "text": "partial"}]})
    async with api(tmp_path / "home", model=model) as served:
        rt = served.rt
        family = await seed_family(rt, live_parent=True)
        base = f"/api/v1/sessions/{{}}/subagents/{family.continuable}/interrupt"
        prompt = await served.http.post(
            f"/api/v1/sessions/{family.parent}/subagents/{family.continuable}/prompt", json=PROMPT
        )
        assert prompt.status_code == 202, prompt.text
        await asyncio.wait_for(model.wait_held("child"), HANG_GUARD_S)
        refused = await served.http.post(base.format("someone-else"))
        assert assert_error(refused, 403, "subagent-unauthorized") == {"childSessionId": family.continuable}
        assert (await served.http.post(base.format(family.parent))).json() == {"accepted": True}
        await rt.settle(HANG_GUARD_S)
        events = (await rt.query.observe_session(family.continuable)).events
        ends = [event.data["reason"]["kind"] for event in events if event.type == "turn/end"]  # type: ignore[index]
        assert ends[-1] == "aborted"


async def test_failures_answer_fixed_messages_and_never_the_backend_text(
    served: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """List, history, prompt and interrupt failures are `internal` with fixed messages; the secret is in no body."""
    rt = served.rt
    secret = "SECRET-backend-detail-42"
    family = await seed_family(rt, live_parent=True)
    base = f"/api/v1/sessions/{family.parent}/subagents"
    bodies: list[str] = []

    def check(response: Any, message: str) -> None:
        assert_error(response, 500, "internal")
        assert response.json()["error"]["message"] == message
        bodies.append(response.text)

    real_list = rt.subagents.list_children
    monkeypatch.setattr(rt.subagents, "list_children", _raising(RuntimeError(secret)))
    check(await served.http.get(base), "subagent catalog read failed")
    monkeypatch.setattr(rt.subagents, "list_children", real_list)
    failure = SessionQueryError(f"inspect failed: {secret}", code="SESSION_QUERY_PERSISTENCE_FAILED")
    monkeypatch.setattr(rt.services, "query", _Override(rt.query, read_history=_raising(failure)))
    check(await served.http.get(f"{base}/{family.continuable}/history"), "subagent history read failed")
    response = await served.http.get(f"/api/v1/sessions/{family.continuable}/history")
    assert_error(response, 500, "session-unreadable")
    bodies.append(response.text)
    monkeypatch.setattr(rt.subagents, "followup", _raising(RuntimeError(secret)))
    check(await served.http.post(f"{base}/{family.continuable}/prompt", json=PROMPT), "subagent prompt failed")
    monkeypatch.setattr(rt.subagents, "interrupt", _raising(SubagentError(secret, "ACTIVATION_TEARDOWN_FAILED")))
    check(await served.http.post(f"{base}/{family.continuable}/interrupt"), "subagent interrupt failed")
    listing = SessionQueryError(f"listing failed: {secret}", code="SESSION_QUERY_PERSISTENCE_FAILED")
    monkeypatch.setattr(rt.services, "query", _Override(rt.query, list_sessions=_raising(listing)))
    check(await served.http.get("/api/v1/sessions"), "session listing failed")
    assert all(secret not in body for body in bodies)


@pytest.mark.parametrize(
    ("service", "message"),
    [
        ("projections", "subagent catalog is unavailable: this deployment does not mount the projection registry"),
        ("query", "subagent catalog is unavailable: this deployment does not mount the session query service"),
    ],
)
async def test_a_catalog_without_its_services_says_which_one_is_missing(
    served: Api, service: str, message: str
) -> None:
    """Without the projection registry or the query service the catalog is 500 `internal` with a fixed message."""
    await seed_family(served.rt)
    saved = getattr(served.rt.services, service)
    setattr(served.rt.services, service, None)
    try:
        response = await served.http.get("/api/v1/sessions/parent/subagents")
    finally:
        setattr(served.rt.services, service, saved)
    assert_error(response, 500, "internal")
    assert response.json()["error"]["message"] == message
