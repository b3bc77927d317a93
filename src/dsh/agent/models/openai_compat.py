"""`OpenAICompatibleClient`: streams chat completions from any OpenAI-compatible endpoint.

Layer: agent. The client wraps the `openai` SDK's `AsyncOpenAI`, which is imported only when a
client sends its first request, so `import dsh`, `import dsh.agent.models` and building a client
stay light. Requests and responses are mapped by `dsh.agent.models._openai_wire`; this module owns
the settings resolution, the SDK client's lifecycle, cancellation and the translation of SDK
failures into `ModelError`s (docs/agent.md#model-clients, docs/agent.md#model-settings).

Retries come in two layers. The SDK's `max_retries` repeats a request that failed before its first
byte (connection errors, 429, 5xx), with its own backoff and the server's `Retry-After`. A stream
that breaks after its first byte (a cut connection, an error chunk, no chunk within
`chunk_timeout_s`) raises a `ModelError` marked `retryable`, which the agent loop retries under the
client's `retry_policy`, discarding the partial step (docs/agent.md#retries). The API key is a
`SecretStr` end to end and is removed from every error message this module builds.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from enum import Enum
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar
from urllib.parse import urlsplit

from dsh.abort import AbortSignal
from dsh.agent.errors import ModelError
from dsh.agent.model import ModelChunk, ModelRequest, RetryPolicy
from dsh.agent.models._openai_wire import ChunkMapper, MalformedStreamError, request_params
from dsh.config import ModelConfig

if TYPE_CHECKING:
    import openai
    from pydantic import SecretStr

__all__ = ["DEEPSEEK_HOST", "OpenAICompatibleClient", "ResolvedModelSettings", "resolve_model_settings"]

DEEPSEEK_HOST: Final = "api.deepseek.com"
"""The only host a `DEEPSEEK_API_KEY` is ever sent to."""

_CONNECT_TIMEOUT_S: Final = 10.0
_WRITE_TIMEOUT_S: Final = 30.0
_POOL_TIMEOUT_S: Final = 10.0
_DETAIL_CHARS: Final = 300
"""Longest provider error text quoted in a `ModelError` message."""

_NOT_CONFIGURED_HINT: Final = (
    "set DEEPSEEK_API_KEY to use DeepSeek, or DSH_MODEL_API_KEY (with DSH_MODEL_BASE_URL) for another "
    "OpenAI-compatible endpoint; `dsh demo` runs a scripted agent without any key"
)

_T = TypeVar("_T")


# ---------------------------------------------------------------- settings


@dataclass(frozen=True, slots=True)
class ResolvedModelSettings:
    """The settings one `OpenAICompatibleClient` runs with; `repr` shows the key masked.

    Attributes:
        base_url: The endpoint (`http` or `https`, with a host).
        api_key: The key sent as `Authorization: Bearer`, never shown.
        model: The default model name.
        provider: The provider name recorded on assistant messages.
        timeout_s: The read timeout of one request.
        max_retries: SDK retries of a request that failed before its first byte.
        max_tokens: The default output limit, if any.
        key_source: Where the key came from: `override` (a caller argument such as a CLI flag),
            `api_key` (`DSH_MODEL_API_KEY` or `model.api_key`) or `deepseek_api_key` (`DEEPSEEK_API_KEY`).
        chunk_timeout_s: The longest wait for the next chunk once a stream is open; past it the
            stream counts as broken (`MODEL_TIMEOUT`, retryable).
    """

    base_url: str
    api_key: SecretStr
    model: str
    provider: str
    timeout_s: float
    max_retries: int
    max_tokens: int | None
    key_source: Literal["override", "api_key", "deepseek_api_key"]
    chunk_timeout_s: float = 60.0

    @property
    def host(self) -> str:
        """The endpoint's host name (lower case)."""
        return _host(self.base_url) or ""

    @property
    def endpoint(self) -> str:
        """`host` or `host:port`, as error messages name the endpoint."""
        port = urlsplit(self.base_url).port
        return self.host if port is None else f"{self.host}:{port}"


