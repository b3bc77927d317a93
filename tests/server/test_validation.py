"""Request validation, the body limit, abort on client disconnect, and what the access log holds."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from dsh.query.service import SessionQuery
from tests.server.helpers import HANG_GUARD_S, Api, HeldPersistence, assert_error, seed_family, stored_session

pytestmark = pytest.mark.slow  # each test starts a real HTTP server: `make test` only

PROMPT = {"content": [{"type": "text", "text": "hi"}]}
MARKER = "ECHO-MARKER-93817"


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "code"),
    [
        ("POST", "/api/v1/sessions/s/prompt", {"json": {**PROMPT, "extra": 1}}, 400, "bad-request"),
        ("GET", "/api/v1/sessions/s/history?maxMessages=0", {}, 400, "bad-request"),
        ("GET", "/api/v1/sessions/a%01b/history", {}, 400, "bad-request"),
        (
            "POST",
            "/api/v1/sessions/s/prompt",
            {"content": b"hello", "headers": {"content-type": "text/plain"}},
            415,
            "unsupported-media-type",
        ),
        (
            "POST",
            "/api/v1/sessions/s/prompt",
            {"content": b"{not json", "headers": {"content-type": "application/json"}},
            400,
            "bad-request",
        ),
        ("POST", "/api/v1/sessions/s/prompt", {"json": {"content": []}}, 400, "bad-request"),
        (
            "POST",
            "/api/v1/sessions/s/prompt",
            {"json": {"content": [{"type": "text", "text": "x"}] * 33}},
            400,
            "bad-request",
        ),
        (
            "POST",
            "/api/v1/sessions/s/prompt",
            {"json": {"content": [{"type": "text", "text": "x" * 100_001}]}},
            400,
            "bad-request",
        ),
        (
            "POST",
            "/api/v1/sessions/s/prompt",
            {"json": {"content": [{"type": "image", "url": "x"}]}},
            400,
            "bad-request",
        ),
        ("POST", "/api/v1/sessions/s/prompt", {"json": {"content": [{"type": "text", "text": 5}]}}, 400, "bad-request"),
        (
            "POST",
            "/api/v1/sessions/s/prompt",
            {
                "content": b'{"content":[{"type":"text","text":"\\ud800"}]}',
                "headers": {"content-type": "application/json"},
            },
            400,
            "bad-request",
        ),
        ("POST", "/api/v1/sessions", {"json": {"prompt": ""}}, 400, "bad-request"),
        ("POST", "/api/v1/sessions", {"json": {"title": "x"}}, 400, "bad-request"),
        ("GET", "/api/v1/sessions?limit=201", {}, 400, "bad-request"),
        ("GET", "/api/v1/sessions?limit=abc", {}, 400, "bad-request"),
        ("GET", "/api/v1/sessions?limit=1.0", {}, 400, "bad-request"),
        ("GET", "/api/v1/sessions?limit=1e1", {}, 400, "bad-request"),
        ("GET", "/api/v1/sessions/s/history?maxMessages=2.0", {}, 400, "bad-request"),
        ("GET", "/api/v1/sessions/s/history?beforeSeq=%205", {}, 400, "bad-request"),
        ("GET", "/api/v1/sessions/s/history?beforeSeq=-1", {}, 400, "bad-request"),
        ("GET", "/api/v1/sessions/s/subagents?scope=everyone", {}, 400, "bad-request"),
        ("GET", "/api/v1/sessions/p/subagents/c/history?mode=forever", {}, 400, "bad-request"),
        ("GET", "/api/v1/sessions/" + "x" * 129, {}, 400, "bad-request"),
        ("GET", "/api/v1/sessions/%ff", {}, 400, "bad-request"),
        ("GET", "/api/v1/stream?sessionId=a%00b", {}, 400, "bad-request"),
        (
            "POST",
            "/api/v1/sessions/s/interrupt",
            {"content": b"junk", "headers": {"content-type": "application/json"}},
            400,
            "bad-request",
        ),
        ("POST", "/api/v1/sessions/s/resume", {"json": {"force": True}}, 400, "bad-request"),
        ("POST", "/api/v1/sessions/p/subagents/c/interrupt", {"json": {"cause": "x"}}, 400, "bad-request"),
    ],
)
async def test_bad_input_is_refused_in_the_error_body_shape(
    served: Api, method: str, path: str, kwargs: dict[str, Any], status: int, code: str
) -> None:
    """Unknown fields, out-of-range numbers, malformed ids, wrong types and non-JSON bodies: 400/415, never 422."""
    assert_error(await served.http.request(method, path, **kwargs), status, code)


@pytest.mark.parametrize("body", [None, b"null", b"{}"])
async def test_routes_without_a_body_accept_none_null_or_an_empty_object(served: Api, body: bytes | None) -> None:
    """Interrupts and `resumeSession` take no body: nothing, `null` or `{}` is accepted."""
    await stored_session(served.rt, "s")
    headers = {"content-type": "application/json"} if body is not None else {}
    for path in (
        "/api/v1/sessions/s/interrupt",
        "/api/v1/sessions/p/subagents/c/interrupt",
        "/api/v1/sessions/s/resume",
    ):
        response = await served.http.post(path, content=body, headers=headers)
        assert response.status_code == 200, (path, response.text)


async def test_validation_issues_name_the_rule_and_never_echo_the_input(served: Api) -> None:
    """`bad-request` details list `{loc, msg, type}`; the offending values do not appear in the response."""
    bodies = [
        {"content": [{"type": MARKER, "text": "x"}]},
        {"content": [{"type": "text", "text": 7}], "clientTimeZone": 7},
        {"content": [{"type": "text", "text": MARKER}], MARKER: MARKER * 3},
    ]
    for body in bodies:
        response = await served.http.post("/api/v1/sessions/s/prompt", json=body)
        details = assert_error(response, 400, "bad-request")
        assert details["issues"]
        for issue in details["issues"]:
            assert set(issue) == {"loc", "msg", "type"}
        assert f"{MARKER}{MARKER}" not in response.text
        assert f'"{MARKER}"' not in response.text or body is bodies[2]
    limit = await served.http.get("/api/v1/sessions", params={"limit": MARKER})
    assert MARKER not in limit.text


async def _chunks(size: int) -> AsyncIterator[bytes]:
    piece = b" " * 65536
    sent = 0
    while sent < size:
        yield piece
        sent += len(piece)


@pytest.mark.parametrize("chunked", [False, True])
async def test_an_oversized_body_is_413_and_never_reaches_the_handler(
    served: Api, chunked: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 2 MiB body, declared or chunked, is 413 `payload-too-large` `{limit}`; no handler runs."""
    called: list[str] = []

    async def create_agent(*args: Any, **kwargs: Any) -> Any:
        called.append("create")
        raise AssertionError("the handler ran")

    monkeypatch.setattr(served.rt, "create_agent", create_agent)
    size = 2 << 20
    headers = {"content-type": "application/json"}
    content: Any = _chunks(size) if chunked else b" " * size
    response = await served.http.post("/api/v1/sessions", content=content, headers=headers)
    details = assert_error(response, 413, "payload-too-large")
    assert details == {"limit": 1 << 20}
    assert called == []


