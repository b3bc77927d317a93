"""Two `dsh serve` processes on one PostgreSQL schema serve every session together (docs/server.md#replicas).

Each test starts real replicas (`python -m dsh serve --database-url postgresql://...`, scripted model,
a shared token) on its own throw-away schema, so its tables and notification channel are its own.
Waits are on facts (a frame, a row) under a hang guard, never timing assertions.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from dsh.testing.postgres import ThrowawaySchemas
from tests.postgres.helpers import sql
from tests.postgres.replicas import (
    GUARD_S,
    Replica,
    ReplicaGroup,
    event_seqs,
    replica_group,
    stream,
    summarised,
    turn_end,
)

pytestmark = pytest.mark.slow

PROMPT = {"content": [{"type": "text", "text": "tell me"}]}
HOLD = {"content": [{"type": "text", "text": "HOLD this turn"}]}


async def _create(replica: Replica) -> str:
    async with replica.client() as http:
        response = await http.post("/api/v1/sessions")
        assert response.status_code == 201, response.text
        return str(response.json()["session"]["id"])


async def _prompt(replica: Replica, session_id: str, body: dict[str, object] = PROMPT) -> str:
    async with replica.client() as http:
        response = await http.post(f"/api/v1/sessions/{session_id}/prompt", json=body)
        assert response.status_code == 202, response.text
        return str(response.json()["messageId"])


async def _until(predicate: object) -> None:
    async def wait() -> None:
        while True:
            value = predicate()  # type: ignore[operator]
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return
            await asyncio.sleep(0.05)

    await asyncio.wait_for(wait(), GUARD_S)


def _user_messages(stored: list[tuple[int, str, dict[str, Any]]]) -> list[str]:
    """The ids of the messages people sent (not the runtime's context messages), in log order."""
    return [data["id"] for _, kind, data in stored if kind == "user/message" and data["source"]["kind"] == "user"]


async def _turn_ended(group: ReplicaGroup, session_id: str, turn: int) -> dict[str, object] | None:
    for _, kind, data in await group.stored(session_id):
        if kind == "turn/end" and data.get("turn") == turn:
            return data
    return None


async def test_a_client_of_replica_b_sees_every_frame_of_a_turn_run_on_a_and_resumes_exactly_on_either(
    pg_schemas: ThrowawaySchemas, tmp_path: Path
) -> None:
    """B's client gets every frame of a turn run on A once, in order; a reconnect to A resumes exactly."""
    async with replica_group(pg_schemas.url, pg_schemas.new(), tmp_path) as group:
        a, b = await group.start("a"), await group.start("b")
        session_id = await _create(a)
        async with stream(b, session_id) as on_b:
            start = on_b.last_id
            assert start is not None
            await _prompt(a, session_id)
            await on_b.until(turn_end(1))
        stored = await group.stored(session_id)
        assert event_seqs(on_b.events) == summarised(stored, int(start))
        assert {"session/event"} <= {sse.event for sse in on_b.events}

        # Turn 2: B's client leaves after the first frame, then reconnects to A with its last id.
        async with stream(b, session_id) as on_b:
            await _prompt(a, session_id)
            first = await on_b.until(lambda sse: sse.event == "session/event")
            last_id = first[-1].last_id
            assert last_id is not None
        await _until(lambda: _turn_ended(group, session_id, 2))
        async with stream(a, session_id, last_event_id=last_id) as on_a:
            await on_a.until(turn_end(2))
        stored = await group.stored(session_id)
        seen = int(last_id)
        assert event_seqs(on_a.events) == summarised(stored, seen)
        assert on_a.events[-1].last_id == str(stored[-1][0]) or stored[-1][1] == "assistant/chunk"


async def test_a_prompt_sent_to_the_replica_without_the_lease_runs_on_the_holder_and_an_interrupt_there_stops_it(
    pg_schemas: ThrowawaySchemas, tmp_path: Path
) -> None:
    """B forwards a prompt for A's session through the store and A runs it; B's interrupt stops A's turn."""
    async with replica_group(pg_schemas.url, pg_schemas.new(), tmp_path) as group:
        a, b = await group.start("a"), await group.start("b")
        session_id = await _create(a)
        holder = await group.holder_of(session_id)
        async with stream(b, session_id) as on_b:
            message_id = await _prompt(b, session_id)
            await on_b.until(turn_end(1))
            assert _user_messages(await group.stored(session_id)) == [message_id]
            assert await group.holder_of(session_id) == holder

            await _prompt(b, session_id, HOLD)
            await on_b.until(lambda sse: sse.event == "session/event" and sse.data["type"] == "step/start")
            async with b.client() as http:
                response = await http.post(f"/api/v1/sessions/{session_id}/interrupt")
                assert response.status_code == 200, response.text
            ended = await on_b.until(turn_end(2))
        assert ended[-1].data["summary"]["reason"]["kind"] == "aborted"
        data = await _turn_ended(group, session_id, 2)
        assert data is not None
        assert data["reason"] == {"kind": "aborted", "reason": {"kind": "user"}}
        rows = await sql(
            group.url, "SELECT kind, state, handler FROM {s}.session_requests ORDER BY id", schema=group.schema
        )
        assert [(kind, state, handler == holder) for kind, state, handler in rows] == [
            ("prompt", "done", True),
            ("prompt", "done", True),  # done once its (interrupted) turn ended
            ("interrupt", "done", True),
        ]


async def test_sigkill_of_the_holder_mid_turn_hands_the_session_and_its_pending_prompt_to_the_other_replica(
    pg_schemas: ThrowawaySchemas, tmp_path: Path
) -> None:
    """SIGKILLed holder: B takes over at once, the turn is closed, the queued prompt runs, nothing is lost."""
    async with replica_group(pg_schemas.url, pg_schemas.new(), tmp_path) as group:
        # Leases outlive the test: only the proof that A's process is gone lets B take over.
        a = await group.start("a", DSH_PG_LEASE_TTL_S="600", DSH_PG_LEASE_RENEW_S="10")
        b = await group.start("b", DSH_PG_LEASE_TTL_S="600", DSH_PG_LEASE_RENEW_S="10")
        session_id = await _create(a)
        holder_a = await group.holder_of(session_id)
        async with stream(b, session_id) as on_b:
            await _prompt(a, session_id, HOLD)
            await on_b.until(lambda sse: sse.event == "session/event" and sse.data["type"] == "step/start")
            queued = await _prompt(b, session_id)  # accepted by A, queued behind the held turn
            acknowledged = await group.stored(session_id)
            await a.kill()
            await on_b.until(turn_end(2))
        stored = await group.stored(session_id)
        assert stored[: len(acknowledged)] == acknowledged
        ends = {data["turn"]: data["reason"] for _, kind, data in stored if kind == "turn/end"}
        assert ends[1] == {"kind": "interrupted"}  # the crash rules close the dead holder's turn
        assert ends[2] == {"kind": "completed"}
        users = _user_messages(stored)
        assert users[-1] == queued
        assert users.count(queued) == 1
        holder_b = await group.holder_of(session_id)
        assert holder_b is not None
        assert holder_b != holder_a
        await _until(lambda: _all_done(group))  # the adopted request is finished by its new holder


async def _all_done(group: ReplicaGroup) -> bool:
    rows = await sql(group.url, "SELECT state FROM {s}.session_requests", schema=group.schema)
    return all(state == "done" for (state,) in rows)


async def test_a_holder_that_only_looks_remote_is_replaced_once_its_lease_expired(
    pg_schemas: ThrowawaySchemas, tmp_path: Path
) -> None:
    """A holder named after another host is waited for: B takes the session only once its lease expired."""
    async with replica_group(pg_schemas.url, pg_schemas.new(), tmp_path) as group:
        a = await group.start("a", DSH_PG_LEASE_TTL_S="3", DSH_PG_LEASE_RENEW_S="1")
        b = await group.start("b", DSH_PG_LEASE_TTL_S="3", DSH_PG_LEASE_RENEW_S="1")
        session_id = await _create(a)
        await _prompt(a, session_id)
        await _until(lambda: _turn_ended(group, session_id, 1))
        await a.kill()
        await sql(
            group.url,
            "UPDATE {s}.session_leases SET holder = 'feedc0ffee00@elsewhere:1', expires_at = now() + interval '3 s' "
            "WHERE session_id = %s",
            [session_id],
            schema=group.schema,
        )
        message_id = await _prompt(b, session_id)
        await _until(lambda: _turn_ended(group, session_id, 2))
        assert _user_messages(await group.stored(session_id))[-1] == message_id
        rows = await sql(group.url, "SELECT kind, sender = handler FROM {s}.session_requests", schema=group.schema)
        assert rows == [("prompt", True)]  # it waited as a request row, then B took the session and did it
        assert (await group.holder_of(session_id) or "").split("@")[1] != "elsewhere:1"


async def test_killing_the_notification_connection_mid_stream_loses_no_frame(
    pg_schemas: ThrowawaySchemas, tmp_path: Path
) -> None:
    """B's listening connection is terminated mid-stream: it listens again and its client misses no frame."""
    async with replica_group(pg_schemas.url, pg_schemas.new(), tmp_path) as group:
        a, b = await group.start("a"), await group.start("b")
        holder_b = await group.holder_of(await _create(b))
        session_id = await _create(a)
        async with stream(b, session_id) as on_b:
            start = int(on_b.last_id or "-1")
            await _prompt(a, session_id)
            await on_b.until(lambda sse: sse.event == "session/event")
            killed = await sql(
                group.url,
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
                [f"dsh listen {holder_b}"[:63]],
            )
            assert killed == [(True,)]
            await _prompt(a, session_id)  # turn 2 commits while B may not be listening
            await on_b.until(turn_end(2))
            await _prompt(a, session_id)
            await on_b.until(turn_end(3))
        stored = await group.stored(session_id)
        assert event_seqs(on_b.events) == summarised(stored, start)
        async with b.client() as http:
            ready = await http.get("/api/v1/ready")
        assert ready.json()["checks"] == {"store": "ok", "notices": "ok"}  # it listens again


async def test_an_idle_session_is_released_and_the_next_prompt_lands_on_the_replica_that_received_it(
    pg_schemas: ThrowawaySchemas, tmp_path: Path
) -> None:
    """An idle session's lease is released (`DSH_SERVE_IDLE_RELEASE_S`); B's prompt then takes it directly."""
    async with replica_group(pg_schemas.url, pg_schemas.new(), tmp_path) as group:
        a = await group.start("a", DSH_SERVE_IDLE_RELEASE_S="1")
        b = await group.start("b")
        session_id = await _create(a)
        await _prompt(a, session_id)
        await _until(lambda: _turn_ended(group, session_id, 1))
        await _until(lambda: _no_lease(group, session_id))
        await _prompt(b, session_id)
        await _until(lambda: _turn_ended(group, session_id, 2))
        assert await group.holder_of(session_id) is not None
        assert await sql(group.url, "SELECT count(*) FROM {s}.session_requests", schema=group.schema) == [(0,)]
        async with a.client() as http:
            ready = await http.get("/api/v1/ready")
        assert ready.status_code == 200
        assert ready.json()["checks"] == {"store": "ok", "notices": "ok"}


async def _no_lease(group: ReplicaGroup, session_id: str) -> bool:
    return await group.holder_of(session_id) is None


async def test_an_approval_waiting_on_the_holder_is_decided_through_the_other_replica(
    pg_schemas: ThrowawaySchemas, tmp_path: Path
) -> None:
    """A's tool call waits for approval; B's clients see `approval/pending`; B's decision reaches A, the call runs."""
    async with replica_group(pg_schemas.url, pg_schemas.new(), tmp_path) as group:
        a, b = await group.start("a"), await group.start("b")
        session_id = await _create(a)
        async with stream(b, session_id) as on_b:
            await _prompt(a, session_id, {"content": [{"type": "text", "text": "WRITE a note"}]})
            pending = await on_b.until(lambda sse: sse.event == "approval/pending")
            approval_id = pending[-1].data["approval"]["id"]
            async with b.client() as http:
                assert (await http.get("/api/v1/approvals")).json() == {"items": []}  # it waits on A
                decided = await http.post(f"/api/v1/approvals/{approval_id}", json={"decision": "allow"})
                assert decided.status_code == 200, decided.text
                assert decided.json() == {"id": approval_id, "sessionId": session_id, "decision": "allow"}
                missing = await http.post("/api/v1/approvals/nobody", json={"decision": "allow"})
                assert missing.status_code == 404
            settled = await on_b.until(lambda sse: sse.event == "approval/settled")
            assert settled[-1].data["outcome"] == "allowed-once"
            await on_b.until(turn_end(1))
        assert (tmp_path / "note.txt").read_text(encoding="utf-8") == "hi"
