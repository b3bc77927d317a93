"""The API's contract surface: the OpenAPI route list, token auth on every route, request ids, the Host check."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import httpx
import pytest

from tests.server.helpers import Api, assert_error
from tests.tools.helpers import GOLDEN, assert_golden

pytestmark = pytest.mark.slow  # each test starts a real HTTP server: `make test` only

_PARAMS = {"id": "some-session", "pid": "some-parent", "cid": "some-child"}


def _operations(document: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for path, item in document["paths"].items():
        for method, operation in item.items():
            rows.append(
                {
                    "method": method.upper(),
                    "path": path,
                    "operationId": operation["operationId"],
                    "statuses": sorted(operation["responses"]),
                }
            )
    return sorted(rows, key=lambda row: (row["path"], row["method"]))


async def test_openapi_is_public_and_its_routes_match_the_golden_list(served: Api) -> None:
    """`GET /openapi.json` needs no token, and its (method, path, operationId, statuses) equal the golden list."""
    async with served.anonymous() as anonymous:
        response = await anonymous.get("/openapi.json")
    assert response.status_code == 200
    text = json.dumps(_operations(response.json()), indent=2) + "\n"
    assert_golden(GOLDEN / "openapi_routes.json", text)


async def test_every_error_response_is_documented_with_the_error_body(served: Api) -> None:
    """Each 4xx/5xx response in the document is JSON with `ErrorBody`; no FastAPI 422 is left; auth is declared."""
    document = (await served.http.get("/openapi.json")).json()
    assert document["components"]["securitySchemes"]["bearerAuth"] == {"type": "http", "scheme": "bearer"}
    for item in document["paths"].values():
        for operation in item.values():
            assert "422" not in operation["responses"]
            for status, response in operation["responses"].items():
                if int(status) >= 400:
                    assert response["content"] == {
                        "application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}
                    }
            assert (operation.get("security") is None) == (operation["operationId"] in ("health", "ready"))


async def test_swagger_ui_and_redoc_are_off(served: Api) -> None:
    """The documentation UIs (which would load CDN assets) are not served."""
    for path in ("/docs", "/redoc"):
        assert_error(await served.http.get(path), 404, "not-found")


async def _call(client: httpx.AsyncClient, method: str, path: str) -> httpx.Response:
    url = path.format(**_PARAMS)
    if method == "POST":
        return await client.post(url, json={"content": [{"type": "text", "text": "hi"}]})
    return await client.get(url)


@pytest.mark.parametrize("token", ["", "wrong-token"])
async def test_every_route_but_health_and_ready_needs_the_token(served: Api, token: str) -> None:
    """Without a (right) token every `/api/v1` operation but health and ready is 401 with `WWW-Authenticate: Bearer`."""
    document = (await served.http.get("/openapi.json")).json()
    operations = [row for row in _operations(document) if row["path"].startswith("/api/v1")]
    assert len(operations) == 18
    async with served.server.client(token=token) as client:
        for row in operations:
            response = await _call(client, row["method"], row["path"])
            if row["operationId"] in ("health", "ready"):
                assert response.status_code == 200
                assert response.json()["ok"] is True
                continue
            assert_error(response, 401, "unauthenticated")
            assert response.headers["www-authenticate"] == "Bearer", row
        assert_error(await client.get("/api/v1/no-such-route"), 401, "unauthenticated")


async def test_a_bearer_token_in_another_scheme_or_case_is_judged_by_its_value(served: Api) -> None:
    """The scheme name is case-insensitive; a Basic header or a token prefix is refused."""
    token = served.server.token
    async with served.anonymous() as client:
        ok = await client.get("/api/v1/sessions", headers={"Authorization": f"bearer {token}"})
        assert ok.status_code == 200
        for header in (f"Basic {token}", f"Bearer {token[:-1]}", f"Bearer {token}x", "Bearer"):
            assert_error(
                await client.get("/api/v1/sessions", headers={"Authorization": header}), 401, "unauthenticated"
            )


async def test_responses_carry_a_request_id_echoing_a_valid_client_value(served: Api) -> None:
    """A valid `X-Request-Id` is echoed; an invalid or missing one is replaced by a generated id (errors too)."""
    echoed = await served.http.get("/api/v1/health", headers={"X-Request-Id": "req-42"})
    assert echoed.headers["x-request-id"] == "req-42"
    replaced = await served.http.get("/api/v1/health", headers={"X-Request-Id": "has space"})
    generated = await served.http.get("/api/v1/health")
    assert replaced.headers["x-request-id"] not in ("", "has space")
    assert generated.headers["x-request-id"] != replaced.headers["x-request-id"]
    async with served.anonymous() as client:
        refused = await client.get("/api/v1/sessions", headers={"X-Request-Id": "req-43"})
    assert refused.headers["x-request-id"] == "req-43"


async def test_a_foreign_host_header_is_refused(served: Api) -> None:
    """A `Host` naming neither the bound host, `localhost` nor `127.0.0.1` is 400 (a DNS-rebinding defence)."""
    details = assert_error(
        await served.http.get("/api/v1/health", headers={"Host": "attacker.example"}), 400, "bad-request"
    )
    assert details["issues"][0]["loc"] == ["header", "host"]
    for host in ("localhost:1234", "127.0.0.1", "LOCALHOST"):
        assert (await served.http.get("/api/v1/health", headers={"Host": host})).status_code == 200


async def test_no_cors_headers_and_no_cookies(served: Api) -> None:
    """A cross-origin request gets no `Access-Control-*` header, and no response sets a cookie."""
    headers = {"Origin": "https://example.org"}
    for response in (
        await served.http.get("/api/v1/sessions", headers=headers),
        await served.http.options("/api/v1/sessions", headers={**headers, "Access-Control-Request-Method": "GET"}),
    ):
        assert not [name for name in response.headers if name.lower().startswith("access-control-")]
        assert "set-cookie" not in response.headers


def test_import_dsh_loads_no_web_stack() -> None:
    """`import dsh` (and the CLI's entry module) never imports fastapi, starlette or uvicorn."""
    code = (
        "import sys, dsh, dsh.cli.main, dsh.testing\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('fastapi', 'starlette', 'uvicorn'))\n"
        "assert not loaded, loaded\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