@pytest.mark.parametrize("chunked", [False, True])
async def test_a_get_with_a_body_is_400_whatever_its_size_or_type(served: Api, chunked: bool) -> None:
    """A GET carrying a body (declared or chunked, JSON or not, small or huge) is 400 `bad-request`, never 413/415."""
    for size, kind in ((2, "application/json"), (2 << 20, "text/plain")):
        content: Any = _chunks(size) if chunked else b" " * size
        response = await served.http.request("GET", "/api/v1/sessions", content=content, headers={"content-type": kind})
        details = assert_error(response, 400, "bad-request")
        assert details == {"issues": [{"loc": ["body"], "msg": "a GET request takes no body", "type": "body"}]}
    assert (await served.http.get("/api/v1/sessions")).status_code == 200


async def test_the_body_limit_is_configurable(tmp_path: Any) -> None:
    """`max_body_bytes` moves the limit: a body just above it is 413, one at it is read."""
    from tests.server.helpers import api

    async with api(tmp_path / "home", max_body_bytes=64) as small:
        body = b'{"prompt": "' + b"x" * 40 + b'"}'
        assert len(body) <= 64
        assert (
            await small.http.post("/api/v1/sessions", content=body, headers={"content-type": "application/json"})
        ).status_code == 201
        big = b'{"prompt": "' + b"x" * 60 + b'"}'
        response = await small.http.post("/api/v1/sessions", content=big, headers={"content-type": "application/json"})
        assert assert_error(response, 413, "payload-too-large") == {"limit": 64}
        await small.rt.settle(HANG_GUARD_S)


