"""The web UI's files and routes: shipped in the package, served without a token under a strict CSP, safe by design."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest

from dsh.server.routes.ui import CSP, asset_names
from tests.server.helpers import Api, assert_error

pytestmark = pytest.mark.slow  # each test starts a real HTTP server: `make test` only

STATIC = Path(str(resources.files("dsh.server").joinpath("static")))


def _text(name: str) -> str:
    return (STATIC / name).read_text(encoding="utf-8")


def _scripts() -> list[str]:
    return sorted(path.name for path in STATIC.glob("*.js"))


def test_the_ui_ships_one_page_one_stylesheet_and_its_modules() -> None:
    """The package holds index.html, app.css, the entry module app.js and the modules it imports, nothing else."""
    names = set(asset_names())
    assert {"index.html", "app.css", "app.js"} <= names
    assert names == {"index.html", "app.css", *_scripts()}
    imported = {match for script in _scripts() for match in re.findall(r'from "\./([\w-]+\.js)"', _text(script))}
    assert imported | {"app.js"} == set(_scripts())


@pytest.mark.parametrize("name", ["index.html", "app.css", "app.js", "stream.js"])
async def test_the_page_and_its_files_need_no_token_and_carry_the_csp(served: Api, name: str) -> None:
    """`/` and `/static/*` answer without a token, with the content security policy and the right media type."""
    path = "/" if name == "index.html" else f"/static/{name}"
    async with served.anonymous() as anonymous:
        response = await anonymous.get(path)
    assert response.status_code == 200
    assert response.headers["content-security-policy"] == CSP
    assert CSP == "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'"
    assert response.headers["x-content-type-options"] == "nosniff"
    kind = {"html": "text/html", "css": "text/css", "js": "text/javascript"}[name.rsplit(".", 1)[1]]
    assert response.headers["content-type"].startswith(kind)
    assert response.content == (STATIC / name).read_bytes()
    assert "set-cookie" not in response.headers


async def test_unknown_ui_files_are_not_found_and_the_api_still_needs_its_token(served: Api) -> None:
    """Only shipped names are served (no path reaches another file), and `/api/v1` stays behind the token."""
    async with served.anonymous() as anonymous:
        for path in (
            "/static/nope.js",
            "/static/..%2Fapp.py",
            "/static/%2e%2e%2f%2e%2e%2fpyproject.toml",
            "/index.html",
        ):
            assert_error(await anonymous.get(path), 404, "not-found")
        assert_error(await anonymous.get("/api/v1/sessions"), 401, "unauthenticated")
    document = (await served.http.get("/openapi.json")).json()
    assert all(path.startswith("/api/v1/") for path in document["paths"])


def test_the_scripts_never_insert_markup_or_put_the_token_in_a_url() -> None:
    """Data text goes in through textContent only; the stream is read with fetch, never EventSource."""
    forbidden = re.compile(
        r"\.innerHTML|\.outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function"
        r"|new EventSource|createContextualFragment"
    )
    for script in _scripts():
        assert forbidden.findall(_text(script)) == [], script
    stream = _text("stream.js")
    assert "getReader()" in stream
    assert "Last-Event-ID" in stream
    api = _text("api.js")
    assert "sessionStorage" in api
    assert "history.replaceState" in api
    assert "Authorization" in api


def test_the_page_loads_nothing_from_elsewhere_and_has_no_inline_code() -> None:
    """No CDN, web font or remote URL anywhere; no inline script, style or event handler in the page."""
    for name in asset_names():
        text = _text(name)
        assert re.findall(r"https?://(?!www\.w3\.org/2000/svg)", text) == [], name
        assert "@import" not in text
        assert "@font-face" not in text
    page = _text("index.html")
    assert re.findall(r"<script(?![^>]*\bsrc=)", page) == []
    assert "<style" not in page
    assert re.findall(r"\son[a-z]+=", page) == []
    assert re.findall(r'\sstyle="', page) == []
