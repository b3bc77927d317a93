"""The OpenAI-compatible client against the fake OpenAI server: wire mapping, faults and cancellation.

Layer: agent (tests). Every request goes over real HTTP to `dsh.testing.fake_openai` on 127.0.0.1; the
client is driven directly through `stream()`, and the server's records show what went over the wire.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from dsh.abort import AbortController, AbortError, AbortSignal
from dsh.agent.assembler import MessageAssembler
from dsh.agent.errors import ModelError
from dsh.agent.model import (
    BlockEnd,
    BlockStart,
    Finish,
    ModelChunk,
    ModelClient,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
    UsageChunk,
)
from dsh.agent.models import OpenAICompatibleClient, resolve_model_settings
from dsh.config import ModelConfig
from dsh.testing.fake_openai import FakeOpenAIServer, FakeReply, FakeToolCall, Gate, fake_usage
from tests.agent.fake_openai_helpers import (
    KEY,
    assistant,
    client_for,
    collect,
    final_blocks,
    request,
    streamed_text,
    tool_result,
    user,
)

READ_TOOL = {
    "name": "read_file",
    "description": "Read a file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
}


@pytest.fixture(scope="module")
def running_server() -> Iterator[FakeOpenAIServer]:
    """One fake server per module: starting uvicorn costs more than every test here."""
    importlib.import_module("openai")  # load the SDK once here, not inside the first test's timing
    with FakeOpenAIServer() as server:
        yield server


@pytest.fixture
def server(running_server: FakeOpenAIServer) -> Iterator[FakeOpenAIServer]:
    """The module's fake server, emptied before and after each test."""
    running_server.reset()
    yield running_server
    running_server.reset()


# ---------------------------------------------------------------- streaming and mapping


async def test_text_in_five_chunks_is_assembled_with_usage(server: FakeOpenAIServer) -> None:
    """Text in 5 chunks plus a usage chunk assembles to the text; OpenAI's cached tokens leave the input count."""
    server.enqueue(FakeReply(text="Hello from the fake model", chunks=5, usage=fake_usage(120, 7, cached=100)))
    client = client_for(server)
    assert isinstance(client, ModelClient)
    assert client.provider == "openai-compatible"
    chunks = await collect(client, request(tools=[READ_TOOL]))
    await client.aclose()

    assert sum(isinstance(c, TextDelta) for c in chunks) == 5
    assembler = MessageAssembler()
    for chunk in chunks:
        assembler.feed(chunk)
    assert assembler.content() == [{"type": "text", "text": "Hello from the fake model"}]
    assert assembler.usage == Usage(input_tokens=20, output_tokens=7, cache_read_tokens=100)
    assert assembler.finish == "stop"
    assert isinstance(chunks[0], BlockStart)
    assert chunks[-2:] == [UsageChunk(Usage(20, 7, 100)), Finish("stop")]


async def test_request_carries_model_tools_usage_option_and_bearer_key(server: FakeOpenAIServer) -> None:
    """The server sees the model name, the tools as functions, `stream_options.include_usage` and the bearer key."""
    server.enqueue(FakeReply(text="ok"))
    client = client_for(server)
    await collect(client, request(tools=[READ_TOOL], model="deepseek-chat"))
    await client.aclose()

    (seen,) = server.requests
    assert seen.path == "/v1/chat/completions"
    assert seen.headers["authorization"] == f"Bearer {KEY}"
    assert seen.body["model"] == "deepseek-chat"
    assert seen.body["stream"] is True
    assert seen.body["stream_options"] == {"include_usage": True}
    assert seen.body["tools"] == [{"type": "function", "function": READ_TOOL}]
    assert "max_tokens" not in seen.body


