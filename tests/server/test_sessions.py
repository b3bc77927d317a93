"""Session routes: the keyset-paged list, create with a prompt, the owner fence, resume and generic history."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from dsh.session.header import HeaderInit
from tests.server.helpers import (
    HANG_GUARD_S,
    Api,
    api,
    assert_error,
    child_header,
    continuable_child,
    one_shot_child,
    stored_session,
)

pytestmark = pytest.mark.slow  # each test starts a real HTTP server: `make test` only


async def _pages(served: Api, **params: object) -> list[list[dict[str, object]]]:
    pages = []
    cursor = None
    while True:
        query = {**params, **({"cursor": cursor} if cursor else {})}
        response = await served.http.get("/api/v1/sessions", params=query)
        assert response.status_code == 200, response.text
        body = response.json()
        pages.append(body["items"])
        cursor = body["nextCursor"]
        if cursor is None:
            return pages


async def test_the_list_pages_newest_first_without_subagents_and_without_log_reads(served: Api) -> None:
    """120 top-level and 30 subagent sessions: 3 pages of 50, newest first, no duplicates or gaps, 0 log reads."""
    rt = served.rt
    top = [f"top-{index:03d}" for index in range(120)]
    for index, session_id in enumerate(top):
        await stored_session(rt, session_id)
        if index % 4 == 0:
            await stored_session(rt, f"sub-{index:03d}", header=child_header(session_id))
    served.reads.reset()
    pages = await _pages(served, limit=50)
    assert [len(page) for page in pages] == [50, 50, 20]
    ids = [item["id"] for page in pages for item in page]
    assert ids == list(reversed(top))
    created = [item["createdAt"] for page in pages for item in page]
    assert created == sorted(created, reverse=True)
    assert all("origin" not in item and item["status"] == "stored" for page in pages for item in page)
    assert served.reads.total_reads == 0
    everything = await _pages(served, limit=200, includeSubagents="true")
    assert len(everything) == 1
    assert len(everything[0]) == 150


async def test_new_sessions_never_shift_a_keyset_page(served: Api) -> None:
    """A session created between two page reads does not repeat or skip a row of the next page."""
    for index in range(5):
        await stored_session(served.rt, f"s{index}")
    first = (await served.http.get("/api/v1/sessions", params={"limit": 2})).json()
    await stored_session(served.rt, "newest")
    second = (await served.http.get("/api/v1/sessions", params={"limit": 2, "cursor": first["nextCursor"]})).json()
    assert [item["id"] for item in first["items"]] == ["s4", "s3"]
    assert [item["id"] for item in second["items"]] == ["s2", "s1"]


@pytest.mark.parametrize("cursor", ["not-base64!", "e30", "eyJjcmVhdGVkQXQiOiJ4IiwiaWQiOjF9", "x" * 2000])
async def test_a_bad_cursor_is_a_bad_request(served: Api, cursor: str) -> None:
    """A cursor this server did not write (garbage, `{}`, wrong types, too long) is 400 `bad-request`."""
    assert_error(await served.http.get("/api/v1/sessions", params={"cursor": cursor}), 400, "bad-request")


async def test_status_comes_from_the_agent_registry(served: Api) -> None:
    """A session with a registered agent is `idle` (or `running`); one without is `stored`."""
    await stored_session(served.rt, "cold")
    await stored_session(served.rt, "warm")
    await served.rt.resume_agent("warm")
    items = (await served.http.get("/api/v1/sessions")).json()["items"]
    assert {item["id"]: item["status"] for item in items} == {"cold": "stored", "warm": "idle"}
    summary = (await served.http.get("/api/v1/sessions/cold")).json()
    assert summary == {
        "id": "cold",
        "createdAt": summary["createdAt"],
        "isSeeded": False,
        "delegationDepth": 0,
        "status": "stored",
    }
    assert_error(await served.http.get("/api/v1/sessions/missing"), 404, "session-not-found")


async def test_create_with_a_prompt_answers_201_and_the_turn_lands_in_history(served: Api) -> None:
    """`POST /sessions {prompt}` is 201 with `Location` and `messageId`; after settling, history shows the turn."""
    response = await served.http.post("/api/v1/sessions", json={"prompt": "hello there"})
    assert response.status_code == 201, response.text
    body = response.json()
    session_id = body["session"]["id"]
    assert response.headers["location"] == f"/api/v1/sessions/{session_id}"
    assert isinstance(body["messageId"], str)
    assert body["session"]["status"] in ("idle", "running")
    await served.rt.settle(HANG_GUARD_S)
    page = (await served.http.get(f"/api/v1/sessions/{session_id}/history")).json()
    types = [entry["event"]["type"] for entry in page["events"]]
    assert types[0] == "turn/start"
    assert types[-1] == "turn/end"
    messages = [entry["event"] for entry in page["events"] if entry["event"]["type"] == "user/message"]
    assert messages[0]["data"]["content"] == [{"type": "text", "text": "hello there"}]
    assert messages[0]["data"]["source"] == {"kind": "user", "rpcId": response.headers["x-request-id"]}


async def test_create_without_a_prompt_makes_an_idle_session(served: Api) -> None:
    """An empty body creates a live top-level session with an idle agent and no message id."""
    response = await served.http.post("/api/v1/sessions")
    assert response.status_code == 201, response.text
    body = response.json()
    assert "messageId" not in body
    assert body["session"]["status"] == "idle"
    assert served.rt.agents.get(body["session"]["id"]) is not None


async def test_create_without_a_model_is_503_and_creates_nothing(tmp_path: Path) -> None:
    """With no model configured, `POST /sessions {prompt}` is 503 `model-unavailable` and no session exists."""
    from dsh.config import Config
    from dsh.runtime import Runtime
    from dsh.testing.server import running_server

    config = Config(home=tmp_path / "home", model={"api_key": None, "deepseek_api_key": None})
    async with Runtime.open(config) as rt, running_server(rt) as server, server.client() as http:
        details = assert_error(await http.post("/api/v1/sessions", json={"prompt": "hi"}), 503, "model-unavailable")
        assert details == {"reason": "not-configured"}
        assert rt.sessions.list() == ()
        assert (await http.get("/api/v1/sessions")).json()["items"] == []


@pytest.mark.parametrize("live", [False, True])
@pytest.mark.parametrize("route", ["prompt", "interrupt", "resume"])
async def test_subagent_sessions_are_fenced_from_the_generic_agent_routes(served: Api, live: bool, route: str) -> None:
    """A subagent-origin session, live or stored, is 409 `agent-busy` on prompt/interrupt/resume; nothing is loaded."""
    rt = served.rt
    await stored_session(rt, "parent")
    await one_shot_child(rt, "parent", "child", live=live)
    served.reads.reset()
    body = {"content": [{"type": "text", "text": "hi"}]} if route == "prompt" else None
    response = await served.http.post(f"/api/v1/sessions/child/{route}", json=body)
    details = assert_error(response, 409, "agent-busy")
    assert details == {"reason": "use subagent delivery for this child session"}
    assert response.json()["error"]["message"] == 'session "child" is owned by subagent routing'
    assert served.reads.total_reads == 0
    assert rt.agents.get("child") is None
    assert (rt.sessions.get("child") is not None) is live


async def test_an_ordinary_fork_is_never_fenced(served: Api) -> None:
    """A fork whose seed holds a descriptor but whose header has no origin accepts a prompt (202)."""
    rt = served.rt
    await stored_session(rt, "parent")
    await continuable_child(rt, "parent", "child")
    child = await rt.query.observe_session("child")
    fork = rt.sessions.create(
        "fork",
        header=HeaderInit(parent_session="child"),
        seed=list(child.events),
        inherited_event_count=len(child.events),
    )
    await rt.sessions.flush(fork)
    rt.sessions.dispose(fork)
    response = await served.http.post(
        "/api/v1/sessions/fork/prompt", json={"content": [{"type": "text", "text": "go"}]}
    )
    assert response.status_code == 202, response.text
    await rt.settle(HANG_GUARD_S)


async def test_generic_history_of_a_child_observes_only(served: Api) -> None:
    """`getSessionHistory` of a subagent child is 200 with its events, and no agent is registered afterwards."""
    rt = served.rt
    await stored_session(rt, "parent")
    await continuable_child(rt, "parent", "child")
    page = (await served.http.get("/api/v1/sessions/child/history")).json()
    assert page["sessionId"] == "child"
    assert page["header"]["origin"] == "subagent"
    assert page["events"][0]["event"]["type"] == "subagent/descriptor"
    assert rt.agents.get("child") is None
    assert rt.sessions.get("child") is None


async def test_prompting_a_stored_session_resumes_it_first(served: Api) -> None:
    """A stored top-level session is cold-resumed as a top-level agent, then gets the prompt as turn 2."""
    rt = served.rt
    await stored_session(rt, "cold")
    response = await served.http.post(
        "/api/v1/sessions/cold/prompt", json={"content": [{"type": "text", "text": "more"}]}
    )
    assert response.status_code == 202, response.text
    await rt.settle(HANG_GUARD_S)
    agent = rt.agents.get("cold")
    assert agent is not None
    starts = [event.data["turn"] for event in agent.session.events if event.type == "turn/start"]  # type: ignore[index]
    assert starts == [1, 2]


async def test_resume_makes_a_cold_parent_live(served: Api) -> None:
    """`resumeSession` registers the stored session's agent and answers its summary; a second call is idempotent."""
    await stored_session(served.rt, "cold")
    first = await served.http.post("/api/v1/sessions/cold/resume")
    assert first.status_code == 200, first.text
    assert first.json()["status"] == "idle"
    again = await served.http.post("/api/v1/sessions/cold/resume")
    assert again.json() == first.json()
    assert_error(await served.http.post("/api/v1/sessions/missing/resume"), 404, "session-not-found")


