"""A fake OpenAI-compatible HTTP server for testing model clients without the network.

Layer: testing (needs the optional `fastapi` and `uvicorn`, imported by this module only, so
`dsh.testing` stays importable without them). `FakeOpenAIServer` serves a FastAPI app with uvicorn
on `127.0.0.1:<free port>` in a background thread: `POST /v1/chat/completions` (streamed as real
server-sent events, or as one JSON body) and `GET /v1/models`. A test queues `FakeReply`s, one per
request in order, and reads back every request (headers and JSON body) and every client disconnect
(docs/agent.md#fake-openai-server).

    with FakeOpenAIServer() as server:
        server.enqueue(FakeReply(text="Hello there", chunks=5, usage=fake_usage(12, 5, cached=4)))
        client = OpenAICompatibleClient(resolve_model_settings(
            ModelConfig(base_url=server.base_url, api_key="sk-test")))
        ...
        assert server.requests[0].headers["authorization"] == "Bearer sk-test"

Faults: an HTTP status (`FakeReply.failure(429)`), a dropped connection after some chunks, a malformed
chunk, a delay before every chunk, and a hold (`Gate`) that stops the stream until the test
releases it. Waiting for server-side facts (`wait_for_disconnects`, `Gate.wait_reached`) is an
awaitable with a generous timeout that only guards against hangs, never a timing assertion.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from types import TracebackType
from typing import Any, Final, Literal

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

__all__ = [
    "FakeOpenAIServer",
    "FakeReply",
    "FakeToolCall",
    "Gate",
    "RecordedRequest",
    "fake_usage",
]

_DEFAULT_TIMEOUT_S: Final = 30.0
"""Hang guard of every wait: generous, because it only fires when something is stuck."""

_DROP_LOG: Final = "ASGI callable returned without completing response."
"""What uvicorn logs when a handler leaves a response unfinished: how a deliberate drop is done."""


class _Tally:
    """A counter that any thread may raise and any event loop may await."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value = 0
        self._waiters: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    @property
    def value(self) -> int:
        with self._lock:
            return self._value

    def add(self, amount: int = 1) -> None:
        with self._lock:
            self._value += amount
            ready = [w for w in self._waiters if self._value >= w[0]]
            self._waiters = [w for w in self._waiters if self._value < w[0]]
        for _target, loop, future in ready:
            with contextlib.suppress(RuntimeError):  # the waiter's loop is closed: nobody waits
                loop.call_soon_threadsafe(_resolve, future)

    def reset(self) -> None:
        with self._lock:
            self._value = 0

    async def wait_for(self, target: int, timeout: float | None, what: str) -> None:  # noqa: ASYNC109 - the hang guard is the point
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        entry = (target, loop, future)
        with self._lock:
            if self._value >= target:
                return
            self._waiters.append(entry)
        try:
            async with asyncio.timeout(timeout):
                await future
        except TimeoutError:
            raise TimeoutError(f"fake OpenAI server: {what} did not happen within {timeout} s") from None
        finally:
            with self._lock:
                if entry in self._waiters:
                    self._waiters.remove(entry)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Gate:
    """A hold point in a streamed reply: the stream stops there until the test calls `release()`.

    `reached` turns true (and `wait_reached()` returns) when the server arrives at the hold, so a test
    can act while the client is known to be waiting for the next chunk.
    """

    def __init__(self) -> None:
        self._reached = _Tally()
        self._released = _Tally()

    @property
    def reached(self) -> bool:
        """True once a stream arrived at this gate."""
        return self._reached.value > 0

    @property
    def released(self) -> bool:
        """True once `release()` was called."""
        return self._released.value > 0

    def release(self) -> None:
        """Let every stream held here (now or later) continue; callable from any thread."""
        if not self.released:
            self._released.add()

    async def wait_reached(self, *, timeout: float = _DEFAULT_TIMEOUT_S) -> None:  # noqa: ASYNC109 - built-in hang guard
        """Return once a stream is held here; `TimeoutError` after `timeout` seconds (a hang guard)."""
        await self._reached.wait_for(1, timeout, "reaching the gate")

    async def hold(self) -> None:
        """Wait here until `release()` (the server side of the gate); marks the gate reached."""
        self._reached.add()
        await self._released.wait_for(1, None, "releasing the gate")


@dataclass(frozen=True, slots=True)
class FakeToolCall:
    """A tool call a fake reply streams; `arguments` is sent as the exact raw string."""

    name: str
    arguments: str
    id: str | None = None