async def test_messages_are_mapped_to_chat_roles(server: FakeOpenAIServer) -> None:
    """System leads; assistant text and calls map to `content`/`tool_calls`, with the reasoning of a round that
    called tools as `reasoning_content`; results are tool messages."""
    call = {"type": "tool-call", "id": "call_7", "name": "read_file", "arguments": '{"path": "a.txt"}'}
    history = [
        user("read a.txt"),
        assistant({"type": "reasoning", "text": "I should read it."}, {"type": "text", "text": "Reading."}, call),
        tool_result("call_7", "file body"),
        assistant({"type": "reasoning", "text": "only thoughts"}, message_id="a2"),
        user("thanks", message_id="u2"),
    ]
    server.enqueue(FakeReply(text="ok"))
    client = client_for(server, max_tokens=64)
    await collect(client, request(*history, system="Be brief."))
    await client.aclose()

    body = server.requests[0].body
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "read a.txt"},
        {
            "role": "assistant",
            "content": "Reading.",
            "reasoning_content": "I should read it.",
            "tool_calls": [
                {
                    "id": "call_7",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_7", "content": "file body"},
        {"role": "user", "content": "thanks"},
    ]
    assert "tools" not in body
    assert body["max_tokens"] == 64


async def test_reasoning_goes_back_only_for_rounds_that_called_tools(server: FakeOpenAIServer) -> None:
    """DeepSeek's thinking-mode rule: reasoning of a round without tool calls is left out, every assistant
    message of a round with tool calls (its final answer included) sends its `reasoning_content` back."""
    call = {"type": "tool-call", "id": "c1", "name": "read_file", "arguments": "{}"}
    history = [
        user("hi"),
        assistant({"type": "reasoning", "text": "greet"}, {"type": "text", "text": "Hello."}),
        user("read it", message_id="u2"),
        assistant({"type": "reasoning", "text": "need the file"}, call, message_id="a2"),
        tool_result("c1", "body"),
        assistant({"type": "reasoning", "text": "summarise"}, {"type": "text", "text": "Done."}, message_id="a3"),
        user("thanks", message_id="u3"),
    ]
    server.enqueue(FakeReply(text="ok"))
    client = client_for(server)
    await collect(client, request(*history))
    await client.aclose()
    sent = [m for m in server.requests[0].body["messages"] if m["role"] == "assistant"]
    assert [m.get("reasoning_content") for m in sent] == [None, "need the file", "summarise"]


async def test_assistant_calls_without_text_send_null_content(server: FakeOpenAIServer) -> None:
    """An assistant message with only tool calls is sent with `content: null`; a request limit wins over the default."""
    call = {"type": "tool-call", "id": "c1", "name": "read_file", "arguments": "{}"}
    server.enqueue(FakeReply(text="ok"))
    client = client_for(server, max_tokens=64)
    await collect(client, request(user("go"), assistant(call), tool_result("c1", "done"), max_tokens=8, system=None))
    await client.aclose()

    body = server.requests[0].body
    assert body["messages"][0] == {"role": "user", "content": "go"}
    assert body["messages"][1]["content"] is None
    assert body["max_tokens"] == 8


async def test_reasoning_content_becomes_a_reasoning_block_before_the_text(server: FakeOpenAIServer) -> None:
    """`reasoning_content` deltas form block 0, which ends when the answer text (block 1) begins."""
    usage = fake_usage(30, 20, cached=10, reasoning=12, cache_field="deepseek")
    server.enqueue(FakeReply(reasoning="Think first.", text="Answer.", chunks=3, usage=usage))
    client = client_for(server)
    chunks = await collect(client, request())
    await client.aclose()

    assert chunks[0] == BlockStart(0, "reasoning")
    assert "".join(c.text for c in chunks if isinstance(c, ReasoningDelta)) == "Think first."
    reasoning_end = chunks.index(BlockEnd(0, {"type": "reasoning", "text": "Think first."}))
    assert chunks.index(BlockStart(1, "text")) == reasoning_end + 1
    assert final_blocks(chunks) == [{"type": "reasoning", "text": "Think first."}, {"type": "text", "text": "Answer."}]
    assert UsageChunk(Usage(20, 20, cache_read_tokens=10, reasoning_tokens=12)) in chunks


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        # DeepSeek: hits inside prompt_tokens, named twice; the miss count is the uncached input.
        (fake_usage(1000, 40, cached=768, cache_field="deepseek"), Usage(232, 40, cache_read_tokens=768)),
        # DeepSeek without the miss count: prompt_tokens minus the hits.
        ({"prompt_tokens": 90, "completion_tokens": 5, "prompt_cache_hit_tokens": 64}, Usage(26, 5, 64)),
        # Every prompt token served from the cache.
        (fake_usage(64, 1, cached=64, cache_field="deepseek"), Usage(0, 1, cache_read_tokens=64)),
        # No cache report at all: everything is uncached input, and no cache count is made up.
        (fake_usage(12, 3), Usage(12, 3)),
    ],
)
async def test_provider_usage_maps_to_disjoint_counts(
    server: FakeOpenAIServer, usage: dict[str, Any], expected: Usage
) -> None:
    """Cache hits a provider counts inside `prompt_tokens` come out of `inputTokens` into `cacheReadTokens`."""
    server.enqueue(FakeReply(text="ok", usage=usage))
    client = client_for(server)
    chunks = await collect(client, request())
    await client.aclose()
    assert UsageChunk(expected) in chunks
    assert expected.billed_input_tokens == usage["prompt_tokens"]


