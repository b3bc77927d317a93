"""The push hub: frames from the runtime's notifications, the filter, replay, overflow, coalescing, close.

Layer: server. Each test opens an in-memory runtime with a started `PushHub` and reads frames from
subscriptions the way the stream route does, waiting on frames under the hang guard.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from dsh.server.stream import RESET_LAST_EVENT_ID, RESET_OVERFLOW, Frame, PushHub
from dsh.subagent.descriptor import snapshot_descriptor
from dsh.testing import ManualTimer
from tests.server.stream_helpers import HANG_GUARD_S, collect, hub_runtime, scripted, take

BROADCAST = [
    ("session/created", {"session": {"id": "new", "parentSession": "p"}}),
    ("session/status", {"sessionId": "a", "status": "running"}),
    ("subagent/start", {"parentSessionId": "p", "childSessionId": "c", "runId": "r", "provider": "spawn"}),
    ("subagent/end", {"parentSessionId": "p", "childSessionId": "c", "runId": "r", "provider": "spawn"}),
]
PER_SESSION = [
    ("session/event", {"sessionId": "a", "seq": 0, "type": "turn/start", "time": 1}),
    ("session/projection", {"type": "session/projection", "sessionId": "b", "key": "k", "value": None, "seq": 0}),
]


def _publish_all(hub: PushHub) -> list[Frame]:
    frames = [hub.publish(event, data) for event, data in [*BROADCAST, *PER_SESSION]]
    assert all(frame is not None for frame in frames)
    return [frame for frame in frames if frame is not None]


async def test_unfiltered_stream_gets_only_created_status_and_subagent_frames(tmp_path: Path) -> None:
    """Without a session filter only `session/created`, `session/status` and `subagent/*` frames flow."""
    async with hub_runtime(tmp_path) as (_, hub):
        subscription = hub.subscribe(None, None)
        _publish_all(hub)
        frames = await take(subscription, 4)
        assert [frame.event for frame in frames] == [event for event, _ in BROADCAST]
        assert subscription.queued == 0


@pytest.mark.parametrize(
    ("followed", "expected"),
    [
        ({"a"}, ["session/status", "session/event"]),
        ({"b"}, ["session/projection"]),
        ({"p"}, ["session/created", "subagent/start", "subagent/end"]),
        ({"c"}, ["subagent/start", "subagent/end"]),
        ({"new"}, ["session/created"]),
        ({"a", "c"}, ["session/status", "subagent/start", "subagent/end", "session/event"]),
        ({"p", "c", "new"}, ["session/created", "subagent/start", "subagent/end"]),
    ],
)
async def test_filtered_stream_matches_session_parent_and_child_ids(
    tmp_path: Path, followed: set[str], expected: list[str]
) -> None:
    """With `sessionId`s a frame flows (once) when its sessionId, parentSessionId or childSessionId is followed."""
    async with hub_runtime(tmp_path) as (_, hub):
        subscription = hub.subscribe(frozenset(followed), None)
        everything = hub.subscribe(frozenset({"a", "b", "c", "p", "new"}), None)
        _publish_all(hub)
        assert [frame.event for frame in await take(subscription, len(expected))] == expected
        assert subscription.queued == 0
        assert len(await take(everything, 6)) == 6


async def test_frame_encodes_as_server_sent_event_with_null_kept(tmp_path: Path) -> None:
    """A frame is `id`, `event`, one-line JSON `data` and a blank line; a `None` value is written as `null`."""
    async with hub_runtime(tmp_path) as (_, hub):
        frame = hub.publish("session/projection", dict(PER_SESSION[1][1]))
        assert frame is not None
        wire = frame.encode()
        assert (
            wire
            == (
                f"id: {frame.id}\nevent: session/projection\n"
                'data: {"type":"session/projection","sessionId":"b","key":"k","value":null,"seq":0}\n\n'
            ).encode()
        )


async def test_registry_push_of_no_value_reaches_the_client_as_present_null(tmp_path: Path) -> None:
    """A projection change to "no value" arrives as `value: null`, exactly as `push_frame` builds it."""
    async with hub_runtime(tmp_path) as (rt, hub):
        session = rt.sessions.create("s1")
        subscription = hub.subscribe(frozenset({"s1"}), None)
        good = session.append("subagent/descriptor", snapshot_descriptor("continuable", provider="spawn", label="x"))
        bad = session.append("subagent/descriptor", {"version": 99})
        frames = await collect(
            subscription, lambda got: any(f.event == "session/projection" and f.data["seq"] == bad.seq for f in got)
        )
        identity = [f.data for f in frames if f.event == "session/projection" and f.data["key"] == "subagent"]
        assert identity == [
            {
                "type": "session/projection",
                "sessionId": "s1",
                "key": "subagent",
                "value": {"mode": "continuable", "label": "x", "seq": good.seq},
                "seq": good.seq,
            },
            {"type": "session/projection", "sessionId": "s1", "key": "subagent", "value": None, "seq": bad.seq},
        ]
        last = next(f for f in frames if f.event == "session/projection" and f.data["value"] is None)
        assert orjson.loads(last.encode().split(b"data: ", 1)[1])["value"] is None
        assert b'"value":null' in last.encode()


async def test_session_events_skip_chunks_and_carry_summaries(tmp_path: Path) -> None:
    """Every logged event but streamed chunks becomes a `session/event` summary, in seq order."""
    model = scripted({"main": [{"text": "A reply long enough to be streamed in several chunks."}]})
    async with hub_runtime(tmp_path, model, log_chunks=True) as (rt, hub):
        agent = await rt.create_agent()
        subscription = hub.subscribe(frozenset({agent.id}), None)
        result = await rt.run("hello there", agent.id)
        await asyncio.wait_for(agent.wait_idle(), HANG_GUARD_S)
        events = list(agent.session.events)
        expected = [event for event in events if event.type != "assistant/chunk"]
        assert any(event.type == "assistant/chunk" for event in events)
        frames = await collect(
            subscription,
            lambda got: sum(f.event == "session/event" for f in got) >= len(expected),
        )
        summaries = [frame.data for frame in frames if frame.event == "session/event"]
        assert [summary["seq"] for summary in summaries] == [event.seq for event in expected]
        # The first `user/message` is the prompt (the per-turn context message follows it).
        by_type = {summary["type"]: summary for summary in reversed(summaries)}
        assert by_type["user/message"]["summary"] == "hello there"
        assert by_type["assistant/message"]["summary"] == result.output
        assert by_type["turn/end"]["summary"] == {"reason": {"kind": "completed"}}
        assert by_type["turn/start"]["turn"] == 1


async def test_created_and_status_frames_follow_the_agent_registry(tmp_path: Path) -> None:
    """A new agent's session is announced with its registry status; its turn goes running, idle, then closed."""
    model = scripted({"main": [{"text": "ok"}]})
    async with hub_runtime(tmp_path, model) as (rt, hub):
        subscription = hub.subscribe(None, None)
        agent = await rt.create_agent()
        created = await take(subscription, 1)
        assert [frame.event for frame in created] == ["session/created"]
        assert created[0].data == {
            "session": {
                "id": agent.id,
                "createdAt": agent.session.header.created_at,
                "isSeeded": False,
                "delegationDepth": 0,
                "status": "idle",
            }
        }
        await rt.run("go", agent.id)
        await agent.aclose()
        rt.agents.unregister(agent)
        statuses = await take(subscription, 3)
        assert [(f.event, f.data) for f in statuses] == [
            ("session/status", {"sessionId": agent.id, "status": status}) for status in ("running", "idle", "closed")
        ]


