"""`GET /api/v1/stream` through a real server: a parent's frames while a background child runs, resume, auth.

Layer: server. The runtime runs a scripted parent that starts a background child with the `agent`
tool; the child's answer is held at a gate until the test has seen `subagent/start`. Frames are read
with httpx's streaming API and parsed as a browser's EventSource would.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from dsh.runtime import Runtime
from dsh.server.stream import RESET_LAST_EVENT_ID
from tests.server.helpers import assert_error
from tests.server.stream_helpers import HANG_GUARD_S, EventSource, Received, scripted, served_hub

pytestmark = pytest.mark.slow  # each test starts a real HTTP server: `make test` only

HELPER = "Helper"


def _parent_script() -> Any:
    return scripted(
        {
            "main": [
                {
                    "match": {"lastUser": "start a helper"},
                    "toolCalls": [
                        {
                            "name": "agent",
                            "arguments": {"description": HELPER, "prompt": "Help out.", "run_in_background": True},
                        }
                    ],
                },
                {"text": "STARTED"},
            ],
            HELPER: [{"hold": HELPER, "text": "HELPER_OK"}],
        }
    )


def _prompt(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}]}


def _of(frames: list[Received], event: str) -> list[Received]:
    return [frame for frame in frames if frame.event == event]


def _last_turn_end(rt: Runtime, session_id: str) -> int:
    agent = rt.agents.get(session_id)
    assert agent is not None
    return max(event.seq for event in agent.session.events if event.type == "turn/end")


async def _run_parent_with_child(rt: Runtime, source: EventSource, http: Any, parent: str) -> list[Received]:
    """Prompt the parent, release its child once `subagent/start` arrived, and read until everything settled."""
    response = await http.post(f"/api/v1/sessions/{parent}/prompt", json=_prompt("start a helper"))
    assert response.status_code == 202, response.text
    started = await source.until(lambda got: bool(_of(got, "subagent/start")))
    assert not _of(started, "subagent/end")
    rt.model_client().release(HELPER)  # type: ignore[attr-defined]
    await source.until(lambda got: bool(_of(got, "subagent/end")))
    await rt.settle(timeout=HANG_GUARD_S)
    final = _last_turn_end(rt, parent)
    # Projection frames are coalesced for 100 ms: wait for the one the final turn end caused.
    return await source.until(
        lambda got: (
            any(f.data["seq"] == final for f in _of(got, "session/projection"))
            and any(f.data["seq"] == final for f in _of(got, "session/event"))
        )
    )


async def test_parent_stream_carries_child_lifecycle_events_and_null_projection_values(tmp_path: Path) -> None:
    """A stream on a parent gets start then end, rising event seqs matching the log, and present projection values."""
    async with served_hub(tmp_path / "home", _parent_script()) as (rt, _, server), server.client() as http:
        created = await http.post("/api/v1/sessions", json={})
        assert created.status_code == 201, created.text
        parent = created.json()["session"]["id"]
        async with http.stream("GET", "/api/v1/stream", params={"sessionId": parent}) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            source = EventSource(response)
            frames = await _run_parent_with_child(rt, source, http, parent)

        starts, ends = _of(frames, "subagent/start"), _of(frames, "subagent/end")
        assert len(starts) == 1
        assert len(ends) == 1
        assert frames.index(starts[0]) < frames.index(ends[0])
        child = starts[0].data["childSessionId"]
        assert starts[0].data == {
            "parentSessionId": parent,
            "childSessionId": child,
            "runId": starts[0].data["runId"],
            "provider": "spawn",
        }
        assert ends[0].data == {**starts[0].data, "stopReason": "completed", "hasOutput": True}

        # Only the parent's own frames, every event once and in log order, chunks left out.
        events = _of(frames, "session/event")
        assert {f.data["sessionId"] for f in events} == {parent}
        seqs = [f.data["seq"] for f in events]
        agent = rt.agents.get(parent)
        assert agent is not None
        assert seqs == [e.seq for e in agent.session.events if e.type != "assistant/chunk" and e.seq >= seqs[0]]
        assert seqs == sorted(set(seqs))

        projections = _of(frames, "session/projection")
        assert projections
        for frame in projections:
            assert list(frame.data) == ["type", "sessionId", "key", "value", "seq"]
            assert frame.data["sessionId"] == parent
        # The parent is no subagent: a `subagent` value it carries is a present `null`, never a dropped key,
        # and the child's identity never leaks into it. A client seeds its view from the history tail page
        # and applies each frame whose seq is newer; the parent's `subagent` stays a present null.
        identity = [frame for frame in projections if frame.data["key"] == "subagent"]
        assert all('"value":null' in frame.raw and frame.data["value"] is None for frame in identity)
        page = (await http.get(f"/api/v1/sessions/{parent}/history")).json()
        held = {key: (value, page["projections"]["asOfSeq"]) for key, value in page["projections"]["values"].items()}
        for frame in projections:
            key, value, seq = frame.data["key"], frame.data["value"], frame.data["seq"]
            if key not in held or seq > held[key][1]:
                held[key] = (value, seq)
        assert "subagent" in held
        assert held["subagent"][0] is None
        assert {frame.data["key"] for frame in projections} <= {"subagent", "subagentTiming", "title", "tokens"}

        # Every frame has a rising id, except the transient deltas of streamed text, which have none.
        assert all(frame.id is None for frame in frames if frame.event == "session/delta")
        ids = [frame.id for frame in frames if frame.event != "session/delta"]
        assert None not in ids
        assert ids == sorted(set(ids))  # type: ignore[type-var]


async def test_reconnect_inside_the_buffer_replays_missed_frames_and_outside_gets_reset(tmp_path: Path) -> None:
    """`Last-Event-ID` still in the ring buffer replays exactly the later frames; an evicted one gets `reset` first."""
    async with served_hub(tmp_path / "home", _parent_script(), buffer_size=32) as (rt, hub, server):
        async with server.client() as http:
            parent = (await http.post("/api/v1/sessions", json={})).json()["session"]["id"]
            async with http.stream("GET", "/api/v1/stream", params={"sessionId": parent}) as response:
                first = EventSource(response)
                frames = await _run_parent_with_child(rt, first, http, parent)
            oldest = hub.buffered()[0].id
            inside = next(frame for frame in frames if frame.id is not None and frame.id >= oldest)
            outside = frames[0]
            assert outside.id is not None
            assert outside.id < oldest - 1  # the scenario built more frames than the buffer keeps

            missed = [
                frame for frame in frames if frame.id is not None and inside.id is not None and frame.id > inside.id
            ]
            headers = {"Last-Event-ID": str(inside.id)}
            async with http.stream("GET", "/api/v1/stream", params={"sessionId": parent}, headers=headers) as response:
                replay = EventSource(response)
                await replay.until(lambda got: len(got) >= len(missed))
            assert [(f.id, f.event, f.raw) for f in replay.frames] == [(f.id, f.event, f.raw) for f in missed]

            headers = {"Last-Event-ID": str(outside.id)}
            async with http.stream("GET", "/api/v1/stream", params={"sessionId": parent}, headers=headers) as response:
                reset = EventSource(response)
                await reset.until(lambda got: len(got) >= 1)
                # After the reset only live frames follow: a new turn of the parent.
                answer = await http.post(f"/api/v1/sessions/{parent}/prompt", json=_prompt("anything else?"))
                assert answer.status_code == 202
                await reset.until(lambda got: any(f.event == "session/event" for f in got))
            assert reset.frames[0].event == "reset"
            assert reset.frames[0].data == {"reason": RESET_LAST_EVENT_ID}
            later = [f for f in reset.frames[1:] if f.event == "session/event"]
            assert later[0].data["seq"] > max(f.data["seq"] for f in _of(frames, "session/event"))
            assert all(f.id is not None and reset.frames[0].id is not None and f.id > reset.frames[0].id for f in later)
            await rt.settle(timeout=HANG_GUARD_S)


async def test_stream_without_a_token_is_unauthenticated(tmp_path: Path) -> None:
    """`GET /api/v1/stream` with no token, or a wrong one, answers 401 `unauthenticated` and subscribes nothing."""
    async with served_hub(tmp_path / "home", scripted({})) as (_, hub, server):
        for token in ("", "not-the-token"):
            async with server.client(token=token) as anonymous:
                response = await anonymous.get("/api/v1/stream")
            assert_error(response, 401, "unauthenticated")
            assert response.headers["www-authenticate"] == "Bearer"
        assert hub.subscribers() == ()


async def test_quiet_stream_gets_pings_and_shutdown_ends_it(tmp_path: Path) -> None:
    """A stream with nothing to send writes `: ping` comments, and closing the hub ends the response."""
    async with served_hub(tmp_path / "home", scripted({}), ping_interval_s=0.01) as (_, hub, server):
        async with server.client() as http, http.stream("GET", "/api/v1/stream") as response:
            source = EventSource(response)
            assert await source.until_comment() == ": ping"
            await hub.aclose()
            assert await source.rest() == []
            assert source.ended


async def test_unfiltered_stream_announces_new_sessions_and_statuses(tmp_path: Path) -> None:
    """Without a filter a client sees `session/created` for a new session and its status changes, no events."""
    model = scripted({"main": [{"text": "HI"}]})
    async with served_hub(tmp_path / "home", model) as (rt, _, server), server.client() as http:
        async with http.stream("GET", "/api/v1/stream") as response:
            source = EventSource(response)
            created = await http.post("/api/v1/sessions", json={"prompt": "hello"})
            assert created.status_code == 201, created.text
            session = created.json()["session"]
            frames = await source.until(
                lambda got: any(f.event == "session/status" and f.data["status"] == "idle" for f in got)
            )
        assert frames[0].event == "session/created"
        assert frames[0].data["session"]["id"] == session["id"]
        assert [(f.event, f.data) for f in frames[1:]] == [
            ("session/status", {"sessionId": session["id"], "status": status}) for status in ("running", "idle")
        ]
        assert orjson.loads(frames[0].raw)["session"]["status"] in {"idle", "running"}
        await rt.settle(timeout=HANG_GUARD_S)