@dataclass(frozen=True, slots=True)
class FakeReply:
    """One queued answer: content, how it is chunked, and the faults to inject.

    Attributes:
        text: Answer text, streamed as `delta.content` in `chunks` pieces.
        reasoning: Reasoning text, streamed first as `delta.reasoning_content` in `chunks` pieces.
        tool_calls: Tool calls, streamed after the text; their arguments are split into
            `argument_chunks` pieces each and interleaved by `index` (call 0 piece 1, call 1 piece 1,
            call 0 piece 2 ...), so fragments split JSON anywhere, mid-string included.
        chunks: How many pieces `text` and `reasoning` are each split into.
        argument_chunks: How many pieces each tool call's arguments are split into.
        deltas: Raw `delta` objects, one per chunk, replacing everything built from the fields above.
        finish_reason: The finish reason; None picks `tool_calls` with calls, else `stop`; "" sends none.
        usage: The raw `usage` object of the final usage chunk (`fake_usage` builds one); None sends
            no usage chunk. It is sent only when the request asked `stream_options.include_usage`.
        status: An HTTP status other than 200 answers with an OpenAI-style error body instead.
        error_message: The error body's message for a non-200 status.
        headers: Extra response headers.
        disconnect_after: Drop the connection after this many `data:` events (a broken stream).
        malformed_after: Send one chunk that is not JSON after this many `data:` events.
        error_after: After this many `data:` events, send an error event (`data: {"error": {...}}`
            with `error_message`, as providers report a failure mid-stream) and end the stream.
        delay_s: Pause before every `data:` event (and before a non-streamed answer).
        hold: Stop before the `data:` event number `hold_after` until the gate is released.
        hold_after: Where `hold` stops: 0 holds right after the response headers, None before them
            (the client is then still waiting for its request to be answered).
    """

    text: str = ""
    reasoning: str = ""
    tool_calls: Sequence[FakeToolCall] = ()
    chunks: int = 1
    argument_chunks: int = 2
    deltas: Sequence[Mapping[str, Any]] | None = None
    finish_reason: str | None = None
    usage: Mapping[str, Any] | None = None
    status: int = 200
    error_message: str = "fake failure"
    headers: Mapping[str, str] = field(default_factory=dict)
    disconnect_after: int | None = None
    malformed_after: int | None = None
    error_after: int | None = None
    delay_s: float = 0.0
    hold: Gate | None = None
    hold_after: int | None = 0

    @classmethod
    def failure(cls, status: int, message: str | None = None, *, headers: Mapping[str, str] | None = None) -> FakeReply:
        """An HTTP error answer with an OpenAI-style error body.

        429 and 5xx answers carry `Retry-After: 0` and `retry-after-ms: 1`, so SDK retries never
        wait: the openai SDK ignores a zero delay (it falls back to its backoff) but honours the
        millisecond header.
        """
        extra: dict[str, str] = {}
        if status == 429 or status >= 500:
            extra = {"retry-after": "0", "retry-after-ms": "1"}
        extra.update(headers or {})
        return cls(status=status, error_message=message or f"fake HTTP {status}", headers=extra)

    def finish(self) -> str | None:
        """The finish reason actually sent (None when none is)."""
        if self.finish_reason == "":
            return None
        if self.finish_reason is not None:
            return self.finish_reason
        return "tool_calls" if self.tool_calls else "stop"

    def stream_deltas(self) -> list[dict[str, Any]]:
        """The `delta` objects of the content chunks, in order (the first carries `role`)."""
        if self.deltas is not None:
            built = [dict(delta) for delta in self.deltas]
        else:
            built = [{"reasoning_content": piece} for piece in _split(self.reasoning, self.chunks)]
            built += [{"content": piece} for piece in _split(self.text, self.chunks)]
            built += self._tool_call_deltas()
        if built:
            built[0] = {"role": "assistant", **built[0]}
        return built

    def _tool_call_deltas(self) -> list[dict[str, Any]]:
        pieces = [_split(call.arguments, self.argument_chunks) or [""] for call in self.tool_calls]
        out: list[dict[str, Any]] = []
        for round_ in range(max((len(p) for p in pieces), default=0)):
            for index, call in enumerate(self.tool_calls):
                if round_ >= len(pieces[index]):
                    continue
                function: dict[str, Any] = {"arguments": pieces[index][round_]}
                entry: dict[str, Any] = {"index": index, "function": function}
                if round_ == 0:
                    entry["id"] = call.id or f"call_{index}"
                    entry["type"] = "function"
                    function["name"] = call.name
                out.append({"tool_calls": [entry]})
        return out

    def message(self) -> dict[str, Any]:
        """The assistant `message` of a non-streamed answer."""
        if self.deltas is not None:
            text = "".join(str(d.get("content") or "") for d in self.deltas)
            reasoning = "".join(str(d.get("reasoning_content") or "") for d in self.deltas)
        else:
            text, reasoning = self.text, self.reasoning
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        if reasoning:
            message["reasoning_content"] = reasoning
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id or f"call_{index}",
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for index, call in enumerate(self.tool_calls)
            ]
        return message