async def test_subagent_notifications_become_start_and_end_frames(tmp_path: Path) -> None:
    """Lifecycle notifications keep the wire fields only; provider notices are not forwarded."""
    async with hub_runtime(tmp_path) as (rt, hub):
        subscription = hub.subscribe(None, None)
        identity = {"runId": "r1", "provider": "spawn", "parentSessionId": "p", "childSessionId": "c", "local": True}
        rt.subagents._emit({"type": "subagent/provider-added", "provider": "x"})
        rt.subagents._emit({"type": "subagent/start", **identity})
        rt.subagents._emit(
            {"type": "subagent/end", **identity, "stopReason": "done", "hasOutput": True, "lastAssistantMessage": "hi"}
        )
        frames = await take(subscription, 2)
        wire = {"parentSessionId": "p", "childSessionId": "c", "runId": "r1", "provider": "spawn"}
        assert [(f.event, f.data) for f in frames] == [
            ("subagent/start", wire),
            ("subagent/end", {**wire, "stopReason": "done", "hasOutput": True}),
        ]
        assert subscription.queued == 0


async def test_last_event_id_inside_the_buffer_replays_the_missed_frames_then_live_ones(tmp_path: Path) -> None:
    """A reconnect with an id still buffered gets exactly the later frames its filter takes, then live frames."""
    async with hub_runtime(tmp_path) as (_, hub):
        first = _publish_all(hub)
        seen = first[1].id
        subscription = hub.subscribe(None, seen)
        live = hub.publish("session/status", {"sessionId": "z", "status": "idle"})
        frames = await take(subscription, 3)
        assert [frame.id for frame in frames] == [first[2].id, first[3].id, live.id if live else -1]
        everything = hub.subscribe(frozenset({"a", "b"}), 0)
        replayed = await take(everything, 3)
        assert [frame.event for frame in replayed] == ["session/status", "session/event", "session/projection"]


