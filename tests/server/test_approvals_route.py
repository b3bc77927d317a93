"""Approvals over the HTTP API: a pending question is pushed on the stream and decided by `decideApproval`.

`dsh serve` keeps an agent's question pending until a client decides it: the stream carries an
`approval/pending` frame (with the exact command), `GET /api/v1/approvals` lists it, `POST
/api/v1/approvals/{id}` answers it, and an `approval/settled` frame follows. A question nobody answers
is refused after `approvals.timeout_s`; a decision for a request that is not pending is 404.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from dsh.agent.ids import SequentialIds
from dsh.config import Config
from dsh.runtime import Runtime
from dsh.testing.event_shapes import assert_harness_shapes
from dsh.testing.server import LiveServer, running_server
from dsh.testing.stored_logs import StepClock
from tests.server.helpers import assert_error
from tests.server.stream_helpers import HANG_GUARD_S, EventSource, scripted

_BASH = {"name": "bash", "arguments": {"command": "echo approved", "description": "Say it"}}


@contextlib.asynccontextmanager
async def _served(tmp_path: Path, **approvals: Any) -> AsyncIterator[tuple[Runtime, LiveServer]]:
    workspace = tmp_path / "work"
    workspace.mkdir()
    model = scripted({"main": [{"toolCalls": [_BASH]}, {"text": "finished"}]})
    config = Config(home=tmp_path / "home", approvals=approvals or {}, sandbox="off")
    async with Runtime.open(
        config, model=model, ids=SequentialIds(), clock=StepClock(), use_cache=False, workspace=workspace
    ) as rt:
        async with running_server(rt) as server:
            yield rt, server


async def test_a_pending_question_is_pushed_listed_and_decided(tmp_path: Path) -> None:
    """The stream announces the question, the list shows it, the route allows it, the call runs."""
    async with _served(tmp_path) as (rt, server), server.client() as http:
        async with http.stream("GET", "/api/v1/stream") as response:
            source = EventSource(response)
            created = await http.post("/api/v1/sessions", json={"prompt": "run it"})
            session_id = created.json()["session"]["id"]
            frames = await source.until(lambda got: any(frame.event == "approval/pending" for frame in got))
            pending = next(frame.data for frame in frames if frame.event == "approval/pending")
            approval = pending["approval"]
            assert pending["sessionId"] == session_id
            assert (approval["toolName"], approval["subject"], approval["preview"]) == (
                "bash",
                "echo approved",
                "$ echo approved",
            )
            assert approval["label"] == "main"
            listed = await http.get("/api/v1/approvals")
            assert listed.status_code == 200
            assert [item["id"] for item in listed.json()["items"]] == [approval["id"]]
            decided = await http.post(f"/api/v1/approvals/{approval['id']}", json={"decision": "allow"})
            assert decided.status_code == 200, decided.text
            assert decided.json() == {"id": approval["id"], "sessionId": session_id, "decision": "allow"}
            frames = await source.until(lambda got: any(frame.event == "approval/settled" for frame in got))
            settled = next(frame.data for frame in frames if frame.event == "approval/settled")
            assert settled == {"sessionId": session_id, "id": approval["id"], "outcome": "allowed-once"}
        await rt.settle(timeout=HANG_GUARD_S)
        assert (await http.get("/api/v1/approvals")).json() == {"items": []}
        again = await http.post(f"/api/v1/approvals/{approval['id']}", json={"decision": "deny"})
        assert_error(again, 404, "approval-not-found")
        events = list(rt.sessions.get(session_id).events)  # type: ignore[union-attr]
    results = [event.data["message"]["content"][0] for event in events if event.type == "tool/result"]  # type: ignore[index]
    assert [block["content"][0]["text"] for block in results] == ["approved\n"]
    assert [event.data["outcome"] for event in events if event.type == "approval/decided"] == ["allowed-once"]  # type: ignore[index]
    assert_harness_shapes(events)


async def test_an_unanswered_question_is_refused_after_its_time(tmp_path: Path) -> None:
    """With nobody deciding, the call is refused as unavailable once `approvals.timeout_s` passed."""
    async with _served(tmp_path, timeout_s=0.05) as (rt, server), server.client() as http:
        created = await http.post("/api/v1/sessions", json={"prompt": "run it"})
        session_id = created.json()["session"]["id"]
        await rt.settle(timeout=HANG_GUARD_S)
        events = list(rt.sessions.get(session_id).events)  # type: ignore[union-attr]
    (text,) = [
        event.data["message"]["content"][0]["content"][0]["text"]
        for event in events
        if event.type == "tool/result"  # type: ignore[index]
    ]
    assert "no decision within 0.05 s" in text
    assert [event.data["outcome"] for event in events if event.type == "approval/decided"] == ["unavailable"]  # type: ignore[index]


async def test_a_decision_must_be_one_of_the_three_answers(tmp_path: Path) -> None:
    """An unknown decision is a bad request; an unknown id is `approval-not-found`."""
    async with _served(tmp_path) as (_, server), server.client() as http:
        assert_error(await http.post("/api/v1/approvals/nope", json={"decision": "maybe"}), 400, "bad-request")
        assert_error(await http.post("/api/v1/approvals/nope", json={"decision": "allow"}), 404, "approval-not-found")