async def test_more_cache_hits_than_prompt_tokens_is_model_unavailable(server: FakeOpenAIServer) -> None:
    """A usage whose cache hits exceed its prompt count is a malformed stream, not a negative count."""
    server.enqueue(
        FakeReply(text="ok", usage={"prompt_tokens": 3, "completion_tokens": 1, "prompt_cache_hit_tokens": 9})
    )
    client = client_for(server)
    with pytest.raises(ModelError) as caught:
        await collect(client, request())
    await client.aclose()
    assert caught.value.code == "MODEL_UNAVAILABLE"
    assert "9 cached prompt tokens but only 3 prompt tokens" in caught.value.message


async def test_interleaved_tool_calls_keep_exact_argument_strings(server: FakeOpenAIServer) -> None:
    """Two tool calls interleaved by index, arguments split mid-string, become two exact tool-call blocks."""
    first = '{"path": "notes/a b.txt", "limit": 10}'
    second = '{"query": "naïve \\"quoted\\" text"}'
    calls = [FakeToolCall("read_file", first, id="call_a"), FakeToolCall("search", second, id="call_b")]
    server.enqueue(FakeReply(tool_calls=calls, argument_chunks=4))
    client = client_for(server)
    chunks = await collect(client, request(tools=[READ_TOOL]))
    await client.aclose()

    deltas = [c for c in chunks if isinstance(c, ToolCallDelta)]
    assert [d.index for d in deltas] == [0, 1, 0, 1, 0, 1, 0, 1]
    assert [d.name for d in deltas if d.name is not None] == ["read_file", "search"]
    assert "".join(d.arguments_delta for d in deltas if d.index == 0) == first
    assert final_blocks(chunks) == [
        {"type": "tool-call", "id": "call_a", "name": "read_file", "arguments": first},
        {"type": "tool-call", "id": "call_b", "name": "search", "arguments": second},
    ]
    assert chunks[-1] == Finish("tool-calls")


async def test_tool_call_without_id_gets_a_stable_stand_in(server: FakeOpenAIServer) -> None:
    """A compatible server that omits the call id still yields a call with an id (`call_<block index>`)."""
    delta = {"tool_calls": [{"index": 0, "function": {"name": "read_file", "arguments": "{}"}}]}
    server.enqueue(FakeReply(deltas=[{"content": "Let me look."}, delta], finish_reason="tool_calls"))
    client = client_for(server)
    chunks = await collect(client, request())
    await client.aclose()
    assert final_blocks(chunks)[1] == {"type": "tool-call", "id": "call_1", "name": "read_file", "arguments": "{}"}


async def test_tool_call_without_a_name_is_model_unavailable(server: FakeOpenAIServer) -> None:
    """A tool call that never names its function cannot be dispatched, so the stream is MODEL_UNAVAILABLE."""
    delta = {"tool_calls": [{"index": 0, "id": "c1", "function": {"arguments": "{}"}}]}
    server.enqueue(FakeReply(deltas=[delta], finish_reason="tool_calls"))
    client = client_for(server)
    with pytest.raises(ModelError) as caught:
        await collect(client, request())
    await client.aclose()
    assert caught.value.code == "MODEL_UNAVAILABLE"
    assert "no function name" in caught.value.message