def fake_usage(
    prompt_tokens: int,
    completion_tokens: int,
    *,
    cached: int | None = None,
    reasoning: int | None = None,
    cache_field: Literal["openai", "deepseek"] = "openai",
) -> dict[str, Any]:
    """A raw `usage` object, with cache hits counted inside `prompt_tokens` as both providers do.

    `cached` goes to `prompt_tokens_details.cached_tokens` (OpenAI), or for DeepSeek to
    `prompt_cache_hit_tokens`, with the rest of the prompt in `prompt_cache_miss_tokens` and the
    hits repeated in `prompt_tokens_details.cached_tokens` (DeepSeek sends both spellings);
    `reasoning` goes to `completion_tokens_details.reasoning_tokens`.
    """
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached is not None:
        if cache_field == "deepseek":
            usage["prompt_cache_hit_tokens"] = cached
            usage["prompt_cache_miss_tokens"] = prompt_tokens - cached
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        else:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
    if reasoning is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return usage


def _split(text: str, pieces: int) -> list[str]:
    """`text` in `pieces` nearly equal consecutive parts (fewer when the text is shorter)."""
    if not text:
        return []
    count = max(1, min(pieces, len(text)))
    size, extra = divmod(len(text), count)
    out, start = [], 0
    for index in range(count):
        end = start + size + (1 if index < extra else 0)
        out.append(text[start:end])
        start = end
    return out


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request the server received.

    Attributes:
        number: 1-based arrival order.
        method: The HTTP method.
        path: The URL path.
        headers: The request headers, names in lower case.
        body: The parsed JSON body (None for a GET or a body that is not JSON).
    """

    number: int
    method: str
    path: str
    headers: Mapping[str, str]
    body: Any


class _DropFilter(logging.Filter):
    """Hides uvicorn's error line for connections this server dropped on purpose, and only those."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._pending = 0

    def expect(self) -> None:
        with self._lock:
            self._pending += 1

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage() != _DROP_LOG:
            return True
        with self._lock:
            if self._pending:
                self._pending -= 1
                return False
        return True


class _Uvicorn(uvicorn.Server):
    """uvicorn's server with a start-up signal for the thread that launched it."""

    def __init__(self, config: uvicorn.Config, started: threading.Event) -> None:
        super().__init__(config)
        self._started_event = started

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self._started_event.set()