def resolve_model_settings(
    config: ModelConfig,
    *,
    base_url: str | None = None,
    api_key: str | SecretStr | None = None,
    model: str | None = None,
    provider: str | None = None,
    timeout_s: float | None = None,
    max_retries: int | None = None,
    max_tokens: int | None = None,
    chunk_timeout_s: float | None = None,
) -> ResolvedModelSettings:
    """Apply caller overrides (CLI flags) to the configured `model` section and pick the key.

    Each field is the override when given, else the configured value (environment `DSH_MODEL*` or
    Python), else the default. The key is the override, else `model.api_key` (`DSH_MODEL_API_KEY`),
    else `model.deepseek_api_key` (`DEEPSEEK_API_KEY`) but only when the endpoint's host is
    `api.deepseek.com`, so a DeepSeek key is never sent to another host. The provider defaults to
    `deepseek` on that host and `openai-compatible` elsewhere.

    Raises:
        ModelError: `MODEL_NOT_CONFIGURED` without a usable key or with a malformed base URL; the
            message names `DEEPSEEK_API_KEY`, `DSH_MODEL_API_KEY` and `dsh demo`.
    """
    from pydantic import SecretStr

    url = (base_url if base_url is not None else config.base_url).strip()
    host = _host(url)
    if host is None:
        raise ModelError(
            f"the model base URL {url!r} is not an http(s) URL with a host; {_NOT_CONFIGURED_HINT}",
            code="MODEL_NOT_CONFIGURED",
        )
    source: Literal["override", "api_key", "deepseek_api_key"]
    if api_key is not None and _secret_text(api_key):
        key, source = _secret_text(api_key), "override"
    elif config.api_key is not None and config.api_key.get_secret_value():
        key, source = config.api_key.get_secret_value(), "api_key"
    elif config.deepseek_api_key is not None and config.deepseek_api_key.get_secret_value():
        if host != DEEPSEEK_HOST:
            raise ModelError(
                f"no API key for the model endpoint {host}: DEEPSEEK_API_KEY is only sent to {DEEPSEEK_HOST}; "
                f"{_NOT_CONFIGURED_HINT}",
                code="MODEL_NOT_CONFIGURED",
            )
        key, source = config.deepseek_api_key.get_secret_value(), "deepseek_api_key"
    else:
        raise ModelError(
            f"no API key for the model endpoint {host}: {_NOT_CONFIGURED_HINT}", code="MODEL_NOT_CONFIGURED"
        )
    chosen_provider = provider or config.provider or ("deepseek" if host == DEEPSEEK_HOST else "openai-compatible")
    return ResolvedModelSettings(
        base_url=url,
        api_key=SecretStr(key),
        model=model or config.model,
        provider=chosen_provider,
        timeout_s=timeout_s if timeout_s is not None else config.timeout_s,
        max_retries=max_retries if max_retries is not None else config.max_retries,
        max_tokens=max_tokens if max_tokens is not None else config.max_tokens,
        key_source=source,
        chunk_timeout_s=chunk_timeout_s if chunk_timeout_s is not None else config.chunk_timeout_s,
    )


def _secret_text(value: str | SecretStr) -> str:
    return value if isinstance(value, str) else value.get_secret_value()


def _host(url: str) -> str | None:
    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018 - a malformed port raises ValueError here
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not host:
        return None
    return host.lower()


# ---------------------------------------------------------------- client


class _State(Enum):
    IDLE = "idle"  # no SDK client yet
    OPEN = "open"
    CLOSED = "closed"