@pytest.mark.parametrize(
    ("reason", "kind"),
    [("stop", "stop"), ("tool_calls", "tool-calls"), ("length", "length"), ("content_filter", "content-filter")],
)
async def test_finish_reasons_map_to_finish_kinds(server: FakeOpenAIServer, reason: str, kind: str) -> None:
    """`stop`, `tool_calls`, `length` and `content_filter` map to the four finish kinds."""
    server.enqueue(FakeReply(text="partial", finish_reason=reason))
    client = client_for(server)
    chunks = await collect(client, request())
    await client.aclose()
    assert chunks[-1] == Finish(kind)  # type: ignore[arg-type]


async def test_unknown_finish_reason_is_model_unavailable(server: FakeOpenAIServer) -> None:
    """A finish reason outside the four known ones is MODEL_UNAVAILABLE."""
    server.enqueue(FakeReply(text="x", finish_reason="insufficient_system_resource"))
    client = client_for(server)
    with pytest.raises(ModelError) as caught:
        await collect(client, request())
    await client.aclose()
    assert caught.value.code == "MODEL_UNAVAILABLE"
    assert "insufficient_system_resource" in caught.value.message


async def test_stream_without_finish_reason_is_model_unavailable(server: FakeOpenAIServer) -> None:
    """A stream that ends cleanly but never sent a finish reason is MODEL_UNAVAILABLE, not a silent stop."""
    server.enqueue(FakeReply(text="x", finish_reason=""))
    client = client_for(server)
    with pytest.raises(ModelError) as caught:
        await collect(client, request())
    await client.aclose()
    assert caught.value.code == "MODEL_UNAVAILABLE"


# ---------------------------------------------------------------- HTTP failures and retries


@pytest.mark.parametrize("status", [401, 403])
async def test_refused_key_is_model_auth_after_one_request(server: FakeOpenAIServer, status: int) -> None:
    """401 and 403 are MODEL_AUTH with the status and request id, and are not retried."""
    server.enqueue(FakeReply.failure(status, "Invalid API key"))
    client = client_for(server)
    with pytest.raises(ModelError) as caught:
        await collect(client, request())
    await client.aclose()
    error = caught.value
    assert (error.code, error.status, error.request_id) == ("MODEL_AUTH", status, "req_1")
    assert "Invalid API key" in error.message
    assert len(server.requests) == 1


async def test_rate_limit_then_success_needs_two_requests(server: FakeOpenAIServer) -> None:
    """A 429 followed by a 200 succeeds through the SDK's retry: two requests, one answer."""
    server.enqueue(FakeReply.failure(429), FakeReply(text="after the retry"))
    client = client_for(server)
    chunks = await collect(client, request())
    await client.aclose()
    assert streamed_text(chunks) == "after the retry"
    assert len(server.requests) == 2


async def test_rate_limit_after_every_retry_is_model_rate_limited(server: FakeOpenAIServer) -> None:
    """429 on every attempt is MODEL_RATE_LIMITED after 1 + max_retries requests, carrying the retry hint."""
    server.enqueue(*[FakeReply.failure(429)] * 2)
    client = client_for(server, max_retries=1)
    with pytest.raises(ModelError) as caught:
        await collect(client, request())
    await client.aclose()
    assert (caught.value.code, caught.value.status, caught.value.retry_after_ms) == ("MODEL_RATE_LIMITED", 429, 1)
    assert len(server.requests) == 2


async def test_server_errors_three_times_are_model_unavailable(server: FakeOpenAIServer) -> None:
    """500 three times with max_retries=2 is MODEL_UNAVAILABLE after exactly three requests."""
    server.enqueue(*[FakeReply.failure(500, "upstream exploded")] * 3)
    client = client_for(server, max_retries=2)
    with pytest.raises(ModelError) as caught:
        await collect(client, request())
    await client.aclose()
    assert (caught.value.code, caught.value.status) == ("MODEL_UNAVAILABLE", 500)
    assert "upstream exploded" in caught.value.message
    assert len(server.requests) == 3


@pytest.mark.parametrize("status", [400, 422])
async def test_rejected_request_is_model_bad_request_without_retry(server: FakeOpenAIServer, status: int) -> None:
    """400 and 422 are MODEL_BAD_REQUEST after one request."""
    server.enqueue(FakeReply.failure(status, "messages: field required"))
    client = client_for(server)
    with pytest.raises(ModelError) as caught:
        await collect(client, request())
    await client.aclose()
    assert (caught.value.code, caught.value.status) == ("MODEL_BAD_REQUEST", status)
    assert len(server.requests) == 1


