"""Streams that break after their first byte are retried by the loop, against the fake server on 127.0.0.1.

Layer: agent. Real HTTP and SSE; the checks read the events the loop wrote and the requests the server got.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from dsh.agent.ids import SequentialIds
from dsh.agent.model import RetryPolicy
from dsh.agent.models import OpenAICompatibleClient, resolve_model_settings
from dsh.config import Config, ModelConfig
from dsh.runtime import Runtime
from dsh.testing.event_shapes import assert_harness_shapes
from dsh.testing.fake_openai import FakeOpenAIServer, FakeReply, Gate
from dsh.testing.stored_logs import StepClock
from tests.agent.helpers import HANG_GUARD_S

KEY = "sk-retry-test-key-0123456789"
ANSWER = "one two three four five six"
FAST = RetryPolicy(max_retries=2, initial_delay_ms=1, max_delay_ms=200)


@contextlib.asynccontextmanager
async def _runtime(
    home: Path, server: FakeOpenAIServer, *, policy: RetryPolicy = FAST, chunk_timeout_s: float = 60.0
) -> AsyncIterator[Runtime]:
    config = ModelConfig(base_url=server.base_url, api_key=KEY, model="fake-chat", max_retries=0)
    settings = resolve_model_settings(config, chunk_timeout_s=chunk_timeout_s)
    client = OpenAICompatibleClient(settings, retry_policy=policy)
    try:
        async with Runtime.open(
            Config(home=home, agent={"log_chunks": True}), model=client, ids=SequentialIds(), clock=StepClock()
        ) as rt:
            yield rt
    finally:
        await client.aclose()


def _data(event: Any) -> Mapping[str, Any]:
    assert isinstance(event.data, Mapping)
    return event.data


async def _run(home: Path, server: FakeOpenAIServer, **options: Any) -> tuple[Any, list[Any]]:
    async with _runtime(home, server, **options) as rt:
        result = await asyncio.wait_for(rt.run("talk"), HANG_GUARD_S)
        events = list(rt.sessions.get(result.session_id).events)  # type: ignore[union-attr]
    assert_harness_shapes(events)
    return result, events


def _assert_one_retry_then_success(server: FakeOpenAIServer, result: Any, events: list[Any], code: str) -> None:
    types = [e.type for e in events]
    assert result.stop_reason == "completed"
    assert result.output == ANSWER
    assert types.count("assistant/message") == 1
    assert types.count("llm/retry") == 1
    assert types.count("llm/retry-started") == 1
    retry = _data(next(e for e in events if e.type == "llm/retry"))
    started = _data(next(e for e in events if e.type == "llm/retry-started"))
    assert (retry["turn"], retry["step"], retry["retry"], retry["maxRetries"]) == (1, 1, 1, 2)
    assert (retry["mode"], retry["provider"], retry["policyKey"]) == ("normal", "openai-compatible", FAST.key)
    assert retry["failure"]["code"] == code
    assert started == {"retryId": retry["retryId"], "turn": 1, "step": 1, "retry": 1}
    # Order within the one step: failed chunks, retry, started, the answer's chunks, the message.
    step = types[types.index("step/start") : types.index("step/end")]
    assert step.index("llm/retry") < step.index("llm/retry-started") < step.index("assistant/message")
    assert step[: step.index("llm/retry")].count("assistant/chunk") >= 1  # the failed attempt's chunks stay
    message = _data(next(e for e in events if e.type == "assistant/message"))
    assert message["message"]["content"] == [{"type": "text", "text": ANSWER}]
    # What the model was sent again holds no trace of the partial step.
    assert len(server.requests) == 2
    assert server.requests[1].body["messages"] == server.requests[0].body["messages"]


async def test_a_stream_cut_after_half_the_text_succeeds_on_retry(
    tmp_path: Path, openai_server: FakeOpenAIServer
) -> None:
    """A connection dropped after half the text is retried: one retry pair, one assistant message, same request."""
    openai_server.enqueue(FakeReply(text=ANSWER, chunks=6, disconnect_after=3), FakeReply(text=ANSWER, chunks=3))
    result, events = await _run(tmp_path, openai_server)
    _assert_one_retry_then_success(openai_server, result, events, "MODEL_UNAVAILABLE")


async def test_a_mid_stream_error_chunk_succeeds_on_retry(tmp_path: Path, openai_server: FakeOpenAIServer) -> None:
    """An error event in the middle of the stream is retried and its message is recorded on `llm/retry`."""
    openai_server.enqueue(
        FakeReply(text=ANSWER, chunks=6, error_after=2, error_message="upstream overloaded"),
        FakeReply(text=ANSWER, chunks=2),
    )
    result, events = await _run(tmp_path, openai_server)
    _assert_one_retry_then_success(openai_server, result, events, "MODEL_UNAVAILABLE")
    retry = _data(next(e for e in events if e.type == "llm/retry"))
    assert "upstream overloaded" in retry["failure"]["message"]


async def test_a_stall_past_the_chunk_timeout_succeeds_on_retry(
    tmp_path: Path, openai_server: FakeOpenAIServer
) -> None:
    """A stream that stops sending after two chunks times out between chunks and is retried as MODEL_TIMEOUT."""
    stalled = Gate()  # never released while the client waits: a server that went silent mid-stream
    openai_server.enqueue(
        FakeReply(text=ANSWER, chunks=6, hold=stalled, hold_after=2), FakeReply(text=ANSWER, chunks=2)
    )
    result, events = await _run(tmp_path, openai_server, chunk_timeout_s=0.3)
    _assert_one_retry_then_success(openai_server, result, events, "MODEL_TIMEOUT")
    await openai_server.wait_for_disconnects(1, timeout=HANG_GUARD_S)  # the stalled response was closed


async def test_retry_after_of_the_stream_sets_the_delay(tmp_path: Path, openai_server: FakeOpenAIServer) -> None:
    """A `retry-after-ms` sent with a stream that then breaks is the retry's delay and the failure's hint."""
    openai_server.enqueue(
        FakeReply(text=ANSWER, chunks=6, disconnect_after=2, headers={"retry-after-ms": "37"}),
        FakeReply(text=ANSWER),
    )
    result, events = await _run(tmp_path, openai_server)
    retry = _data(next(e for e in events if e.type == "llm/retry"))
    assert (retry["delayMs"], retry["failure"]["providerRetryAfterMs"]) == (37, 37)
    assert result.stop_reason == "completed"


async def test_a_retry_after_beyond_the_longest_delay_ends_the_turn(
    tmp_path: Path, openai_server: FakeOpenAIServer
) -> None:
    """A provider asking to wait longer than the policy's longest delay is not retried: the turn ends with the error."""
    openai_server.enqueue(FakeReply(text=ANSWER, chunks=6, disconnect_after=2, headers={"retry-after": "30"}))
    result, events = await _run(tmp_path, openai_server)
    assert [e.type for e in events].count("llm/retry") == 0
    assert result.error is not None
    assert result.error["code"] == "MODEL_UNAVAILABLE"
    assert len(openai_server.requests) == 1