class OpenAICompatibleClient:
    """A `ModelClient` for OpenAI-compatible chat completions (DeepSeek by default).

    Args:
        settings: Resolved settings (`resolve_model_settings`); the SDK client is built on first use.
        retry_policy: How the agent loop retries a stream that broke after its first byte; default
            `settings.max_retries` retries with the harness's backoff (docs/agent.md#retries).

    Attributes:
        provider: The provider name recorded on assistant messages.
        model: The default model name, for callers that build requests.
        retry_policy: The loop's retry policy for this client's retryable failures.
    """

    def __init__(self, settings: ResolvedModelSettings, *, retry_policy: RetryPolicy | None = None) -> None:
        self._settings = settings
        self.provider = settings.provider
        self.model = settings.model
        self.retry_policy = retry_policy if retry_policy is not None else RetryPolicy(max_retries=settings.max_retries)
        self._state = _State.IDLE
        self._sdk: openai.AsyncOpenAI | None = None

    def __repr__(self) -> str:
        return f"OpenAICompatibleClient(provider={self.provider!r}, base_url={self._settings.base_url!r})"

    @property
    def settings(self) -> ResolvedModelSettings:
        """The settings the client runs with (the key stays a `SecretStr`)."""
        return self._settings

    async def aclose(self) -> None:
        """Close the SDK client and its connections; idempotent."""
        sdk, self._sdk = self._sdk, None
        self._state = _State.CLOSED
        if sdk is not None:
            await sdk.close()

    def _client(self) -> openai.AsyncOpenAI:
        if self._state is _State.CLOSED:
            raise ModelError("the model client is closed", code="MODEL_UNAVAILABLE")
        if self._sdk is None:
            import openai  # deferred: the SDK is heavy and only real model runs need it

            settings = self._settings
            http_client = None
            if settings.base_url.lower().startswith("http://"):
                # A plain-HTTP endpoint (a local server) never speaks TLS, so its client builds no
                # TLS context: loading the CA bundle costs about 90 ms of CPU per process. Redirects
                # are not followed either, so no TLS connection can ever be made with it.
                http_client = openai.DefaultAsyncHttpxClient(verify=False, follow_redirects=False)
            self._sdk = openai.AsyncOpenAI(
                base_url=settings.base_url,
                api_key=settings.api_key.get_secret_value(),
                timeout=openai.Timeout(
                    connect=_CONNECT_TIMEOUT_S,
                    read=settings.timeout_s,
                    write=_WRITE_TIMEOUT_S,
                    pool=_POOL_TIMEOUT_S,
                ),
                max_retries=settings.max_retries,
                http_client=http_client,
            )
            self._state = _State.OPEN
        return self._sdk

    async def stream(self, request: ModelRequest, *, signal: AbortSignal) -> AsyncIterator[ModelChunk]:
        """Stream one chat completion as dsh chunks; raise `ModelError` on failure.

        When `signal` aborts, the pending request or chunk read is cancelled and the HTTP response
        closed at once (docs/agent.md#cancellation); the abort reason is then raised.
        """
        signal.throw_if_aborted()
        sdk = self._client()
        params = request_params(request, default_max_tokens=self._settings.max_tokens)
        params["model"] = request.model or self._settings.model
        # `create` is overloaded on `stream`; the keyword dict is built by the wire module.
        create: Any = sdk.chat.completions.create
        aborted = asyncio.ensure_future(signal.wait())
        response: Any = None
        try:
            response = await self._until_aborted(create(**params), aborted, signal, streaming=False, discard=_close)
            request_id = _request_id_of(response)
            hint = _stream_retry_after_ms(response)
            mapper = ChunkMapper()
            while True:
                raw = await self._until_aborted(
                    asyncio.wait_for(_next_or_end(response), self._settings.chunk_timeout_s),
                    aborted,
                    signal,
                    streaming=True,
                    request_id=request_id,
                    retry_after_ms=hint,
                )
                if raw is _END:
                    break
                for chunk in self._mapped(partial(mapper.feed, raw), request_id):
                    yield chunk
            for chunk in self._mapped(mapper.end, request_id, cut=True):
                yield chunk
        finally:
            aborted.cancel()
            if response is not None:
                # Closing the response closes the HTTP stream, so the server sees the client leave.
                await response.close()

    def _mapped(
        self, chunks: Callable[[], Iterator[ModelChunk]], request_id: str | None, *, cut: bool = False
    ) -> list[ModelChunk]:
        try:
            return list(chunks())
        except MalformedStreamError as error:
            # A stream that simply stopped before its finish reason was cut off; other faults are
            # the endpoint's protocol errors, which a retry would only repeat.
            raise ModelError(
                self._scrub(f"the model endpoint {self._settings.endpoint} sent a malformed stream: {error}"),
                code="MODEL_UNAVAILABLE",
                request_id=request_id,
                retryable=cut,
            ) from None

    async def _until_aborted(
        self,
        work: Coroutine[Any, Any, _T],
        aborted: asyncio.Future[object],
        signal: AbortSignal,
        *,
        streaming: bool,
        request_id: str | None = None,
        discard: Callable[[_T], Awaitable[None]] | None = None,
        retry_after_ms: int | None = None,
    ) -> _T:
        """Await `work` unless `signal` aborts first; SDK failures become `ModelError`s.

        On an abort (or when the caller is cancelled) the work is cancelled and awaited, and a result
        it produced anyway goes to `discard`: an opened response must be closed even when the abort
        won the race against it, or its connection would stay open.
        """
        task = asyncio.ensure_future(work)
        interrupted = True
        try:
            await asyncio.wait((task, aborted), return_when=asyncio.FIRST_COMPLETED)
            interrupted = signal.aborted
        finally:
            if interrupted:
                # Cancelling the pending request or read is what makes an abort prompt even while the
                # server holds the stream (docs/agent.md#cancellation).
                await _abandon(task, discard)
        if interrupted:
            signal.throw_if_aborted()
        try:
            return task.result()
        except ModelError:
            raise
        except Exception as error:
            failure = self._translate(error, streaming=streaming, request_id=request_id)
            if failure.retryable and retry_after_ms is not None:
                failure.retry_after_ms = retry_after_ms
            raise failure from error

    # ------------------------------------------------------------ errors

    def _translate(self, error: Exception, *, streaming: bool, request_id: str | None) -> ModelError:
        import openai

        host = self._settings.endpoint
        if isinstance(error, openai.APIStatusError):
            status = error.status_code
            detail = _detail(error)
            found_id = error.request_id or request_id
            if status in (401, 403):
                code = "MODEL_AUTH"
                text = f"the model endpoint {host} refused the API key (HTTP {status}): {detail}"
            elif status == 429:
                code = "MODEL_RATE_LIMITED"
                text = (
                    f"the model endpoint {host} is rate limiting requests (HTTP 429, "
                    f"{self._settings.max_retries} retries used): {detail}"
                )
            elif status == 408:
                code = "MODEL_TIMEOUT"
                text = f"the model endpoint {host} timed out the request (HTTP 408): {detail}"
            elif 400 <= status < 500:
                code = "MODEL_BAD_REQUEST"
                text = f"the model endpoint {host} rejected the request (HTTP {status}): {detail}"
            else:
                code = "MODEL_UNAVAILABLE"
                text = f"the model endpoint {host} failed (HTTP {status}): {detail}"
            return ModelError(
                self._scrub(text),
                code=code,
                status=status,
                request_id=found_id,
                retry_after_ms=_retry_after_ms(error.response.headers) if status == 429 else None,
            )
        if streaming and isinstance(error, TimeoutError):
            text = f"the model stream from {host} stalled: no chunk within {self._settings.chunk_timeout_s:g} s"
            return ModelError(self._scrub(text), code="MODEL_TIMEOUT", request_id=request_id, retryable=True)
        if isinstance(error, openai.APITimeoutError):
            text = f"the model endpoint {host} did not answer within {self._settings.timeout_s:g} s"
            return ModelError(self._scrub(text), code="MODEL_TIMEOUT", request_id=request_id, retryable=streaming)
        if streaming:
            # Anything else once chunks flow is a broken stream: a dropped connection or an error
            # event in the stream, both worth a retry; or a chunk that is not JSON, which is not.
            if isinstance(error, ValueError):
                text = f"the model endpoint {host} sent a malformed chunk: {_describe_cause(error)}"
                return ModelError(self._scrub(text), code="MODEL_UNAVAILABLE", request_id=request_id)
            if isinstance(error, openai.APIError):
                text = f"the model stream from {host} broke off: {_describe_cause(error)}"
            else:
                text = f"the model stream from {host} failed: {_describe_cause(error)}"
            return ModelError(self._scrub(text), code="MODEL_UNAVAILABLE", request_id=request_id, retryable=True)
        if isinstance(error, openai.APIConnectionError):
            text = f"cannot reach the model endpoint {host}: {_describe_cause(error)}"
        else:
            text = f"the request to the model endpoint {host} failed: {_describe_cause(error)}"
        return ModelError(self._scrub(text), code="MODEL_UNAVAILABLE", request_id=request_id)

    def _scrub(self, text: str) -> str:
        key = self._settings.api_key.get_secret_value()
        return text.replace(key, "***") if key else text