async def test_unreachable_endpoint_is_model_unavailable() -> None:
    """A refused connection (nothing listens on the port) is MODEL_UNAVAILABLE."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = ModelConfig(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY)
    client = OpenAICompatibleClient(resolve_model_settings(config, max_retries=0))
    with pytest.raises(ModelError) as caught:
        await collect(client, request())
    await client.aclose()
    assert caught.value.code == "MODEL_UNAVAILABLE"
    assert f"127.0.0.1:{port}" in caught.value.message


async def test_a_plain_http_endpoint_that_redirects_is_not_followed() -> None:
    """A plain-HTTP endpoint's client follows no redirect (it has no TLS context): a 307 is a model error."""
    import http.server
    import threading

    hits: list[str] = []

    class Redirect(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            hits.append(self.path)
            self.send_response(307)
            self.send_header("Location", "/followed")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect) as redirecting:
        thread = threading.Thread(target=redirecting.serve_forever, daemon=True)
        thread.start()
        try:
            config = ModelConfig(base_url=f"http://127.0.0.1:{redirecting.server_address[1]}/v1", api_key=KEY)
            client = OpenAICompatibleClient(resolve_model_settings(config, max_retries=0))
            with pytest.raises(ModelError) as caught:
                await collect(client, request())
            await client.aclose()
        finally:
            redirecting.shutdown()
    assert caught.value.code.startswith("MODEL_")
    assert hits == ["/v1/chat/completions"]


# ---------------------------------------------------------------- broken streams


async def test_disconnect_after_three_chunks_is_model_unavailable_and_not_retried(server: FakeOpenAIServer) -> None:
    """A connection dropped after 3 chunks yields the partial text, then MODEL_UNAVAILABLE; no retry."""
    server.enqueue(FakeReply(text="abcdefgh", chunks=8, disconnect_after=3), FakeReply(text="must not be used"))
    client = client_for(server)
    received: list[ModelChunk] = []

    async def consume() -> None:
        async for chunk in client.stream(request(), signal=AbortSignal.none()):
            received.append(chunk)

    with pytest.raises(ModelError) as caught:
        await consume()
    await client.aclose()
    assert caught.value.code == "MODEL_UNAVAILABLE"
    assert caught.value.request_id == "req_1"
    assert streamed_text(received) == "abc"
    assert len(server.requests) == 1
    assert server.pending == 1


async def test_malformed_chunk_is_model_unavailable(server: FakeOpenAIServer) -> None:
    """A `data:` line that is not JSON is MODEL_UNAVAILABLE naming the malformed chunk."""
    server.enqueue(FakeReply(text="abc", chunks=3, malformed_after=1))
    client = client_for(server)
    with pytest.raises(ModelError) as caught:
        await collect(client, request())
    await client.aclose()
    assert caught.value.code == "MODEL_UNAVAILABLE"
    assert "malformed" in caught.value.message


async def test_chunk_of_the_wrong_shape_is_model_unavailable(server: FakeOpenAIServer) -> None:
    """A JSON chunk whose `delta.content` is not a string is MODEL_UNAVAILABLE, not a crash."""
    server.enqueue(FakeReply(deltas=[{"content": "fine"}, {"content": {"nested": True}}]))
    client = client_for(server)
    with pytest.raises(ModelError) as caught:
        await collect(client, request())
    await client.aclose()
    assert caught.value.code == "MODEL_UNAVAILABLE"
    assert "content" in caught.value.message


async def test_silent_stream_hits_the_read_timeout(server: FakeOpenAIServer) -> None:
    """A stream held longer than the read timeout is MODEL_TIMEOUT (the hold, not a clock, makes it silent)."""
    gate = Gate()
    server.enqueue(FakeReply(text="late", hold=gate))
    client = client_for(server, timeout_s=0.2)
    with pytest.raises(ModelError) as caught:
        await collect(client, request())
    gate.release()
    await client.aclose()
    assert caught.value.code == "MODEL_TIMEOUT"
    assert len(server.requests) == 1


# ---------------------------------------------------------------- cancellation and lifecycle