async def test_after_the_last_attempt_the_turn_ends_with_the_model_error(
    tmp_path: Path, openai_server: FakeOpenAIServer
) -> None:
    """Three cut streams with two retries allowed: two retry pairs, then MODEL_UNAVAILABLE and the last partial kept
    as interrupted."""
    openai_server.enqueue(*(FakeReply(text=ANSWER, chunks=6, disconnect_after=3) for _ in range(3)))
    result, events = await _run(tmp_path, openai_server)
    types = [e.type for e in events]
    assert (types.count("llm/retry"), types.count("llm/retry-started")) == (2, 2)
    assert [_data(e)["retry"] for e in events if e.type == "llm/retry"] == [1, 2]
    assert len({_data(e)["retryId"] for e in events if e.type == "llm/retry"}) == 1
    messages = [_data(e) for e in events if e.type == "assistant/message"]
    assert len(messages) == 1
    assert messages[0]["interrupted"] is True
    assert result.error is not None
    assert result.error["code"] == "MODEL_UNAVAILABLE"
    assert len(openai_server.requests) == 3


async def test_failures_that_are_not_transient_are_not_retried(tmp_path: Path, openai_server: FakeOpenAIServer) -> None:
    """A malformed chunk is the endpoint's protocol fault: no retry, the turn ends at once."""
    openai_server.enqueue(FakeReply(text=ANSWER, chunks=4, malformed_after=1))
    result, events = await _run(tmp_path, openai_server)
    assert "llm/retry" not in [e.type for e in events]
    assert result.error is not None
    assert len(openai_server.requests) == 1


async def test_cancelling_during_the_backoff_writes_no_started_event(
    tmp_path: Path, openai_server: FakeOpenAIServer
) -> None:
    """A turn cancelled while it waits to retry ends aborted after `llm/retry`, with no `llm/retry-started`."""
    slow = RetryPolicy(max_retries=2, initial_delay_ms=60_000, max_delay_ms=60_000, jitter_ratio=0)
    openai_server.enqueue(FakeReply(text=ANSWER, chunks=6, disconnect_after=2))
    async with _runtime(tmp_path, openai_server, policy=slow) as rt:
        agent = await rt.create_agent()
        scheduled = asyncio.Event()
        rt.sessions.on_event(lambda _session, event: scheduled.set() if event.type == "llm/retry" else None)
        message_id = await agent.send("talk")
        await asyncio.wait_for(scheduled.wait(), HANG_GUARD_S)
        agent.cancel("user")
        result = await asyncio.wait_for(agent.turn_result(message_id), HANG_GUARD_S)
        events = list(agent.session.events)
    types = [e.type for e in events]
    assert result.stop_reason == "aborted"
    assert "llm/retry" in types
    assert "llm/retry-started" not in types
    assert_harness_shapes(events)


def test_retry_policy_delays_double_up_to_the_cap() -> None:
    """Without jitter the delays are 500, 1000, 2000 ... ms, never above the cap; bad policies are refused."""
    policy = RetryPolicy(max_retries=9, jitter_ratio=0)
    assert [policy.delay_ms(n, 0.5) for n in (1, 2, 3, 6)] == [500, 1000, 2000, 10_000]
    jittered = RetryPolicy(jitter_ratio=0.1)
    assert (jittered.delay_ms(1, 0.0), jittered.delay_ms(1, 1.0)) == (450, 550)
    with pytest.raises(ValueError, match="jitter"):
        RetryPolicy(jitter_ratio=2)