_END: Final = object()


async def _next_or_end(stream: Any) -> Any:
    # StopAsyncIteration must not cross a task boundary, so the end of the stream is a sentinel.
    try:
        return await stream.__anext__()
    except StopAsyncIteration:
        return _END


async def _abandon(task: asyncio.Future[_T], discard: Callable[[_T], Awaitable[None]] | None) -> None:
    """Cancel `task` and wait for it; hand a result it still produced to `discard`."""
    task.cancel()
    await asyncio.wait((task,))
    if task.cancelled() or task.exception() is not None:
        return  # the failure is moot once the caller gave up on the work
    if discard is not None:
        await discard(task.result())


async def _close(stream: Any) -> None:
    await stream.close()


def _request_id_of(stream: Any) -> str | None:
    response = getattr(stream, "response", None)
    headers = getattr(response, "headers", None)
    found = headers.get("x-request-id") if headers is not None else None
    return found if isinstance(found, str) else None


def _stream_retry_after_ms(stream: Any) -> int | None:
    """A `Retry-After` the endpoint sent with a stream's headers (some gateways do), for its retry."""
    response = getattr(stream, "response", None)
    headers = getattr(response, "headers", None)
    return _retry_after_ms(headers) if headers is not None else None


def _detail(error: Any) -> str:
    body = getattr(error, "body", None)
    message = body.get("message") if isinstance(body, dict) else None
    text = message if isinstance(message, str) and message else str(getattr(error, "message", "") or error)
    return _clip(text)


def _describe_cause(error: BaseException) -> str:
    parts = [f"{type(error).__name__}: {error}" if str(error) else type(error).__name__]
    cause = error.__cause__ or error.__context__
    if cause is not None and str(cause) and str(cause) not in parts[0]:
        parts.append(str(cause))
    return _clip(" (".join(parts) + (")" if len(parts) > 1 else ""))


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _DETAIL_CHARS else text[: _DETAIL_CHARS - 1] + "…"


def _retry_after_ms(headers: Any) -> int | None:
    for name, scale in (("retry-after-ms", 1.0), ("retry-after", 1000.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            found = float(value) * scale
        except ValueError:
            continue
        if found >= 0 and found != float("inf"):
            return round(found)
    return None


# Shown under the name users import (docs/architecture.md#public-names).
OpenAICompatibleClient.__module__ = "dsh.agent.models"
ResolvedModelSettings.__module__ = "dsh.agent.models"
