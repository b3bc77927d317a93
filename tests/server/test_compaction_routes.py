"""The HTTP API of long sessions: `compactSession`, and titles and token totals on session summaries."""

from __future__ import annotations

from pathlib import Path

from dsh.testing.event_shapes import assert_harness_shapes
from tests.server.helpers import api, assert_error, one_shot_child, scripted

PROMPT = {"content": [{"type": "text", "text": "Plan the team offsite in Lisbon"}]}
USAGE = {"inputTokens": 400, "outputTokens": 40, "cacheReadTokens": 100}


async def _two_turns(http, rt) -> str:  # type: ignore[no-untyped-def]
    created = (await http.post("/api/v1/sessions", json={"prompt": "Plan the team offsite in Lisbon"})).json()
    session_id = created["session"]["id"]
    agent = rt.agents.get(session_id)
    await agent.turn_result(created["messageId"])
    second = (await http.post(f"/api/v1/sessions/{session_id}/prompt", json=PROMPT)).json()
    await agent.turn_result(second["messageId"])
    return str(session_id)


async def test_compact_session_writes_one_compaction_and_the_summary_shows_title_and_tokens(tmp_path: Path) -> None:
    """`POST .../compact` writes one compaction and answers it; `getSession` and `listSessions` carry the title
    and the token total from the live registry."""
    model = scripted(
        main=[{"text": "one", "usage": USAGE}, {"text": "two", "usage": USAGE}],
        compaction=[{"text": "## Goal\n- an offsite"}],
    )
    async with api(tmp_path / "home", model=model) as ready:
        session_id = await _two_turns(ready.http, ready.rt)
        response = await ready.http.post(f"/api/v1/sessions/{session_id}/compact")
        assert response.status_code == 200, response.text
        body = response.json()
        summary = (await ready.http.get(f"/api/v1/sessions/{session_id}")).json()
        listed = (await ready.http.get("/api/v1/sessions")).json()["items"]
        events = list(ready.rt.sessions.get(session_id).events)  # type: ignore[union-attr]
    assert body["compacted"] is True
    assert body["compaction"]["summary"] == "## Goal\n- an offsite"
    assert [event.type for event in events].count("compaction/start") == 1
    assert events[body["compaction"]["endSeq"]].type == "compaction/end"
    assert summary["title"] == "Plan the team offsite in"
    # Two turns and the summary request (the script's default usage); the scripted model has no price.
    assert summary["tokens"] == {
        "inputTokens": 810,
        "outputTokens": 85,
        "cacheReadTokens": 200,
        "cacheWriteTokens": 0,
        "reasoningTokens": 0,
        "requests": 3,
    }
    assert listed == [summary]
    assert_harness_shapes(events)


async def test_a_failed_compaction_is_502_and_the_session_takes_the_next_prompt(tmp_path: Path) -> None:
    """A summary request that fails answers 502 `compaction-failed` with the reason; the session is unchanged and
    its next prompt runs."""
    model = scripted(
        main=[{"text": "one"}, {"text": "two"}, {"text": "three"}],
        compaction=[{"error": {"code": "MODEL_UNAVAILABLE", "message": "summary model down"}}],
    )
    async with api(tmp_path / "home", model=model) as ready:
        session_id = await _two_turns(ready.http, ready.rt)
        agent = ready.rt.agents.get(session_id)
        assert agent is not None
        before = list(agent.session.surface.nodes)
        response = await ready.http.post(f"/api/v1/sessions/{session_id}/compact")
        assert_error(response, 502, "compaction-failed")
        assert "summary model down" in response.json()["error"]["message"]
        assert list(agent.session.surface.nodes) == before
        third = (await ready.http.post(f"/api/v1/sessions/{session_id}/prompt", json=PROMPT)).json()
        result = await agent.turn_result(third["messageId"])
        assert (result.stop_reason, result.output) == ("completed", "three")


async def test_compact_answers_false_when_nothing_is_worth_summarising_and_refuses_children(tmp_path: Path) -> None:
    """A one-exchange session answers `{compacted: false}`; an unknown id is 404, a subagent child 409."""
    async with api(tmp_path / "home", model=scripted(main=[{"text": "one"}])) as ready:
        created = (await ready.http.post("/api/v1/sessions", json={"prompt": "hello"})).json()
        session_id = created["session"]["id"]
        await ready.rt.agents.get(session_id).turn_result(created["messageId"])  # type: ignore[union-attr]
        response = await ready.http.post(f"/api/v1/sessions/{session_id}/compact")
        assert response.json() == {"compacted": False}
        assert_error(await ready.http.post("/api/v1/sessions/nobody/compact"), 404, "session-not-found")
        await one_shot_child(ready.rt, session_id, "fenced-child")
        assert_error(await ready.http.post("/api/v1/sessions/fenced-child/compact"), 409, "agent-busy")
