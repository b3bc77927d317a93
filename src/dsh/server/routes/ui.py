"""The web UI's routes: `GET /` and `GET /static/<name>`, served without a token.

Layer: server. The UI is plain files shipped inside the package (`dsh/server/static/`: one HTML
page, ES modules and one stylesheet; no build step, framework, CDN or web font). These routes hold
no data, so they need no token; every data call the page makes carries the token in its
`Authorization` header (docs/ui.md#the-token). Each answer carries the content security policy
`CSP`: scripts, styles, connections and frames only from this origin, images also as `data:` URLs,
and no framing by any other page. A name that is not one of the shipped files is `not-found`; names
are looked up in a fixed table, so no request can reach another file.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from importlib import resources
from typing import Final

from fastapi import APIRouter, Response

from dsh.server.errors import WireError

__all__ = ["CSP", "STATIC_PACKAGE", "asset_names", "router"]

CSP: Final = "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'"
"""The `Content-Security-Policy` of every UI answer."""

STATIC_PACKAGE: Final = "dsh.server"
"""The package whose `static/` folder holds the UI files."""

_MEDIA_TYPES: Final[Mapping[str, str]] = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}

_HEADERS: Final[Mapping[str, str]] = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Revalidate every time: a new version of the package is picked up at the next load.
    "Cache-Control": "no-cache",
}

router = APIRouter()


@functools.cache
def _assets() -> Mapping[str, tuple[bytes, str]]:
    """Every shipped UI file by name: its bytes and media type (read once per process)."""
    folder = resources.files(STATIC_PACKAGE).joinpath("static")
    found: dict[str, tuple[bytes, str]] = {}
    for entry in folder.iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1] if "." in entry.name else ""
        media = _MEDIA_TYPES.get(suffix)
        if media is not None and entry.is_file():
            found[entry.name] = (entry.read_bytes(), media)
    return found


def asset_names() -> tuple[str, ...]:
    """The names `/static/<name>` serves, sorted."""
    return tuple(sorted(_assets()))


def _answer(name: str) -> Response:
    asset = _assets().get(name)
    if asset is None:
        raise WireError("not-found", "no such route")
    body, media = asset
    return Response(body, media_type=media, headers=dict(_HEADERS))


@router.get("/", include_in_schema=False)
async def index() -> Response:
    """The web UI's page."""
    return _answer("index.html")


@router.get("/static/{name}", include_in_schema=False)
async def static(name: str) -> Response:
    """One of the UI's files (modules, stylesheet)."""
    return _answer(name)