class FakeOpenAIServer:
    """The fake endpoint; a context manager that starts and stops the server thread.

    Args:
        model: The model id `GET /v1/models` lists (answers echo the request's model).
        start_timeout_s: How long `start()` waits for the server to listen.
    """

    def __init__(self, *, model: str = "fake-model", start_timeout_s: float = _DEFAULT_TIMEOUT_S) -> None:
        self.model = model
        self._start_timeout_s = start_timeout_s
        self._lock = threading.Lock()
        self._replies: deque[FakeReply] = deque()
        self._requests: list[RecordedRequest] = []
        self._disconnected: list[int] = []
        self._request_tally = _Tally()
        self._disconnect_tally = _Tally()
        self._gates: list[Gate] = []
        self._numbers = itertools.count(1)
        self._drops = _DropFilter()
        self._server: _Uvicorn | None = None
        self._thread: threading.Thread | None = None
        self._port: int | None = None
        self.app = self._build_app()

    # ------------------------------------------------------------ lifecycle

    def __enter__(self) -> FakeOpenAIServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Bind `127.0.0.1:0`, start the server thread and wait until it accepts connections."""
        if self._thread is not None:
            raise RuntimeError("the fake OpenAI server is already started")
        # IPPROTO_TCP explicitly: asyncio turns Nagle off (TCP_NODELAY) only on sockets that say so, and
        # without it every keep-alive request waits on delayed ACKs (~40 ms).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind(("127.0.0.1", 0))
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            http="h11",
            ws="none",
            lifespan="off",
            loop="asyncio",
            # No logging configuration and no access-log switch: both would change process-wide
            # loggers that other tests (and the application) own.
            log_config=None,
            timeout_graceful_shutdown=5,
        )
        started = threading.Event()
        server = _Uvicorn(config, started)
        logging.getLogger("uvicorn.error").addFilter(self._drops)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="fake-openai", daemon=True)
        self._server, self._thread = server, thread
        thread.start()
        if not started.wait(self._start_timeout_s):
            self.stop()
            raise RuntimeError(f"the fake OpenAI server did not start within {self._start_timeout_s} s")

    def stop(self) -> None:
        """Release every gate, stop the server and join its thread; idempotent."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        for gate in self._gate_list():
            gate.release()
        if server is not None and thread is not None:
            server.should_exit = True
            thread.join(self._start_timeout_s)
            if thread.is_alive():
                server.force_exit = True
                thread.join(self._start_timeout_s)
        logging.getLogger("uvicorn.error").removeFilter(self._drops)

    @property
    def port(self) -> int:
        """The bound port."""
        if self._port is None:
            raise RuntimeError("the fake OpenAI server is not started")
        return self._port

    @property
    def base_url(self) -> str:
        """`http://127.0.0.1:<port>/v1`, the client's base URL."""
        return f"http://127.0.0.1:{self.port}/v1"

    # ------------------------------------------------------------ test side

    def enqueue(self, *replies: FakeReply) -> None:
        """Queue answers; each request takes the next one (an empty queue answers 400)."""
        with self._lock:
            self._replies.extend(replies)
            self._gates.extend(r.hold for r in replies if r.hold is not None)

    def reset(self) -> None:
        """Forget queued replies, recorded requests and disconnects, and number requests from 1 again."""
        for gate in self._gate_list():
            gate.release()
        with self._lock:
            self._replies.clear()
            self._requests.clear()
            self._disconnected.clear()
            self._gates.clear()
            self._numbers = itertools.count(1)
            self._request_tally.reset()
            self._disconnect_tally.reset()

    @property
    def pending(self) -> int:
        """How many queued replies no request has taken yet."""
        with self._lock:
            return len(self._replies)

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request so far, in arrival order."""
        with self._lock:
            return list(self._requests)

    @property
    def disconnects(self) -> list[int]:
        """The numbers of the requests whose client went away before the stream was complete."""
        with self._lock:
            return list(self._disconnected)

    async def wait_for_requests(self, count: int = 1, *, timeout: float = _DEFAULT_TIMEOUT_S) -> None:  # noqa: ASYNC109 - a hang guard
        """Return once `count` requests arrived (since the last `reset`); a hang guard, not a timer."""
        await self._request_tally.wait_for(count, timeout, f"{count} request(s)")

    async def wait_for_disconnects(self, count: int = 1, *, timeout: float = _DEFAULT_TIMEOUT_S) -> None:  # noqa: ASYNC109 - a hang guard
        """Return once `count` client disconnects were recorded; a hang guard, not a timer."""
        await self._disconnect_tally.wait_for(count, timeout, f"{count} client disconnect(s)")

    def _gate_list(self) -> list[Gate]:
        with self._lock:
            return list(self._gates)

    # ------------------------------------------------------------ server side

    def _record(self, request: Request, body: Any) -> int:
        with self._lock:
            number = next(self._numbers)
            headers = {k.lower(): v for k, v in request.headers.items()}
            self._requests.append(RecordedRequest(number, request.method, request.url.path, headers, body))
        self._request_tally.add()
        return number

    def _take(self) -> FakeReply | None:
        with self._lock:
            return self._replies.popleft() if self._replies else None

    def _disconnected_from(self, number: int) -> None:
        with self._lock:
            self._disconnected.append(number)
        self._disconnect_tally.add()

    def _build_app(self) -> FastAPI:
        app = FastAPI(title="fake OpenAI-compatible server", openapi_url=None, docs_url=None, redoc_url=None)

        @app.get("/v1/models")
        async def list_models(request: Request) -> Response:
            number = self._record(request, None)
            data = [{"id": self.model, "object": "model", "created": 0, "owned_by": "dsh-fake"}]
            return JSONResponse({"object": "list", "data": data}, headers={"x-request-id": f"req_{number}"})

        @app.post("/v1/chat/completions")
        async def chat_completions(request: Request) -> Response:
            raw = await request.body()
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            number = self._record(request, body)
            headers = {"x-request-id": f"req_{number}"}
            reply = self._take()
            if not isinstance(body, dict):
                return _error(400, "the request body is not a JSON object", headers)
            if reply is None:
                return _error(400, "fake OpenAI server: no reply queued for this request", headers)
            headers.update(reply.headers)
            if reply.status != 200:
                return _error(reply.status, reply.error_message, headers)
            model = str(body.get("model", self.model))
            options = body.get("stream_options")
            with_usage = isinstance(options, dict) and options.get("include_usage") is True
            if body.get("stream") is True:
                return _EventStream(
                    _events(number, model, reply, with_usage=with_usage),
                    reply,
                    headers=headers,
                    on_disconnect=partial(self._disconnected_from, number),
                    on_drop=self._drops.expect,
                )
            if reply.delay_s:
                await asyncio.sleep(reply.delay_s)
            if reply.hold is not None:
                await reply.hold.hold()
            return JSONResponse(_completion(number, model, reply), headers=headers)

        return app


def _error(status: int, message: str, headers: Mapping[str, str]) -> Response:
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"message": message, "type": kind, "param": None, "code": str(status)}}
    return JSONResponse(body, status_code=status, headers=dict(headers))


def _completion(number: int, model: str, reply: FakeReply) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": f"chatcmpl-{number}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": reply.message(), "finish_reason": reply.finish()}],
    }
    if reply.usage is not None:
        out["usage"] = dict(reply.usage)
    return out


class _EventStream(Response):
    """A streamed completion that also watches for the client going away.

    Starlette's own streaming response stops quietly when the client leaves; this one records the
    disconnect, and can drop the connection on purpose (by leaving the response unfinished, which
    makes uvicorn close the socket mid-body, exactly what a crashed upstream looks like).
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        events: list[bytes],
        reply: FakeReply,
        *,
        headers: Mapping[str, str],
        on_disconnect: Callable[[], None],
        on_drop: Callable[[], None],
    ) -> None:
        # No body: `init_headers` then sets no Content-Length and the response is sent chunked.
        self.status_code = 200
        self.background = None
        self.init_headers({"cache-control": "no-cache", **headers})
        self._events = events
        self._reply = reply
        self._on_disconnect = on_disconnect
        self._on_drop = on_drop

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sender = asyncio.ensure_future(self._send_events(send))
        watcher = asyncio.ensure_future(_client_gone(receive))
        try:
            await asyncio.wait((sender, watcher), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not sender.done() or not watcher.done():
                for task in (sender, watcher):
                    task.cancel()
                await asyncio.wait((sender, watcher))
        if not sender.cancelled() and sender.exception() is None:
            if sender.result() == "dropped":
                self._on_drop()
                return  # unfinished on purpose: uvicorn closes the connection
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        if not watcher.cancelled() and watcher.exception() is None:
            self._on_disconnect()
            return
        sender.result()  # a failure of the sender itself surfaces as a server error

    async def _send_events(self, send: Send) -> Literal["complete", "dropped"]:
        reply = self._reply
        if reply.hold is not None and reply.hold_after is None:
            await reply.hold.hold()
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        for position, event in enumerate(self._events):
            if reply.disconnect_after is not None and position >= reply.disconnect_after:
                return "dropped"
            if reply.error_after is not None and position >= reply.error_after:
                await send({"type": "http.response.body", "body": _error_event(reply), "more_body": True})
                return "complete"
            if reply.hold is not None and position == reply.hold_after:
                await reply.hold.hold()
            if reply.delay_s:
                await asyncio.sleep(reply.delay_s)
            if reply.malformed_after is not None and position == reply.malformed_after:
                await send(
                    {"type": "http.response.body", "body": b'data: {"id": "broken", "choi\n\n', "more_body": True}
                )
            await send({"type": "http.response.body", "body": event, "more_body": True})
        if reply.hold is not None and reply.hold_after is not None and reply.hold_after >= len(self._events):
            await reply.hold.hold()
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True})
        return "complete"


def _error_event(reply: FakeReply) -> bytes:
    body = {"error": {"message": reply.error_message, "type": "server_error", "param": None, "code": "overloaded"}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


async def _client_gone(receive: Receive) -> None:
    # The request body was read by the handler, so the next message is the disconnect.
    while (await receive())["type"] != "http.disconnect":
        pass


def _events(number: int, model: str, reply: FakeReply, *, with_usage: bool) -> list[bytes]:
    created = int(time.time())

    def chunk(choices: list[dict[str, Any]], usage: Mapping[str, Any] | None = None) -> bytes:
        body: dict[str, Any] = {
            "id": f"chatcmpl-{number}",
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": choices,
        }
        if usage is not None:
            body["usage"] = dict(usage)
        return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"

    events = [chunk([{"index": 0, "delta": delta, "finish_reason": None}]) for delta in reply.stream_deltas()]
    finish = reply.finish()
    if finish is not None:
        events.append(chunk([{"index": 0, "delta": {}, "finish_reason": finish}]))
    if with_usage and reply.usage is not None:
        events.append(chunk([], reply.usage))
    return events