async def test_abort_while_waiting_for_a_chunk_closes_the_stream(server: FakeOpenAIServer) -> None:
    """Aborting while the client waits for a held chunk raises the abort, and the server records the disconnect."""
    gate = Gate()
    server.enqueue(FakeReply(text="one two three", chunks=3, hold=gate, hold_after=1))
    client = client_for(server)
    controller = AbortController()
    first_text = asyncio.Event()
    received: list[ModelChunk] = []

    async def consume() -> None:
        async for chunk in client.stream(request(), signal=controller.signal):
            received.append(chunk)
            if isinstance(chunk, TextDelta):
                first_text.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first_text.wait(), timeout=30)
    await gate.wait_reached()
    controller.abort()
    with pytest.raises(AbortError):
        await task
    await server.wait_for_disconnects(1)
    await client.aclose()
    assert server.disconnects == [1]
    assert not gate.released
    assert streamed_text(received) == "one t"


async def test_abort_before_the_response_headers_closes_the_request(server: FakeOpenAIServer) -> None:
    """Aborting while the server holds even the response headers raises the abort and drops the connection."""
    gate = Gate()
    server.enqueue(FakeReply(text="never sent", hold=gate, hold_after=None))
    client = client_for(server)
    controller = AbortController()
    task = asyncio.create_task(collect(client, request(), controller.signal))
    await gate.wait_reached()
    controller.abort("user")
    with pytest.raises(AbortError) as caught:
        await task
    await server.wait_for_disconnects(1)
    await client.aclose()
    assert caught.value.reason == "user"
    assert server.disconnects == [1]
    assert len(server.requests) == 1


async def test_cancelling_the_consumer_closes_the_stream(server: FakeOpenAIServer) -> None:
    """Cancelling the task that iterates the stream propagates CancelledError and still closes the connection."""
    gate = Gate()
    server.enqueue(FakeReply(text="held", hold=gate))
    client = client_for(server)
    task = asyncio.create_task(collect(client, request()))
    await gate.wait_reached()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await server.wait_for_disconnects(1)
    await client.aclose()
    assert server.disconnects == [1]


async def test_aborted_signal_sends_no_request(server: FakeOpenAIServer) -> None:
    """A signal aborted before `stream()` starts raises at once, and nothing reaches the server."""
    client = client_for(server)
    with pytest.raises(AbortError):
        await collect(client, request(), AbortSignal.aborted_with())
    await client.aclose()
    assert server.requests == []


async def test_closed_client_refuses_to_stream(server: FakeOpenAIServer) -> None:
    """After `aclose()` (idempotent) the client raises MODEL_UNAVAILABLE instead of reopening."""
    server.enqueue(FakeReply(text="first"))
    client = client_for(server)
    assert streamed_text(await collect(client, request())) == "first"
    await client.aclose()
    await client.aclose()
    with pytest.raises(ModelError) as caught:
        await collect(client, request())
    assert caught.value.code == "MODEL_UNAVAILABLE"


async def test_key_never_appears_in_logs_errors_or_reprs(
    server: FakeOpenAIServer, caplog: pytest.LogCaptureFixture
) -> None:
    """With DEBUG logging, the key shows up in no log record, error text (even when echoed) or repr."""
    caplog.set_level(logging.DEBUG)
    server.enqueue(FakeReply.failure(401, f"Incorrect API key provided: {KEY}"), FakeReply(text="fine"))
    client = client_for(server)
    with pytest.raises(ModelError) as caught:
        await collect(client, request())
    chunks = await collect(client, request())
    await client.aclose()

    assert server.requests[0].headers["authorization"] == f"Bearer {KEY}"
    assert KEY not in str(caught.value)
    assert KEY not in repr(caught.value)
    assert KEY not in json.dumps(caught.value.to_json())
    assert KEY not in repr(client)
    assert KEY not in repr(client.settings)
    assert KEY not in repr(chunks)
    assert all(KEY not in record.getMessage() for record in caplog.records)
    assert KEY not in caplog.text
    assert any(record.name.startswith("openai") for record in caplog.records)  # the SDK's DEBUG log ran


