"""History pages on both routes: one shared read, message-aligned paging, fail-soft projections."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from dsh.projection import ClientView, ProjectionUnit
from dsh.session.session import Session
from tests.server.helpers import Api, api, assert_error, continuable_child, stored_session

pytestmark = pytest.mark.slow  # each test starts a real HTTP server: `make test` only


class _Passthrough:
    def validate_python(self, value: object, /) -> object:
        return value


def _hostile_unit() -> ProjectionUnit[Any, Any]:
    def apply(state: Any, event: Any) -> Any:
        raise RuntimeError("hostile unit")

    return ProjectionUnit(
        key="hostile",
        state_version=1,
        init=dict,
        apply=apply,
        state_schema=_Passthrough(),
        view=ClientView(render=lambda state: None, schema=_Passthrough()),
    )


def _chatty(session: Session, turns: int) -> None:
    """`turns` turns of one user message and one assistant message assembled from two chunks (60 messages for 30)."""
    for turn in range(1, turns + 1):
        session.append("turn/start", {"turn": turn})
        user = {
            "id": f"u{turn}",
            "role": "user",
            "content": [{"type": "text", "text": f"q{turn}"}],
            "source": {"kind": "user"},
        }
        session.append("user/message", user)
        session.append("step/start", {"turn": turn, "step": 1})
        chunks = [
            session.append(
                "assistant/chunk", {"turn": turn, "step": 1, "chunk": {"type": "text-delta", "text": part}}
            ).seq
            for part in ("a", "b")
        ]
        message = {
            "id": f"a{turn}",
            "role": "assistant",
            "content": [{"type": "text", "text": "ab"}],
            "source": {"kind": "model", "provider": "scripted", "model": "m"},
        }
        session.append("assistant/message", {"turn": turn, "step": 1, "message": message}, source_event_seqs=chunks)
        session.append("step/end", {"turn": turn, "step": 1})
        session.append("turn/end", {"turn": turn, "reason": {"kind": "completed"}})


def _messages(page: dict[str, Any]) -> list[dict[str, Any]]:
    return [e["event"] for e in page["events"] if e["event"]["type"] in ("user/message", "assistant/message")]


async def test_sixty_messages_page_as_fifty_then_ten_without_splitting_a_group(served: Api) -> None:
    """Defaults give 50 messages and `hasMore`; `beforeSeq` = the first seq gives the other 10; groups stay whole."""
    session = served.rt.sessions.create("chatty")
    _chatty(session, 30)
    await served.rt.sessions.flush(session)
    served.rt.sessions.dispose(session)
    tail = (await served.http.get("/api/v1/sessions/chatty/history")).json()
    assert len(_messages(tail)) == 50
    assert tail["hasMore"] is True
    first_seq = tail["events"][0]["event"]["seq"]
    assert tail["nextBeforeSeq"] == first_seq
    assert "projections" in tail
    older = (await served.http.get("/api/v1/sessions/chatty/history", params={"beforeSeq": first_seq})).json()
    assert len(_messages(older)) == 10
    assert older["hasMore"] is False
    assert "nextBeforeSeq" not in older
    assert "projections" not in older
    for page in (tail, older):
        seqs = {entry["event"]["seq"] for entry in page["events"]}
        for message in _messages(page):
            assert set(message.get("sourceEventSeqs", ())) <= seqs
    assert older["events"][-1]["event"]["seq"] + 1 == first_seq


async def _both(served: Api, parent: str, child: str, **params: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    served.reads.reset()
    generic = await served.http.get(f"/api/v1/sessions/{child}/history", params=params)
    generic_reads = served.reads.total_reads
    assert generic.status_code == 200, generic.text
    served.reads.reset()
    scoped = await served.http.get(f"/api/v1/sessions/{parent}/subagents/{child}/history", params=params)
    assert scoped.status_code == 200, scoped.text
    return {"page": generic.json(), "reads": generic_reads}, {"page": scoped.json(), "reads": served.reads.total_reads}


async def test_both_routes_read_the_same_events_live_without_log_reads(served: Api) -> None:
    """For a live child, generic and subagent history give identical events, and neither reads a log."""
    rt = served.rt
    await stored_session(rt, "parent")
    await continuable_child(rt, "parent", "child", live=True)
    generic, scoped = await _both(served, "parent", "child")
    assert generic["page"]["events"] == scoped["page"]["events"]
    assert generic["page"]["live"] is True
    assert (generic["reads"], scoped["reads"]) == (0, 0)
    assert generic["page"]["projections"] == scoped["page"]["projections"]
    assert generic["page"]["projections"]["values"]["subagent"]["label"] == "Collect sources"


async def test_both_routes_read_the_same_events_cold_with_one_observation_each(tmp_path: Path) -> None:
    """A cold child: each route observes the log once (the catalog hits the cache); tail pages carry projections."""
    async with api(tmp_path / "home", use_cache=True) as served:
        rt = served.rt
        await stored_session(rt, "parent")
        await continuable_child(rt, "parent", "child")
        served.reads.reset()
        catalog = await served.http.get("/api/v1/sessions/parent/subagents")
        assert [row["id"] for row in catalog.json()["entries"]] == ["child"]
        assert served.reads.total_reads == 0, "the catalog served the cold child from the projection cache"
        generic, scoped = await _both(served, "parent", "child")
        assert generic["page"]["events"] == scoped["page"]["events"]
        assert generic["page"]["live"] is False
        assert (generic["reads"], scoped["reads"]) == (1, 1)
        assert generic["page"]["projections"]["values"]["subagent"]["mode"] == "continuable"
        first = generic["page"]["events"][-1]["event"]["seq"]
        older_generic, older_scoped = await _both(served, "parent", "child", beforeSeq=first)
        assert "projections" not in older_generic["page"]
        assert "projections" not in older_scoped["page"]
        assert older_generic["page"]["events"] == older_scoped["page"]["events"]


@pytest.mark.parametrize("live", [False, True])
async def test_a_hostile_unit_drops_projections_and_logs_one_warning(
    served: Api, live: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A raising projection unit: both routes answer 200 without `projections`, one warning per read."""
    rt = served.rt
    await stored_session(rt, "parent")
    await continuable_child(rt, "parent", "child", live=live)
    dispose = rt.projections.register(_hostile_unit())
    try:
        for path in ("/api/v1/sessions/child/history", "/api/v1/sessions/parent/subagents/child/history"):
            caplog.clear()
            with caplog.at_level(logging.WARNING):
                response = await served.http.get(path)
            assert response.status_code == 200, response.text
            assert "projections" not in response.json()
            warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("dsh.query")]
            assert len(warnings) == 1
            assert not [r for r in caplog.records if r.name.startswith("dsh.server") and r.levelno >= logging.WARNING]
    finally:
        dispose()


async def test_history_errors(served: Api) -> None:
    """Unknown id → 404 `session-not-found`; a corrupt stored log → 500 `session-unreadable`; bad paging → 400."""
    assert_error(await served.http.get("/api/v1/sessions/nobody/history"), 404, "session-not-found")
    await stored_session(served.rt, "plain")
    for params in ({"beforeSeq": -1}, {"maxMessages": 0}, {"maxMessages": 201}, {"beforeSeq": "x"}):
        assert_error(await served.http.get("/api/v1/sessions/plain/history", params=params), 400, "bad-request")