class _Status499(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.seen = asyncio.Event()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        line = record.getMessage()
        self.lines.append(line)
        if " 499 " in line:
            self.seen.set()


async def test_a_client_that_disconnects_cancels_the_catalog_listing(served: Api) -> None:
    """A held cold read: the client leaves, the listing raises `CANCELLED`, and the access log records 499."""
    rt = served.rt
    family = await seed_family(rt)
    held = HeldPersistence(rt.persistence)
    rt.services.query = SessionQuery(rt.sessions, held, projections=rt.projections)
    outcome: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
    real = rt.subagents.list_children

    async def spy(*args: Any, **kwargs: Any) -> Any:
        try:
            result = await real(*args, **kwargs)
        except BaseException as error:
            outcome.set_result(error)
            raise
        outcome.set_result(None)
        return result

    rt.subagents.list_children = spy  # type: ignore[method-assign]
    access = _Status499()
    logger = logging.getLogger("dsh.server.access")
    logger.addHandler(access)
    previous = logger.level
    logger.setLevel(logging.INFO)
    try:
        async with served.server.client() as client:
            request = asyncio.ensure_future(client.get(f"/api/v1/sessions/{family.parent}/subagents"))
            await asyncio.wait_for(held.entered.wait(), HANG_GUARD_S)
            request.cancel()
            with pytest.raises(asyncio.CancelledError):
                await request
        error = await asyncio.wait_for(outcome, HANG_GUARD_S)
        assert getattr(error, "code", None) == "CANCELLED"
        await asyncio.wait_for(access.seen.wait(), HANG_GUARD_S)
    finally:
        logger.removeHandler(access)
        logger.setLevel(previous)
        held.release.set()
    assert any(line.startswith(f"GET /api/v1/sessions/{family.parent}/subagents 499 ") for line in access.lines)


async def test_the_access_log_holds_no_token_body_or_key(served: Api, caplog: pytest.LogCaptureFixture) -> None:
    """Method, path, status and duration are logged; the token, a wrong token and the body text are not."""
    await stored_session(served.rt, "s")
    secret_text = "BODY-SECRET-5521"
    with caplog.at_level(logging.DEBUG):
        await served.http.post("/api/v1/sessions/s/prompt", json={"content": [{"type": "text", "text": secret_text}]})
        async with served.server.client(token="WRONG-TOKEN-771") as wrong:
            await wrong.get("/api/v1/sessions")
        await served.rt.settle(HANG_GUARD_S)
    text = "\n".join(record.getMessage() for record in caplog.records)
    assert "POST /api/v1/sessions/s/prompt 202 " in text
    assert "GET /api/v1/sessions 401 " in text
    for secret in (served.server.token, "WRONG-TOKEN-771", secret_text):
        assert secret not in text


async def test_a_path_id_with_a_slash_or_percent_is_one_segment(served: Api) -> None:
    """Ids holding `/`, `%` or `..` are legal: percent-encoded they address exactly that session."""
    for session_id in ("a/b", "100%", ".."):
        await stored_session(served.rt, session_id)
        encoded = httpx.URL("/").copy_with(
            raw_path=b"/api/v1/sessions/"
            + session_id.replace("%", "%25").replace("/", "%2F").replace(".", "%2E").encode()
        )
        response = await served.http.get(encoded)
        assert response.status_code == 200, (session_id, response.text)
        assert response.json()["id"] == session_id