async def test_last_event_id_older_than_the_buffer_gets_reset_first(tmp_path: Path) -> None:
    """An id whose successors were evicted from the ring buffer gets one `reset` frame, then live frames only."""
    async with hub_runtime(tmp_path, buffer_size=4) as (_, hub):
        first = _publish_all(hub)  # six frames: the two oldest are gone
        assert [frame.id for frame in hub.buffered()] == [frame.id for frame in first[2:]]
        # The oldest id the buffer can still serve replays normally.
        boundary = hub.subscribe(None, first[1].id)
        assert [frame.event for frame in await take(boundary, 2)] == ["subagent/start", "subagent/end"]
        subscription = hub.subscribe(None, first[0].id)
        live = hub.publish("session/status", {"sessionId": "z", "status": "idle"})
        frames = await take(subscription, 2)
        assert [(frame.event, frame.data) for frame in frames] == [
            ("reset", {"reason": RESET_LAST_EVENT_ID}),
            ("session/status", {"sessionId": "z", "status": "idle"}),
        ]
        assert live is not None
        assert frames[0].id < live.id


@pytest.mark.parametrize("last_event_id", [-1, 10_000])
async def test_malformed_or_future_last_event_id_gets_reset(tmp_path: Path, last_event_id: int) -> None:
    """An id this process never issued (another process's, or a malformed one passed as -1) gets `reset`."""
    async with hub_runtime(tmp_path) as (_, hub):
        _publish_all(hub)
        subscription = hub.subscribe(None, last_event_id)
        frames = await take(subscription, 1)
        assert [(frame.event, frame.data) for frame in frames] == [("reset", {"reason": RESET_LAST_EVENT_ID})]
        assert subscription.queued == 0


async def test_ids_rise_across_every_frame_and_resets_are_never_buffered(tmp_path: Path) -> None:
    """Frame ids rise strictly in build order; a client's `reset` takes an id but stays out of the buffer."""
    async with hub_runtime(tmp_path) as (_, hub):
        first = _publish_all(hub)
        reset = (await take(hub.subscribe(None, -1), 1))[0]
        second = _publish_all(hub)
        ids = [frame.id for frame in [*first, reset, *second]]
        assert ids == sorted(set(ids))
        assert reset.id not in {frame.id for frame in hub.buffered()}
        assert hub.last_id == second[-1].id


async def test_slow_client_overflow_gets_reset_and_its_stream_ends(tmp_path: Path) -> None:
    """A client `queue_size` frames behind gets its queue replaced by one `reset`, then its stream ends."""
    async with hub_runtime(tmp_path, queue_size=3) as (_, hub):
        slow = hub.subscribe(None, None)
        fast = hub.subscribe(None, None)
        received: list[Frame] = []
        for event, data in BROADCAST:
            frame = hub.publish(event, data)
            assert frame is not None
            received.extend(await take(fast, 1))
        frames = await collect(slow, lambda _: False)
        assert [(frame.event, frame.data) for frame in frames] == [("reset", {"reason": RESET_OVERFLOW})]
        assert slow.overflowed
        assert slow.ended
        assert hub.subscribers() == (fast,)
        assert [frame.event for frame in received] == [event for event, _ in BROADCAST]


async def test_replay_longer_than_the_queue_overflows_into_reset(tmp_path: Path) -> None:
    """A replay that does not fit the client's queue ends as an overflow too."""
    async with hub_runtime(tmp_path, queue_size=2) as (_, hub):
        _publish_all(hub)
        frames = await collect(hub.subscribe(None, 0), lambda _: False)
        assert [frame.event for frame in frames] == ["reset"]