async def test_concurrent_resumes_of_one_session_share_one_agent(served: Api) -> None:
    """Two prompts racing to resume the same stored session both succeed on the one agent."""
    await stored_session(served.rt, "cold")
    body = {"content": [{"type": "text", "text": "x"}]}
    first, second = await asyncio.gather(
        served.http.post("/api/v1/sessions/cold/prompt", json=body),
        served.http.post("/api/v1/sessions/cold/prompt", json=body),
    )
    assert (first.status_code, second.status_code) == (202, 202)
    await served.rt.settle(HANG_GUARD_S)


async def test_interrupt_cancels_a_running_turn_and_is_a_no_op_otherwise(tmp_path: Path) -> None:
    """A held turn is cancelled (cause `user`, it ends `aborted`); an idle or stored session accepts it as a no-op."""
    from tests.server.helpers import scripted

    model = scripted(main=[{"hold": "slow", "text": "partial answer"}])
    async with api(tmp_path / "home", model=model) as served:
        created = (await served.http.post("/api/v1/sessions", json={"prompt": "work"})).json()
        session_id = created["session"]["id"]
        agent = served.rt.agents.get(session_id)
        assert agent is not None
        result = agent.turn_result(created["messageId"])
        await asyncio.wait_for(model.wait_held("slow"), HANG_GUARD_S)
        response = await served.http.post(f"/api/v1/sessions/{session_id}/interrupt")
        assert response.json() == {"accepted": True}
        turn = await asyncio.wait_for(result, HANG_GUARD_S)
        assert turn.stop_reason == "aborted"
        await stored_session(served.rt, "cold")
        assert (await served.http.post("/api/v1/sessions/cold/interrupt")).json() == {"accepted": True}
        assert_error(await served.http.post("/api/v1/sessions/missing/interrupt"), 404, "session-not-found")


async def test_a_registered_title_unit_gives_live_sessions_a_title(served: Api) -> None:
    """With a client-visible `title` unit, a live session's summary carries its title; a cold one has none."""
    from dsh.projection import ClientView, ProjectionUnit

    class Passthrough:
        def validate_python(self, value: object, /) -> object:
            return value

    def apply(state: Any, event: Any) -> Any:
        return {"title": event.data["title"]} if event.type == "session/title" else state

    unit: ProjectionUnit[Any, Any] = ProjectionUnit(
        key="title",
        state_version=1,
        init=dict,
        apply=apply,
        state_schema=Passthrough(),
        view=ClientView(render=lambda state: state.get("title"), schema=Passthrough()),
    )
    dispose = served.rt.projections.register(unit)
    try:
        live = await stored_session(served.rt, "live", live=True)
        live.append("session/title", {"title": "Teapots", "messageSeqs": [], "source": {"kind": "user"}})
        await stored_session(served.rt, "cold")
        items = {item["id"]: item for item in (await served.http.get("/api/v1/sessions")).json()["items"]}
        assert items["live"]["title"] == "Teapots"
        assert "title" not in items["cold"]
    finally:
        dispose()
