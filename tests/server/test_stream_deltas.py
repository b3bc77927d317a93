"""Streamed answers on the push stream: coalesced, transient `session/delta` frames before the message.

Layer: server. The hub's `DeltaRelay` listens to every live agent's chunks (they are not logged by
default) and sends the text to the session's followers only, without ids, never buffered.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from dsh.server.stream import Frame
from dsh.testing import ManualTimer
from tests.server.stream_helpers import HANG_GUARD_S, collect, hub_runtime, scripted

ANSWER = "Streaming answers arrive piece by piece, then as one message."


def _is_message(frame: object) -> bool:
    return isinstance(frame, Frame) and frame.event == "session/event" and frame.data["type"] == "assistant/message"


async def test_streamed_text_reaches_followers_as_delta_frames_before_its_message(tmp_path: Path) -> None:
    """Held deltas go out at the stream's end, before `assistant/message`, without ids and outside the buffer."""
    timer = ManualTimer()  # the window never ends on its own: only the stream's end sends the text
    model = scripted({"main": [{"text": ANSWER, "chunkSize": 5}]})
    async with hub_runtime(tmp_path, model, timer=timer) as (rt, hub):
        agent = await rt.create_agent()
        follower = hub.subscribe(frozenset({agent.id}), None)
        everyone = hub.subscribe(None, None)
        await rt.run("hello", agent.id)
        await asyncio.wait_for(agent.wait_idle(), HANG_GUARD_S)
        frames = await collect(follower, lambda got: any(_is_message(frame) for frame in got))
        deltas = [frame for frame in frames if frame.event == "session/delta"]
        assert deltas, [frame.event for frame in frames]
        message_at = next(index for index, frame in enumerate(frames) if _is_message(frame))
        assert all(frames.index(delta) < message_at for delta in deltas)
        assert "".join(delta.data["text"] for delta in deltas) == ANSWER
        assert deltas[0].data == {
            "sessionId": agent.id,
            "turn": 1,
            "step": 1,
            "kind": "text",
            "offset": 0,
            "text": deltas[0].data["text"],
        }
        for delta in deltas:
            assert delta.id is None
            assert not delta.encode().startswith(b"id:")
            assert delta.encode().startswith(b"event: session/delta\ndata: {")
        assert all(frame.event != "session/delta" for frame in hub.buffered())
        broadcast = [everyone._queue[index].event for index in range(everyone.queued)]
        assert "session/delta" not in broadcast


async def test_without_a_window_every_chunk_is_its_own_delta_with_rising_offsets(tmp_path: Path) -> None:
    """`delta_ms=0`: one frame per streamed chunk, each `offset` where the previous text ended."""
    model = scripted({"main": [{"text": ANSWER, "chunkSize": 8}]})
    async with hub_runtime(tmp_path, model, delta_ms=0) as (rt, hub):
        agent = await rt.create_agent()
        follower = hub.subscribe(frozenset({agent.id}), None)
        await rt.run("hello", agent.id)
        frames = await collect(follower, lambda got: any(_is_message(frame) for frame in got))
        deltas = [frame.data for frame in frames if frame.event == "session/delta"]
        assert len(deltas) == -(-len(ANSWER) // 8)
        offsets = [delta["offset"] for delta in deltas]
        assert offsets == [8 * index for index in range(len(deltas))]
        assert "".join(delta["text"] for delta in deltas) == ANSWER


async def test_a_window_merges_the_chunks_that_arrive_within_it(tmp_path: Path) -> None:
    """Held until the window ends: the text streamed so far goes out as one frame, the rest at the end."""
    timer = ManualTimer()
    model = scripted({"main": [{"text": ANSWER, "chunkSize": 4, "hold": "mid"}]})
    async with hub_runtime(tmp_path, model, timer=timer) as (rt, hub):
        agent = await rt.create_agent()
        follower = hub.subscribe(frozenset({agent.id}), None)
        await agent.send("hello")
        await asyncio.wait_for(model.wait_held("mid"), HANG_GUARD_S)
        assert follower.queued == 0 or all(
            follower._queue[index].event != "session/delta" for index in range(follower.queued)
        )
        timer.advance(50)
        first = await collect(follower, lambda got: any(frame.event == "session/delta" for frame in got))
        held = [frame.data for frame in first if frame.event == "session/delta"]
        assert held == [{"sessionId": agent.id, "turn": 1, "step": 1, "kind": "text", "offset": 0, "text": ANSWER[:4]}]
        model.release("mid")
        rest = await collect(follower, lambda got: any(_is_message(frame) for frame in got))
        tail = [frame.data for frame in rest if frame.event == "session/delta"]
        assert tail
        assert tail[0]["offset"] == 4
        assert "".join(delta["text"] for delta in [*held, *tail]) == ANSWER