async def test_projection_changes_coalesce_to_the_latest_per_session_and_key(tmp_path: Path) -> None:
    """Within the window only the newest value per session and key is sent, when the timer fires."""
    timer = ManualTimer()
    async with hub_runtime(tmp_path, coalesce_ms=100, timer=timer) as (rt, hub):
        one, two = rt.sessions.create("s1"), rt.sessions.create("s2")
        subscription = hub.subscribe(frozenset({"s1", "s2"}), None)
        one.append("subagent/descriptor", snapshot_descriptor("continuable", provider="spawn", label="x"))
        two.append("subagent/descriptor", snapshot_descriptor("continuable", provider="spawn", label="y"))
        last = one.append("subagent/descriptor", snapshot_descriptor("continuable", provider="spawn", label="z"))
        events = await take(subscription, 5)
        # Events are forwarded at once; each creation is announced on the next loop turn.
        assert [frame.event for frame in events] == ["session/event"] * 3 + ["session/created"] * 2
        assert timer.pending == 1
        timer.advance(99)
        assert subscription.queued == 0
        timer.advance(1)
        frames = await take(subscription, 4)
        pushed = {(f.data["sessionId"], f.data["key"]): f.data for f in frames}
        assert [frame.event for frame in frames] == ["session/projection"] * 4
        assert len(pushed) == 4
        assert pushed["s1", "subagent"]["value"] == {"mode": "continuable", "label": "z", "seq": last.seq}
        assert pushed["s1", "subagentTiming"]["seq"] == last.seq
        assert pushed["s2", "subagent"]["value"]["label"] == "y"
        assert timer.pending == 0
        assert subscription.queued == 0


async def test_close_sends_waiting_coalesced_frames_and_ends_streams_after_their_queue(tmp_path: Path) -> None:
    """`aclose` flushes the coalescing window, lets each stream drain its queue, then ends it."""
    timer = ManualTimer()
    async with hub_runtime(tmp_path, coalesce_ms=100, timer=timer) as (rt, hub):
        session = rt.sessions.create("s1")
        subscription = hub.subscribe(frozenset({"s1"}), None)
        session.append("subagent/descriptor", snapshot_descriptor("continuable", provider="spawn", label="x"))
        await hub.aclose()
        frames = await collect(subscription, lambda _: False)
        assert [frame.event for frame in frames] == ["session/event", "session/projection", "session/projection"]
        assert subscription.ended
        assert hub.subscribers() == ()
        late = hub.subscribe(None, None)
        assert late.ended
        assert await collect(late, lambda _: False) == []
        assert hub.publish("session/status", {"sessionId": "s1", "status": "idle"}) is None
        session.append("subagent/descriptor", {"version": 99})  # no listener is left to forward it
        assert timer.pending == 0


async def test_client_close_drops_queued_frames_and_unsubscribes(tmp_path: Path) -> None:
    """A disconnecting client's `close()` ends its stream at once and it receives nothing more."""
    async with hub_runtime(tmp_path) as (_, hub):
        subscription = hub.subscribe(None, None)
        following = hub.subscribe(frozenset({"a", "p"}), None)
        _publish_all(hub)
        subscription.close()
        following.close()
        assert await collect(subscription, lambda _: False) == []
        assert await collect(following, lambda _: False) == []
        assert hub.subscribers() == ()
        assert hub._followers == {}
        assert hub._broadcast == {}


async def test_a_cancelled_wait_loses_no_frame(tmp_path: Path) -> None:
    """Cancelling a read that is waiting (the route's ping timeout) leaves the next frame for the next read."""
    async with hub_runtime(tmp_path) as (_, hub):
        subscription = hub.subscribe(None, None)
        reader = asyncio.ensure_future(subscription.__anext__())
        await asyncio.sleep(0)
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        frame = hub.publish(*BROADCAST[1])
        assert await take(subscription, 1) == [frame]


async def test_a_payload_that_is_not_json_is_dropped_without_raising(tmp_path: Path) -> None:
    """The hub never raises into a notifying source: an unencodable frame is logged and dropped."""
    async with hub_runtime(tmp_path) as (_, hub):
        subscription = hub.subscribe(None, None)
        assert hub.publish("session/status", {"sessionId": "a", "status": {1, 2}}) is None
        frame = hub.publish(*BROADCAST[1])
        assert await take(subscription, 1) == [frame]
        assert subscription.queued == 0


async def test_hub_settings_are_checked(tmp_path: Path) -> None:
    """A zero buffer or queue, or a negative coalescing window, is refused at construction."""
    async with hub_runtime(tmp_path) as (rt, _):
        for settings in ({"buffer_size": 0}, {"queue_size": 0}, {"coalesce_ms": -1}):
            with pytest.raises(ValueError, match="buffer_size"):
                PushHub(rt, **settings)  # type: ignore[arg-type]
