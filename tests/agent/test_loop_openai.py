"""The turn loop on the real OpenAI-compatible client, against the fake server on 127.0.0.1.

Layer: agent. The requests cross real HTTP and SSE; the events checked are the ones the loop wrote.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dsh.agent.ids import SequentialIds
from dsh.agent.models import OpenAICompatibleClient, resolve_model_settings
from dsh.config import Config, ModelConfig
from dsh.runtime import Runtime
from dsh.testing.fake_openai import FakeOpenAIServer, FakeReply, FakeToolCall, Gate, fake_usage
from dsh.testing.stored_logs import StepClock
from tests.agent.helpers import HANG_GUARD_S, TOOL_STEP_THEN_ANSWER, EchoTool, types_of

KEY = "sk-loop-test-key-0123456789"


def _data(event: Any) -> Mapping[str, Any]:
    assert isinstance(event.data, Mapping)
    return event.data


def _runtime(home: Path, server: FakeOpenAIServer, *, max_retries: int = 2, tools: Any = ()) -> Runtime:
    model = {"base_url": server.base_url, "api_key": KEY, "model": "fake-chat", "max_retries": max_retries}
    return Runtime.open(Config(home=home, model=model), ids=SequentialIds(), clock=StepClock(), tools=tools)


async def test_a_streamed_answer_is_assembled_with_its_usage(tmp_path: Path, openai_server: FakeOpenAIServer) -> None:
    """Text in five SSE chunks plus usage becomes one assistant message; the server saw the model, tools and key."""
    openai_server.enqueue(FakeReply(text="The answer is forty-two.", chunks=5, usage=fake_usage(12, 7, cached=4)))
    async with _runtime(tmp_path, openai_server, tools=[EchoTool()]) as rt:
        result = await rt.run("what is it?")
        events = list(rt.sessions.get(result.session_id).events)  # type: ignore[union-attr]
    message = _data(next(e for e in events if e.type == "assistant/message"))
    assert message["message"]["content"] == [{"type": "text", "text": "The answer is forty-two."}]
    assert message["usage"] == {"inputTokens": 8, "outputTokens": 7, "cacheReadTokens": 4}
    assert message["message"]["source"] == {"kind": "model", "provider": "openai-compatible", "model": "fake-chat"}
    sent = openai_server.requests[0]
    assert sent.body["model"] == "fake-chat"
    assert "echo" in [tool["function"]["name"] for tool in sent.body["tools"]]
    assert sent.body["stream_options"] == {"include_usage": True}
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    assert result.output == "The answer is forty-two."


async def test_deepseek_cache_hits_are_logged_as_disjoint_step_usage(
    tmp_path: Path, openai_server: FakeOpenAIServer
) -> None:
    """DeepSeek's inclusive prompt count with cache hits is logged per step as uncached input plus cache reads;
    `turn/end` carries no usage, and the turn result sums the steps."""
    first = fake_usage(1000, 40, cached=768, reasoning=9, cache_field="deepseek")
    second = fake_usage(1100, 5, cached=1024, cache_field="deepseek")
    openai_server.enqueue(FakeReply(tool_calls=[FakeToolCall("c1", "echo", '{"text": "x"}')], usage=first))
    openai_server.enqueue(FakeReply(text="done", usage=second))
    async with _runtime(tmp_path, openai_server, tools=[EchoTool()]) as rt:
        result = await rt.run("go")
        events = list(rt.sessions.get(result.session_id).events)  # type: ignore[union-attr]
    usages = [_data(e)["usage"] for e in events if e.type == "assistant/message"]
    assert usages == [
        {"inputTokens": 232, "outputTokens": 40, "cacheReadTokens": 768, "reasoningTokens": 9},
        {"inputTokens": 76, "outputTokens": 5, "cacheReadTokens": 1024},
    ]
    assert [_data(e) for e in events if e.type == "turn/end"] == [{"turn": 1, "reason": {"kind": "completed"}}]
    assert result.usage is not None
    assert result.usage.to_json() == {
        "inputTokens": 308,
        "outputTokens": 45,
        "cacheReadTokens": 1792,
        "reasoningTokens": 9,
    }


async def test_a_tool_turn_over_sse_goes_model_tool_model_answer(
    tmp_path: Path, openai_server: FakeOpenAIServer
) -> None:
    """Tool-call deltas split across SSE chunks dispatch the tool, and the second request carries its result."""
    echo = EchoTool()
    openai_server.enqueue(
        FakeReply(tool_calls=[FakeToolCall("echo", '{"text": "split across chunks"}', id="call_a")], argument_chunks=4),
        FakeReply(text="echoed it"),
    )
    async with _runtime(tmp_path, openai_server, tools=[echo]) as rt:
        result = await rt.run("please echo")
        events = list(rt.sessions.get(result.session_id).events)  # type: ignore[union-attr]
    assert types_of(events) == TOOL_STEP_THEN_ANSWER
    assert _data(events[11])["arguments"] == '{"text": "split across chunks"}'
    assert echo.calls == ["split across chunks"]
    result_block = _data(events[12])["message"]["content"][0]
    assert result_block["isError"] is False
    second = openai_server.requests[1].body["messages"]
    assert second[-1] == {"role": "tool", "tool_call_id": "call_a", "content": "echo: split across chunks"}
    assert result.output == "echoed it"
    assert result.stop_reason == "completed"


async def test_two_interleaved_tool_calls_keep_their_exact_arguments(
    tmp_path: Path, openai_server: FakeOpenAIServer
) -> None:
    """Two calls interleaved by index, arguments split mid-string, are dispatched with their exact argument text."""
    echo = EchoTool()
    calls = [
        FakeToolCall("echo", '{"text": "first \\"one\\""}', id="c1"),
        FakeToolCall("echo", '{"text":"second"}', id="c2"),
    ]
    openai_server.enqueue(FakeReply(tool_calls=calls, argument_chunks=5), FakeReply(text="both done"))
    async with _runtime(tmp_path, openai_server, tools=[echo]) as rt:
        result = await rt.run("two calls")
        events = list(rt.sessions.get(result.session_id).events)  # type: ignore[union-attr]
    assert [_data(e)["arguments"] for e in events if e.type == "tool/call"] == [call.arguments for call in calls]
    assert echo.calls == ['first "one"', "second"]


async def test_length_and_content_filter_end_the_turn_max_tokens_and_blocked(
    tmp_path: Path, openai_server: FakeOpenAIServer
) -> None:
    """finish_reason length ends the turn max-tokens; content_filter ends it blocked."""
    openai_server.enqueue(
        FakeReply(text="cut o", finish_reason="length"), FakeReply(text="", finish_reason="content_filter")
    )
    async with _runtime(tmp_path, openai_server) as rt:
        first = await rt.run("long")
        second = await rt.run("bad")
    assert (first.stop_reason, second.stop_reason) == ("max-tokens", "blocked")


async def test_http_failures_map_to_model_codes_and_retries(tmp_path: Path, openai_server: FakeOpenAIServer) -> None:
    """401 fails MODEL_AUTH after one request; 429 then 200 succeeds after two; 500 three times is MODEL_UNAVAILABLE."""
    async with _runtime(tmp_path, openai_server, max_retries=2) as rt:
        openai_server.enqueue(FakeReply.failure(401))
        auth = await rt.run("a")
        assert len(openai_server.requests) == 1
        openai_server.reset()
        openai_server.enqueue(FakeReply.failure(429), FakeReply(text="fine"))
        limited = await rt.run("b")
        assert len(openai_server.requests) == 2
        openai_server.reset()
        openai_server.enqueue(FakeReply.failure(500), FakeReply.failure(500), FakeReply.failure(500))
        broken = await rt.run("c")
        assert len(openai_server.requests) == 3
    assert auth.error is not None
    assert auth.error["code"] == "MODEL_AUTH"
    assert limited.stop_reason == "completed"
    assert limited.output == "fine"
    assert broken.error is not None
    assert broken.error["code"] == "MODEL_UNAVAILABLE"
    assert KEY not in str(auth.error) + str(broken.error)


async def test_a_broken_stream_keeps_the_partial_text_as_interrupted(
    tmp_path: Path, openai_server: FakeOpenAIServer
) -> None:
    """With no retry left, a disconnect after three chunks ends the turn MODEL_UNAVAILABLE; the partial text is
    kept only as interrupted."""
    openai_server.enqueue(FakeReply(text="one two three four five six", chunks=6, disconnect_after=3))
    async with _runtime(tmp_path, openai_server, max_retries=0) as rt:
        result = await rt.run("talk")
        events = list(rt.sessions.get(result.session_id).events)  # type: ignore[union-attr]
    messages = [_data(e) for e in events if e.type == "assistant/message"]
    assert len(messages) == 1
    assert messages[0]["interrupted"] is True
    partial = messages[0]["message"]["content"][0]["text"]
    assert partial
    assert "one two three four five six".startswith(partial)
    assert partial != "one two three four five six"
    assert result.error is not None
    assert result.error["code"] == "MODEL_UNAVAILABLE"


async def test_cancelling_a_held_stream_closes_the_http_response(
    tmp_path: Path, openai_server: FakeOpenAIServer
) -> None:
    """Cancelling a turn whose stream the server holds makes the server record the client's disconnect."""
    gate = Gate()
    openai_server.enqueue(FakeReply(text="never finished", chunks=3, hold=gate, hold_after=1))
    async with _runtime(tmp_path, openai_server) as rt:
        agent = await rt.create_agent()
        message_id = await agent.send("wait")
        await gate.wait_reached(timeout=HANG_GUARD_S)
        agent.cancel("user")
        result = await asyncio.wait_for(agent.turn_result(message_id), HANG_GUARD_S)
        await openai_server.wait_for_disconnects(1, timeout=HANG_GUARD_S)
        gate.release()
    assert result.stop_reason == "aborted"
    assert len(openai_server.disconnects) == 1


async def test_the_runtime_builds_its_client_from_the_model_settings(
    tmp_path: Path, openai_server: FakeOpenAIServer
) -> None:
    """Without a model argument the runtime talks to `config.model`; the client it built closes with it."""
    openai_server.enqueue(FakeReply(text="configured"))
    async with _runtime(tmp_path, openai_server) as rt:
        client = rt.model_client()
        assert isinstance(client, OpenAICompatibleClient)
        result = await rt.run("hi")
    assert result.output == "configured"
    settings = resolve_model_settings(ModelConfig(base_url=openai_server.base_url, api_key=KEY))
    assert settings.base_url.startswith("http://127.0.0.1:")