@pytest.mark.slow
def test_importing_the_models_package_does_not_import_openai() -> None:
    """`import dsh.agent.models` (and the client module) leaves the openai SDK unloaded."""
    code = (
        "import sys, dsh.agent.models, dsh.agent.models.openai_compat; "
        "print('openai' in sys.modules, 'httpx2' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "False"]


@pytest.mark.slow
def test_the_sdk_is_imported_only_by_the_first_request() -> None:
    """Building the client (directly or as a runtime's model) leaves openai unloaded; its first request loads it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code = f"""
import asyncio, sys
from dsh import Config, Runtime
from dsh.abort import AbortSignal
from dsh.agent.errors import ModelError
from dsh.agent.model import ModelRequest, RequestMeta

async def main():
    config = Config(database_url="memory:", model={{"base_url": "http://127.0.0.1:{port}/v1", "api_key": "k",
                                                   "max_retries": 0}})
    async with Runtime.open(config) as rt:
        client = rt.model_client()
        await rt.create_agent()
        print("openai" in sys.modules)
        content = [{{"type": "text", "text": "hi"}}]
        user = {{"id": "u", "role": "user", "content": content, "source": {{"kind": "user"}}}}
        request = ModelRequest("m", None, [user], [], RequestMeta("s", "main", 1, 1))
        try:
            async for _ in client.stream(request, signal=AbortSignal.none()):
                pass
        except ModelError as error:
            print(error.code)
        print("openai" in sys.modules)

asyncio.run(main())
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "MODEL_UNAVAILABLE", "True"], result.stderr


@pytest.mark.slow
def test_dsh_testing_imports_without_fastapi_or_uvicorn() -> None:
    """`import dsh.testing` works where fastapi and uvicorn are missing; only the fake server module needs them."""
    code = (
        "import sys\n"
        "class Refuse:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('fastapi', 'uvicorn', 'starlette'):\n"
        "            raise ImportError(f'{name} is not installed')\n"
        "sys.meta_path.insert(0, Refuse())\n"
        "import dsh.testing\n"
        "try:\n"
        "    import dsh.testing.fake_openai\n"
        "except ImportError:\n"
        "    print('fake server needs fastapi')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "fake server needs fastapi"


# ---------------------------------------------------------------- the fake server itself


async def test_fake_server_answers_non_streamed_completions_and_lists_models(server: FakeOpenAIServer) -> None:
    """Without `stream`, the fake answers one `chat.completion` body; `GET /v1/models` lists its model."""
    calls = [FakeToolCall("read_file", '{"path": "x"}')]
    server.enqueue(FakeReply(text="whole", reasoning="hmm", tool_calls=calls, usage=fake_usage(3, 2)))
    async with httpx.AsyncClient(base_url=server.base_url) as http:
        completion = (await http.post("/chat/completions", json={"model": "m", "messages": []})).json()
        models = (await http.get("/models")).json()
    message = completion["choices"][0]["message"]
    assert completion["object"] == "chat.completion"
    assert (message["content"], message["reasoning_content"]) == ("whole", "hmm")
    assert message["tool_calls"][0]["function"] == {"name": "read_file", "arguments": '{"path": "x"}'}
    assert completion["choices"][0]["finish_reason"] == "tool_calls"
    assert completion["usage"]["prompt_tokens"] == 3
    assert models["data"][0]["id"] == server.model
    assert [r.method for r in server.requests] == ["POST", "GET"]


async def test_fake_server_streams_real_server_sent_events(server: FakeOpenAIServer) -> None:
    """The stream is `data: <chunk JSON>` events, a usage chunk with `choices: []`, then `data: [DONE]`."""
    server.enqueue(FakeReply(text="hey", chunks=3, usage=fake_usage(1, 1)))
    body = {"model": "m", "messages": [], "stream": True, "stream_options": {"include_usage": True}}
    async with httpx.AsyncClient(base_url=server.base_url) as http:
        response = await http.post("/chat/completions", json=body)
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [line.removeprefix("data: ") for line in response.text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == "hey"
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["total_tokens"] == 2


async def test_fake_server_refuses_a_request_with_no_reply_queued(server: FakeOpenAIServer) -> None:
    """An empty queue answers 400 with an error body saying so, rather than inventing an answer."""
    async with httpx.AsyncClient(base_url=server.base_url) as http:
        response = await http.post("/chat/completions", json={"model": "m", "messages": []})
    assert response.status_code == 400
    assert "no reply queued" in response.json()["error"]["message"]
